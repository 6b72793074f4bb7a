-- Schema version 13 (SQLite): a run may carry how long after it is due its first attempt
-- may still begin (docs/design.md, "A run that starts too late"). NULL: no limit of its
-- own. The claim reads it with the row (no statement changes); an attempt claimed later
-- than due + start_within fails its run without running any workflow code.
ALTER TABLE durable_runs ADD COLUMN start_within REAL;
