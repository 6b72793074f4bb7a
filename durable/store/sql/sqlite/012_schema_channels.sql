-- Schema version 12 (SQLite): nothing changes here. On PostgreSQL, version 12 gives each
-- schema NOTIFY channels of its own; SQLite's change signal is data_version, one per
-- database file. The number is kept so both stores share one schema version.
SELECT 1;
