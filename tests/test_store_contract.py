"""The store contract: one suite, run against every store (SQLite and PostgreSQL).

Each test runs on asyncio and trio (``anyio_backend`` from conftest) for every store in the
``store`` fixture's params. PostgreSQL needs a server at ``PG_URL`` (the tests skip with the
reason when there is none); on trio it runs on an asyncio loop of its own, in a thread
(durable/store/_loop.py), so every combination runs.
Every PostgreSQL test gets its own schema, dropped at teardown.
"""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import anyio
import pytest

from durable._clock import FakeClock
from durable._errors import ConfigError, SchemaVersionError, StoreUnavailableError
from durable._types import EntryKind, Fence, Finish, JournalWrite, NewRun, Run, RunState
from durable.store import SCHEMA_VERSION, Store, store_from_url
from tests.helpers import at_schema, kinds, poll
from tests.pg import connect_sync, pg_url, postgres_server, psycopg, split_url

__all__ = ["pg_url", "postgres_server"]  # the PostgreSQL fixtures and PG_URL: tests/pg.py

pytestmark = pytest.mark.anyio

LEASE = 30.0


# -- fixtures ------------------------------------------------------------------------------------
@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path, anyio_backend: str) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'contract.db'}"
    return str(request.getfixturevalue("pg_url"))


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@asynccontextmanager
async def opened(url: str, clock: FakeClock, **options: Any) -> AsyncIterator[Store]:
    store = store_from_url(url, clock=clock, **options)
    await store.open()
    try:
        yield store
    finally:
        await store.aclose()


@asynccontextmanager
async def many(url: str, clock: FakeClock, n: int) -> AsyncIterator[list[Store]]:
    """``n`` stores on one database, as ``n`` worker processes would have."""
    async with AsyncExitStack() as stack:
        yield [await stack.enter_async_context(opened(url, clock)) for _ in range(n)]


@pytest.fixture
async def store(store_url: str, clock: FakeClock) -> AsyncIterator[Store]:
    async with opened(store_url, clock) as s:
        yield s


def raw_execute(url: str, statement: str) -> None:
    """Run one statement on the store's database directly, outside the store."""
    if url.startswith("sqlite:///"):
        conn = sqlite3.connect(url[len("sqlite:///"):])
        try:
            conn.execute(statement)
            conn.commit()
        finally:
            conn.close()
        return
    base, _, query = url.partition("?")
    schema = parse_qs(query)["schema"][0]
    with psycopg.connect(base, autocommit=True, options=f"-c search_path={schema}") as pg:
        pg.execute(statement.encode())


def raw_errors() -> tuple[type[Exception], ...]:
    return (sqlite3.DatabaseError,) if psycopg is None else (sqlite3.DatabaseError, psycopg.Error)


# -- helpers -------------------------------------------------------------------------------------
async def create(store: Store, run_id: str, *, key: str | None = None, workflow: str = "wf",
                 delay: float = 0.0) -> Run:
    run, created = await store.create_run(
        NewRun(run_id, workflow, [run_id], key, store.clock.now() + delay))
    assert created
    return run


async def claim_one(store: Store, worker: str = "w1") -> Run:
    runs = await store.claim(worker, LEASE, 1)
    assert len(runs) == 1, runs
    return runs[0]


def fence(run: Run) -> Fence:
    return Fence(run.id, run.epoch)


STEP = JournalWrite(EntryKind.STEP_STARTED, step=1, step_key="1:charge", name="charge",
                    try_number=1)
DONE = JournalWrite(EntryKind.STEP_COMPLETED, step=1, step_key="1:charge", name="charge",
                    try_number=1, data={"result": 42})


async def journal_kinds(store: Store, run_id: str) -> list[str]:
    return kinds(await store.journal(run_id))


# -- creating and reading runs ------------------------------------------------------------------
async def test_create_is_idempotent_by_id(store: Store) -> None:
    first, created = await store.create_run(NewRun("r1", "wf", [1, "a"], "k", 5.0, timeout=9.0))
    assert created
    assert (first.state, first.epoch, first.attempt, first.args) == (RunState.QUEUED, 0, 0,
                                                                     [1, "a"])
    again, created = await store.create_run(NewRun("r1", "other", [2], None, 7.0))
    assert not created
    assert again == first
    assert await store.get_run("r1") == first
    assert await store.get_run("missing") is None
    entries = await store.journal("r1")
    assert kinds(entries) == ["run_created"]
    assert entries[0].data == {"workflow": "wf", "args": [1, "a"], "key": "k", "run_at": 5.0}


