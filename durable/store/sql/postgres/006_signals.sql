-- Schema version 6 (PostgreSQL): durable waiting (docs/design.md, "Durable waiting").
-- A run released to wait for a signal is queued with waiting_for = the signal's name and
-- run_at = its timeout (or never); a signal of that name makes it due at once, in the
-- statement that records the signal. signals counts the run's signals: a release compares
-- it with the count its attempt saw (in the row it updates, so a concurrent signal is
-- re-read after its lock), and a signal sent meanwhile is never slept through.
ALTER TABLE durable_runs ADD COLUMN waiting_for text;
ALTER TABLE durable_runs ADD COLUMN signals integer NOT NULL DEFAULT 0;

-- Signals sent to runs, kept until consumed (and after: the journal says which wait_for
-- received which seq). signal_id makes a send idempotent (NULL: no id, never a duplicate).
CREATE TABLE durable_signals (
    seq        bigserial PRIMARY KEY,
    run_id     text NOT NULL,
    name       text NOT NULL,
    signal_id  text,
    payload    text,
    created_at double precision NOT NULL,
    origin     text
);
CREATE INDEX durable_signals_by_run ON durable_signals (run_id, name, seq);
CREATE UNIQUE INDEX durable_signals_once ON durable_signals (run_id, signal_id);

-- A queued run made due earlier (a signal for a waiting run) is work too: wake idle workers.
DROP TRIGGER durable_runs_notify_update ON durable_runs;
CREATE TRIGGER durable_runs_notify_update AFTER UPDATE ON durable_runs
    FOR EACH ROW WHEN (
        (NEW.state = 'queued' AND OLD.state <> 'queued')
        OR (NEW.state = 'queued' AND NEW.run_at < OLD.run_at)
        OR (NEW.cancel_requested AND NOT OLD.cancel_requested)
        OR (OLD.state = 'running' AND NEW.state <> 'running'
            AND OLD.concurrency_key IS NOT NULL))
    EXECUTE FUNCTION durable_notify_work();
