-- Schema version 8 (SQLite): nothing changes here. On PostgreSQL, version 8 names the
-- transaction in each durable_work NOTIFY; SQLite's change signal is data_version, which
-- names nothing. The number is kept so both stores share one schema version.
SELECT 1;