async def test_create_keeps_the_clients_headers_in_the_created_entry(store: Store) -> None:
    headers = {"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"}
    await store.create_run(NewRun("h1", "wf", [], None, 5.0, headers=headers))
    [created] = await store.journal("h1")
    assert created.data["headers"] == headers and created.data["workflow"] == "wf"


async def test_queue_stats_count_due_runs_per_workflow(store: Store, clock: FakeClock) -> None:
    assert await store.queue_stats() == {}
    now = clock.now()
    await store.create_run(NewRun("q1", "a", [], None, now - 30.0))
    await store.create_run(NewRun("q2", "a", [], None, now - 5.0))
    await store.create_run(NewRun("q3", "b", [], None, now))
    await store.create_run(NewRun("q4", "b", [], None, now + 60.0))  # not due yet
    await store.create_run(NewRun("q5", "c", [], None, now - 99.0))
    assert len(await store.claim("w", 30.0, 1, run_id="q5")) == 1  # running: not queued
    assert await store.queue_stats() == {"a": (2, 30.0), "b": (1, 0.0)}
    clock.advance(61.0)
    assert await store.queue_stats() == {"a": (2, 91.0), "b": (2, 61.0)}


async def test_list_latest_and_next_run_at(store: Store, clock: FakeClock) -> None:
    assert await store.next_run_at() is None
    await create(store, "a", key="k", delay=50)
    clock.advance(1)
    await create(store, "b", key="k", workflow="other", delay=10)
    clock.advance(1)
    await create(store, "c", key="k")
    assert [r.id for r in await store.list_runs()] == ["c", "b", "a"]
    assert [r.id for r in await store.list_runs(workflow="wf", limit=1)] == ["c"]
    assert [r.id for r in await store.list_runs(state=RunState.RUNNING)] == []
    latest = await store.latest_run("wf", "k")
    assert latest is not None and latest.id == "c"
    assert await store.latest_run("wf", "nope") is None
    assert await store.next_run_at() == clock.now()


async def test_next_due_in_is_the_wait_until_the_earliest_run_not_due_yet(
        store: Store, clock: FakeClock) -> None:
    """The worker's wait for a run not due yet (Worker._next_due): seconds by the store's
    clock, of the given workflows only; a due run, a running one and a finished one are not
    waited for."""
    assert await store.next_due_in(["wf"]) is None
    await create(store, "due")  # due now: the claim's, not a wait's
    assert await store.next_due_in(["wf"]) is None
    await create(store, "later", delay=30)
    await create(store, "other", workflow="other", delay=5)
    await create(store, "sooner", delay=12)
    assert await store.next_due_in(["wf"]) == pytest.approx(12)
    assert await store.next_due_in(["other", "wf"]) == pytest.approx(5)
    assert await store.next_due_in(None) == pytest.approx(5)
    assert await store.next_due_in(["none"]) is None
    clock.advance(12)  # "sooner" is due now: "later" is next, 18 s on
    assert await store.next_due_in(["wf"]) == pytest.approx(18)
    claimed = await store.claim("w", 30.0, 10, workflows=["wf"])
    assert {r.id for r in claimed} == {"due", "sooner"}
    assert await store.next_due_in(["wf"]) == pytest.approx(18)
    clock.advance(18)
    assert await store.next_due_in(["wf"]) is None


# -- claiming ------------------------------------------------------------------------------------
async def test_claim_exactly_once_under_concurrent_claims(store_url: str, clock: FakeClock,
                                                          store: Store) -> None:
    await create(store, "r1")
    results: list[list[Run]] = []
    go = anyio.Event()

    async def claim(worker: Store, name: str) -> None:
        await go.wait()
        results.append(await worker.claim(name, LEASE, 1))

    async with many(store_url, clock, 5) as workers:
        async with anyio.create_task_group() as tg:
            for i, worker in enumerate(workers):
                tg.start_soon(claim, worker, f"w{i}")
            go.set()
    claimed = [run for runs in results for run in runs]
    assert len(results) == 5
    assert [r.id for r in claimed] == ["r1"]
    assert (await journal_kinds(store, "r1")).count("run_claimed") == 1
    run = await store.get_run("r1")
    assert run is not None and run.state is RunState.RUNNING and run.worker == claimed[0].worker


