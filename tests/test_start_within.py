"""A run's ``start_within`` (a start's, else its workflow's): a first attempt claimed more
than that many seconds after the run was due runs none of the workflow's code and fails the
run, so a deletion queued while no worker ran does not happen hours later. Counted from the
run's due time (a delayed start's too), on the store's clock; later attempts (a recovery, a
replay) are not checked. On SQLite and PostgreSQL, asyncio and trio; the store's time is a
FakeClock."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import durable
from durable import RunState
from durable._clock import FakeClock
from durable._report import render_timeline, utc
from durable._types import EntryKind

from .helpers import poll, running_worker
from .httpserver import LoopbackServer, Rule, loopback_server
from .pg import pg_url, postgres_server
from .test_cli import cli
from .test_guard_history_waits import finished, waiting_in
from .waiting import client, clock, store_url

__all__ = ["client", "clock", "pg_url", "postgres_server", "store_url"]

pytestmark = pytest.mark.anyio

HOUR = 3600.0


def flows(registry: durable.Registry, server: LoopbackServer, ran: list[str],
          start_within: float | None = None) -> None:
    @durable.activity("drop", registry=registry)
    async def drop(ctx: durable.ActivityContext, db: str) -> str:
        r = await ctx.http.delete(f"{server.url}/databases/{db}")
        return str(r.json())

    @durable.workflow("drop.db", registry=registry, start_within=start_within)
    async def drop_db(ctx: durable.WorkflowContext, db: str) -> str:
        ran.append(db)
        return await drop(ctx, db)


def shown(run: durable.Run, journal: list[durable.JournalEntry]) -> str:
    return " ".join(render_timeline(run, journal, width=400).split())


@pytest.mark.parametrize("concurrency", [16, 1], ids=["claim", "read_claim"])
async def test_a_run_claimed_too_late_runs_nothing_and_fails_and_a_replay_runs_it(
        client: durable.Client, registry: durable.Registry, clock: FakeClock,
        concurrency: int) -> None:
    """Started with start_within=60 while no worker ran; the first worker comes 61 s after:
    its attempt runs no workflow code (the service sees nothing) and fails the run, saying
    when it was due and when it was claimed. The timeline shows the limit. A replay (the
    operator asking for it again) runs it. With one free slot the worker reads the run and
    its claim would ride on the first write (durable/_claims.py): the claim commits first,
    since its time is what is compared."""
    ran: list[str] = []
    async with loopback_server() as server:
        server.on("/databases/db1", Rule(body={"deleted": True}))
        flows(registry, server, ran)
        await client.start("drop.db", "db1", id="late", start_within=60)
        queued = await client.store.get_run("late")
        assert queued is not None and queued.start_within == 60
        clock.advance(61)
        async with running_worker(client, registry, concurrency=concurrency):
            failed = await poll(lambda: finished(client, "late"), timeout=15)
            assert failed.state is RunState.FAILED and failed.attempt == 1, failed
            assert failed.error is not None
            assert "did not start within 60 s of being due" in failed.error, failed.error
            assert "claimed 1.0 min after" in failed.error
            assert "ran none of its code; replay it" in failed.error
            assert ran == [] and server.seen("/databases/db1") == []
            journal = await client.store.journal("late")
            assert [e.kind for e in journal] == [
                EntryKind.RUN_CREATED, EntryKind.RUN_CLAIMED, EntryKind.RUN_FAILED]
            assert journal[0].data["start_within"] == 60
            assert "run created, to start within 1.0 min" in shown(failed, journal)
            await client.replay("late")
            done = await client.wait("late", timeout=15)
    assert done.state is RunState.COMPLETED and done.attempt == 2, done.error
    assert ran == ["db1"]


async def test_a_run_claimed_in_time_runs(
        client: durable.Client, registry: durable.Registry, clock: FakeClock) -> None:
    """59 s after it was due, within its 60: the run runs as any other."""
    ran: list[str] = []
    async with loopback_server() as server:
        server.on("/databases/db2", Rule(body={"deleted": True}))
        flows(registry, server, ran)
        await client.start("drop.db", "db2", id="on-time", start_within=60)
        clock.advance(59)
        async with running_worker(client, registry):
            done = await client.wait("on-time", timeout=15)
    assert done.state is RunState.COMPLETED and done.attempt == 1, done.error
    assert ran == ["db2"]


async def test_a_delayed_run_counts_from_when_it_is_due(
        client: durable.Client, registry: durable.Registry, clock: FakeClock) -> None:
    """Due in an hour, to start within 60 s of that: claimed 30 s after it is due (an hour
    and a half-minute after its creation), it runs; counted from its creation it would
    fail."""
    ran: list[str] = []
    async with loopback_server() as server:
        server.on("/databases/db3", Rule(body={"deleted": True}))
        flows(registry, server, ran)
        await client.start("drop.db", "db3", id="delayed", delay=HOUR, start_within=60)
        clock.advance(HOUR + 30)
        async with running_worker(client, registry):
            done = await client.wait("delayed", timeout=15)
    assert done.state is RunState.COMPLETED, done.error
    assert ran == ["db3"]


async def test_a_run_due_before_it_was_created_counts_from_its_creation(
        client: durable.Client, registry: durable.Registry, clock: FakeClock) -> None:
    """``run_at`` an hour in the past (as a schedule's caught-up fire has): the run could
    not start before it existed, so its 60 s count from its creation; claimed 30 s after
    that, it runs."""
    ran: list[str] = []
    async with loopback_server() as server:
        server.on("/databases/db8", Rule(body={"deleted": True}))
        flows(registry, server, ran)
        run = await client.start("drop.db", "db8", id="past", run_at=clock.now() - HOUR,
                                 start_within=60)
        assert run.start_by == run.created_at + 60
        clock.advance(30)
        async with running_worker(client, registry):
            done = await client.wait("past", timeout=15)
    assert done.state is RunState.COMPLETED, done.error
    assert ran == ["db8"]


async def test_the_workflows_start_within_applies_unless_the_start_gives_its_own(
        client: durable.Client, registry: durable.Registry, clock: FakeClock) -> None:
    """``@durable.workflow(start_within=60)``: a run started by name without a limit of its
    own fails when claimed 2 min late; one started with ``start_within=HOUR`` runs."""
    ran: list[str] = []
    async with loopback_server() as server:
        server.on("/databases/db4", Rule(body={"deleted": True}))
        server.on("/databases/db5", Rule(body={"deleted": True}))
        flows(registry, server, ran, start_within=60)
        await client.start("drop.db", "db4", id="by-default")
        await client.start("drop.db", "db5", id="own-limit", start_within=HOUR)
        clock.advance(120)
        async with running_worker(client, registry):
            late = await poll(lambda: finished(client, "by-default"), timeout=15)
            done = await client.wait("own-limit", timeout=15)
    assert late.state is RunState.FAILED and late.start_within is None
    assert late.error is not None and "did not start within 60 s" in late.error
    assert done.state is RunState.COMPLETED, done.error
    assert ran == ["db5"]
    assert server.seen("/databases/db4") == []


async def test_a_recovered_attempt_is_not_held_to_start_within(
        client: durable.Client, registry: durable.Registry, clock: FakeClock) -> None:
    """The first attempt was claimed in time and its worker died in the step; the recovery
    comes long after the limit: the run began in time, so the next attempt goes on (the
    limit is about a start, not a resumption)."""
    from .helpers import died_in_step_one, given_away

    async with loopback_server() as server:
        server.on("/databases/db6", Rule(body={"deleted": True}))

        @durable.activity("drop.six", registry=registry)
        async def drop_six(ctx: durable.ActivityContext) -> str:
            r = await ctx.http.delete(f"{server.url}/databases/db6")
            return str(r.json())

        @durable.workflow("drop.db6", registry=registry, start_within=60)
        async def drop_db6(ctx: durable.WorkflowContext) -> str:
            return await drop_six(ctx)

        dead = await died_in_step_one(client, "drop.db6", "resumed", "drop.six")
        clock.advance(HOUR)
        await poll(lambda: given_away(client.store, "resumed", dead.epoch), timeout=10)
        async with running_worker(client, registry):
            done = await client.wait("resumed", timeout=15)
    assert done.state is RunState.COMPLETED and done.attempt == 2, done.error


async def test_a_run_released_to_sleep_and_claimed_late_goes_on(
        client: durable.Client, registry: durable.Registry, clock: FakeClock) -> None:
    """A run that started in time sleeps 2 min (released, due then) and no worker runs until
    an hour after it is due again: its next attempt is not held to ``start_within`` (that
    bounds the start, not a resumption) and completes."""
    ran: list[str] = []

    @durable.workflow("napper", registry=registry, start_within=60)
    async def napper(ctx: durable.WorkflowContext) -> str:
        ran.append("started")
        await ctx.sleep(120)
        ran.append("woke")
        return "woke"

    async with running_worker(client, registry):
        await client.start("napper", id="nap")
        released = await waiting_in(client, "nap", 1)
    clock.advance(120 + HOUR)
    async with running_worker(client, registry):
        done = await client.wait("nap", timeout=15)
    assert released.run_at > released.created_at + 100
    assert done.state is RunState.COMPLETED and done.attempt == 2, done.error
    assert ran == ["started", "started", "woke"]


@pytest.mark.parametrize("bad", [0, -1, float("nan"), float("inf"), True, "60"])
async def test_a_bad_start_within_is_refused_and_nothing_is_written(
        client: durable.Client, registry: durable.Registry, bad: object) -> None:
    with pytest.raises(durable.ConfigError, match="start_within must be positive seconds"):
        await client.start("drop.db", "db7", id="bad", start_within=bad)
    assert await client.store.get_run("bad") is None
    with pytest.raises(durable.ConfigError, match="start_within must be positive seconds"):
        durable.workflow("bad.limit", registry=registry, start_within=bad)(_nothing)


async def _nothing(ctx: durable.WorkflowContext) -> None:
    return None


def test_the_cli_starts_a_run_with_a_limit_and_show_says_when_it_must_start(
        tmp_path: Path) -> None:
    """``durable start --start-within 600``: the run keeps it, and ``show`` says by when it
    must be claimed and what happens later; ``--json`` carries it."""
    db = f"sqlite:///{tmp_path / 'd.db'}"
    started = cli("start", "cli.hello", '"a"', "--import", "tests.cliflows", "--id", "w1",
                  "--start-within", "600", "--json", db=db)
    assert started.returncode == 0, started.stderr
    run = json.loads(started.stdout)
    assert run["start_within"] == 600
    shown = cli("show", "w1", db=db)
    assert shown.returncode == 0, shown.stderr
    [line] = [ln for ln in shown.stdout.splitlines() if ln.startswith("start by")]
    assert utc(run["run_at"] + 600) in line
    assert line.endswith("(else it fails without running)"), line
    assert "run created, to start within 10.0 min" in shown.stdout
