"""Nothing waits for a poll (issue 10, targets 3 and 6): every poll here is 60 s long, so
each test passes only if the change signal (in-process hub, SQLite ``data_version``) woke
the waiter; none asserts a time."""

from __future__ import annotations

import queue
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import pytest

import durable
from durable import RunState, _wake
from durable._types import NewRun
from durable.store import Store, store_from_url
from durable.store._sqlite import SqliteStore

from . import pgflows
from .conftest import ROOT, subprocess_env
from .helpers import poll
from .httpserver import LoopbackServer, Rule, loopback_server
from .pg import pg_url, postgres_server

__all__ = ["pg_url", "postgres_server"]  # fixtures

pytestmark = pytest.mark.anyio

LONG = 60.0
BOUND = 20.0  # well below LONG: reaching it means a poll, not a signal, was needed


@asynccontextmanager
async def opened(url: str) -> AsyncIterator[Store]:
    store = store_from_url(url)
    await store.open()
    try:
        yield store
    finally:
        await store.aclose()


@asynccontextmanager
async def worker_on(store: Store, registry: durable.Registry,
                    **options: Any) -> AsyncIterator[durable.Worker]:
    options.setdefault("poll_interval", LONG)
    worker = durable.Worker(store, registry=registry, **options)
    async with anyio.create_task_group() as tg:
        await tg.start(worker.run)
        try:
            yield worker
        finally:
            worker.shutdown(grace=0)


def flows(registry: durable.Registry) -> None:
    @durable.activity(registry=registry)
    async def add(ctx: durable.ActivityContext, a: int, b: int) -> int:
        return a + b

    @durable.workflow("wake.sum", registry=registry)
    async def total(ctx: durable.WorkflowContext) -> int:
        return await add(ctx, 1, 2) + await add(ctx, 3, 4)


async def test_in_process_start_is_claimed_and_wait_returns_without_a_poll(
        tmp_path: Path, registry: durable.Registry) -> None:
    flows(registry)
    async with opened(f"sqlite:///{tmp_path / 'w.db'}") as store:
        store.pushes_changes = False  # type: ignore[misc]  # only the in-process hub is left
        client = durable.Client(store, registry=registry)
        async with worker_on(store, registry):
            with anyio.fail_after(BOUND):
                for i in range(3):
                    run = await client.start("wake.sum", id=f"r{i}")
                    done = await client.wait(run.id, poll=LONG)
                    assert done.state is RunState.COMPLETED and done.result == 10


async def test_another_store_is_woken_by_data_version(
        tmp_path: Path, registry: durable.Registry) -> None:
    """Client and worker on two store objects: no hub between them, only the commits."""
    flows(registry)
    url = f"sqlite:///{tmp_path / 'w.db'}"
    async with opened(url) as mine, opened(url) as theirs:
        client = durable.Client(mine, registry=registry)
        async with worker_on(theirs, registry):
            with anyio.fail_after(BOUND):
                for i in range(3):
                    run = await client.start("wake.sum", id=f"r{i}")
                    done = await client.wait(run.id, poll=LONG)
                    assert done.state is RunState.COMPLETED


