-- Schema version 11 (PostgreSQL): a run created queued is announced with its row
-- (docs/postgres.md, *LISTEN/NOTIFY*). The durable_work payload of an INSERT is
-- '<schema> <txid> <the row as JSON>' when it fits in a NOTIFY (under 8,000 bytes), so a
-- worker in another process can start the run at once, its claim riding on the attempt's
-- first write, without first reading what is queued (the claim decides, as for a run a
-- start in its own process hands over). Otherwise, and for every other change, the
-- payload is as in version 8. A worker of an older version reads the longer payload as a
-- change it cannot judge, and reads what is queued, as for a cancel.
CREATE OR REPLACE FUNCTION durable_notify_work() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    carried text;
BEGIN
    IF TG_OP = 'UPDATE' THEN
        IF NEW.cancel_requested AND NOT OLD.cancel_requested THEN
            PERFORM pg_notify('durable_work', TG_TABLE_SCHEMA);
            RETURN NULL;
        END IF;
    ELSE
        carried := TG_TABLE_SCHEMA || ' ' || txid_current() || ' ' || row_to_json(NEW)::text;
        IF octet_length(carried) < 8000 THEN
            PERFORM pg_notify('durable_work', carried);
            RETURN NULL;
        END IF;
    END IF;
    PERFORM pg_notify('durable_work', TG_TABLE_SCHEMA || ' ' || txid_current());
    RETURN NULL;
END
$$;
