"""Store guarantees under faults (issue 8), on SQLite and PostgreSQL, asyncio and trio.

An interrupted run keeps its key, a pending cancel is never executed again, recoveries are
bounded, fencing tokens increase in their scope, ids are data, and records are written by
compare-and-set on the version a run read.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from pathlib import Path

import anyio
import pytest

import durable
import durable.testing
from durable._clock import FakeClock
from durable._errors import NotSentError, StaleRecordError, StoreUnavailableError
from durable._types import EntryKind, Fence, JournalWrite, NewRun, Run, RunState
from durable.store import Store, store_from_url
from durable.store._sqlite import SqliteStore
from tests.helpers import poll
from tests.test_store_contract import (
    LEASE,
    claim_one,
    clock,
    create,
    fence,
    journal_kinds,
    opened,
    pg_url,
    postgres_server,
    raw_execute,
    store,
    store_url,
)

__all__ = ["clock", "pg_url", "postgres_server", "store", "store_url"]  # fixtures

pytestmark = pytest.mark.anyio


def ids(runs: list[Run]) -> list[str]:
    return sorted(r.id for r in runs)


# -- 1. an interrupted run keeps its place on its key -------------------------------------------
async def test_a_released_run_keeps_its_key_against_a_later_run(store: Store,
                                                                 clock: FakeClock) -> None:
    await create(store, "reset", key="slot-1")
    reset = await claim_one(store)
    clock.advance(1)
    await create(store, "teardown", key="slot-1")  # queued while the reset runs
    clock.advance(1)
    assert await store.release(fence(reset), [JournalWrite(EntryKind.RUN_INTERRUPTED)])
    # The teardown's run_at is older than the released reset's: FIFO by run_at alone would
    # hand it the key. The reset has started, so it keeps the key.
    again = await store.claim("w2", LEASE, 10)
    assert ids(again) == ["reset"]
    assert again[0].attempt == 2
    assert await store.claim("w3", LEASE, 10) == []
    assert await store.finish(fence(again[0]), RunState.COMPLETED)
    assert ids(await store.claim("w3", LEASE, 10)) == ["teardown"]


async def test_a_recovered_run_keeps_its_key_against_a_later_run(store: Store,
                                                                  clock: FakeClock) -> None:
    await create(store, "reset", key="slot-1")
    reset = await claim_one(store)
    clock.advance(1)
    await create(store, "teardown", key="slot-1")
    clock.advance(LEASE)
    assert await store.recover_stale() == [fence(reset)]
    assert await store.claim("w2", LEASE, 10, run_id="teardown") == []
    assert ids(await store.claim("w2", LEASE, 10)) == ["reset"]


async def test_runs_that_never_started_are_served_fifo_per_key(store: Store,
                                                               clock: FakeClock) -> None:
    now = clock.now()
    # created first, due last
    assert (await store.create_run(NewRun("z-late", "wf", [], "k", now + 5)))[1]
    clock.advance(0.5)
    assert (await store.create_run(NewRun("y-first", "wf", [], "k", now)))[1]
    clock.advance(0.5)
    assert (await store.create_run(NewRun("a-second", "wf", [], "k", now)))[1]  # same run_at
    clock.advance(10)
    order = []
    while runs := await store.claim("w", LEASE, 10):
        assert len(runs) == 1
        order.append(runs[0].id)
        assert await store.finish(fence(runs[0]), RunState.COMPLETED)
    assert order == ["y-first", "a-second", "z-late"]  # run_at, then creation order


# -- 2. a pending cancel is never executed again ------------------------------------------------
async def test_release_of_a_run_with_a_pending_cancel_cancels_it(store: Store) -> None:
    await create(store, "r1", key="k")
    run = await claim_one(store)
    assert await store.request_cancel("r1") is not None
    assert await store.release(fence(run), [JournalWrite(EntryKind.RUN_INTERRUPTED)])
    done = await store.get_run("r1")
    assert done is not None and done.state is RunState.CANCELLED
    assert done.error is not None and "cancel" in done.error
    assert (await journal_kinds(store, "r1"))[-2:] == ["run_interrupted", "run_cancelled"]
    assert await store.claim("w2", LEASE, 10) == []
    await create(store, "next", key="k")  # the key is free again
    assert ids(await store.claim("w2", LEASE, 10)) == ["next"]


async def test_recovery_of_a_run_with_a_pending_cancel_cancels_it(store: Store,
                                                                   clock: FakeClock) -> None:
    await create(store, "r1")
    run = await claim_one(store)
    assert await store.request_cancel("r1") is not None
    clock.advance(LEASE + 1)
    assert await store.recover_stale() == [fence(run)]
    done = await store.get_run("r1")
    assert done is not None and done.state is RunState.CANCELLED
    assert (await journal_kinds(store, "r1"))[-2:] == ["run_recovered", "run_cancelled"]
    assert await store.claim("w2", LEASE, 10) == []


async def test_claim_reports_a_cancel_flag_that_is_still_set(store_url: str, store: Store,
                                                              clock: FakeClock) -> None:
    # A run queued with the flag set (a database written by an older durable): the claim
    # hands the flag to the attempt, which cancels without running code.
    await create(store, "r1")
    await anyio.to_thread.run_sync(
        raw_execute, store_url,
        "UPDATE durable_runs SET cancel_requested = "
        + ("1" if store_url.startswith("sqlite") else "true") + " WHERE id = 'r1'")
    run = await claim_one(store)
    assert run.cancel_requested


async def test_an_attempt_handed_a_cancel_flag_runs_no_workflow_code(
        store_url: str, clock: FakeClock, registry: durable.Registry) -> None:
    """The attempt's side of the claim above: a worker that claims a run with the flag set
    ends it cancelled before any workflow code runs (cancelled before this claim)."""
    ran: list[str] = []

    @durable.workflow("f.flagged", registry=registry)
    async def flagged(ctx: durable.WorkflowContext) -> str:
        ran.append("body")
        return "ran"

    async with durable.Client.connect(store_url, clock=clock, registry=registry) as client:
        await client.start("f.flagged", id="r1")
        await anyio.to_thread.run_sync(
            raw_execute, store_url,
            "UPDATE durable_runs SET cancel_requested = "
            + ("1" if store_url.startswith("sqlite") else "true") + " WHERE id = 'r1'")
        async with durable.testing.running_worker(client, registry=registry):
            done = await client.wait("r1", timeout=15)
        entries = await client.journal("r1")
    assert done.state is RunState.CANCELLED and ran == []
    assert [e.kind.value for e in entries][-2:] == ["run_claimed", "run_cancelled"]


# -- 11. recoveries are counted and bounded -----------------------------------------------------
async def test_recoveries_are_counted_and_bounded(store_url: str, clock: FakeClock) -> None:
    async with opened(store_url, clock, max_recoveries=2) as store:
        await create(store, "pill")
        for n in range(1, 4):
            run = await claim_one(store)
            assert run.recoveries == n - 1
            assert await store.append(fence(run), [JournalWrite(
                EntryKind.STEP_STARTED, step=1, step_key="1:kill", name="kill", try_number=n)])
            clock.advance(LEASE + 1)
            assert await store.recover_stale() == [fence(run)]
            after = await store.get_run("pill")
            assert after is not None and after.recoveries == n
            if n < 3:
                assert after.state is RunState.QUEUED
        assert after.state is RunState.FAILED
        assert after.error is not None
        assert "3 times" in after.error and "step 1 (kill)" in after.error, after.error
        assert (await journal_kinds(store, "pill"))[-2:] == ["run_recovered", "run_failed"]
        assert await store.claim("w", LEASE, 10) == []


async def test_max_recoveries_from_the_url(store_url: str, clock: FakeClock) -> None:
    sep = "&" if "?" in store_url else "?"
    store = store_from_url(f"{store_url}{sep}max_recoveries=0", clock=clock)
    await store.open()
    try:
        await create(store, "r1")
        await claim_one(store)
        clock.advance(LEASE + 1)
        assert len(await store.recover_stale()) == 1
        run = await store.get_run("r1")
        assert run is not None and run.state is RunState.FAILED
        assert run.error is not None and "no step was running" in run.error
    finally:
        await store.aclose()


# -- 4. fencing tokens increase within their scope ----------------------------------------------
async def test_fencing_scope_is_the_key_or_the_run(store: Store, clock: FakeClock) -> None:
    keyed = await create(store, "a", key="slot-1")
    unkeyed = await create(store, "b")
    assert keyed.fencing_scope == "key:slot-1"
    assert unkeyed.fencing_scope == "run:b"
    assert Run.scope_of("x", None) == "run:x" and Run.scope_of("x", "k") == "key:k"


async def test_tokens_strictly_increase_within_each_scope(store: Store,
                                                          clock: FakeClock) -> None:
    last: dict[str, int] = {}

    def check(runs: list[Run]) -> None:
        for r in runs:
            assert r.epoch > last.get(r.fencing_scope, 0), (r.id, r.epoch, last)
            last[r.fencing_scope] = r.epoch

    for i in range(4):
        await create(store, f"k{i}", key="K")
        await create(store, f"u{i}")
    await create(store, "other", key="L")
    for _ in range(12):
        runs = await store.claim("w", LEASE, 10)
        check(runs)
        for j, r in enumerate(runs):  # interrupt some, recover some, finish the rest
            if j % 3 == 0:
                assert await store.release(fence(r))
            elif j % 3 == 1:
                assert await store.finish(fence(r), RunState.COMPLETED)
        clock.advance(LEASE + 1)
        await store.recover_stale()
    assert set(last) >= {"key:K", "key:L", "run:u0"}


# -- 18. ids are data ----------------------------------------------------------------------------
# Each odd id starts with another run's id: a JSON path built from it would first find that
# run's entry, then fail to parse the rest ("JSON path error"), failing the whole renewal.
@pytest.mark.parametrize("odd", ['plain"uote', "plain'apos", "plain\\slash", "plain$",
                                 "plain.dot", "plain[0]", "plain\"'\\$.[*]", 'plain"]'])
async def test_odd_ids_do_not_break_other_runs_renewals(store: Store, odd: str) -> None:
    await create(store, "plain")
    await create(store, odd)
    runs = await store.claim("w1", LEASE, 10)
    assert ids(runs) == sorted(["plain", odd])
    renewed = await store.renew("w1", [fence(r) for r in runs], LEASE,
                                {r.id: {"at": r.id} for r in runs})
    assert sorted(r.run_id for r in renewed) == sorted(["plain", odd])
    for r in runs:  # every fenced write works with the id
        assert await store.put_records(fence(r), [(odd, odd, odd)],
                                       [JournalWrite(EntryKind.VALUE, data={"id": r.id})])
    rec = await store.get_record(odd, odd)
    assert rec is not None and rec.value == odd
    assert await store.request_cancel(odd) is not None


# -- records: compare-and-set on the version a run read -----------------------------------------
async def test_records_carry_versions_and_refuse_stale_writes(store: Store) -> None:
    await create(store, "a")
    a = await claim_one(store)
    assert await store.put_records(fence(a), [("slots", "s1", {"v": 1})],
                                   expected={("slots", "s1"): 0})  # create only
    first = await store.get_record("slots", "s1")
    assert first is not None and first.version == 1
    assert await store.put_records(fence(a), [("slots", "s1", {"v": 2})],
                                   expected={("slots", "s1"): 1})
    second = await store.get_record("slots", "s1")
    assert second is not None and (second.value, second.version) == ({"v": 2}, 2)

    before = await journal_kinds(store, "a")
    with pytest.raises(StaleRecordError, match=r"slots/s1.*version 1.*now 2"):
        await store.put_records(fence(a), [("slots", "other", 1), ("slots", "s1", {"v": 3})],
                                [JournalWrite(EntryKind.VALUE, data={"x": 1})],
                                expected={("slots", "s1"): 1})
    assert await store.get_record("slots", "other") is None  # nothing of the call
    assert await journal_kinds(store, "a") == before
    with pytest.raises(StaleRecordError):
        await store.put_records(fence(a), [("slots", "s1", 0)], expected={("slots", "s1"): 0})
    # A blind write (no expected version) and an unfenced seed still advance the version.
    assert await store.put_records(fence(a), [("slots", "s1", "blind")])
    assert await store.put_records(None, [("slots", "s1", "seed")])
    last = await store.get_record("slots", "s1")
    assert last is not None and (last.value, last.version) == ("seed", 4)
    # A fenced-out attempt gets False (not StaleRecordError), whatever the versions.
    assert not await store.put_records(Fence("a", a.epoch + 100), [("slots", "s1", 1)],
                                       expected={("slots", "s1"): 0})


async def test_tokens_of_unrelated_runs_do_not_fence_each_others_records(
        store: Store) -> None:
    await create(store, "older", key="slot-1")
    older = await claim_one(store)
    await create(store, "newer", key="slot-2")
    newer = await claim_one(store)
    assert newer.epoch > older.epoch
    assert await store.put_records(fence(newer), [("hooks", "shared", "newer")])
    # tokens are compared within a scope only: the older run (another key, still holding
    # its lease) is not fenced out of a record the newer one wrote
    assert await store.put_records(fence(older), [("hooks", "shared", "older")])
    rec = await store.get_record("hooks", "shared")
    assert rec is not None and (rec.value, rec.epoch) == ("older", older.epoch)


# -- 7. a write's outcome: not sent, or unknown ---------------------------------------------------
async def test_a_write_that_waited_in_vain_for_the_write_lock_is_not_sent_and_wrote_nothing(
        tmp_path: Path, clock: FakeClock) -> None:
    """Another process holds SQLite's write lock for longer than a write waits for it: the
    write's transaction never began, so it is NotSentError (to be tried again), not an
    outcome unknown; nothing of it is in the journal, and once the lock is free it goes
    through."""
    path = tmp_path / "busy.db"
    sqlite = SqliteStore(str(path), clock=clock, busy_timeout=0.05)
    sqlite._open_wait = 0.2  # how long a write waits for the lock (30 s at least otherwise)
    await sqlite.open()
    try:
        await create(sqlite, "r1")
        run = await claim_one(sqlite)
        entry = [JournalWrite(EntryKind.VALUE, data={"x": 1})]
        holder = sqlite3.connect(path, isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")
        try:
            with anyio.fail_after(10), pytest.raises(NotSentError, match="locked"):
                await sqlite.append(fence(run), entry)
        finally:
            holder.rollback()
            holder.close()
        assert "value" not in await journal_kinds(sqlite, "r1")
        assert await sqlite.append(fence(run), entry)
        assert (await journal_kinds(sqlite, "r1")).count("value") == 1
    finally:
        await sqlite.aclose()


class TakenOverDuringTheFinish(SqliteStore):
    """The first finish gets no answer (StoreUnavailableError, nothing of it written), and
    meanwhile the run was recovered and completed by another attempt, whose run_completed
    is in the journal under its own epoch."""

    armed = True

    async def finish(self, fence: Fence, state: RunState, *, result: durable.JSON = None,
                     error: str | None = None, entries: Sequence[JournalWrite] = ()) -> bool:
        if not self.armed:
            return await super().finish(fence, state, result=result, error=error,
                                        entries=entries)
        self.armed = False
        assert isinstance(self.clock, FakeClock)
        self.clock.advance(LEASE + 1)  # the attempt's lease lapsed in the store
        await self.recover_stale(fence.run_id, fence.epoch)
        [other] = await self.claim("other-worker", LEASE, 1, run_id=fence.run_id)
        assert await super().finish(Fence(other.id, other.epoch), RunState.COMPLETED,
                                    result="theirs",
                                    entries=[JournalWrite(EntryKind.RUN_COMPLETED)])
        raise StoreUnavailableError("the connection was lost with the finish sent")


async def test_a_finish_without_an_answer_is_not_confirmed_by_another_attempt_s_entry(
        tmp_path: Path, clock: FakeClock) -> None:
    """An attempt's finish gets no answer; the journal it reads to tell what happened holds
    run_completed, but written by another attempt (another epoch) that completed the run
    meanwhile. The attempt does not take that entry for its own: it says its outcome is
    unknown, never that the run completed with its result."""
    registry = durable.Registry()

    @durable.workflow("faults.mine", registry=registry)
    async def mine(ctx: durable.WorkflowContext) -> str:
        return "mine"

    sqlite = TakenOverDuringTheFinish(str(tmp_path / "taken.db"), clock=clock)
    await sqlite.open()
    client = durable.Client(sqlite, registry=registry)
    try:
        with durable.testing.capture_logs() as logs:
            async with durable.testing.running_worker(client, registry=registry,
                                                      concurrency=1):
                await client.start("faults.mine", id="m1")
                with anyio.fail_after(20):
                    run = await client.wait("m1")
                await poll(lambda: any(e["event"].startswith("conclude_")
                                       for e in logs))
        journal = await sqlite.journal("m1")
    finally:
        await sqlite.aclose()
    assert (run.state, run.result, run.epoch) == (RunState.COMPLETED, "theirs", 2)
    first = [e["event"] for e in logs if e.get("epoch") == 1]
    assert "conclude_outcome_unknown" in first, first
    assert "conclude_confirmed" not in first and "run_completed" not in first, first
    assert [e.kind for e in journal].count(EntryKind.RUN_COMPLETED) == 1
