"""Leases judged by the PostgreSQL server's clock (issue 8, item 5).

With no injected clock, the PostgreSQL store's statements read the time in SQL
(``statement_timestamp()``), so a step of a worker's or a reader's wall clock changes nothing:
not the lease a claim or renewal writes, not the fence of a write, not a recovery's verdict,
not when a started run is due.

The wall clock is stepped by patching this process's ``time.time`` (stepping the machine's
clock needs CAP_SYS_TIME and would step every process on this shared machine, the database
server included); the server's clock is untouched, as it is when one worker's host steps.
They run on asyncio and on trio (where the store runs on a loop thread of its own).
"""

from __future__ import annotations

import time

import anyio
import pytest

import durable
from durable import RunState
from durable._types import EntryKind, Fence, JournalWrite

from .helpers import poll, running_worker
from .pg import connect_sync, pg_url, postgres_server

__all__ = ["pg_url", "postgres_server"]  # fixtures, used by name

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.parametrize(
        "anyio_backend",
        ["asyncio", "trio"],
    ),
]

HOUR = 3600.0


def step_wall_clock(monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + seconds)


def server_now(url: str) -> float:
    with connect_sync(url) as conn:
        return float(conn.execute("SELECT extract(epoch from clock_timestamp())").fetchone()[0])


