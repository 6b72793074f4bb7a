-- Schema version 12 (PostgreSQL): each schema notifies on channels of its own,
-- 'durable_work:<schema>' and 'durable_done:<schema>' (docs/postgres.md, *LISTEN/NOTIFY*),
-- so a listener hears its own schema's changes only. Before, every schema of a server sent
-- on the shared 'durable_work' and 'durable_done', and every listener read (and dropped)
-- the traffic of all the others. A channel name holds 63 bytes: a schema whose channel
-- name would be longer is named by the md5 of its name instead ('durable_work:<32 hex
-- digits>'), as PostgresStore computes it (channel_name; its schema names are ASCII). The
-- payloads are as in version 11 (they still begin with the schema). Only pg_catalog's
-- functions are called here: the trigger runs on the writer's search_path, which need not
-- name this schema. A worker of an older version still running against this schema hears
-- nothing: it finds work at its poll and cancels at its renewal, and its waits at their poll.
CREATE OR REPLACE FUNCTION durable_notify_work() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    channel text := 'durable_work:' || TG_TABLE_SCHEMA;
BEGIN
    IF octet_length(channel) > 63 THEN
        channel := 'durable_work:' || md5(TG_TABLE_SCHEMA);
    END IF;
    IF TG_OP = 'UPDATE' THEN
        IF NEW.cancel_requested AND NOT OLD.cancel_requested THEN
            PERFORM pg_notify(channel, TG_TABLE_SCHEMA);
            RETURN NULL;
        END IF;
    END IF;
    PERFORM pg_notify(channel, TG_TABLE_SCHEMA || ' ' || txid_current());
    RETURN NULL;
END
$$;
CREATE OR REPLACE FUNCTION durable_notify_created() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    channel text := 'durable_work:' || TG_TABLE_SCHEMA;
    queued bigint;
    carried text;
BEGIN
    SELECT count(*) INTO queued FROM created WHERE state = 'queued';
    IF queued = 0 THEN
        RETURN NULL;
    END IF;
    IF octet_length(channel) > 63 THEN
        channel := 'durable_work:' || md5(TG_TABLE_SCHEMA);
    END IF;
    IF queued = 1 THEN
        SELECT TG_TABLE_SCHEMA || ' ' || txid_current() || ' ' || row_to_json(c)::text
          INTO carried FROM created AS c WHERE c.state = 'queued';
        IF octet_length(carried) < 8000 THEN
            PERFORM pg_notify(channel, carried);
            RETURN NULL;
        END IF;
    END IF;
    PERFORM pg_notify(channel, TG_TABLE_SCHEMA || ' ' || txid_current());
    RETURN NULL;
END
$$;
