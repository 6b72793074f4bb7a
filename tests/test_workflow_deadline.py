"""A workflow's ``timeout`` (or a run's ``start(timeout=)``) counts from its first attempt's
claim, across attempts: a run recovered after a crash, released for a durable wait or
given back at a shutdown gets what is left of it, not the whole timeout again, and a wait
longer than what is left makes the run due when the time runs out, to fail then. A replay
counts it anew. Before, it was a deadline per attempt: a run that kept being resumed, or
slept, was never bounded by it. On SQLite and PostgreSQL, asyncio and trio; the store's
time is a FakeClock, the attempt's time left is real."""

from __future__ import annotations

import sys
from pathlib import Path

import anyio
import pytest

import durable
from durable import RunState
from durable._clock import FakeClock
from durable._report import CUT_SHORT, render_timeline, waiting_phrase
from durable._types import EntryKind
from durable.store._sqlite import SqliteStore

from .helpers import died_in_step_one, given_away, poll, running_worker
from .httpserver import LoopbackServer, Rule, loopback_server
from .pg import pg_url, postgres_server
from .test_guard_history_waits import finished, waiting_in
from .waiting import client, clock, store_url

__all__ = ["client", "clock", "pg_url", "postgres_server", "store_url"]

pytestmark = pytest.mark.anyio

HOUR = 3600.0
LEASE = 30.0  # died_in_step_one's


def flows(registry: durable.Registry, server: LoopbackServer, timeout: float) -> None:
    @durable.activity("slow", registry=registry)
    async def slow(ctx: durable.ActivityContext) -> str:
        r = await ctx.http.get(f"{server.url}/slow")
        return str(r.json())

    @durable.workflow("bounded", registry=registry, timeout=timeout)
    async def bounded(ctx: durable.WorkflowContext) -> str:
        return await slow(ctx)


async def test_a_timeout_that_ran_out_before_a_recovery_fails_the_run_and_a_replay_starts_it_anew(
        client: durable.Client, registry: durable.Registry, clock: FakeClock) -> None:
    """A worker died in step 1 of a run with a 60 s timeout; its lease lapses and the clock
    moves past the timeout: the next attempt runs nothing (the service sees no request), and
    the run fails, step 1 journaled in doubt. A replay has the whole timeout again: it
    completes."""
    async with loopback_server() as server:
        server.on("/slow", Rule(hang=True))
        flows(registry, server, timeout=60)
        dead = await died_in_step_one(client, "bounded", "b1", "slow")
        clock.advance(LEASE + 31)  # 61 s after the dead worker's claim
        await poll(lambda: given_away(client.store, "b1", dead.epoch), timeout=10)
        async with running_worker(client, registry):
            failed = await poll(lambda: finished(client, "b1"), timeout=15)
            assert failed.state is RunState.FAILED and failed.attempt == 2, failed
            assert failed.error is not None
            assert "workflow timed out after 60 s (counted from its first attempt" in failed.error
            assert "before attempt 2 began" in failed.error
            assert server.seen("/slow") == []
            journal = await client.store.journal("b1")
            doubt = [e for e in journal if e.kind is EntryKind.STEP_IN_DOUBT]
            assert [e.step for e in doubt] == [1], journal
            server.rules["/slow"] = [Rule(body={"deleted": True})]
            await client.replay("b1", in_doubt="rerun")
            done = await client.wait("b1", timeout=15)
    assert done.state is RunState.COMPLETED, done.error
    assert done.attempt == 3


async def test_a_recovered_attempt_gets_only_what_is_left_of_the_timeout(
        client: durable.Client, registry: durable.Registry, clock: FakeClock) -> None:
    """Timeout 40 s; a worker died in step 1 and the clock moved 39.5 s: the recovered
    attempt has half a second, and its request in flight is aborted when it runs out (with
    the whole timeout again the run would still be waiting on the service)."""
    async with loopback_server() as server:
        server.on("/slow", Rule(hang=True))
        flows(registry, server, timeout=40)
        dead = await died_in_step_one(client, "bounded", "b2", "slow")
        clock.advance(39.5)
        await poll(lambda: given_away(client.store, "b2", dead.epoch), timeout=10)
        async with running_worker(client, registry):
            done = await client.wait("b2", timeout=10)
            [seen] = server.seen("/slow")
            await server.wait_for(lambda: seen.disconnected_at is not None)
    assert done.state is RunState.FAILED and done.attempt == 2
    assert done.error is not None
    assert "workflow timed out after 40 s (counted from its first attempt" in done.error
    assert "before attempt" not in done.error  # it ran, and was cut off