async def test_competing_workers_take_each_run_once_with_distinct_epochs(
        store_url: str, clock: FakeClock, store: Store) -> None:
    for i in range(20):
        await create(store, f"r{i:02}")
    taken: list[Run] = []
    epochs_per_claim: list[set[int]] = []

    async def drain(worker: Store, name: str) -> None:
        while runs := await worker.claim(name, LEASE, 3):
            taken.extend(runs)
            epochs_per_claim.append({r.epoch for r in runs})

    async with many(store_url, clock, 4) as workers, anyio.create_task_group() as tg:
        for i, worker in enumerate(workers):
            tg.start_soon(drain, worker, f"w{i}")
    assert sorted(r.id for r in taken) == [f"r{i:02}" for i in range(20)]
    # Fencing tokens of different claims never collide (PostgreSQL also gives every run of
    # one claim its own epoch; SQLite gives the runs of one claim statement the same one).
    all_epochs = [e for epochs in epochs_per_claim for e in epochs]
    assert len(all_epochs) == len(set(all_epochs)) and min(all_epochs) > 0
    assert all(r.attempt == 1 and r.lease_expires_at == clock.now() + LEASE for r in taken)


async def test_finished_runs_are_never_claimed(store: Store) -> None:
    for name, state in [("done", RunState.COMPLETED), ("bad", RunState.FAILED),
                        ("stopped", RunState.CANCELLED)]:
        await create(store, name)
        run = await claim_one(store)
        assert await store.finish(fence(run), state, result=None, error="x")
    await create(store, "never")
    assert await store.request_cancel("never") is not None
    assert await store.claim("w2", LEASE, 10) == []
    for name in ("done", "bad", "stopped"):
        assert await store.claim("w2", LEASE, 1, run_id=name) == []


async def test_concurrency_key_allows_one_running_run(store: Store, clock: FakeClock) -> None:
    await create(store, "k1", key="K")
    clock.advance(1)
    await create(store, "k2", key="K")
    await create(store, "free")
    first = await store.claim("w1", LEASE, 10)
    assert sorted(r.id for r in first) == ["free", "k1"]
    assert await store.claim("w2", LEASE, 10) == []
    assert await store.claim("w2", LEASE, 10, run_id="k2") == []
    k1 = next(r for r in first if r.id == "k1")
    assert await store.finish(fence(k1), RunState.COMPLETED)
    assert [r.id for r in await store.claim("w2", LEASE, 10)] == ["k2"]


async def test_delayed_run_is_not_claimed_before_run_at(store: Store, clock: FakeClock) -> None:
    run = await create(store, "later", delay=60)
    assert await store.next_run_at() == run.run_at
    assert await store.claim("w1", LEASE, 10) == []
    clock.advance(59.5)
    assert await store.claim("w1", LEASE, 10, run_id="later") == []
    clock.advance(0.5)
    assert (await claim_one(store)).id == "later"
    assert await store.next_run_at() is None


async def test_claim_only_listed_workflows(store: Store) -> None:
    await create(store, "a", workflow="known")
    await create(store, "b", workflow="unknown")
    assert [r.id for r in await store.claim("w1", LEASE, 10, workflows=["known"])] == ["a"]
    assert await store.claim("w1", LEASE, 10, workflows=[]) == []
    assert [r.id for r in await store.claim("w1", LEASE, 10)] == ["b"]


async def test_claimable_is_what_a_claim_would_take_read_without_a_write(store: Store) -> None:
    await create(store, "a", workflow="known")
    await create(store, "k1", key="k")
    await create(store, "k2", key="k")
    await create(store, "later", delay=60)
    read = [r.id for r in await store.claimable("w1", 10, workflows=["known", "wf"])]
    # a store without the read knows none (the worker then claims the usual way)
    assert read == ([] if not store.claims_ride_on_writes else ["a", "k1"])
    assert all(r.state is RunState.QUEUED for r in await store.list_runs())
    assert await store.claimable("w1", 10, workflows=[]) == []


async def test_claim_with_commits_the_finishes_then_claims_and_appends(store: Store) -> None:
    first = await claim_one(await _with(store, "done"))
    await create(store, "next")
    stale = Fence("done", first.epoch + 1000)
    result = await store.claim_with(
        "w1", LEASE, "next", 1, [STEP],
        # refused: it writes none of its entries, and changes nothing else
        [Finish(stale, RunState.FAILED, error="not mine",
                entries=(DONE, JournalWrite(EntryKind.RUN_FAILED, data={"error": "x"}))),
         Finish(fence(first), RunState.COMPLETED, result=7,
                entries=(JournalWrite(EntryKind.RUN_COMPLETED),))])
    assert result.finished == (False, True) and result.appended
    assert result.run is not None and result.run.id == "next"
    assert (result.run.state, result.run.attempt, result.run.worker) == (
        RunState.RUNNING, 1, "w1")
    done = await store.get_run("done")
    assert done is not None and done.state is RunState.COMPLETED and done.result == 7
    done_entries = await store.journal("done")
    assert kinds(done_entries) == ["run_created", "run_claimed", "run_completed"]
    assert done_entries[2].epoch == first.epoch
    entries = await store.journal("next")
    assert kinds(entries) == ["run_created", "run_claimed", "step_started"]
    assert {e.epoch for e in entries[1:]} == {result.run.epoch}
    assert entries[2].step_key == STEP.step_key
    assert await store.append(fence(result.run), [DONE])  # the new fence holds


