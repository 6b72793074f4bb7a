-- Schema version 6 (SQLite): durable waiting (docs/design.md, "Durable waiting").
-- A run released to wait for a signal is queued with waiting_for = the signal's name and
-- run_at = its timeout (or never); a signal of that name makes it due at once, in the
-- statement that records the signal. signals counts the run's signals: a release compares
-- it with the count its attempt saw, so a signal sent meanwhile is never slept through.
ALTER TABLE durable_runs ADD COLUMN waiting_for TEXT;
ALTER TABLE durable_runs ADD COLUMN signals INTEGER NOT NULL DEFAULT 0;

-- Signals sent to runs, kept until consumed (and after: the journal says which wait_for
-- received which seq). signal_id makes a send idempotent (NULL: no id, never a duplicate).
CREATE TABLE durable_signals (
    seq        INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id     TEXT NOT NULL,
    name       TEXT NOT NULL,
    signal_id  TEXT,
    payload    TEXT,
    created_at REAL NOT NULL,
    origin     TEXT
);
CREATE INDEX durable_signals_by_run ON durable_signals (run_id, name, seq);
CREATE UNIQUE INDEX durable_signals_once ON durable_signals (run_id, signal_id);
