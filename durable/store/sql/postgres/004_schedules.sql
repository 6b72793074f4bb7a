-- Schema version 4 (PostgreSQL): schedules (docs/design.md, "Schedules"). A schedule starts a
-- run of its workflow at each fire of its cron expression; fires at or before fired_through
-- are done with (started, or skipped by the catch-up policy). Every change of a schedule is
-- a compare-and-set on its version, so a fire seen by several workers starts one run.
CREATE TABLE durable_schedules (
    name            text PRIMARY KEY,
    workflow        text NOT NULL,
    args            text NOT NULL,
    cron            text NOT NULL,
    timezone        text NOT NULL,
    concurrency_key text,
    catchup         integer NOT NULL DEFAULT 0 CHECK (catchup >= 0),
    paused          boolean NOT NULL DEFAULT false,
    fired_through   double precision NOT NULL,
    last_fire_at    double precision,
    last_run_id     text,
    origin          text NOT NULL CHECK (origin IN ('code', 'cli')),
    version         bigint NOT NULL DEFAULT 1,
    created_at      double precision NOT NULL,
    updated_at      double precision NOT NULL
);
