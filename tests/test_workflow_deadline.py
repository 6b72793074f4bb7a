"""A workflow's ``timeout`` (or a run's ``start(timeout=)``) counts from its first attempt's
claim, across attempts: a run recovered after a crash, released for a durable wait or
given back at a shutdown gets what is left of it, not the whole timeout again, and a wait
longer than what is left makes the run due when the time runs out, to fail then. A replay
counts it anew. Before, it was a deadline per attempt: a run that kept being resumed, or
slept, was never bounded by it. On SQLite and PostgreSQL, asyncio and trio; the store's
time is a FakeClock, the attempt's time left is real."""

from __future__ import annotations

import html
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio
import pytest

import durable
from durable import RunState
from durable._clock import FakeClock
from durable._report import CUT_SHORT, render_timeline, utc, waiting_phrase
from durable._types import EntryKind
from durable.store._sqlite import SqliteStore

from .helpers import died_in_step_one, given_away, poll, running_worker
from .httpserver import LoopbackServer, Rule, loopback_server
from .pg import pg_url, postgres_server
from .test_console_http import console
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


class _SlowToBegin(durable.Interceptor):
    """Holds each attempt ``delay`` seconds between its claim and its workflow code, as a
    busy worker's loop (or an interceptor that reads something first) would."""

    def __init__(self, delay: float) -> None:
        self.delay = delay

    async def intercept_attempt(self, info: durable.AttemptInfo,
                                call_next: Callable[[], Awaitable[str]]) -> str:
        await anyio.sleep(self.delay)  # the time to begin is the subject, not a wait
        return await call_next()


async def test_a_first_attempt_s_timeout_counts_from_its_claim_not_from_its_code(
        client: durable.Client, registry: durable.Registry) -> None:
    """Timeout 0.5 s; the first attempt's workflow code begins 0.8 s after its claim: its
    time ran out before it began, so it sends nothing and the run fails as timed out.
    (Counted from the code's start, it had its 0.5 s again and deleted.) A later attempt
    counts from the first claim's stamp; the first counts from when its claim was sent."""
    async with loopback_server() as server:
        server.on("/slow", Rule(body={"deleted": True}))
        flows(registry, server, timeout=0.5)
        async with running_worker(client, registry, interceptors=[_SlowToBegin(0.8)]):
            await client.start("bounded", id="late-code")
            done = await client.wait("late-code", timeout=15)
        assert server.seen("/slow") == []
    assert done.state is RunState.FAILED and done.attempt == 1
    assert done.error == "TimeoutError: workflow timed out after 0.5 s", done.error


@pytest.mark.parametrize("waits", ["sleep", "signal"])
async def test_a_durable_wait_longer_than_the_timeout_ends_when_the_timeout_does(
        client: durable.Client, registry: durable.Registry, clock: FakeClock,
        waits: str) -> None:
    """A run with a 60 s timeout sleeps an hour (or waits for a signal with no timeout of
    its own): it is released to be due in 60 s, not in an hour (or never), and then fails
    at once: its next attempt replays up to the wait and does nothing more."""
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
    assert ran == ["started", "started"]  # attempt 2 replayed up to the wait, then stopped
    assert done.error.endswith(
        f"its replay of the journal stopped at step 1 "
        f"({'durable.sleep' if waits == 'sleep' else 'durable.wait_for ' + repr('go')}), "
        "which the journal does not hold as done"), done.error


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


def stopping_flows(registry: durable.Registry, server: LoopbackServer,
                   held: anyio.Event) -> None:
    """``deleting``: a DELETE (in doubt if cut off: never run twice), then, in its first
    attempt only, a hold (``held`` is set) that the test ends by stopping the worker: the
    run's work is done and its end unrecorded, as after a crash right after its last step.
    ``deleting.more``: the same, then a second call, and a cleanup step if that fails."""
    async def call(ctx: durable.ActivityContext, path: str) -> str:
        r = await ctx.http.request("DELETE" if path == "/db" else "POST", server.url + path)
        return str(r.json())

    @durable.activity("drop", registry=registry)
    async def drop(ctx: durable.ActivityContext) -> str:
        return await call(ctx, "/db")

    @durable.activity("notify", registry=registry)
    async def notify(ctx: durable.ActivityContext) -> str:
        return await call(ctx, "/notify")

    @durable.activity("cleanup", registry=registry)
    async def cleanup(ctx: durable.ActivityContext) -> str:
        return await call(ctx, "/cleanup")

    async def hold(ctx: durable.WorkflowContext) -> None:
        if ctx.attempt == 1:  # (not deterministic, on purpose: the test's crash point)
            held.set()
            await anyio.sleep_forever()

    @durable.workflow("deleting", registry=registry, timeout=60)
    async def deleting(ctx: durable.WorkflowContext) -> str:
        dropped = await drop(ctx)
        await hold(ctx)
        return f"done: {dropped}"

    @durable.workflow("deleting.more", registry=registry, timeout=60)
    async def deleting_more(ctx: durable.WorkflowContext) -> str:
        await drop(ctx)
        await hold(ctx)
        try:
            return await notify(ctx)
        except Exception:  # what a workflow may well do: the timeout must still hold
            return await cleanup(ctx)


