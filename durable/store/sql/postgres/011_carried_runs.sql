-- Schema version 11 (PostgreSQL): a run created queued is announced with its row
-- (docs/postgres.md, *LISTEN/NOTIFY*). The durable_work payload of an INSERT of one queued
-- run is '<schema> <txid> <the row as JSON>' when it fits in a NOTIFY (under 8,000 bytes),
-- so a worker in another process can start the run at once, its claim riding on the
-- attempt's first write, without first reading what is queued (the claim decides, as for a
-- run a start in its own process hands over). An INSERT of several queued runs, or of one
-- too large, sends '<schema> <txid>' as in version 8 (folded into one per transaction), and
-- so does every other change (durable_notify_work, unchanged). A statement trigger, so
-- that it can tell one run from many (the rows it inserted: created). A worker of an older
-- version reads the longer payload as a change it cannot judge, and reads what is queued,
-- as for a cancel.
CREATE FUNCTION durable_notify_created() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    queued bigint;
    carried text;
BEGIN
    SELECT count(*) INTO queued FROM created WHERE state = 'queued';
    IF queued = 0 THEN
        RETURN NULL;
    END IF;
    IF queued = 1 THEN
        SELECT TG_TABLE_SCHEMA || ' ' || txid_current() || ' ' || row_to_json(c)::text
          INTO carried FROM created AS c WHERE c.state = 'queued';
        IF octet_length(carried) < 8000 THEN
            PERFORM pg_notify('durable_work', carried);
            RETURN NULL;
        END IF;
    END IF;
    PERFORM pg_notify('durable_work', TG_TABLE_SCHEMA || ' ' || txid_current());
    RETURN NULL;
END
$$;
DROP TRIGGER durable_runs_notify_insert ON durable_runs;
CREATE TRIGGER durable_runs_notify_insert AFTER INSERT ON durable_runs
    REFERENCING NEW TABLE AS created FOR EACH STATEMENT
    EXECUTE FUNCTION durable_notify_created();
