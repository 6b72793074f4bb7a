"""When a worker claims (issue 10, target 6): after an attempt ends only when that end may
leave a run to claim, and, on PostgreSQL, not for a ``durable_work`` NOTIFY whose
transaction its last claim already saw. Every poll here is 60 s long, and where the
worker's own rule is tested the store's change signals are off, so each wake-up test
passes only if that rule claimed (none asserts a time); the counting tests fail if the
empty claims (one after each attempt, one on the run's own NOTIFY) come back."""

from __future__ import annotations

import collections
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

import durable
from durable import RunState
from durable.store import Store, store_from_url

from .helpers import poll
from .pg import pg_url, postgres_server
from .test_wake import worker_on

__all__ = ["pg_url", "postgres_server"]  # fixtures

pytestmark = pytest.mark.anyio

LONG = 60.0
BOUND = 20.0  # well below LONG: reaching it means a poll, not the rule, was needed

pg_only = pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
asyncio_only = pytest.mark.parametrize("anyio_backend", ["asyncio"])
"""A test that holds the store's own coroutines with the test's events, or reads with
psycopg's async API: on trio those run on the store's loop thread."""


@asynccontextmanager
async def opened(url: str, *, signals: bool = True) -> AsyncIterator[Store]:
    store = store_from_url(url)
    await store.open()
    if not signals:  # only the worker's own rules (and the in-process hub) are left
        store.pushes_changes = False  # type: ignore[misc]
    try:
        yield store
    finally:
        await store.aclose()


class Claims:
    """Counts what a worker does through a store object to take runs: claims (the plain
    statement, and claims riding on a first write), reads of what a claim would take, and
    every such look that returned (a claim or a read that found the key taken, say)."""

    def __init__(self, store: Store) -> None:
        self.started = 0
        """Claims sent (``claim`` and ``claim_with``)."""
        self.returned = 0
        """Claims and reads (``claimable``) that returned."""
        self.empty = 0
        self.reads = 0
        self.rides = 0
        """Claims riding on a first write (``claim_with``)."""
        claim, claim_with, claimable = store.claim, store.claim_with, store.claimable

        async def counted(*args: Any, **kwargs: Any) -> list[durable.Run]:
            self.started += 1
            try:
                runs = await claim(*args, **kwargs)
            finally:
                self.returned += 1
            self.empty += not runs
            return runs

        async def counted_ride(*args: Any, **kwargs: Any) -> Any:
            self.started += 1
            self.rides += 1
            try:
                outcome = await claim_with(*args, **kwargs)
            finally:
                self.returned += 1
            self.empty += outcome.run is None
            return outcome

        async def counted_read(*args: Any, **kwargs: Any) -> list[durable.Run]:
            self.reads += 1
            try:
                return await claimable(*args, **kwargs)
            finally:
                self.returned += 1

        store.claim = counted  # type: ignore[method-assign]
        store.claim_with = counted_ride  # type: ignore[method-assign]
        store.claimable = counted_read  # type: ignore[method-assign]


class NoRides(durable.Interceptor):
    """A pass-through write hook: with an interceptor the worker claims by the plain
    statement (no claim riding on a finish, SQLite's shortcut), as on PostgreSQL."""

    async def intercept_write(self, info: durable.WriteInfo,
                              call_next: Callable[[], Awaitable[bool]]) -> bool:
        return await call_next()


def gated_flows(registry: durable.Registry, gate: list[anyio.Event]) -> None:
    @durable.workflow("cw.gated", registry=registry)
    async def gated(ctx: durable.WorkflowContext) -> str:
        await gate[0].wait()
        return "done"

    @durable.workflow("cw.quick", registry=registry)
    async def quick(ctx: durable.WorkflowContext) -> str:
        return "quick"


async def running(client: durable.Client, run_id: str) -> None:
    await poll(lambda: _is(client, run_id, RunState.RUNNING))


async def _is(client: durable.Client, run_id: str, state: RunState) -> bool:
    return (await client.get(run_id)).state is state