async def test_claim_with_a_run_gone_or_changed_claims_nothing_or_appends_nothing(
        store: Store) -> None:
    first = await claim_one(await _with(store, "held"))
    await create(store, "changed")
    # not claimable (running elsewhere): nothing of it changes, the finish still commits
    result = await store.claim_with("w2", LEASE, "held", 1, [STEP],
                                    [Finish(fence(first), RunState.COMPLETED)])
    assert result.finished == (True,) and result.run is None and not result.appended
    assert await journal_kinds(store, "held") == ["run_created", "run_claimed"]
    # claimed, but not as read (another attempt came in between): the claim holds, the
    # entries were not written
    released = await claim_one(store)
    assert await store.release(fence(released))
    result = await store.claim_with("w2", LEASE, "changed", 1, [STEP])
    assert result.run is not None and result.run.attempt == 2 and not result.appended
    assert result.run.state is RunState.RUNNING and result.run.worker == "w2"
    assert "step_started" not in await journal_kinds(store, "changed")
    assert (await store.claim_with("w3", LEASE, "missing", 1)).run is None


async def test_claim_with_no_entries_of_a_run_changed_since_read_is_not_as_expected(
        store: Store) -> None:
    """A claim that commits without entries (its attempt made no write in time) of a run
    that another attempt ran in between: it holds the run, but not as the caller read it
    (``appended`` False), so the worker runs a fresh attempt on it, which reads the run's
    journal, rather than the attempt started on the read, which knows none of it. A
    claim as read holds it as expected."""
    await create(store, "changed")
    released = await claim_one(store)
    assert await store.release(fence(released))
    result = await store.claim_with("w2", LEASE, "changed", 1)
    assert result.run is not None and result.run.attempt == 2 and not result.appended
    await create(store, "again")
    assert await store.release(fence(await claim_one(store)))
    result = await store.claim_with("w2", LEASE, "again", 2)  # as read: attempt 2
    assert result.run is not None and result.appended  # as expected, no entries to write


async def _with(store: Store, run_id: str) -> Store:
    await create(store, run_id)
    return store


# -- leases --------------------------------------------------------------------------------------
async def test_renew_returns_held_runs_with_cancel_flags_and_drops_lost_ones(
        store: Store, clock: FakeClock) -> None:
    for name in "abcd":
        await create(store, name)
    runs = {r.id: r for r in await store.claim("w1", LEASE, 4)}
    assert sorted(runs) == ["a", "b", "c", "d"]
    assert await store.request_cancel("b") is not None
    assert await store.release(fence(runs["c"]))
    held = [fence(runs["a"]), fence(runs["b"]), fence(runs["c"]),
            Fence("d", runs["d"].epoch + 1000)]

    clock.advance(20)
    renewed = await store.renew("w1", held, LEASE, {"a": {"progress": 1}})
    assert {(r.run_id, r.epoch, r.cancel_requested) for r in renewed} == {
        ("a", runs["a"].epoch, False), ("b", runs["b"].epoch, True)}
    assert await store.renew("intruder", held, LEASE) == []
    assert await store.renew("w1", [], LEASE) == []
    clock.advance(20)  # 40 s after the claim, 20 s after the renewal: still held
    assert await store.append(fence(runs["a"]), [STEP])
    a = await store.get_run("a")
    assert a is not None and a.lease_expires_at == clock.now() - 20 + LEASE
    clock.advance(LEASE)
    assert await store.renew("w1", held, LEASE) == []


async def test_fenced_writes_are_refused_with_a_stale_epoch(store: Store) -> None:
    await create(store, "r1")
    run = await claim_one(store)
    before = await journal_kinds(store, "r1")
    for stale in (Fence("r1", run.epoch + 1), Fence("r1", 0), Fence("other", run.epoch)):
        assert not await store.append(stale, [STEP, DONE])
        assert not await store.put_records(stale, [("slots", "x", 1)], [STEP])
        assert not await store.finish(stale, RunState.COMPLETED, entries=[DONE])
        assert not await store.release(stale, [STEP])
    assert await journal_kinds(store, "r1") == before
    assert await store.get_record("slots", "x") is None
    current = await store.get_run("r1")
    assert current is not None and current.state is RunState.RUNNING
    assert current.epoch == run.epoch
    assert await store.append(fence(run), [STEP, DONE])
    assert await journal_kinds(store, "r1") == [*before, "step_started", "step_completed"]


