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
from functools import partial
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
from .pg import pg_url, postgres_server  # noqa: F401  (fixtures)

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


async def run_one_at_a_time(client: durable.Client, registry: durable.Registry,
                            workflow: Any, steps: int, runs: int,
                            commits: Callable[[], int] = lambda: 0) -> int:
    """Queue ``runs`` runs of ``steps`` steps, run them one at a time to their results (no
    renewal falls in the block: only the runs' own commits are made), check a journal;
    return how much ``commits()`` grew from the starts' end to the runs' (before the
    worker stops)."""
    for i in range(runs):
        await client.start(workflow, steps, id=f"r{i:02d}")
    before = commits()
    async with running_worker(client, registry, concurrency=1, lease=600.0,
                              heartbeat_interval=300.0):
        for i in range(runs):
            assert (await client.wait(f"r{i:02d}", timeout=30)).result == sum(range(steps))
        counted = commits() - before
    journal = await client.journal("r05")
    assert kinds(journal) == ["run_created", "run_claimed", *(
        ["step_started", "step_completed"] * steps), "run_completed"]
    assert len({e.epoch for e in journal[1:]}) == 1
    return counted


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
        used = await run_one_at_a_time(client, registry, workflow, steps, runs,
                                       lambda: commits[0])
        # each run: its claim with step 1 (and the previous run's finish), the other
        # steps; the last run's finish commits on its own, at once (nothing queued)
        assert used == runs * steps + 1
    finally:
        await store.aclose()


def journal_transactions(url: str, exclude: str = "run_created") -> int:
    """How many PostgreSQL transactions wrote the journal's entries (their ``xmin``s), the
    starts' ``run_created`` left out: every commit of an attempt journals something."""
    from .pg import connect_sync

    with connect_sync(url) as conn:
        row = conn.execute("SELECT count(DISTINCT xmin::text) FROM durable_journal "
                           "WHERE kind <> %s", (exclude,)).fetchone()
    return int(row[0])


@pytest.mark.parametrize("steps", [STEPS, 1])
async def test_on_postgresql_too_a_claim_and_a_finish_ride_on_the_runs_writes(
        pg_url: str, monkeypatch: pytest.MonkeyPatch, steps: int,  # noqa: F811
        anyio_backend_name: str) -> None:
    """The same count on PostgreSQL, by the transactions that wrote the journal (the
    server's own record): claim_with is one statement there (the finish, the claim, the
    first entries), so a run's claim and its previous run's finish add no commit."""
    registry, workflow = steps_registry()
    monkeypatch.setattr(_claims, "RIDE_WAIT", 30.0)
    store = durable.store_from_url(pg_url)
    await store.open()
    runs = 20
    try:
        await run_one_at_a_time(durable.Client(store, registry=registry), registry,
                                workflow, steps, runs)
        assert journal_transactions(pg_url) == runs * steps + 1
    finally:
        await store.aclose()


async def test_on_postgresql_a_claim_refused_by_the_key_index_still_commits_the_finish(
        pg_url: str, anyio_backend_name: str) -> None:  # noqa: F811
    """Two claims of runs of one key at the same moment: the server refuses the second
    statement (the one-running-run-per-key index) and rolls all of it back, the carried
    finish too. The store then commits the finish on its own and claims nothing."""
    from durable._types import Finish, NewRun

    from .pg import connect_sync

    store = durable.store_from_url(pg_url)
    await store.open()
    try:
        now = store.clock.now()
        await store.create_run(NewRun("done", "wf", [], None, now))
        first = (await store.claim("w1", 600.0, 1))[0]
        await store.create_run(NewRun("b", "wf", [], "k", now))
        await store.create_run(NewRun("a", "wf", [], "k", now + 1))
        finish = Finish(Fence(first.id, first.epoch), RunState.COMPLETED, result=1,
                        entries=(JournalWrite(EntryKind.RUN_COMPLETED),))
        step = JournalWrite(EntryKind.STEP_STARTED, step=1, step_key="1:s", name="s",
                            try_number=1)
        with connect_sync(pg_url) as other, connect_sync(pg_url) as look:
            other.execute("BEGIN")  # another claim of the key, not committed yet
            other.execute("UPDATE durable_runs SET state = 'running' WHERE id = 'a'")
            outcome: list[Any] = []

            async def claim() -> None:
                outcome.append(await store.claim_with("w1", 600.0, "b", 1, [step],
                                                      [finish]))

            async with anyio.create_task_group() as tg:
                tg.start_soon(claim)
                # the claim of "b" waits on the index entry of "a"'s uncommitted claim
                await poll(lambda: look.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                    "AND application_name = 'durable'").fetchone()[0])
                other.execute("COMMIT")
        result = outcome[0]
        assert result.finished == (True,) and result.run is None and not result.appended
        done = await store.get_run("done")
        assert done is not None and done.state is RunState.COMPLETED and done.result == 1
        assert kinds(await store.journal("done"))[-1] == "run_completed"
        b = await store.get_run("b")
        assert b is not None and b.state is RunState.QUEUED and b.attempt == 0
        assert kinds(await store.journal("b")) == ["run_created"]
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


