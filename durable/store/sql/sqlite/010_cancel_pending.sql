-- Schema version 10 (SQLite): the running runs an operator cancel is pending on
-- (docs/design.md, "Nothing waits for a poll"). A worker looks for them
-- after every change signal, and a busy worker's own commits are change signals too: it
-- read the cancel flags of every run it held (1,000 ids: 0.5-0.9 ms, up to 50 times a
-- second, its cost growing with the runs held). Partial: only a running run with a cancel
-- pending has an entry, and it leaves the index when the run ends, so the look reads the
-- cancels in flight whatever the worker holds, and a state change of any other run writes
-- nothing to it.
CREATE INDEX durable_runs_cancel_pending ON durable_runs (id)
    WHERE cancel_requested AND state = 'running';
