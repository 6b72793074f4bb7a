-- Schema version 13 (PostgreSQL): a run may carry how long after it is due its first
-- attempt may still begin (docs/design.md, "A run that starts too late"). NULL: no limit of
-- its own. A nullable column without a default: the ALTER rewrites nothing. The claim
-- reads it with the row, and a start's NOTIFY carries it (row_to_json of the row).
ALTER TABLE durable_runs ADD COLUMN start_within double precision;