async def test_a_long_append_is_journaled_whole_in_order_or_refused_whole(
        store: Store) -> None:
    """An append of many entries (6,000: more parameters than one SQLite statement may
    take) is written in its order, all of it, or refused whole by a stale fence."""
    db = getattr(store, "_db", None)
    if db is not None:  # SQLite: the default limit of a build (32,766 parameters), not this
        for conn in (db._conn, db._inline):  # build's own (Debian's: 250,000)
            if conn is not None:
                conn.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, 32_766)
    await create(store, "r1")
    run = await claim_one(store)
    before = await journal_kinds(store, "r1")
    entries = [JournalWrite(EntryKind.VALUE, data={"n": i}) for i in range(6_000)]
    assert not await store.append(Fence("r1", run.epoch + 1), entries)
    assert await journal_kinds(store, "r1") == before
    assert await store.append(fence(run), entries)
    written = [e for e in await store.journal("r1") if e.kind is EntryKind.VALUE]
    assert [e.data["n"] for e in written] == list(range(6_000))


async def test_journal_keeps_a_steps_try_apart_from_the_runs_attempt(store: Store) -> None:
    await create(store, "r1")
    run = await claim_one(store)
    second_try = JournalWrite(EntryKind.STEP_STARTED, step=1, step_key="1:charge",
                              name="charge", try_number=2)
    assert await store.append(fence(run), [second_try])
    claimed, started = (await store.journal("r1"))[1:]
    # one column stores both counters; each comes back under its own name
    assert (claimed.kind, claimed.attempt, claimed.try_number) == (EntryKind.RUN_CLAIMED, 1,
                                                                   None)
    assert (started.kind, started.try_number, started.attempt) == (EntryKind.STEP_STARTED, 2,
                                                                   None)


async def test_fenced_writes_are_refused_once_the_lease_expired(
        store: Store, clock: FakeClock) -> None:
    await create(store, "r1")
    old = await claim_one(store)
    clock.advance(LEASE)  # the lease ends at exactly this instant
    before = await journal_kinds(store, "r1")
    assert not await store.append(fence(old), [STEP])
    assert not await store.put_records(fence(old), [("slots", "x", 1)])
    assert not await store.finish(fence(old), RunState.COMPLETED, entries=[DONE])
    assert not await store.release(fence(old))
    assert await store.renew("w1", [fence(old)], LEASE) == []
    assert await journal_kinds(store, "r1") == before

    assert await store.recover_stale() == [fence(old)]
    new = await claim_one(store, "w2")
    assert new.epoch > old.epoch and new.attempt == 2
    assert not await store.append(fence(old), [STEP])
    assert await store.append(fence(new), [STEP])


async def test_finish_and_release_write_entries_with_the_state_change(
        store: Store, clock: FakeClock) -> None:
    await create(store, "r1")
    run = await claim_one(store)
    assert await store.finish(fence(run), RunState.COMPLETED, result={"total": 3},
                              entries=[DONE, JournalWrite(EntryKind.RUN_COMPLETED)])
    done = await store.get_run("r1")
    assert done is not None
    assert (done.state, done.result, done.worker, done.lease_expires_at) == (
        RunState.COMPLETED, {"total": 3}, None, None)
    assert (await journal_kinds(store, "r1"))[-2:] == ["step_completed", "run_completed"]
    assert not await store.finish(fence(run), RunState.FAILED, error="again")

    await create(store, "r2")
    run2 = await claim_one(store)
    clock.advance(5)
    assert await store.release(fence(run2), [JournalWrite(EntryKind.RUN_INTERRUPTED)])
    back = await store.get_run("r2")
    assert back is not None
    assert (back.state, back.worker, back.run_at) == (RunState.QUEUED, None, clock.now())
    assert (await journal_kinds(store, "r2"))[-1] == "run_interrupted"
    assert not await store.release(fence(run2))
    assert (await claim_one(store)).epoch > run2.epoch


