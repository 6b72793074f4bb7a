-- Schema version 14 (PostgreSQL): workflows an operator paused (docs/design.md, "Pausing a
-- workflow"). While a workflow has a row here no claim takes a run of it (claimable_where);
-- its queued runs keep their place and their intent, and its running attempts go on. One
-- row per paused workflow. A resume deletes the row, and the statement notifies the
-- schema's work channel (durable_notify_work, with no row: a plain "look"), so idle
-- workers claim the runs that were held at once, not at their poll.
CREATE TABLE durable_paused (
    workflow   text PRIMARY KEY,
    paused_at  double precision NOT NULL,
    origin     text            -- who paused it (JSON), as an operator action's origin
);
CREATE TRIGGER durable_paused_notify_resume AFTER DELETE ON durable_paused
    FOR EACH STATEMENT EXECUTE FUNCTION durable_notify_work();
