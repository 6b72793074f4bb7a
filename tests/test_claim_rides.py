"""One commit per step: a claim rides on its attempt's first journal write, and carries the
finish of the worker's previous attempt (durable/_claims.py; docs/design.md, "One commit per
step").

Commits are counted on the store's own connections (as scripts/bench.py counts them); the
crash tests SIGKILL a real worker process on a real SQLite file at the two moments that
matter: while a run read for a claim runs its workflow code (nothing of it may be visible,
and the previous run's result is not committed either: it waits in the claim's
transaction), and once the claim has committed with the first step."""

from __future__ import annotations

import os
import signal
import sqlite3
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

import durable
from durable import RunState, _claims
from durable._types import EntryKind, Fence, JournalWrite
from durable.store._sqlite import SqliteStore

from . import rideflows
from .helpers import kinds, poll, python_process, running_worker

pytestmark = pytest.mark.anyio

STEPS = 5


@contextmanager
def counting_commits(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Connections opened in the block count their commits in the list's one item."""
    commits = [0]
    real = sqlite3.connect

    class Counting(sqlite3.Connection):
        def commit(self) -> None:
            if self.in_transaction:
                commits[0] += 1
            super().commit()

    def connect(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        kwargs.setdefault("factory", Counting)
        return real(*args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(sqlite3, "connect", connect)
        yield commits


def steps_registry(calls: list[int] | None = None) -> tuple[durable.Registry, Any]:
    registry = durable.Registry()

    @durable.activity("t.noop", registry=registry)
    async def noop(ctx: durable.ActivityContext, i: int) -> int:
        if calls is not None:
            calls.append(i)
        return i

    @durable.workflow("t.steps", registry=registry)
    async def steps(ctx: durable.WorkflowContext, n: int) -> int:
        return sum([await noop(ctx, i) for i in range(n)])

    return registry, steps


@pytest.mark.parametrize("steps", [STEPS, 1])
async def test_sequential_runs_commit_once_per_step_and_the_last_result_at_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, steps: int) -> None:
    registry, workflow = steps_registry()
    # a loaded machine may take longer than the wait to reach a first write: then the claim
    # commits on its own (one commit more); here only the first write may commit it
    monkeypatch.setattr(_claims, "RIDE_WAIT", 30.0)
    store = SqliteStore(str(tmp_path / "rides.db"))
    with counting_commits(monkeypatch) as commits:
        await store.open()
    runs = 20
    try:
        client = durable.Client(store, registry=registry)
        for i in range(runs):
            await client.start(workflow, steps, id=f"r{i:02d}")
        before = commits[0]
        # no renewal falls in the block: only the runs' own commits are counted
        async with running_worker(client, registry, concurrency=1, lease=600.0,
                                  heartbeat_interval=300.0):
            for i in range(runs):
                assert (await client.wait(f"r{i:02d}", timeout=30)).result == sum(
                    range(steps))
            used = commits[0] - before
        # each run: its claim with step 1 (and the previous run's finish), the other
        # steps; the last run's finish commits on its own, at once (nothing queued)
        assert used == runs * steps + 1
        journal = await client.journal("r05")
        assert kinds(journal) == ["run_created", "run_claimed", *(
            ["step_started", "step_completed"] * steps), "run_completed"]
    finally:
        await store.aclose()


async def test_a_result_waits_no_longer_than_the_bound_for_a_claim_to_ride_on(
        client: durable.Client) -> None:
    """The next run's workflow code waits before its first write (here for the test): the
    claim commits on its own after the bound, with the previous run's finish."""
    registry, steps = steps_registry()
    go = anyio.Event()

    @durable.workflow("t.later", registry=registry)
    async def later(ctx: durable.WorkflowContext) -> int:
        await go.wait()  # something before the first journal write
        return int(await steps.fn(ctx, 1))

    client.registry = registry
    await client.start(steps, 1, id="first")
    await client.start(later, id="second")
    async with running_worker(client, registry, concurrency=1):
        done = await client.wait("first", timeout=20)  # never set go before: it must come
        second = await client.get("second")
        go.set()
        assert (await client.wait("second", timeout=20)).result == 0
    assert done.state is RunState.COMPLETED and done.result == 0
    assert second.state is RunState.RUNNING  # claimed with the first's finish
    assert kinds(await client.journal("second"))[:2] == ["run_created", "run_claimed"]


async def test_a_workflow_that_reads_its_epoch_before_its_claim_gets_the_claimed_one(
        client: durable.Client) -> None:
    registry = durable.Registry()

    @durable.activity("t.one", registry=registry)
    async def one(ctx: durable.ActivityContext) -> int:
        return 1

    @durable.workflow("t.epoch", registry=registry)
    async def epoch(ctx: durable.WorkflowContext) -> list[int]:
        seen = ctx.epoch  # before any journal write: the claim has not committed yet
        return [seen, await one(ctx)]

    client.registry = registry
    await client.start(epoch, id="e1")
    async with running_worker(client, registry, concurrency=1):
        done = await client.wait("e1", timeout=20)
    assert done.state is RunState.COMPLETED
    assert done.result == [done.epoch, 1] and done.attempt == 1
    assert kinds(await client.journal("e1")).count("run_claimed") == 1


def between_read_and_claim(store: Any, action: Callable[[], Awaitable[None]]) -> anyio.Event:
    """``action`` runs once, after the worker's first read of what to claim that found a
    run and before its claim (another worker or an operator in between); the event is set
    once it ran."""
    real = store.claimable
    done = anyio.Event()

    async def stale_claimable(*args: Any, **kwargs: Any) -> list[durable.Run]:
        read = await real(*args, **kwargs)
        if read and not done.is_set():
            await action()
            done.set()
        return read

    store.claimable = stale_claimable
    return done


async def test_a_run_that_changed_since_it_was_read_runs_from_its_journal(
        client: durable.Client) -> None:
    """Read as never started, but an attempt ran (and journaled step 1) before the claim:
    the claim holds, the attempt started on the read is dropped, and a fresh one replays
    step 1 from the journal instead of running it again."""
    calls: list[int] = []
    registry, steps = steps_registry(calls)
    client.registry = registry
    store = client.store
    await client.start(steps, 2, id="c1")

    async def another_workers_attempt() -> None:
        [other] = await store.claim("other", 30.0, 1)
        fence = Fence(other.id, other.epoch)
        assert await store.append(fence, [
            JournalWrite(EntryKind.STEP_STARTED, 1, "1", "t.noop", 1, {"args": [0]}),
            JournalWrite(EntryKind.STEP_COMPLETED, 1, "1", "t.noop", 1, {"result": 0})])
        assert await store.release(fence)

    between_read_and_claim(store, another_workers_attempt)
    async with running_worker(client, registry, concurrency=1):
        done = await client.wait("c1", timeout=20)
    assert done.state is RunState.COMPLETED and done.result == 1 and done.attempt == 2
    assert calls == [1]  # step 1 came from the journal; only step 2 ran here
    journal = await client.journal("c1")
    assert kinds(journal).count("step_started") == 2  # one each, none from the dropped one


async def test_a_run_cancelled_since_it_was_read_is_not_claimed_and_nothing_runs(
        client: durable.Client) -> None:
    calls: list[int] = []
    registry, steps = steps_registry(calls)
    client.registry = registry
    store = client.store
    await client.start(steps, 2, id="x1")

    async def cancel() -> None:
        await store.request_cancel("x1")

    cancelled = between_read_and_claim(store, cancel)
    async with running_worker(client, registry, concurrency=1) as worker:
        await poll(lambda: cancelled.is_set() and not worker.pending and not worker.active)
    assert calls == []
    run = await client.get("x1")
    assert run.state is RunState.CANCELLED and run.attempt == 0
    assert "run_claimed" not in kinds(await client.journal("x1"))


# -- crashes --------------------------------------------------------------------------------------
@contextmanager
def worker_process(db_url: str, backend: str) -> Iterator[Any]:
    log = Path(db_url.removeprefix("sqlite:///")).with_suffix(".worker.log")
    with python_process(
        ["-m", "durable.worker", "--db", db_url, "--import", "tests.rideflows",
         "--concurrency", "1", "--lease", "30", "--poll", "0.05", "--log-level", "warning",
         "--backend", backend],
        log,
    ) as proc:
        yield proc


def lines(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


@pytest.mark.parametrize("where", ["code", "step"])
async def test_a_worker_killed_around_a_claim_that_rides_on_the_first_write(
        db_url: str, tmp_path: Path, anyio_backend: str, where: str) -> None:
    """``code``: killed while the read run's workflow code runs, before its first write:
    nobody ever saw it claimed (queued, never started), and the previous run's finish,
    which waits in that claim's transaction, is not committed either (its run is taken
    over as after any crash before a finish). ``step``: killed in the first step's
    activity: the previous run's result, the claim and the step's start committed
    together."""
    log, gate = tmp_path / "log.txt", tmp_path / "gate"
    async with durable.Client.connect(db_url) as client:
        await client.start(rideflows.ride_first, id="a")
        await client.start(rideflows.ride_second, str(log), str(gate), where, id="b")
        with worker_process(db_url, anyio_backend) as proc:
            await poll(lambda: where in lines(log), timeout=30)
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        a, b = await client.get("a"), await client.get("b")
        journal_a, journal_b = await client.journal("a"), await client.journal("b")
        if where == "code":
            assert b.state is RunState.QUEUED and b.attempt == 0 and b.worker is None
            assert kinds(journal_b) == ["run_created"]
            assert a.state is RunState.RUNNING and a.result is None
            assert kinds(journal_a) == ["run_created", "run_claimed", "step_started"]
        else:
            assert a.state is RunState.COMPLETED and a.result == 1
            assert b.state is RunState.RUNNING and b.attempt == 1
            assert kinds(journal_b) == ["run_created", "run_claimed", "step_started"]
            assert {e.epoch for e in journal_b[1:]} == {b.epoch}
            # one transaction: A's last entry, then B's claim and first step, in a row
            assert journal_a[-1].kind.value == "run_completed"
            assert journal_b[1].seq == journal_a[-1].seq + 1
        gate.touch()
        async with running_worker(client, durable.default_registry, lease=30.0,
                                  liveness_interval=0.02):
            done_a = await client.wait("a", timeout=30)
            done_b = await client.wait("b", timeout=30)
        assert done_a.state is RunState.COMPLETED and done_a.result == 1
        assert done_b.state is RunState.COMPLETED and done_b.result == "held"
        assert done_b.attempt == (1 if where == "code" else 2)
        assert done_a.recoveries == (1 if where == "code" else 0)