# -- recovery ------------------------------------------------------------------------------------
async def test_recover_stale_is_a_compare_and_set(store_url: str, store: Store,
                                                  clock: FakeClock) -> None:
    await create(store, "r1")
    run = await claim_one(store)
    assert await store.recover_stale("r1", run.epoch) == []  # not expired yet
    clock.advance(LEASE + 1)
    assert await store.recover_stale("r1", run.epoch + 1) == []  # another epoch
    results: list[list[Fence]] = []
    go = anyio.Event()

    async def recover(other: Store) -> None:
        await go.wait()
        results.append(await other.recover_stale("r1", run.epoch))

    async with many(store_url, clock, 2) as others:
        async with anyio.create_task_group() as tg:
            for other in others:
                tg.start_soon(recover, other)
            go.set()
    assert sorted(results, key=len) == [[], [fence(run)]]
    entries = await store.journal("r1")
    recovered = [e for e in entries if e.kind is EntryKind.RUN_RECOVERED]
    assert len(recovered) == 1
    assert recovered[0].epoch == run.epoch
    assert recovered[0].data["worker"] == "w1"
    assert recovered[0].data["lease_expired_at"] == run.lease_expires_at
    requeued = await store.get_run("r1")
    assert requeued is not None
    assert (requeued.state, requeued.worker, requeued.run_at) == (RunState.QUEUED, None,
                                                                  clock.now())


async def test_sweep_recovers_every_expired_run_once(store: Store, clock: FakeClock) -> None:
    for name in "abc":
        await create(store, name)
    runs = await store.claim("w1", LEASE, 3)
    await create(store, "fresh")
    clock.advance(LEASE / 2)
    fresh = await claim_one(store, "w2")
    clock.advance(LEASE / 2)
    assert sorted(await store.recover_stale(), key=lambda f: f.run_id) == [fence(r) for r in
                                                                          runs]
    assert await store.recover_stale() == []
    still = await store.get_run("fresh")
    assert still is not None and still.state is RunState.RUNNING and still.epoch == fresh.epoch


# -- the journal ---------------------------------------------------------------------------------
async def test_journal_is_append_only(store_url: str, store: Store) -> None:
    await create(store, "r1")
    run = await claim_one(store)
    assert await store.append(fence(run), [STEP, DONE])
    entries = await store.journal("r1")
    assert [e.seq for e in entries] == sorted(e.seq for e in entries)
    assert [e.seq for e in await store.journal("r1", after=entries[1].seq)] == [
        e.seq for e in entries[2:]]
    for statement in ("UPDATE durable_journal SET kind = 'value'",
                      "DELETE FROM durable_journal"):
        with pytest.raises(raw_errors(), match="append-only"):
            await anyio.to_thread.run_sync(raw_execute, store_url, statement)
    assert await store.journal("r1") == entries


# -- operator actions ----------------------------------------------------------------------------
async def test_request_cancel(store: Store) -> None:
    await create(store, "queued")
    cancelled = await store.request_cancel("queued")
    assert cancelled is not None and cancelled.state is RunState.CANCELLED
    assert (await journal_kinds(store, "queued"))[-1] == "run_cancelled"

    await create(store, "running")
    run = await claim_one(store)
    flagged = await store.request_cancel("running")
    assert flagged is not None
    assert (flagged.state, flagged.cancel_requested) == (RunState.RUNNING, True)
    assert (await journal_kinds(store, "running"))[-1] == "run_cancel_requested"
    assert await store.finish(fence(run), RunState.CANCELLED)
    assert await store.request_cancel("running") is None
    assert await store.request_cancel("missing") is None


async def test_cancels_requested_names_the_asked_runs_with_a_cancel_pending(
        store: Store) -> None:
    """What a worker reads after a change signal (migration 010's index of the running runs
    with a cancel pending): of the runs asked about, those; not a flagged run nobody asked
    about, not one that ended with its flag set, not one cancelled while it was queued."""
    running = {}
    for run_id in ("a", "b", "c"):
        await create(store, run_id)
        running[run_id] = await claim_one(store)
    await create(store, "d")
    for run_id in ("a", "b", "d"):
        assert await store.request_cancel(run_id) is not None
    assert await store.cancels_requested({"a", "c", "d"}) == {"a"}
    assert await store.cancels_requested(["a", "b", "c", "d", "missing"]) == {"a", "b"}
    assert await store.finish(fence(running["b"]), RunState.CANCELLED)
    assert await store.cancels_requested({"a", "b", "c", "d"}) == {"a"}
    assert await store.cancels_requested(set()) == set()