@pytest.mark.parametrize("waits", ["sleep", "signal"])
async def test_a_durable_wait_longer_than_the_timeout_ends_when_the_timeout_does(
        client: durable.Client, registry: durable.Registry, clock: FakeClock,
        waits: str) -> None:
    """A run with a 60 s timeout sleeps an hour (or waits for a signal with no timeout of
    its own): it is released to be due in 60 s, not in an hour (or never), and then fails
    at once, running nothing more."""
    ran: list[str] = []

    @durable.workflow("napping", registry=registry, timeout=60)
    async def napping(ctx: durable.WorkflowContext) -> str:
        ran.append("started")
        if waits == "sleep":
            await ctx.sleep(HOUR)
        else:
            await ctx.wait_for("go")
        ran.append("woke")
        return "woke"

    async with running_worker(client, registry):
        await client.start("napping", id="nap")
        released = await waiting_in(client, "nap", 1)
        assert released.run_at == pytest.approx(clock.now() + 60, abs=5)
        journal = await client.store.journal("nap")
        [waiting] = [e for e in journal if e.kind is EntryKind.RUN_WAITING]
        assert waiting.data["cut_short"] is True
        assert waiting.data["reason"] == ("sleep" if waits == "sleep" else "signal")
        said = waiting_phrase(released, journal)
        assert said is not None and said.endswith(CUT_SHORT), said
        shown = " ".join(render_timeline(released, journal, width=400).split())
        assert "attempt ended to wait without a lease" in shown
        # said of the run's state, and of the release in its timeline
        assert shown.count(" ".join(CUT_SHORT.split())) == 2, shown
        clock.advance(61)
        done = await poll(lambda: finished(client, "nap"), timeout=15)
    assert done.state is RunState.FAILED and done.attempt == 2
    assert done.error is not None and "before attempt 2 began" in done.error
    assert ran == ["started"]


async def test_a_wait_shorter_than_the_timeout_is_not_moved(
        client: durable.Client, registry: durable.Registry, clock: FakeClock) -> None:
    """A sleep that ends within the timeout keeps its wake time, and the run completes after
    it with the time that is left."""
    @durable.workflow("short.nap", registry=registry, timeout=HOUR)
    async def short_nap(ctx: durable.WorkflowContext) -> str:
        await ctx.sleep(60)
        return "woke"

    async with running_worker(client, registry):
        await client.start("short.nap", id="short")
        released = await waiting_in(client, "short", 1)
        assert released.run_at == pytest.approx(clock.now() + 60, abs=1)
        with anyio.fail_after(15):
            clock.advance(61)
            done = await client.wait("short", timeout=15)
    assert done.state is RunState.COMPLETED and done.result == "woke"


class ClockFailsAtRelease(SqliteStore):
    """A real SQLite store whose clock cannot be read by the release of a run that waits
    (fault injection at that one read: the store failing exactly there cannot be arranged
    with a real outage, which would fail the writes around it too)."""

    async def now(self) -> float:
        if sys._getframe(1).f_code.co_name == "_store_deadline":
            raise durable.StoreUnavailableError("database unreachable (injected)")
        return await super().now()


async def test_a_wait_whose_release_cannot_read_the_clock_is_released_as_it_asked(
        tmp_path: Path, registry: durable.Registry) -> None:
    """The store's time could not be read at the release (to cut the wait short): the run is
    released all the same, due when its wait ends (the attempt that claims it then still
    fails if the timeout has run out), not left held until its lease lapses."""
    store = ClockFailsAtRelease(str(tmp_path / "c.db"))
    await store.open()
    client = durable.Client(store, registry=registry)

    @durable.workflow("napping.long", registry=registry, timeout=60)
    async def napping(ctx: durable.WorkflowContext) -> None:
        await ctx.sleep(HOUR)

    try:
        async with running_worker(client, registry):
            await client.start("napping.long", id="nap")
            released = await waiting_in(client, "nap", 1)
        journal = await store.journal("nap")
        [waiting] = [e for e in journal if e.kind is EntryKind.RUN_WAITING]
        [timer] = [e for e in journal if e.kind is EntryKind.TIMER_STARTED]
        assert released.run_at == waiting.data["until"] == timer.data["until"]
        assert "cut_short" not in waiting.data
    finally:
        await store.aclose()