async def interrupted_after_its_steps(client: durable.Client, registry: durable.Registry,
                                      clock: FakeClock, held: anyio.Event,
                                      workflow: str, run_id: str) -> None:
    """Run ``workflow`` until its first attempt holds after its steps, stop its worker (the
    attempt ends unrecorded: interrupted), and move the clock past the 60 s timeout."""
    async with running_worker(client, registry):
        await client.start(workflow, id=run_id)
        with anyio.fail_after(10):
            await held.wait()
    run = await client.store.get_run(run_id)
    assert run is not None and run.state is RunState.QUEUED
    clock.advance(61)


async def test_a_run_whose_steps_were_all_done_completes_although_its_time_ran_out(
        client: durable.Client, registry: durable.Registry, clock: FakeClock) -> None:
    """Its first attempt deleted the database and was stopped before it recorded the run's
    end; the next attempt is claimed after the timeout ran out. Its replay of the journal
    needs nothing new: the run completes with its result (it was not failed as timed out
    for a time it did not need), and the DELETE was sent once."""
    held = anyio.Event()
    async with loopback_server() as server:
        server.on("/db", Rule(body={"deleted": True}))
        stopping_flows(registry, server, held)
        await interrupted_after_its_steps(client, registry, clock, held, "deleting", "d1")
        async with running_worker(client, registry):
            done = await client.wait("d1", timeout=15)
        assert len(server.seen("/db")) == 1
    assert done.state is RunState.COMPLETED, done.error
    assert done.attempt == 2 and done.result == "done: {'deleted': True}"
    # why it completed past its timeout is journaled, and said where the run is read
    journal = await client.store.journal("d1")
    [claim, _] = [e for e in journal if e.kind is EntryKind.RUN_CLAIMED]
    ended = journal[-1]
    assert ended.kind is EntryKind.RUN_COMPLETED
    assert ended.data == {"overdue": True, "timeout": 60.0, "ran_out_at": claim.at + 60}
    said = ("completed by an attempt claimed after its 60 s timeout ran out ({}): every "
            "step had been done, its replay needed nothing new")
    # the timeline gives the clock alone on the run's date
    clock_only = utc(claim.at + 60).split()[1]
    assert "run " + said.format(clock_only) in " ".join(
        render_timeline(done, journal, width=400).split())
    async with console(client) as http:  # the attempts table, in the timeline's words
        page = html.unescape((await http.get("/runs/d1")).text)
        assert "run " + said.format(clock_only) in page


async def test_a_run_whose_time_ran_out_does_nothing_new_even_if_its_code_catches_it(
        client: durable.Client, registry: durable.Registry, clock: FakeClock) -> None:
    """The same, with a step left to do: the replay stops there and the run fails as timed
    out, naming the step; the workflow catches the error and calls a cleanup step, which
    does not run either (the error is the attempt's doom, its scope cancelled)."""
    held = anyio.Event()
    async with loopback_server() as server:
        for path in ("/db", "/notify", "/cleanup"):
            server.on(path, Rule(body={"ok": True}))
        stopping_flows(registry, server, held)
        await interrupted_after_its_steps(client, registry, clock, held, "deleting.more",
                                          "d2")
        async with running_worker(client, registry):
            done = await client.wait("d2", timeout=15)
        assert [len(server.seen(p)) for p in ("/db", "/notify", "/cleanup")] == [1, 0, 0]
    assert done.state is RunState.FAILED and done.attempt == 2
    assert done.error is not None and done.error.startswith(
        "TimeoutError: workflow timed out after 60 s (counted from its first attempt"), done.error
    assert done.error.endswith(
        "before attempt 2 began; it did nothing new: its replay of the journal stopped at "
        "step 2 (notify), which the journal does not hold as done"), done.error
    journal = await client.store.journal("d2")
    assert [e.step for e in journal if e.kind is EntryKind.STEP_STARTED] == [1]


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