async def test_requeue_only_from_failed_or_cancelled(store: Store) -> None:
    await create(store, "r1")
    assert await store.requeue("r1", None, None) is None  # queued
    run = await claim_one(store)
    assert await store.requeue("r1", None, None) is None  # running
    assert await store.finish(fence(run), RunState.FAILED, error="boom")
    again = await store.requeue("r1", 2, "retry")
    assert again is not None
    assert (again.state, again.error, again.result, again.cancel_requested) == (
        RunState.QUEUED, None, None, False)
    replayed = (await store.journal("r1"))[-1]
    assert replayed.kind is EntryKind.RUN_REPLAYED
    assert replayed.data == {"from_step": 2, "in_doubt": "retry"}
    run = await claim_one(store)
    assert run.attempt == 2
    assert await store.finish(fence(run), RunState.COMPLETED)
    assert await store.requeue("r1", None, None) is None  # completed

    await create(store, "r2")
    assert await store.request_cancel("r2") is not None
    requeued = await store.requeue("r2", None, None)
    assert requeued is not None and requeued.state is RunState.QUEUED
    assert await store.requeue("missing", None, None) is None


# -- records -------------------------------------------------------------------------------------
async def test_records_are_fenced(store: Store, clock: FakeClock) -> None:
    assert await store.get_record("slots", "x") is None
    assert await store.put_records(None, [("slots", "seed", {"free": 2})])
    seeded = await store.get_record("slots", "seed")
    assert seeded is not None and (seeded.value, seeded.epoch) == ({"free": 2}, 0)

    await create(store, "older")
    older = await claim_one(store)
    await create(store, "newer")
    newer = await claim_one(store)
    assert newer.epoch > older.epoch
    assert await store.put_records(fence(newer), [("slots", "x", "newer")], [STEP])
    written = await store.get_record("slots", "x")
    assert written is not None and (written.value, written.epoch) == ("newer", newer.epoch)

    # A superseded attempt cannot write, and the whole call is undone. (Epochs of two
    # different runs are not compared: a stale read is caught by record versions.)
    before = await journal_kinds(store, "older")
    assert not await store.put_records(Fence("older", older.epoch - 1),
                                       [("slots", "y", 1), ("slots", "x", 2)], [STEP])
    assert await store.get_record("slots", "y") is None
    assert await journal_kinds(store, "older") == before
    assert not await store.put_records(Fence("older", 0), [("slots", "z", 1)])

    clock.advance(1)
    assert await store.put_records(fence(older), [("slots", "y", [1, 2])])
    assert [(r.key, r.value) for r in await store.list_records("slots")] == [
        ("seed", {"free": 2}), ("x", "newer"), ("y", [1, 2])]
    assert await store.list_records("other") == []


# -- schema --------------------------------------------------------------------------------------
async def test_a_newer_schema_version_is_refused(store_url: str, store: Store,
                                                 clock: FakeClock) -> None:
    assert await store.schema_version() == SCHEMA_VERSION
    async with opened(store_url, clock) as again:  # reopening an up-to-date database
        assert await again.schema_version() == SCHEMA_VERSION
    await anyio.to_thread.run_sync(
        raw_execute, store_url,
        f"UPDATE durable_meta SET value = '{SCHEMA_VERSION + 1}' WHERE key = 'schema_version'")
    newer = store_from_url(store_url, clock=clock)
    with pytest.raises(SchemaVersionError, match="newer than this durable understands"):
        await newer.open()


# -- PostgreSQL only -----------------------------------------------------------------------------
postgres_only = pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])


@postgres_only
async def test_postgres_url_options_and_password_redaction() -> None:
    if psycopg is None:
        pytest.skip("psycopg is not installed")
    with pytest.raises(ConfigError, match="schema must be"):
        store_from_url("postgresql://127.0.0.1/test?schema=Bad-Name")
    store = store_from_url("postgresql://me:sekret@127.0.0.1:1/test?schema=s1&sslmode=disable")
    assert "sekret" not in store.url
    assert store.url == "postgresql://me:***@127.0.0.1:1/test?sslmode=disable&schema=s1"
    with pytest.raises(StoreUnavailableError) as info:
        await store.open()
    assert "sekret" not in str(info.value) and "127.0.0.1" in str(info.value)


@postgres_only
async def test_postgres_concurrent_first_opens_migrate_once(pg_url: str,
                                                            clock: FakeClock) -> None:
    versions: list[int] = []

    async def open_one() -> None:
        async with opened(pg_url, clock) as s:
            versions.append(await s.schema_version())

    async with anyio.create_task_group() as tg:
        for _ in range(4):
            tg.start_soon(open_one)
    assert versions == [SCHEMA_VERSION] * 4


async def test_an_open_without_upgrade_refuses_an_older_schema_and_leaves_it(
        store_url: str, clock: FakeClock) -> None:
    """``upgrade=False`` (the operator's read and control commands): a schema behind this
    durable's is an error naming ``durable migrate``, and stays as it was; an open that may
    upgrade (a worker's, a client's) then takes it to the current version."""
    older = SCHEMA_VERSION - 1
    at_schema(store_url, older)
    for _ in range(2):  # refused again: the first refusal changed nothing
        with pytest.raises(SchemaVersionError,
                           match=rf"schema version {older}, older than .*durable migrate --db"):
            async with opened(store_url, clock, create=False, upgrade=False):
                pass
    async with opened(store_url, clock, create=False) as store:
        assert await store.schema_version() == SCHEMA_VERSION


