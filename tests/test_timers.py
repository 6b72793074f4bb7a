"""Durable timers: ``ctx.sleep`` / ``ctx.sleep_until`` and long retry delays release the run
(no lease, no slot) until they are due; the wake time is journaled once (docs/design.md,
"Durable waiting"). On SQLite and PostgreSQL, asyncio and trio; time is a FakeClock."""

from __future__ import annotations

import html
import os
import re
import signal
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

import durable
from durable import RunState
from durable._clock import FakeClock
from durable._report import cancel_phrase, render_timeline, utc
from durable._types import EntryKind

from . import waitflows
from .helpers import kinds, poll, python_process, running_worker
from .pg import pg_url, postgres_server
from .test_console_http import console
from .waiting import client, clock, store_url

__all__ = ["client", "clock", "pg_url", "postgres_server", "store_url"]

pytestmark = pytest.mark.anyio

HOUR = 3600.0


def lines(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


def declare(registry: durable.Registry, log: Path) -> dict[str, Any]:
    calls: dict[str, Any] = {"tries": []}

    @durable.activity("t.mark", registry=registry)
    async def mark(ctx: durable.ActivityContext, name: str) -> str:
        with open(log, "a") as f:
            f.write(f"{name}\n")
        return name

    @durable.workflow("t.nap", registry=registry)
    async def nap(ctx: durable.WorkflowContext, seconds: float) -> str:
        await mark(ctx, "before")
        await ctx.sleep(seconds)
        return str(await mark(ctx, "after"))

    @durable.workflow("t.until", registry=registry)
    async def until(ctx: durable.WorkflowContext, when: float) -> str:
        await ctx.sleep_until(when)
        return str(await mark(ctx, "after"))

    @durable.activity("t.flaky", registry=registry,
                      retry=durable.RetryPolicy(max_tries=3, initial_delay=60, max_delay=60,
                                                jitter=0))
    async def flaky(ctx: durable.ActivityContext) -> int:
        calls["tries"].append(ctx.try_number)
        if ctx.try_number == 1:
            raise RuntimeError("not yet")
        return ctx.try_number

    @durable.workflow("t.retry", registry=registry)
    async def retrying(ctx: durable.WorkflowContext) -> int:
        await mark(ctx, "before")
        return int(await flaky(ctx))

    return calls


async def asleep(client: durable.Client, run_id: str) -> None:
    """Until the run's sleep has journaled its wake time: the step before it has returned
    (its line in the log is written before that) and the wake time was read from the clock,
    so a clock moved from now on moves toward it."""
    async def journaled() -> bool:
        return "timer_started" in kinds(await client.store.journal(run_id))
    await poll(journaled)


async def released(client: durable.Client, run_id: str, attempt: int = 1) -> durable.Run:
    """The run once its attempt ``attempt`` ended and released it to wait."""
    async def check() -> durable.Run | None:
        run = await client.store.get_run(run_id)
        return run if run and run.state is RunState.QUEUED and run.attempt == attempt else None

    found: durable.Run = await poll(check, timeout=15)
    return found


async def test_an_hour_sleep_holds_no_lease_and_resumes_past_it(
        client: durable.Client, registry: durable.Registry, clock: FakeClock,
        tmp_path: Path) -> None:
    log = tmp_path / "log"
    declare(registry, log)
    async with running_worker(client, registry) as worker:
        run = await client.start("t.nap", HOUR, id="nap")
        waiting = await released(client, "nap")
        # released: no lease, no worker, no slot held, due at the journaled wake time
        assert waiting.worker is None and waiting.lease_expires_at is None
        assert waiting.run_at == pytest.approx(clock.now() + HOUR, abs=0.01)
        await poll(lambda: worker.active == {})  # its task ends just after the release
        [timer] = [e for e in await client.store.journal("nap")
                   if e.kind is EntryKind.TIMER_STARTED]
        assert timer.data["until"] == pytest.approx(clock.now() + HOUR, abs=0.01)
        clock.advance(HOUR - 1)
        assert await client.store.claim("another-worker", 30.0, 10) == []  # not due yet
        assert (await client.store.get_run("nap")).state is RunState.QUEUED  # type: ignore[union-attr]
        clock.advance(1)
        done = await client.wait(run.id, timeout=15)
    assert done.state is RunState.COMPLETED and done.result == "after"
    assert lines(log) == ["before", "after"]  # nothing before the sleep ran again
    journal = kinds(await client.store.journal("nap"))
    assert journal.count("timer_started") == 1 and journal.count("timer_fired") == 1
    assert journal.count("run_waiting") == 1 and journal.count("run_claimed") == 2


async def test_sleep_until_a_time_and_a_time_already_passed(
        client: durable.Client, registry: durable.Registry, clock: FakeClock,
        tmp_path: Path) -> None:
    declare(registry, tmp_path / "log")
    async with running_worker(client, registry):
        await client.start("t.until", clock.now() + 10, id="later")
        past = await client.start("t.until", clock.now() - 10, id="past")
        assert (await client.wait(past.id, timeout=15)).state is RunState.COMPLETED
        waiting = await released(client, "later")
        assert waiting.run_at == pytest.approx(clock.now() + 10, abs=0.01)
        clock.advance(10)
        assert (await client.wait("later", timeout=15)).result == "after"


async def test_a_short_sleep_stays_in_the_attempt_on_the_store_clock(
        client: durable.Client, registry: durable.Registry, clock: FakeClock,
        tmp_path: Path) -> None:
    log = tmp_path / "log"
    declare(registry, log)
    # below the threshold, and longer than the wait below gives it in real time: only the
    # fake clock moving can end it
    async with running_worker(client, registry, durable_wait_threshold=100.0, lease=600):
        run = await client.start("t.nap", 30.0, id="short")
        await asleep(client, "short")
        held = await client.store.get_run("short")
        assert held is not None and held.state is RunState.RUNNING and held.worker is not None
        clock.advance(30.0)
        done = await client.wait(run.id, timeout=15)
    assert done.result == "after"
    assert "run_waiting" not in kinds(await client.store.journal("short"))


async def test_a_sleep_resumed_by_another_attempt_keeps_its_wake_time(
        client: durable.Client, registry: durable.Registry, clock: FakeClock,
        tmp_path: Path) -> None:
    log = tmp_path / "log"
    declare(registry, log)
    async with running_worker(client, registry, durable_wait_threshold=100.0, lease=600):
        await client.start("t.nap", 60.0, id="kept")
        await asleep(client, "kept")  # not the log's line: the wake time is read after it
        clock.advance(40)
    # the worker shut down mid-sleep (grace 0): interrupted and released
    interrupted = await client.store.get_run("kept")
    assert interrupted is not None and interrupted.state is RunState.QUEUED
    async with running_worker(client, registry, durable_wait_threshold=100.0, lease=600):
        await poll(lambda: client.store.get_run("kept"), timeout=15)
        await poll(lambda: _state_is(client, "kept", RunState.RUNNING, attempt=2))
        clock.advance(19)
        await anyio.sleep(0.6)  # negative check: two slices of the wait pass, still asleep
        assert (await client.store.get_run("kept")).state is RunState.RUNNING  # type: ignore[union-attr]
        clock.advance(1)  # 60 s after the first attempt journaled the wake time
        done = await client.wait("kept", timeout=15)
    assert done.result == "after" and lines(log) == ["before", "after"]
    journal = await client.store.journal("kept")
    assert kinds(journal).count("timer_started") == 1
    # on the store's clock, whatever the scheduling: the step after the sleep started no
    # earlier than the wake time the first attempt journaled (60 s after it slept)
    timer = next(e for e in journal if e.kind is EntryKind.TIMER_STARTED)
    after = [e for e in journal if e.kind is EntryKind.STEP_STARTED and e.seq > timer.seq]
    assert after and after[0].at >= timer.data["until"] == pytest.approx(timer.at + 60.0, abs=0.01)


async def _state_is(client: durable.Client, run_id: str, state: RunState,
                    attempt: int) -> bool:
    run = await client.store.get_run(run_id)
    return run is not None and run.state is state and run.attempt == attempt


async def test_cancel_during_a_released_sleep_cancels_at_once(
        client: durable.Client, registry: durable.Registry, clock: FakeClock,
        tmp_path: Path) -> None:
    log = tmp_path / "log"
    declare(registry, log)
    async with running_worker(client, registry):
        await client.start("t.nap", HOUR, id="nap")
        await released(client, "nap")
        cancelled = await client.cancel("nap", origin={"via": "test"})
        assert cancelled.state is RunState.CANCELLED
        assert cancelled.error == "cancelled while waiting"
        clock.advance(HOUR)
        assert await client.store.claim("another-worker", 30.0, 10) == []  # ended, not due
    assert lines(log) == ["before"]
    assert kinds(await client.store.journal("nap"))[-1] == "run_cancelled"


async def test_a_long_retry_delay_releases_the_run_and_keeps_the_try_count(
        client: durable.Client, registry: durable.Registry, clock: FakeClock,
        tmp_path: Path) -> None:
    log = tmp_path / "log"
    calls = declare(registry, log)
    async with running_worker(client, registry) as worker:
        await client.start("t.retry", id="retry")
        waiting = await released(client, "retry")
        assert waiting.worker is None and waiting.lease_expires_at is None
        assert waiting.run_at == pytest.approx(clock.now() + 60, abs=0.01)
        await poll(lambda: worker.active == {})  # its task ends just after the release
        clock.advance(60)
        done = await client.wait("retry", timeout=15)
    assert done.state is RunState.COMPLETED and done.result == 2
    assert calls["tries"] == [1, 2] and lines(log) == ["before"]
    journal = await client.store.journal("retry")
    assert [e.try_number for e in journal if e.kind is EntryKind.STEP_STARTED] == [1, 1, 2]
    [retrying] = [e for e in journal if e.kind is EntryKind.STEP_RETRYING]
    assert retrying.data["retry_at"] == pytest.approx(clock.now(), abs=0.01)


async def test_a_run_waiting_to_retry_is_said_to_wait_for_its_retry(
        client: durable.Client, registry: durable.Registry, clock: FakeClock,
        tmp_path: Path) -> None:
    """A run released for a step's retry delay: the console says it waits to retry that
    step, and its cancel says it was cancelled while it waited to retry it. Before, the
    cancel said "while it slept" (it looked for the reason "retry", the release journals
    "retry of step N") and the console "Waiting to retry of step 2 until ..."."""
    declare(registry, tmp_path / "log")
    async with running_worker(client, registry):
        await client.start("t.retry", id="retry")
        waiting = await released(client, "retry")
        async with console(client) as http:
            page = html.unescape((await http.get("/runs/retry")).text)
        assert f"Waiting to retry step 2 until {utc(waiting.run_at)};" in page, page
        cancelled = await client.cancel("retry")
    said = cancel_phrase(cancelled, await client.store.journal("retry"))
    assert said == "cancelled while it waited to retry step 2 (attempt 1 had run: step 1 done)"


async def test_bad_sleeps_fail_the_run_with_a_clear_error(
        client: durable.Client, registry: durable.Registry, tmp_path: Path) -> None:
    declare(registry, tmp_path / "log")
    async with running_worker(client, registry):
        for bad in (-1, True, "5"):
            run = await client.start("t.nap", bad)
            done = await client.wait(run.id, timeout=15)
            assert done.state is RunState.FAILED
            assert "ctx.sleep: expected seconds >= 0" in (done.error or "")


# -- a real worker process, SIGKILLed ---------------------------------------------------------
@pytest.mark.parametrize("threshold", [None, "7200"], ids=["released", "in-attempt"])
async def test_an_hour_sleep_survives_a_worker_sigkill(
        db_url: str, tmp_path: Path, anyio_backend: str, threshold: str | None) -> None:
    """Released (the run sleeps in the store while its worker dies) or sleeping inside the
    attempt (the dead worker's run is taken over): either way, a new worker an hour later
    resumes past the sleep, with the wake time the first attempt journaled."""
    log = tmp_path / "log"
    async with durable.Client.connect(db_url) as client:
        await client.start("wait.nap", str(log), id="nap")
        with python_process(
                ["-m", "durable.worker", "--db", db_url, "--import", "tests.waitflows",
                 "--poll", "0.05", "--log-level", "warning", "--backend", anyio_backend,
                 *([] if threshold is None else ["--wait-threshold", threshold])],
                tmp_path / "worker.log") as proc:
            await poll(lambda: _timer_journaled(client, "nap", released=threshold is None),
                       timeout=20)
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        run = await client.store.get_run("nap")
        assert run is not None
        assert run.state is (RunState.QUEUED if threshold is None else RunState.RUNNING)
        [timer] = [e for e in await client.store.journal("nap")
                   if e.kind is EntryKind.TIMER_STARTED]
        wake = float(timer.data["until"])
    assert wake == pytest.approx(time.time() + HOUR, abs=60)
    later = FakeClock(wake + 0.5)  # an hour later (a store clock, for the new worker)
    async with durable.Client.connect(db_url, clock=later,
                                      registry=durable.default_registry) as client:
        async with running_worker(client, durable.default_registry):
            done = await client.wait("nap", timeout=20)
        journal = kinds(await client.store.journal("nap"))
    assert done.state is RunState.COMPLETED and done.result == "two"
    assert lines(log) == ["one", "two"]
    assert journal.count("timer_started") == 1
    assert waitflows.nap.name == "wait.nap"


async def _timer_journaled(client: durable.Client, run_id: str, *, released: bool) -> bool:
    journal = kinds(await client.store.journal(run_id))
    if released:
        return "run_waiting" in journal
    run = await client.store.get_run(run_id)
    # kept in the attempt: journaled, and the step before it has committed its completion
    return "timer_started" in journal and run is not None and run.state is RunState.RUNNING


async def test_show_says_until_when_a_run_sleeps(
        client: durable.Client, registry: durable.Registry, clock: FakeClock,
        tmp_path: Path) -> None:
    declare(registry, tmp_path / "log")
    async with running_worker(client, registry):
        await client.start("t.nap", HOUR, id="nap")
        run = await released(client, "nap")
        asleep = render_timeline(run, await client.store.journal("nap"))
        clock.advance(HOUR)
        done = await client.wait("nap", timeout=15)
    wake = "2023-11-14 23:13:20.000 UTC"  # FakeClock's start + 1 h
    assert f"waiting   sleeping until {wake}" in asleep
    assert re.search(rf"durable\.sleep +sleeping +until {wake}", asleep), asleep
    after = render_timeline(done, await client.store.journal("nap"))
    assert re.search(r"durable\.sleep +completed +1\.0 h", after), after


async def test_show_of_a_sleep_the_run_left_says_it_ended_unwoken(
        client: durable.Client, registry: durable.Registry, clock: FakeClock,
        tmp_path: Path) -> None:
    """A sleep cut off by a cancel is not shown sleeping (it never woke: the run ended),
    and after a replay the cancelled attempt's sleep is not shown sleeping beside the new
    one (it ended with the cancel; only the replay's sleep, to its own wake time, goes on).
    Before, show printed "sleeping until <the old wake time>" for both."""
    declare(registry, tmp_path / "log")
    async with running_worker(client, registry):
        await client.start("t.nap", HOUR, id="nap")
        await released(client, "nap")
        cancelled = await client.cancel("nap")
        shown = render_timeline(cancelled, await client.store.journal("nap"), width=200)
        first_wake = "2023-11-14 23:13:20.000 UTC"  # FakeClock's start + 1 h
        assert re.search(rf"durable\.sleep +sleeping +the run cancelled meanwhile · until "
                         rf"{first_wake}", shown), shown
        clock.advance(60)
        await client.replay("nap")
        again = await released(client, "nap", attempt=2)
        shown = render_timeline(again, await client.store.journal("nap"), width=200)
    second_wake = "2023-11-14 23:14:20.000 UTC"  # a minute later: the replay's sleep
    rows = re.findall(r"durable\.sleep +sleeping +(.*)", shown)
    assert rows == [f"the run cancelled meanwhile · until {first_wake}",
                    f"until {second_wake}"], shown


async def test_cancel_during_a_short_sleep_in_the_attempt_stops_it_at_once(
        client: durable.Client, registry: durable.Registry, tmp_path: Path) -> None:
    log = tmp_path / "log"
    declare(registry, log)
    async with running_worker(client, registry):
        await client.start("t.nap", 1.5, id="short")
        await poll(lambda: _state_is(client, "short", RunState.RUNNING, attempt=1))
        await poll(lambda: lines(log) == ["before"])
        await client.cancel("short")
        with anyio.fail_after(5):  # the fake clock never moves: only the cancel ends it
            done = await client.wait("short", timeout=5)
    assert done.state is RunState.CANCELLED and lines(log) == ["before"]


async def test_an_hour_sleep_beside_a_step_in_flight_stays_in_the_attempt(
        client: durable.Client, registry: durable.Registry, clock: FakeClock) -> None:
    """Releasing the run would cut off the step in flight beside the sleep (docs/design.md,
    *Durable waiting*: a wait with steps in flight holds the lease for its whole length):
    the hour passes in the attempt, which finishes the step, then wakes, without a release
    and without running the step again."""
    started, finish = anyio.Event(), anyio.Event()
    ran: list[str] = []

    @durable.activity("t.slow", registry=registry, on_doubt="fail")  # its end journaled at once
    async def slow(ctx: durable.ActivityContext, name: str) -> str:
        ran.append(name)
        started.set()
        await finish.wait()
        return name

    @durable.workflow("t.beside", registry=registry)
    async def beside(ctx: durable.WorkflowContext) -> list[Any]:
        out: list[Any] = []

        async def item() -> None:
            out.append(await ctx.step(slow, "item", key="item"))

        async with anyio.create_task_group() as tg:
            tg.start_soon(item)
            await started.wait()
            await ctx.sleep(HOUR)  # far above the threshold, with "item" in flight
            out.append("woke")
        return out

    # a lease longer than the hour: the fake clock jumps, the renewals (real time) do not
    async with running_worker(client, registry, lease=3 * HOUR):
        await client.start("t.beside", id="beside")
        await poll(lambda: _journaled(client, "beside", "timer_started"))
        clock.advance(HOUR / 2)
        finish.set()  # the step ends while the sleep goes on
        await poll(lambda: _journaled(client, "beside", "step_completed"))
        held = await client.store.get_run("beside")
        assert held is not None and held.state is RunState.RUNNING and held.attempt == 1
        clock.advance(HOUR / 2)
        done = await client.wait("beside", timeout=15)
    assert done.result == ["item", "woke"] and ran == ["item"]
    journal = kinds(await client.store.journal("beside"))
    assert "run_waiting" not in journal and journal.count("run_claimed") == 1


async def _journaled(client: durable.Client, run_id: str, kind: str) -> bool:
    return kind in kinds(await client.store.journal(run_id))
