-- Schema version 5 (PostgreSQL): retention (docs/design.md, "Retention"). `durable prune`
-- deletes finished runs and their journals in small batches; each leaves a tombstone here,
-- so `show` and the console say "pruned on ..." instead of "no such run".
CREATE TABLE durable_pruned_runs (
    id              text PRIMARY KEY,
    workflow        text NOT NULL,
    concurrency_key text,
    state           text NOT NULL CHECK (state IN ('completed', 'failed', 'cancelled')),
    ended_at        double precision NOT NULL,
    pruned_at       double precision NOT NULL
);
-- the finished runs of a state by their end (a finished run's updated_at), oldest first
CREATE INDEX durable_runs_by_end ON durable_runs (state, updated_at, id COLLATE "C");

-- The journal stays append-only: no entry is ever changed or truncated, and an entry may be
-- deleted only when its run is finished and is being pruned (a tombstone of exactly this
-- ending exists: same id, the run's end; the pruning transaction wrote it and holds the run's
-- row lock). Every other DELETE is refused, as before.
CREATE FUNCTION durable_journal_prune_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM durable_pruned_runs AS p JOIN durable_runs AS r ON r.id = p.id
               WHERE p.id = OLD.run_id AND p.ended_at = r.updated_at
                 AND r.state IN ('completed', 'failed', 'cancelled')) THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION 'the durable journal is append-only: only the entries of a finished run '
                    'being pruned may be deleted';
END
$$;
DROP TRIGGER durable_journal_no_delete ON durable_journal;
CREATE TRIGGER durable_journal_no_delete BEFORE DELETE ON durable_journal
    FOR EACH ROW EXECUTE FUNCTION durable_journal_prune_only();