# -- the claim after an attempt ends ------------------------------------------------------------
async def test_the_next_run_of_a_key_is_claimed_when_the_run_ahead_of_it_ends(
        tmp_path: Path, registry: durable.Registry) -> None:
    """The run ahead finishes: nothing else wakes the worker (no change signal, no
    start), and the last claim found nothing (the key was taken), yet the key's next run
    is claimed at once because the run that ended had a key."""
    gate = [anyio.Event()]
    gated_flows(registry, gate)
    async with opened(f"sqlite:///{tmp_path / 'w.db'}", signals=False) as store:
        claims = Claims(store)
        client = durable.Client(store, registry=registry)
        async with worker_on(store, registry, concurrency=4):
            with anyio.fail_after(BOUND):
                await client.start("cw.gated", id="ahead", key="k")
                await running(client, "ahead")
                seen = claims.returned
                await client.start("cw.quick", id="next", key="k")
                await poll(lambda: claims.returned > seen)  # its claim found the key taken
                assert (await client.get("next")).state is RunState.QUEUED
                gate[0].set()
                done = await client.wait("next", poll=LONG)
            assert done.state is RunState.COMPLETED


async def test_a_run_released_due_at_once_is_claimed_when_its_attempt_ends(
        tmp_path: Path, registry: durable.Registry) -> None:
    """A signal recorded between the wait's count and its release (sent on the store
    directly: no in-process wake) makes the released run due at once; the attempt's end
    claims it again (it was released, not finished)."""
    @durable.workflow("cw.waits", registry=registry)
    async def waits(ctx: durable.WorkflowContext) -> Any:
        return await ctx.wait_for("go")

    async with opened(f"sqlite:///{tmp_path / 'w.db'}", signals=False) as store:
        class SignalBeforeRelease(durable.Interceptor):
            sent = 0

            async def intercept_write(self, info: durable.WriteInfo,
                                      call_next: Callable[[], Awaitable[bool]]) -> bool:
                if info.kind == "release" and not self.sent:
                    self.sent += 1
                    await store.send_signal(info.run.id, "go", "went")
                return await call_next()

        hook = SignalBeforeRelease()
        client = durable.Client(store, registry=registry)
        async with worker_on(store, registry, durable_wait_threshold=0,
                             interceptors=[hook]):
            with anyio.fail_after(BOUND):
                await client.start("cw.waits", id="w")
                done = await client.wait("w", poll=LONG)
        assert hook.sent == 1
        assert done.state is RunState.COMPLETED and done.result == "went"
        assert done.attempt == 2  # released once, claimed again


async def test_a_run_queued_while_every_slot_was_taken_is_claimed_when_one_frees(
        tmp_path: Path, registry: durable.Registry) -> None:
    """Its start woke the worker while no slot was free; the slot's end claims it."""
    gate = [anyio.Event()]
    gated_flows(registry, gate)
    async with opened(f"sqlite:///{tmp_path / 'w.db'}", signals=False) as store:
        client = durable.Client(store, registry=registry)
        async with worker_on(store, registry, concurrency=1, interceptors=[NoRides()]):
            with anyio.fail_after(BOUND):
                await client.start("cw.gated", id="first")
                await running(client, "first")
                await client.start("cw.quick", id="queued")
                assert (await client.get("queued")).state is RunState.QUEUED
                gate[0].set()
                done = await client.wait("queued", poll=LONG)
            assert done.state is RunState.COMPLETED


async def test_a_run_started_while_handed_over_runs_took_every_slot_is_claimed_when_one_frees(
        tmp_path: Path, registry: durable.Registry) -> None:
    """Two starts handed over to a worker with two slots (each claimed without a read),
    then a third while both run: the claim that took the last slot counts as one that
    took all it could, so the first end claims the third run (no change signal, no poll)."""
    gate = [anyio.Event()]
    gated_flows(registry, gate)
    async with opened(f"sqlite:///{tmp_path / 'w.db'}", signals=False) as store:
        claims = Claims(store)
        client = durable.Client(store, registry=registry)
        async with worker_on(store, registry, concurrency=2):
            with anyio.fail_after(BOUND):
                await poll(lambda: claims.returned == 1)  # the worker's first look
                for run_id in ("a", "b"):
                    await client.start("cw.gated", id=run_id)
                    await running(client, run_id)
                await client.start("cw.quick", id="c")
                assert (await client.get("c")).state is RunState.QUEUED
                assert claims.reads == 0  # both handed over
                gate[0].set()
                done = await client.wait("c", poll=LONG)
            assert done.state is RunState.COMPLETED


