-- Schema version 14 (SQLite): workflows an operator paused (docs/design.md, "Pausing a
-- workflow"). While a workflow has a row here no claim takes a run of it (claimable_where);
-- its queued runs keep their place and their intent, and its running attempts go on. One
-- row per paused workflow; a resume deletes it (any commit wakes the workers: data_version).
CREATE TABLE durable_paused (
    workflow   TEXT PRIMARY KEY,
    paused_at  REAL NOT NULL,
    origin     TEXT            -- who paused it (JSON), as an operator action's origin
) WITHOUT ROWID;