class TellingStore(SqliteStore):
    """A store whose commits would not tell other processes: it overrides notify_finished,
    which records the runs it is told of."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.told: list[str] = []

    async def notify_finished(self, run_id: str) -> None:
        self.told.append(run_id)


async def test_notify_finished_is_called_only_where_a_store_overrides_it(
        tmp_path: Path, registry: durable.Registry, pg_url: str) -> None:
    """The worker tells a store that overrides notify_finished of each finished run, after
    the finish; the two stores signal by their commits and do not override it, so their
    runs cost no bound and no call for it."""
    flows(registry)
    store = TellingStore(str(tmp_path / "t.db"))
    await store.open()
    try:
        client = durable.Client(store, registry=registry)
        async with worker_on(store, registry):
            with anyio.fail_after(BOUND):
                for i in range(3):
                    await client.start("wake.sum", id=f"r{i}")
                    assert (await client.wait(f"r{i}", poll=LONG)).state is RunState.COMPLETED
                await poll(lambda: len(store.told) == 3, timeout=BOUND)
        assert store.told == ["r0", "r1", "r2"]
    finally:
        await store.aclose()
    for url in (f"sqlite:///{tmp_path / 's.db'}", pg_url):
        plain = store_from_url(url)
        assert type(plain).notify_finished is Store.notify_finished, url
        assert not durable.Worker(plain, registry=registry)._notifies


async def test_a_lost_signal_ends_in_the_fallback_poll(
        tmp_path: Path, registry: durable.Registry) -> None:
    """A client whose store gives no signal still sees the finish, at its fallback poll."""
    flows(registry)
    url = f"sqlite:///{tmp_path / 'w.db'}"
    async with opened(url) as mine, opened(url) as theirs:
        mine.pushes_changes = False  # type: ignore[misc]
        client = durable.Client(mine, registry=registry)
        async with worker_on(theirs, registry):
            run = await client.start("wake.sum", id="r")
            with anyio.fail_after(BOUND):
                done = await client.wait(run.id, poll=0.05)
            assert done.state is RunState.COMPLETED


async def _cancel_a_hanging_request(server: LoopbackServer, client_store: Store,
                                    worker_store: Store, registry: durable.Registry,
                                    renew_every: float = 50.0, poll: float = LONG
                                    ) -> durable.Run:
    """A run whose step hangs in ``ctx.http.get``, on a worker with a 60 s lease renewed
    every ``renew_every`` s (50: within BOUND, no renewal can carry the cancel); the client
    cancels once the server saw the request; the server must see the connection close."""
    server.on("/hang", Rule(hang=True))

    @durable.activity(registry=registry)
    async def call(ctx: durable.ActivityContext) -> None:
        await ctx.http.get(f"{server.url}/hang")

    @durable.workflow("wake.hang", registry=registry)
    async def hanging(ctx: durable.WorkflowContext) -> None:
        await call(ctx)

    client = durable.Client(client_store, registry=registry)
    async with worker_on(worker_store, registry, lease=LONG, heartbeat_interval=renew_every,
                         poll_interval=poll):
        with anyio.fail_after(BOUND):
            run = await client.start("wake.hang", id="h")
            await server.wait_for(lambda: bool(server.seen("/hang")), timeout=BOUND)
            [seen] = server.seen("/hang")
            await client.cancel(run.id)
            await server.wait_for(lambda: seen.disconnected_at is not None, timeout=BOUND)
            return await client.wait(run.id, poll=LONG)


async def test_cancel_reaches_the_request_in_flight_by_the_change_signal(
        tmp_path: Path, registry: durable.Registry) -> None:
    """Lease 60 s, renewals every 50 s: only the change signal can stop the request."""
    url = f"sqlite:///{tmp_path / 'w.db'}"
    async with loopback_server() as server, opened(url) as mine, opened(url) as theirs:
        done = await _cancel_a_hanging_request(server, mine, theirs, registry)
    assert done.state is RunState.CANCELLED


async def test_in_process_cancel_reaches_the_attempt_by_the_hub(
        tmp_path: Path, registry: durable.Registry) -> None:
    """The store's own signal off, renewals every 50 s: only the hub can deliver it."""
    url = f"sqlite:///{tmp_path / 'w.db'}"
    async with loopback_server() as server, opened(url) as store:
        store.pushes_changes = False  # type: ignore[misc]
        done = await _cancel_a_hanging_request(server, store, store, registry)
    assert done.state is RunState.CANCELLED


async def test_with_no_change_signal_the_renewal_carries_the_cancel(
        tmp_path: Path, registry: durable.Registry) -> None:
    """The fallback: the worker's store gives no change signal and the operator's client
    is on another store object (no hub in common), so only the cancel flag in the answer to
    a renewal (every 0.2 s here) can stop the request in flight. (The worker finds the run
    by its poll, every 0.2 s: a claim's poll reads no cancel flags.)"""
    url = f"sqlite:///{tmp_path / 'w.db'}"
    async with loopback_server() as server, opened(url) as mine, opened(url) as theirs:
        theirs.pushes_changes = False  # type: ignore[misc]
        done = await _cancel_a_hanging_request(server, mine, theirs, registry,
                                               renew_every=0.2, poll=0.2)
    assert done.state is RunState.CANCELLED


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
async def test_a_worker_in_another_process_is_woken(
        tmp_path: Path, backend: str, anyio_backend: str,
        request: pytest.FixtureRequest) -> None:
    """``durable worker --poll 60`` in a subprocess claims at once; the wait returns
    (PostgreSQL: by NOTIFY durable_work and durable_done)."""
    url = store_url(backend, tmp_path, anyio_backend, request)
    async with opened(url) as store:
        client = durable.Client(store)
        with worker_process(url):
            with anyio.fail_after(BOUND):
                for i in range(3):
                    run = await client.start(pgflows.three, str(tmp_path), id=f"p{i}")
                    done = await client.wait(run.id, poll=LONG)
                    assert done.state is RunState.COMPLETED


