-- Schema version 11 (SQLite): nothing changes here. On PostgreSQL, version 11 carries a
-- created run's row in its durable_work NOTIFY; SQLite's change signal is data_version,
-- which carries nothing. The number is kept so both stores share one schema version.
SELECT 1;