async def test_a_wake_owed_while_a_carried_claim_held_the_slot_is_paid_at_the_next_end(
        tmp_path: Path, registry: durable.Registry) -> None:
    """One slot, three runs queued before the worker starts (so nothing wakes its claim
    loop while the slot is taken): the first run's finish carries the claim of the second
    (it rides on the finish, durable/_claims.py), so the first's end finds no slot free and
    owes its wake. The third is not due yet, so the second's finish carries no claim and
    says nothing more is queued; the second's end pays the owed wake, and the claim loop,
    woken, looks when the third is due and claims it then, not at the 60 s poll."""
    gates = {"first": anyio.Event(), "second": anyio.Event()}

    @durable.workflow("cw.held", registry=registry)
    async def held(ctx: durable.WorkflowContext, name: str) -> str:
        await gates[name].wait()
        return name

    @durable.workflow("cw.quick", registry=registry)
    async def quick(ctx: durable.WorkflowContext) -> str:
        return "quick"

    async with opened(f"sqlite:///{tmp_path / 'w.db'}", signals=False) as store:
        claims = Claims(store)
        client = durable.Client(store, registry=registry)
        await client.start(held, "first", id="first")
        await client.start(held, "second", id="second")
        await client.start(quick, id="later", delay=3.0)
        async with worker_on(store, registry, concurrency=1):
            with anyio.fail_after(BOUND):
                await running(client, "first")
                rides = claims.rides
                gates["first"].set()
                await running(client, "second")
                assert claims.rides > rides  # its claim rode on the first's finish
                gates["second"].set()
                assert (await client.wait("second", poll=LONG)).state is RunState.COMPLETED
                assert (await client.get("later")).state is RunState.QUEUED  # not due yet
                done = await client.wait("later", poll=LONG)
            assert done.state is RunState.COMPLETED


async def test_a_run_started_during_a_claim_that_missed_it_is_claimed_right_after(
        tmp_path: Path, registry: durable.Registry) -> None:
    """A start in this process wakes the worker while its claim statement is under way
    (it ran before the run existed): that claim ends without the run, and the worker
    claims again at once for it instead of waiting for its 60 s poll."""
    gate = [anyio.Event()]
    gate[0].set()
    gated_flows(registry, gate)
    async with opened(f"sqlite:///{tmp_path / 'w.db'}", signals=False) as store:
        in_claim, let_go = anyio.Event(), anyio.Event()
        claim = store.claim

        async def held_claim(*args: Any, **kwargs: Any) -> list[durable.Run]:
            runs = await claim(*args, **kwargs)
            if not let_go.is_set():  # the worker's first claim: held after its statement
                in_claim.set()
                await let_go.wait()
            return runs

        store.claim = held_claim  # type: ignore[method-assign]
        client = durable.Client(store, registry=registry)
        async with worker_on(store, registry, interceptors=[NoRides()]):
            with anyio.fail_after(BOUND):
                await in_claim.wait()
                await client.start("cw.quick", id="late")
                let_go.set()
                done = await client.wait("late", poll=LONG)
            assert done.state is RunState.COMPLETED


async def test_a_finished_run_without_a_key_claims_nothing_after_it(
        tmp_path: Path, registry: durable.Registry) -> None:
    """A chain of starts, each waited for (the in-process hub wakes the worker and hands
    it the run as created): one claim per run, riding on the run's first write, with no
    read of what is queued before it (nothing else woke the worker), and none after each
    attempt's end (it would find nothing)."""
    gate = [anyio.Event()]
    gate[0].set()
    gated_flows(registry, gate)
    async with opened(f"sqlite:///{tmp_path / 'w.db'}", signals=False) as store:
        claims = Claims(store)
        client = durable.Client(store, registry=registry)
        async with worker_on(store, registry):
            with anyio.fail_after(BOUND):
                await poll(lambda: claims.returned == 1)  # the worker's first look
                for i in range(20):
                    run = await client.start("cw.quick", id=f"q{i}")
                    assert (await client.wait(run.id, poll=LONG)).state is RunState.COMPLETED
        assert (claims.started, claims.reads) == (1 + 20, 0)