async def another_workers_attempt(store: durable.Store) -> None:
    """Another worker claims the run, journals step 1 (t.noop of 0, done) and releases it."""
    [other] = await store.claim("other", 30.0, 1)
    fence = Fence(other.id, other.epoch)
    assert await store.append(fence, [
        JournalWrite(EntryKind.STEP_STARTED, 1, "1", "t.noop", 1, {"args": [0]}),
        JournalWrite(EntryKind.STEP_COMPLETED, 1, "1", "t.noop", 1, {"result": 0})])
    assert await store.release(fence)


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

    between_read_and_claim(store, partial(another_workers_attempt, store))
    async with running_worker(client, registry, concurrency=1):
        done = await client.wait("c1", timeout=20)
    assert done.state is RunState.COMPLETED and done.result == 1 and done.attempt == 2
    assert calls == [1]  # step 1 came from the journal; only step 2 ran here
    journal = await client.journal("c1")
    assert kinds(journal).count("step_started") == 2  # one each, none from the dropped one


async def test_on_postgresql_a_claim_without_entries_of_a_changed_run_runs_from_its_journal(
        pg_url: str, anyio_backend_name: str) -> None:  # noqa: F811
    """The same on PostgreSQL, with a claim that commits without entries: the workflow
    code waits before its first write (longer than RIDE_WAIT), so the claim goes alone.
    The run changed in between (another attempt journaled step 1 and released it): the
    attempt started on the read must not run on it (it would run step 1 again); a fresh
    one replays step 1 from the journal."""
    calls: list[int] = []
    registry = durable.Registry()
    gate = anyio.Event()

    @durable.activity("t.noop", registry=registry)
    async def noop(ctx: durable.ActivityContext, i: int) -> int:
        calls.append(i)
        return i

    @durable.workflow("t.gated", registry=registry)
    async def gated(ctx: durable.WorkflowContext) -> int:
        await gate.wait()  # workflow code before its first write, past RIDE_WAIT
        return await noop(ctx, 0) + await noop(ctx, 1)

    store = durable.store_from_url(pg_url)
    await store.open()
    try:
        client = durable.Client(store, registry=registry)
        await client.start(gated, id="g1")

        between_read_and_claim(store, partial(another_workers_attempt, store))
        async with running_worker(client, registry, concurrency=1):
            # the claim committed alone (by this worker, attempt 2), then the code goes on
            await poll(lambda: _claimed_by_a_worker(store, "g1"), timeout=20)
            gate.set()
            done = await client.wait("g1", timeout=20)
        assert done.state is RunState.COMPLETED and done.result == 1 and done.attempt == 2
        assert calls == [1]  # step 1 came from the journal; only step 2 ran here
    finally:
        await store.aclose()


async def _claimed_by_a_worker(store: durable.Store, run_id: str) -> bool:
    run = await store.get_run(run_id)
    return run is not None and run.attempt == 2 and run.state is RunState.RUNNING


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
