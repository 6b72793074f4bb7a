-- Schema version 8 (PostgreSQL): a durable_work NOTIFY names the transaction that made the
-- work (docs/postgres.md, *LISTEN/NOTIFY*). The payload is '<schema> <txid>' for a run
-- queued, made due earlier or a keyed run ending: a worker whose last claim's snapshot
-- already saw that transaction (it claimed what there was) does not claim again for it.
-- A cancel requested keeps the bare '<schema>': the worker holding the run acts on it
-- whatever it claimed. Identical payloads of one transaction are still folded into one.
CREATE OR REPLACE FUNCTION durable_notify_work() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' THEN
        IF NEW.cancel_requested AND NOT OLD.cancel_requested THEN
            PERFORM pg_notify('durable_work', TG_TABLE_SCHEMA);
            RETURN NULL;
        END IF;
    END IF;
    PERFORM pg_notify('durable_work', TG_TABLE_SCHEMA || ' ' || txid_current());
    RETURN NULL;
END
$$;