# -- PostgreSQL: a NOTIFY the last claim already saw ---------------------------------------------
async def chain(client: durable.Client, prefix: str, n: int) -> None:
    for i in range(n):
        run = await client.start("cw.quick", id=f"{prefix}{i}")
        assert (await client.wait(run.id, poll=LONG)).state is RunState.COMPLETED


@pg_only
@pytest.mark.parametrize("client_store", ["the worker's", "another"])
async def test_postgres_a_chain_claims_once_per_run(
        pg_url: str, registry: durable.Registry, client_store: str) -> None:
    """Start, wait, start the next, NOTIFY on. The client on the worker's store object:
    the in-process wake hands each run over, which is claimed riding on its first write
    without a read, and neither the run's own NOTIFY (its start was told to the worker
    here: Store.told_here) nor the attempt's end reads or claims again. On another store
    object (as in another process): only the NOTIFY wakes the worker, once per run, and
    it carries the run (schema 11): claimed riding on its first write without a read as
    well, and the attempt's end claims nothing."""
    gated_flows(registry, [anyio.Event()])
    async with opened(pg_url) as theirs, opened(pg_url) as other:
        mine = theirs if client_store == "the worker's" else other
        claims = Claims(theirs)
        client = durable.Client(mine, registry=registry)
        async with worker_on(theirs, registry):
            with anyio.fail_after(BOUND):
                await chain(client, "warm", 2)  # the listener's first subscription
                before, read, rode = claims.started, claims.reads, claims.rides
                await chain(client, "c", 40)
            made, reads = claims.started - before, claims.reads - read
        assert (made, claims.rides - rode, reads) == (40, 40, 0), claims.empty


@asyncio_only
async def test_postgres_a_start_s_notify_judged_before_its_insert_returned_is_no_news(
        pg_url: str, registry: durable.Registry) -> None:
    """The start's NOTIFY can reach the worker's listener before the insert's answer
    reaches the start (a loaded machine: about one run in five): the judgement then waits
    for the starts in flight, whose hand-over is about to be told (Store.told_here), and
    the chain still reads nothing. Here every insert's answer is held back until the
    listener has begun to judge its NOTIFY, so each NOTIFY comes first."""
    gated_flows(registry, [anyio.Event()])
    async with opened(pg_url) as store:
        claims = Claims(store)
        client = durable.Client(store, registry=registry)
        heard = anyio.Event()

        class Told(collections.OrderedDict[int, None]):
            def __contains__(self, txid: object) -> bool:
                heard.set()  # the listener judges a NOTIFY
                return super().__contains__(txid)

        store._told = Told()  # type: ignore[attr-defined]
        row = store._row  # type: ignore[attr-defined]

        holding: list[bool] = []  # from the warm-up's end: before, the listener may not yet listen

        async def held_back(query: str, params: Any) -> Any:
            found = await row(query, params)
            if query is insert_run and holding:
                with anyio.fail_after(BOUND):
                    await heard.wait()  # the listener judges the NOTIFY first
            return found

        from durable.store._postgres import Q
        insert_run = Q["insert_run"]
        store._row = held_back  # type: ignore[attr-defined]
        async with worker_on(store, registry):
            with anyio.fail_after(BOUND):
                await chain(client, "warm", 2)  # the listener's first subscription
                holding.append(True)
                before, read, rode = claims.started, claims.reads, claims.rides
                for i in range(10):
                    heard = anyio.Event()
                    run = await client.start("cw.quick", id=f"n{i}")
                    assert (await client.wait(run.id, poll=LONG)).state is RunState.COMPLETED
            made, reads = claims.started - before, claims.reads - read
        # each run claimed once, riding on its first write: not by a claim the NOTIFY woke
        assert (made, claims.rides - rode, reads) == (10, 10, 0)