async def test_a_forward_wall_step_does_not_let_a_reader_recover_a_live_run(
        pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    registry = durable.Registry()

    @durable.workflow("noop", registry=registry)
    async def noop(ctx: durable.WorkflowContext) -> None:
        return None

    async with durable.Client.connect(pg_url, registry=registry) as client:
        await client.start("noop", id="r1")
        [run] = await client.store.claim("worker-a", 30.0, 1)
        step_wall_clock(monkeypatch, HOUR)
        assert await client.store.recover_stale() == []
        seen = await client.get("r1")  # the read path's recovery
        assert seen.state is RunState.RUNNING and seen.epoch == run.epoch
        assert await client.store.append(
            Fence("r1", run.epoch), [JournalWrite(EntryKind.STEP_STARTED, step=1, name="x")])
        # the renewal writes the server's time plus the lease, not this host's
        [renewal] = await client.store.renew("worker-a", [Fence("r1", run.epoch)], 30.0)
        assert renewal.epoch == run.epoch
        renewed = await client.store.get_run("r1")
        assert renewed is not None and renewed.lease_expires_at is not None
        assert abs(renewed.lease_expires_at - (server_now(pg_url) + 30.0)) < 5.0


async def test_store_now_is_the_servers_clock(
        pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    async with durable.Client.connect(pg_url) as client:
        step_wall_clock(monkeypatch, -HOUR)
        before = server_now(pg_url)
        now = await client.store.now()
        after = server_now(pg_url)
        assert before <= now <= after
        # an injected clock still rules (tests): the store then passes its time
    fake = durable.FakeClock(1_800_000_000.0)
    async with durable.Client.connect(pg_url, clock=fake) as client:
        assert await client.store.now() == 1_800_000_000.0


async def test_a_run_started_by_a_host_whose_clock_is_ahead_is_due_at_once(
        pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    registry = durable.Registry()

    @durable.workflow("noop", registry=registry)
    async def noop(ctx: durable.WorkflowContext) -> None:
        return None

    step_wall_clock(monkeypatch, HOUR)
    async with durable.Client.connect(pg_url, registry=registry) as client:
        started = await client.start("noop", id="r1")
        assert abs(started.run_at - server_now(pg_url)) < 5.0
        assert [r.id for r in await client.store.claim("w", 30.0, 1)] == ["r1"]
        delayed = await client.start("noop", id="r2", delay=60.0)
        assert abs(delayed.run_at - (server_now(pg_url) + 60.0)) < 5.0


async def test_a_run_due_at_once_takes_the_servers_time_in_its_insert(
        pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """start() without a delay asks the server nothing before the insert (one round trip,
    not two): the INSERT takes the server's time for run_at and created_at, and the
    run_created entry journals that run_at."""
    registry = durable.Registry()

    @durable.workflow("noop", registry=registry)
    async def noop(ctx: durable.WorkflowContext) -> None:
        return None

    async with durable.Client.connect(pg_url, registry=registry) as client:
        asked: list[float] = []
        real_now = client.store.now

        async def now() -> float:
            asked.append(await real_now())
            return asked[-1]

        monkeypatch.setattr(client.store, "now", now)
        step_wall_clock(monkeypatch, HOUR)
        before = server_now(pg_url)
        started = await client.start("noop", id="r1")
        after = server_now(pg_url)
        assert asked == []
        assert before <= started.run_at == started.created_at <= after
        created = (await client.store.journal("r1"))[0]
        assert created.kind is EntryKind.RUN_CREATED
        assert created.data == {"run_at": started.run_at, "workflow": "noop", "args": [],
                                "key": None}
        delayed = await client.start("noop", id="r2", delay=60.0)
        assert len(asked) == 1 and delayed.run_at == asked[0] + 60.0
        assert (await client.store.journal("r2"))[0].data["run_at"] == delayed.run_at


async def test_a_worker_keeps_its_lease_while_the_wall_clock_jumps_an_hour(
        pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """End to end: the worker's renewals, the attempt's own check (assert_still_mine), the
    worker's sweep and a reader's recovery all judge on the server's clock."""
    registry = durable.Registry()
    stepped = anyio.Event()
    waiting = anyio.Event()

    @durable.activity(registry=registry, retry=durable.RetryPolicy(max_tries=1))
    async def careful(ctx: durable.ActivityContext) -> str:
        waiting.set()
        await stepped.wait()
        await ctx.assert_still_mine()
        return "done"

    @durable.workflow("careful", registry=registry)
    async def wf(ctx: durable.WorkflowContext) -> str:
        return await careful(ctx)

    async with durable.Client.connect(pg_url, registry=registry) as client:
        async with running_worker(client, registry, lease=5.0, sweep_interval=0.05):
            await client.start("careful", id="c1")
            await poll(waiting.is_set)
            held = await client.get("c1")
            step_wall_clock(monkeypatch, HOUR)
            assert (await client.get("c1")).epoch == held.epoch  # the read path's recovery
            stepped.set()
            done = await client.wait("c1")
        assert done.state is RunState.COMPLETED, done.error
        assert done.result == "done"
        journal = await client.journal("c1")
        assert [e.kind for e in journal].count(EntryKind.RUN_CLAIMED) == 1


async def test_the_servers_time_keeps_the_queue_and_lease_indexes_usable(
        pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The server's time must be one the planner can use as an index bound: with a
    volatile function (``clock_timestamp()``) a claim scanned every delayed queued run and
    the sweep every running one, on each poll. The plans are those of the statements the
    store sends, with the parameters it sends (recorded on their way to the driver)."""
    import json

    import psycopg

    from durable.store._postgres import Q

    sent: dict[str, tuple[str, object]] = {}
    execute = psycopg.AsyncCursor.execute  # (AsyncConnection.execute calls it too)

    async def recording(self: psycopg.AsyncCursor[object], query: str,
                        params: object = None, **kwargs: object) -> object:
        for name in ("claim", "recover_stale"):
            if query == Q[name]:
                sent[name] = (query, params)
        return await execute(self, query, params, **kwargs)  # type: ignore[arg-type]

    with connect_sync(pg_url) as conn:
        async with durable.Client.connect(pg_url) as client:  # the schema
            conn.execute(
                "INSERT INTO durable_runs (id, workflow, args, state, run_at, created_at, "
                "updated_at, worker, lease_expires_at) "
                "SELECT 'r' || g, 'wf', '[]', CASE WHEN g % 10 = 0 THEN 'running' "
                "WHEN g % 2 = 0 THEN 'queued' ELSE 'completed' END, "
                "extract(epoch from now()) + 3600 + g, g, g, 'w', "
                "CASE WHEN g % 10 = 0 THEN extract(epoch from now()) + 3600 + g END "
                "FROM generate_series(1, 20000) AS g")
            conn.execute("ANALYZE durable_runs")
            monkeypatch.setattr(psycopg.AsyncCursor, "execute", recording)
            assert await client.store.claim("w", 30.0, 10) == []
            assert await client.store.recover_stale() == []
            monkeypatch.undo()

        def plan(name: str) -> str:
            query, params = sent[name]
            row = conn.execute("EXPLAIN (FORMAT JSON) " + query, params).fetchone()
            return json.dumps(row[0])

        claim, sweep = plan("claim"), plan("recover_stale")
    assert "durable_runs_leases" in sweep and '"Index Cond": "(lease_expires_at <=' in sweep, sweep
    assert '"Index Cond": "(run_at <=' in claim, claim