def store_url(backend: str, tmp_path: Path, anyio_backend: str,
              request: pytest.FixtureRequest) -> str:
    """A SQLite file in ``tmp_path``, or the test's PostgreSQL schema."""
    if backend == "postgres":
        return str(request.getfixturevalue("pg_url"))
    return f"sqlite:///{tmp_path / 'w.db'}"


@contextmanager
def worker_process(url: str, *options: str) -> Iterator[None]:
    """``durable worker --poll 60`` on ``url`` in a subprocess (tests.pgflows), for the
    block."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "durable", "worker", "--db", url, "--import",
         "tests.pgflows", "--poll", str(LONG), "--log-level", "error", *options],
        cwd=ROOT, env=subprocess_env(), stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL)
    try:
        yield
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# -- a run not due yet: the worker wakes when it is due, not at its next poll --------------------
@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
@pytest.mark.parametrize("where", ["here", "process"])
@pytest.mark.parametrize("due", ["delayed start", "released sleep", "released retry"])
async def test_a_run_not_due_yet_is_claimed_when_it_is_due_not_at_the_poll(
        tmp_path: Path, backend: str, where: str, due: str, anyio_backend: str,
        request: pytest.FixtureRequest) -> None:
    """A start with a delay, a durable sleep and a retry delay longer than the wait
    threshold (the attempt releases the run, due again at the sleep's or the delay's end):
    a worker whose poll is 60 s, in this process or in another (``durable worker --poll
    60``), claims each when it becomes due. Nothing else changes meanwhile, so no change
    signal wakes it: before, each waited for the poll. 0.4 s each, three in a row, bounded
    by 20 s."""
    url = store_url(backend, tmp_path, anyio_backend, request)
    seconds = 0.4

    async def three_in_a_row(client: durable.Client) -> None:
        with anyio.fail_after(BOUND):
            for i in range(3):
                if due == "delayed start":
                    run = await client.start(pgflows.three, str(tmp_path), id=f"d{i}",
                                             delay=seconds)
                elif due == "released sleep":
                    run = await client.start(pgflows.nap, str(tmp_path), seconds, id=f"d{i}")
                else:  # pg.flaky's retry is due 0.4 s after its first try failed
                    run = await client.start(pgflows.retried, str(tmp_path), id=f"d{i}")
                done = await client.wait(run.id, poll=LONG)
                assert done.state is RunState.COMPLETED, done
                journal = [e.kind.value for e in await client.journal(run.id)]
                if due != "delayed start":  # released, then claimed again: two attempts
                    assert "run_waiting" in journal and done.attempt == 2, (journal, done)

    async with opened(url) as store:
        client = durable.Client(store)
        if where == "here":
            async with worker_on(store, durable.default_registry,
                                 durable_wait_threshold=0.1):
                await three_in_a_row(client)
            return
        with worker_process(url, "--wait-threshold", "0.1"):
            await three_in_a_row(client)


# -- PostgreSQL: the finish hands the run over, and its statement sends the NOTIFY --------------
pg_only = pytest.mark.parametrize(
    "anyio_backend", ["asyncio", "trio"])


@pg_only
async def test_postgres_in_process_wait_takes_the_finished_run_from_the_finish(
        pg_url: str, registry: durable.Registry) -> None:
    """The worker's finish returns the run's row and hands it to this process's waits:
    they return it without reading the run again (one round trip less), for a finish sent
    alone and for finishes sent together (group commit's finish_batch)."""
    go = anyio.Event()

    @durable.workflow("wake.gated", registry=registry)
    async def gated(ctx: durable.WorkflowContext) -> str:
        await go.wait()
        return "done"

    async with opened(pg_url) as store:
        # only the hub wakes the waits (no NOTIFY): a read after the finish could only
        # be the wait reading the run again
        store.pushes_changes = False  # type: ignore[misc]
        reads: list[str] = []
        real_get = store.get_run

        async def get_run(run_id: str) -> durable.Run | None:
            reads.append(run_id)
            return await real_get(run_id)

        store.get_run = get_run  # type: ignore[method-assign]
        client = durable.Client(store, registry=registry)
        async with worker_on(store, registry):
            for size in (1, 4):
                go = anyio.Event()
                reads.clear()
                ids = [f"g{size}-{i}" for i in range(size)]
                done: dict[str, durable.Run] = {}

                async def wait(run_id: str, into: dict[str, durable.Run] = done) -> None:
                    into[run_id] = await client.wait(run_id, poll=LONG)

                with anyio.fail_after(BOUND):
                    for run_id in ids:
                        await client.start("wake.gated", id=run_id)
                    async with anyio.create_task_group() as tg:
                        for run_id in ids:
                            tg.start_soon(wait, run_id)
                        await poll(lambda n=size: len(reads) == n)  # each wait's first read

                        async def held(ids: list[str] = ids) -> bool:
                            # every claim committed: no finish rides on one (claim_with)
                            runs = [await real_get(i) for i in ids]
                            return all(r is not None and r.state is RunState.RUNNING
                                       for r in runs)
                        await poll(held)
                        batched = store.batched_writes - store.batches
                        go.set()
                assert sorted(reads) == ids  # and no read after the finish
                for run_id in ids:
                    assert done[run_id].state is RunState.COMPLETED
                    assert done[run_id] == await real_get(run_id)
            assert store.batched_writes - store.batches > batched  # a finish_batch came
        hub = _wake.hub(store)
        assert hub.waited == {} and hub.settled == {}


@pg_only
async def test_postgres_a_cancel_of_a_queued_run_wakes_another_processes_wait(
        pg_url: str, registry: durable.Registry) -> None:
    """The cancel's statement sends NOTIFY durable_done: a wait on another store object
    (as in another process) returns without its 60 s fallback poll."""
    flows(registry)
    async with opened(pg_url) as mine, opened(pg_url) as theirs:
        waiter = durable.Client(mine, registry=registry)
        operator = durable.Client(theirs, registry=registry)
        run = await operator.start("wake.sum", id="later", delay=3600)
        read = anyio.Event()
        real_get = mine.get_run

        async def get_run(run_id: str) -> durable.Run | None:
            found = await real_get(run_id)
            read.set()
            return found

        mine.get_run = get_run  # type: ignore[method-assign]
        result: list[durable.Run] = []

        async def wait() -> None:
            result.append(await waiter.wait(run.id, poll=LONG))

        with anyio.fail_after(BOUND):
            async with anyio.create_task_group() as tg:
                tg.start_soon(wait)
                await read.wait()  # the wait saw the run queued: now only a signal helps
                await operator.cancel(run.id)
        assert result[0].state is RunState.CANCELLED


async def test_a_patient_waiter_lets_the_watcher_look_less_often_while_its_process_commits(
        tmp_path: Path, registry: durable.Registry) -> None:
    """A process's own commits change ``data_version`` for its watcher too. While the process
    commits and every waiter is patient (a worker with no free slot), the looks are
    CHANGE_POLL_OWN apart instead of CHANGE_POLL (a sequential worker woke its event loop at
    every 2 ms look otherwise); another process's commits, an impatient waiter, or the end of
    its own commits bring the 2 ms looks back. Every change is still signalled. The
    watcher's looks are stepped one by one (its pause waits for the test), so what happens
    before each look is chosen by the test."""
    flows(registry)
    url = f"sqlite:///{tmp_path / 'w.db'}"
    async with opened(url) as mine, opened(url) as theirs:
        watcher = mine.change_watcher()
        assert watcher is not None
        pauses: queue.Queue[float] = queue.Queue()
        go: queue.Queue[None] = queue.Queue()
        real_pause = watcher._pause

        def stepped_pause(seconds: float) -> None:
            pauses.put(seconds)
            go.get()

        watcher._pause = stepped_pause  # type: ignore[method-assign]
        clients = {"mine": durable.Client(mine, registry=registry),
                   "theirs": durable.Client(theirs, registry=registry)}
        started = 0

        async def look(*committers: str) -> tuple[float, int]:
            """One look of the watcher after these commits: the pause it takes next, and
            the changes it signalled."""
            nonlocal started
            for name in committers:
                await clients[name].start("wake.sum", id=f"r{started}")
                started += 1
            before = watcher.count
            go.put(None)  # the watcher looks, signals (or not), then pauses again
            pause = await anyio.to_thread.run_sync(pauses.get)
            return pause, watcher.count - before

        async def keep_waiting(patient: bool) -> None:
            seen = watcher.count
            while True:
                seen = await watcher.wait(seen, LONG, patient=patient)

        own, poll_ = _wake.CHANGE_POLL_OWN, _wake.CHANGE_POLL
        try:
            with anyio.fail_after(BOUND):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(keep_waiting, True)
                    await anyio.to_thread.run_sync(pauses.get)  # the first pause
                    assert await look("theirs") == (poll_, 1)
                    assert await look("mine") == (own, 1)
                    assert await look("mine") == (own, 1)
                    assert await look("mine", "theirs") == (own, 1)  # it cannot tell
                    assert await look("theirs") == (poll_, 1)
                    assert await look("mine") == (own, 1)
                    assert await look() == (poll_, 0)  # it stopped committing
                    # an impatient waiter (a client waiting for a run): 2 ms looks
                    impatient = anyio.CancelScope()

                    async def wait_impatiently() -> None:
                        with impatient:
                            await keep_waiting(False)

                    tg.start_soon(wait_impatiently)
                    await poll(lambda: watcher._impatient == 1, timeout=BOUND)
                    assert await look("mine") == (poll_, 1)
                    impatient.cancel()
                    await poll(lambda: watcher._impatient == 0, timeout=BOUND)
                    assert await look("mine") == (own, 1)
                    tg.cancel_scope.cancel()
        finally:  # the watcher's thread goes on as usual (the store's close joins it)
            watcher._pause = real_pause  # type: ignore[method-assign]
            go.put(None)


async def test_an_impatient_waiter_cuts_a_long_pause_short(tmp_path: Path) -> None:
    """An impatient waiter ends a long pause, at the earliest where a CHANGE_POLL pause would
    have ended (a look at once mostly sees the commit that waiter just made)."""
    async with opened(f"sqlite:///{tmp_path / 'w.db'}") as store:
        watcher = store.change_watcher()
        assert watcher is not None
        with anyio.fail_after(BOUND):
            async with anyio.create_task_group() as tg:
                tg.start_soon(partial(anyio.to_thread.run_sync, watcher._pause, LONG,
                                      abandon_on_cancel=True))
                await watcher.wait(watcher.count, 0.001)  # impatient, gone at once
            # nudged before it began: it still lasts a CHANGE_POLL pause (a lower bound on
            # a sleep, which never ends early)
            watcher._nudge.set()
            began = time.monotonic()
            await anyio.to_thread.run_sync(watcher._pause, LONG, abandon_on_cancel=True)
            assert time.monotonic() - began >= _wake.CHANGE_POLL


@pytest.mark.parametrize(("concurrency", "impatient"), [(1, 0), (2, 1)])
async def test_a_worker_waits_patiently_only_with_no_free_slot(
        tmp_path: Path, registry: durable.Registry, concurrency: int, impatient: int) -> None:
    """The worker's wait for work is patient while all its slots are taken (only a cancel
    can matter then), impatient with a slot free (new work is wanted at once)."""
    release = anyio.Event()

    @durable.activity(registry=registry)
    async def hold(ctx: durable.ActivityContext) -> None:
        await release.wait()

    @durable.workflow("wake.hold", registry=registry)
    async def holding(ctx: durable.WorkflowContext) -> None:
        await hold(ctx)

    async with opened(f"sqlite:///{tmp_path / 'w.db'}") as store:
        watcher = store.change_watcher()
        assert watcher is not None
        client = durable.Client(store, registry=registry)
        async with worker_on(store, registry, concurrency=concurrency) as worker:
            await client.start("wake.hold", id="held")
            # the notify loop waiting (its only waiter), as it waits with the run held
            await poll(lambda: bool(worker.active) and watcher._waiters == 1
                       and watcher._impatient == impatient, timeout=BOUND)
            release.set()
            await client.wait("held", poll=LONG)


async def test_a_commit_while_the_watcher_thread_slept_is_not_lost_at_its_restart(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The watcher's thread ends once nobody waited for a while; another process commits
    before the next wait restarts it. The restart reads its baseline after that commit, so
    it counts one change for whatever it may have missed: the worker's wait for work
    returns at once instead of sleeping through its 60 s fallback poll."""
    monkeypatch.setattr(_wake, "WATCH_IDLE_STOP", 0.05)
    url = f"sqlite:///{tmp_path / 'w.db'}"
    async with opened(url) as mine, opened(url) as theirs:
        watcher = mine.change_watcher()
        assert watcher is not None
        await mine.wait_for_work(0.0)  # the first wait returns at once: changes since then
        await poll(lambda: watcher._thread is not None and not watcher._thread.is_alive())
        await theirs.create_run(NewRun("queued-meanwhile", "wake.sum", [], None, None))
        with anyio.fail_after(BOUND):
            assert await mine.wait_for_work(LONG) is None