@pg_only
async def test_postgres_a_key_freed_on_another_store_wakes_the_worker_of_the_next_run(
        pg_url: str, registry: durable.Registry) -> None:
    """The run ahead of the key runs on another store's worker (which cannot run the next
    run's workflow): its end's NOTIFY is news to this worker, whose last claim found the
    key taken, so it claims the next run without waiting for its poll."""
    gate = [anyio.Event()]
    theirs_only, mine_only = durable.Registry(), durable.Registry()

    @durable.workflow("cw.ahead", registry=theirs_only)
    async def ahead(ctx: durable.WorkflowContext) -> str:
        await gate[0].wait()
        return "ahead"

    @durable.workflow("cw.behind", registry=mine_only)
    async def behind(ctx: durable.WorkflowContext) -> str:
        return "behind"

    async with opened(pg_url) as mine, opened(pg_url) as theirs:
        claims = Claims(mine)
        client = durable.Client(mine, registry=registry)
        async with worker_on(theirs, theirs_only), worker_on(mine, mine_only):
            with anyio.fail_after(BOUND):
                await client.start("cw.ahead", id="ahead", key="k")
                await running(client, "ahead")
                seen = claims.returned
                await client.start("cw.behind", id="behind", key="k")
                await poll(lambda: claims.returned > seen)  # it found the key taken
                assert (await client.get("behind")).state is RunState.QUEUED
                gate[0].set()
                done = await client.wait("behind", poll=LONG)
            assert done.state is RunState.COMPLETED


@asyncio_only
async def test_postgres_a_snapshot_saw_only_the_transactions_committed_before_it(
        pg_url: str) -> None:
    """Snapshot.saw against the server: a transaction still open when the snapshot is
    taken is not seen, nor one that began after it; one committed before it is."""
    import psycopg

    from durable.store._postgres import Snapshot

    base = pg_url.split("?")[0]

    async def snapshot(conn: psycopg.AsyncConnection[Any]) -> Snapshot:
        cur = await conn.execute("SELECT txid_current_snapshot()::text")
        row = await cur.fetchone()
        assert row is not None
        return Snapshot.parse(row[0])

    async def txid(conn: psycopg.AsyncConnection[Any]) -> int:
        cur = await conn.execute("SELECT txid_current()")
        row = await cur.fetchone()
        assert row is not None
        return int(row[0])

    async with await psycopg.AsyncConnection.connect(base, autocommit=True) as looker, \
            await psycopg.AsyncConnection.connect(base) as writer:
        open_one = await txid(writer)  # a transaction, left open
        during = await snapshot(looker)
        await writer.commit()
        after = await snapshot(looker)
        later = await txid(writer)  # began after `after` was taken
        await writer.commit()
    assert not during.saw(open_one)
    assert after.saw(open_one)
    assert not after.saw(later)
    assert Snapshot.parse("10:20:12,15").saw(11)
    assert not any(Snapshot.parse("10:20:12,15").saw(t) for t in (12, 15, 20, 25))


@pg_only
async def test_an_idle_worker_ramps_its_claims_up_on_postgres(
        pg_url: str, registry: durable.Registry) -> None:
    """With more slots free than Store.claim_ramp, a worker claims at most that many runs,
    or twice what it holds, by one claim (a claim of 1,000 runs was one long statement
    with the worker idle), and goes on claiming at once while runs are left."""
    gate = [anyio.Event()]
    gated_flows(registry, gate)
    async with opened(pg_url) as store:
        store.claim_ramp = 3  # type: ignore[misc]  # (PostgresStore's: CLAIM_RAMP)
        limits: list[int] = []
        claim = store.claim

        async def recorded(worker: str, lease: float, limit: int,
                           **kwargs: Any) -> list[durable.Run]:
            limits.append(limit)
            return await claim(worker, lease, limit, **kwargs)

        store.claim = recorded  # type: ignore[method-assign]
        rode: list[str] = []
        claim_with = store.claim_with

        async def recorded_ride(worker: str, lease: float, run_id: str,
                                *args: Any, **kwargs: Any) -> Any:
            rode.append(run_id)
            return await claim_with(worker, lease, run_id, *args, **kwargs)

        store.claim_with = recorded_ride  # type: ignore[method-assign]
        client = durable.Client(store, registry=registry)
        for i in range(10):
            await client.start("cw.gated", id=f"g{i}")
        async with worker_on(store, registry, concurrency=10):
            with anyio.fail_after(BOUND):
                for i in range(10):
                    await running(client, f"g{i}")
                # the last run, for the one slot left, by a claim that rides on its
                # attempt's first write (Store.claim_with)
                assert (limits[:2], rode) == ([3, 6], ["g9"])
                gate[0].set()
                for i in range(10):
                    assert (await client.wait(f"g{i}", poll=LONG)).state is RunState.COMPLETED
