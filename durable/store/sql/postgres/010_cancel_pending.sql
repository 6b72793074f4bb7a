-- Schema version 10 (PostgreSQL): the running runs an operator cancel is pending on
-- (docs/design.md, "Nothing waits for a poll"). A worker looked up the
-- cancel flags of every run it held after each change signal (`id = ANY(...)`, a lookup
-- per held run); it now reads this index, which holds only the cancels in flight (a
-- running run with a cancel pending; it leaves the index when the run ends), whatever the
-- worker holds. The statement's own WHERE is the predicate, so a generic plan reads it.
CREATE INDEX durable_runs_cancel_pending ON durable_runs (id)
    WHERE cancel_requested AND state = 'running';