@postgres_only
async def test_postgres_open_of_a_current_schema_only_reads(pg_url: str,
                                                          clock: FakeClock) -> None:
    """Read commands open without a write: with the schema current, open() reads its
    version and takes no lock, so it opens and answers while another session holds the
    migration's advisory lock and a lock on the schema table that any write to it waits
    for (before, every open waited for both)."""
    async with opened(pg_url, clock):
        pass  # creates the schema: a write, once
    _, schema = split_url(pg_url)
    holder = connect_sync(pg_url)
    try:
        holder.execute("SELECT pg_advisory_lock(hashtextextended(%s, 0))",
                       (f"durable.migrate.{schema}",))
        holder.execute("BEGIN")
        holder.execute("LOCK TABLE durable_meta IN EXCLUSIVE MODE")
        for create in (False, True):  # a read command, and a worker's or client's open
            with anyio.fail_after(5):
                async with opened(pg_url, clock, create=create) as store:
                    assert await store.schema_version() == SCHEMA_VERSION
                    assert await store.list_runs() == []
    finally:
        holder.close()


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # its rival: psycopg's async API
async def test_postgres_claim_that_trips_the_key_index_claims_nothing(
        pg_url: str, clock: FakeClock) -> None:
    """A claim racing another transaction for the same key gets [], not an error."""
    async with opened(pg_url, clock) as store:
        await create(store, "k1", key="K")
        base, _, query = pg_url.partition("?")
        schema = parse_qs(query)["schema"][0]
        rival = await psycopg.AsyncConnection.connect(base, options=f"-c search_path={schema}")
        try:
            # An uncommitted rival transaction holds a running run of key K: the claim of
            # k1 passes its checks (it cannot see the rival's row), then waits on the
            # unique index until the rival commits, and then violates it.
            await rival.execute(
                "INSERT INTO durable_runs (id, workflow, args, concurrency_key, state, run_at,"
                " created_at, updated_at) VALUES ('rival', 'wf', '[]', 'K', 'running', 0, 0, 0)")
            result: list[list[Run]] = []
            async with anyio.create_task_group() as tg:
                async def claim() -> None:
                    result.append(await store.claim("w1", LEASE, 10))

                tg.start_soon(claim)
                # autocommit: inside a transaction PostgreSQL keeps the sessions it listed
                # first (a session opened since is never seen)
                async with await psycopg.AsyncConnection.connect(
                        base, autocommit=True) as watcher:
                    async def claim_is_blocked() -> bool:
                        cur = await watcher.execute(
                            "SELECT 1 FROM pg_stat_activity"
                            " WHERE %s = ANY (pg_blocking_pids(pid))",
                            (rival.info.backend_pid,))
                        return await cur.fetchone() is not None

                    await poll(claim_is_blocked)
                await rival.commit()
            assert result == [[]]
        finally:
            await rival.close()
        run = await store.get_run("k1")
        assert run is not None and run.state is RunState.QUEUED
        assert "run_claimed" not in await journal_kinds(store, "k1")


@postgres_only
async def test_postgres_wait_for_work_wakes_on_queued_runs_and_cancels(
        pg_url: str, clock: FakeClock) -> None:
    async with opened(pg_url, clock) as store:
        wait_for_work = store.wait_for_work  # type: ignore[attr-defined]
        with anyio.fail_after(5):
            await wait_for_work(30)  # the first call subscribes and returns at once
        start = anyio.current_time()
        await wait_for_work(0.05)  # nothing happened: waits out the timeout
        assert anyio.current_time() - start >= 0.05

        async with opened(pg_url, clock) as client:  # another process queues a run
            await create(client, "r1")
            with anyio.fail_after(5):
                await wait_for_work(30)
            run = await claim_one(store)
            await client.request_cancel("r1")
            with anyio.fail_after(5):
                await wait_for_work(30)
            assert await store.release(fence(run))  # with the cancel pending: it ends
            assert (await store.get_run("r1")).state is RunState.CANCELLED  # type: ignore[union-attr]
            await create(client, "r2")
            with anyio.fail_after(5):
                await wait_for_work(30)
            other = await claim_one(store)
            assert await store.release(fence(other))  # released: queued again
            with anyio.fail_after(5):
                await wait_for_work(30)
