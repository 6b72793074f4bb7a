-- Schema version 1 of the durable store (PostgreSQL).
-- Every object is created in the store's schema: the connection's search_path is set to it
-- (the URL's ?schema= option, default public), so no name here is schema-qualified.
CREATE TABLE durable_meta (
    key   text PRIMARY KEY,
    value text NOT NULL
);

-- Fencing tokens: every claim takes the next value, so epochs are globally monotonic and
-- distinct across all runs and workers.
CREATE SEQUENCE durable_epochs AS bigint;

CREATE TABLE durable_runs (
    id               text PRIMARY KEY,
    workflow         text NOT NULL,
    args             text NOT NULL,
    concurrency_key  text,
    state            text NOT NULL
                     CHECK (state IN ('queued', 'running', 'completed', 'failed', 'cancelled')),
    epoch            bigint NOT NULL DEFAULT 0,
    attempt          integer NOT NULL DEFAULT 0,
    run_at           double precision NOT NULL,
    created_at       double precision NOT NULL,
    updated_at       double precision NOT NULL,
    worker           text,
    lease_expires_at double precision,
    heartbeat_at     double precision,
    heartbeat_detail text,
    cancel_requested boolean NOT NULL DEFAULT false,
    result           text,
    error            text,
    timeout          double precision
);

-- At most one running run per concurrency key, enforced by the database itself.
CREATE UNIQUE INDEX durable_runs_one_running_per_key
    ON durable_runs (concurrency_key) WHERE state = 'running' AND concurrency_key IS NOT NULL;
-- The queue, in claim order, and the first queued run of each key.
CREATE INDEX durable_runs_queue ON durable_runs (run_at, created_at, id) WHERE state = 'queued';
CREATE INDEX durable_runs_queued_by_key
    ON durable_runs (concurrency_key, run_at, created_at, id)
    WHERE state = 'queued' AND concurrency_key IS NOT NULL;
-- Leases, for the recovery sweep.
CREATE INDEX durable_runs_leases ON durable_runs (lease_expires_at) WHERE state = 'running';
CREATE INDEX durable_runs_by_key ON durable_runs (workflow, concurrency_key, created_at);
CREATE INDEX durable_runs_by_created ON durable_runs (created_at);

CREATE TABLE durable_journal (
    seq      bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    run_id   text NOT NULL,
    epoch    bigint NOT NULL,
    kind     text NOT NULL,
    step     integer,
    step_key text,
    name     text,
    attempt  integer,
    at       double precision NOT NULL,
    data     text
);
CREATE INDEX durable_journal_by_run ON durable_journal (run_id, seq);

-- The journal is append-only: nothing may change, delete or truncate an entry.
CREATE FUNCTION durable_journal_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'the durable journal is append-only';
END
$$;
CREATE TRIGGER durable_journal_no_update BEFORE UPDATE ON durable_journal
    FOR EACH ROW EXECUTE FUNCTION durable_journal_append_only();
CREATE TRIGGER durable_journal_no_delete BEFORE DELETE ON durable_journal
    FOR EACH ROW EXECUTE FUNCTION durable_journal_append_only();
CREATE TRIGGER durable_journal_no_truncate BEFORE TRUNCATE ON durable_journal
    FOR EACH STATEMENT EXECUTE FUNCTION durable_journal_append_only();

CREATE TABLE durable_records (
    namespace  text NOT NULL,
    key        text NOT NULL,
    value      text NOT NULL,
    epoch      bigint NOT NULL,
    updated_at double precision NOT NULL,
    PRIMARY KEY (namespace, key)
);

-- Wake idle workers (LISTEN durable_work) when work appears: a run is queued (created,
-- requeued, released, recovered), a cancel is requested, or a running run with a
-- concurrency key ends (the next run of that key becomes claimable). The payload is the
-- schema, so stores in other schemas of the same database ignore it. NOTIFY is sent at
-- commit and identical notifications of one transaction are folded into one.
CREATE FUNCTION durable_notify_work() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('durable_work', TG_TABLE_SCHEMA);
    RETURN NULL;
END
$$;
CREATE TRIGGER durable_runs_notify_insert AFTER INSERT ON durable_runs
    FOR EACH ROW WHEN (NEW.state = 'queued')
    EXECUTE FUNCTION durable_notify_work();
CREATE TRIGGER durable_runs_notify_update AFTER UPDATE ON durable_runs
    FOR EACH ROW WHEN (
        (NEW.state = 'queued' AND OLD.state <> 'queued')
        OR (NEW.cancel_requested AND NOT OLD.cancel_requested)
        OR (OLD.state = 'running' AND NEW.state <> 'running'
            AND OLD.concurrency_key IS NOT NULL))
    EXECUTE FUNCTION durable_notify_work();
