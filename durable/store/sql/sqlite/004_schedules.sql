-- Schema version 4 (SQLite): schedules (docs/design.md, "Schedules"). A schedule starts a run
-- of its workflow at each fire of its cron expression; fires at or before fired_through are
-- done with (started, or skipped by the catch-up policy). Every change of a schedule is a
-- compare-and-set on its version, so a fire seen by several workers starts one run.
CREATE TABLE durable_schedules (
    name            TEXT PRIMARY KEY,
    workflow        TEXT NOT NULL,
    args            TEXT NOT NULL,
    cron            TEXT NOT NULL,
    timezone        TEXT NOT NULL,
    concurrency_key TEXT,
    catchup         INTEGER NOT NULL DEFAULT 0,  -- 0: skip missed fires; N: catch up to N
    paused          INTEGER NOT NULL DEFAULT 0,
    fired_through   REAL NOT NULL,
    last_fire_at    REAL,
    last_run_id     TEXT,
    origin          TEXT NOT NULL,               -- 'code' or 'cli'
    version         INTEGER NOT NULL DEFAULT 1,
    created_at      REAL NOT NULL,
    updated_at      REAL NOT NULL
);
