-- Schema version 1 of the durable store (SQLite).
CREATE TABLE durable_meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);

CREATE TABLE durable_runs (
    id               TEXT PRIMARY KEY,
    workflow         TEXT NOT NULL,
    args             TEXT NOT NULL,
    concurrency_key  TEXT,
    state            TEXT NOT NULL
                     CHECK (state IN ('queued', 'running', 'completed', 'failed', 'cancelled')),
    epoch            INTEGER NOT NULL DEFAULT 0,
    attempt          INTEGER NOT NULL DEFAULT 0,
    run_at           REAL NOT NULL,
    created_at       REAL NOT NULL,
    updated_at       REAL NOT NULL,
    worker           TEXT,
    lease_expires_at REAL,
    heartbeat_at     REAL,
    heartbeat_detail TEXT,
    cancel_requested INTEGER NOT NULL DEFAULT 0,
    result           TEXT,
    error            TEXT,
    timeout          REAL
);

-- At most one running run per concurrency key, enforced by the database itself.
CREATE UNIQUE INDEX durable_runs_one_running_per_key
    ON durable_runs (concurrency_key) WHERE state = 'running' AND concurrency_key IS NOT NULL;
-- the claim's order; and the epoch, so max(epoch) + 1 is an index lookup, not a scan
CREATE INDEX durable_runs_queue ON durable_runs (state, run_at, created_at, id);
CREATE INDEX durable_runs_epoch ON durable_runs (epoch);
CREATE INDEX durable_runs_by_key ON durable_runs (workflow, concurrency_key, created_at);
CREATE INDEX durable_runs_by_created ON durable_runs (created_at);

CREATE TABLE durable_journal (
    seq      INTEGER PRIMARY KEY,
    run_id   TEXT NOT NULL,
    epoch    INTEGER NOT NULL,
    kind     TEXT NOT NULL,
    step     INTEGER,
    step_key TEXT,
    name     TEXT,
    attempt  INTEGER,
    at       REAL NOT NULL,
    data     TEXT
);
CREATE INDEX durable_journal_by_run ON durable_journal (run_id, seq);

-- The journal is append-only: nothing may change or delete an entry.
CREATE TRIGGER durable_journal_no_update BEFORE UPDATE ON durable_journal
BEGIN SELECT RAISE(ABORT, 'the durable journal is append-only'); END;
CREATE TRIGGER durable_journal_no_delete BEFORE DELETE ON durable_journal
BEGIN SELECT RAISE(ABORT, 'the durable journal is append-only'); END;

CREATE TABLE durable_records (
    namespace  TEXT NOT NULL,
    key        TEXT NOT NULL,
    value      TEXT NOT NULL,
    epoch      INTEGER NOT NULL,
    updated_at REAL NOT NULL,
    PRIMARY KEY (namespace, key)
);
