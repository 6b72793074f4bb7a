"""Group commit in the PostgreSQL store, tested on asyncio: its tests hold the store's own
coroutines and connections, which on trio run on the store's loop thread, where the
mechanism is the same (durable/store/_loop.py; tests/test_store_loop.py).

Concurrent fenced appends and finishes of many attempts go out as one statement. Each write
is fenced on its own (a refused one takes nothing from the others) and each caller learns
its own outcome; a batch whose connection dies after it was sent reports an unknown outcome
(StoreUnavailableError, never NotSentError) to every caller in it. Batches are made
deterministic by holding a run's row lock from another connection, so the first batch
waits on the server while the others queue behind it.
"""

from __future__ import annotations

import functools
import re
from collections.abc import AsyncIterator, Awaitable, Callable

import anyio
import psycopg
import pytest

from durable._errors import ConfigError, NotSentError, StoreError, StoreUnavailableError
from durable._types import EntryKind, Fence, JournalWrite, RunState
from durable.store import store_from_url
from durable.store._postgres import (
    FINISH_BATCH_JOBS,
    Q_ONE_ENTRY,
    PostgresStore,
    Q,
    _entry_rows,
    _Write,
)
from tests.helpers import poll
from tests.pg import pg_url, postgres_server, split_url
from tests.test_store_contract import create, fence, journal_kinds

__all__ = ["pg_url", "postgres_server"]

pytestmark = pytest.mark.anyio

VALUE = JournalWrite(EntryKind.VALUE, data={"n": 1})


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def pg_store(pg_url: str) -> AsyncIterator[PostgresStore]:
    store = store_from_url(pg_url)
    assert isinstance(store, PostgresStore)
    await store.open()
    try:
        yield store
    finally:
        await store.aclose()


async def claimed(store: PostgresStore, n: int, prefix: str = "r") -> list[Fence]:
    for i in range(n):
        await create(store, f"{prefix}{i:02d}")
    runs = await store.claim("w1", 300.0, n)
    assert len(runs) == n
    return sorted((fence(r) for r in runs), key=lambda f: f.run_id)


async def locker(url: str, run_id: str) -> psycopg.AsyncConnection[tuple[object, ...]]:
    """A connection holding ``run_id``'s row lock in an open transaction."""
    base, schema = split_url(url)
    conn = await psycopg.AsyncConnection.connect(base, options=f"-c search_path={schema}")
    await conn.execute("SELECT 1 FROM durable_runs WHERE id = %s FOR UPDATE", (run_id,))
    return conn


async def in_one_batch(url: str, store: PostgresStore, first: Fence, results: dict[str, bool],
                       writes: list[Callable[[], Awaitable[None]]]) -> None:
    """Send ``writes`` as one batch: the lead (an append of one entry by ``first``, its
    outcome in ``results``) goes out alone and waits for ``first``'s row lock, held by
    another connection, while ``writes`` queue behind it; then the lock is let go."""
    lock = await locker(url, first.run_id)
    try:
        async with anyio.create_task_group() as tg:
            async def lead() -> None:
                results[first.run_id] = await store.append(first, [VALUE])

            tg.start_soon(lead)
            await poll(lambda: store.batches == 1)  # the lead's batch waits for the lock
            for write in writes:
                tg.start_soon(write)
            await poll(lambda: len(store._pending) == len(writes))
            await lock.commit()
    finally:
        await lock.close()


def checked_out(store: PostgresStore) -> int:
    """Pooled connections out of the pool but the store's hot one (kept for the next
    checkout: PostgresStore._put_back)."""
    assert store._pool is not None
    stats = store._pool.get_stats()
    return stats["pool_size"] - stats["pool_available"] - (store._hot is not None)


async def blocked_by(url: str, conn: psycopg.AsyncConnection[tuple[object, ...]]) -> list[int]:
    """Server pids of the statements waiting for ``conn``'s locks."""
    base, _ = split_url(url)
    async with await psycopg.AsyncConnection.connect(base, autocommit=True) as watcher:
        cur = await watcher.execute(
            "SELECT pid FROM pg_stat_activity WHERE %s = ANY (pg_blocking_pids(pid))",
            (conn.info.backend_pid,))
        return [int(row[0]) for row in await cur.fetchall()]


def test_every_statement_is_short_enough_for_psycopg_to_keep_its_conversion() -> None:
    """psycopg converts a statement's text (``%(name)s`` to ``$n``) once and keeps the
    result, but only for a text of at most MAX_CACHED_STATEMENT_LENGTH bytes; a longer one
    is converted again on every call (claim_with, sent with its comments, was: 6,021
    bytes). The store sends its statements without comment lines and indentation."""
    from psycopg import _queries

    limit = getattr(_queries, "MAX_CACHED_STATEMENT_LENGTH", 4096)
    sent = {**Q, **{f"one {name}": q for name, q in Q_ONE_ENTRY.items()},
            "FINISH_BATCH_JOBS": FINISH_BATCH_JOBS}
    assert {name: len(q.encode()) for name, q in sent.items() if len(q.encode()) > limit} == {}
    assert not [name for name, q in sent.items()
                if any(line.startswith(("--", " ")) for line in q.splitlines())]


async def test_one_batch_commits_the_writes_whose_fence_holds_and_refuses_the_others(
        pg_url: str, pg_store: PostgresStore) -> None:
    first, *fences = await claimed(pg_store, 13)
    # Odd runs are written with a stale epoch (another attempt's): refused, alone.
    wrong = {f.run_id for f in fences[1::2]}
    writes = [Fence(f.run_id, f.epoch + 1000) if f.run_id in wrong else f for f in fences]
    results: dict[str, bool] = {}

    async def write(i: int, f: Fence) -> None:
        if i % 3 == 0:  # finishes and appends in the same batch
            results[f.run_id] = await pg_store.finish(
                f, RunState.COMPLETED, result=i,
                entries=[JournalWrite(EntryKind.RUN_COMPLETED, data={"result": i})])
        else:
            results[f.run_id] = await pg_store.append(f, [VALUE, VALUE])

    await in_one_batch(pg_url, pg_store, first, results,
                       [functools.partial(write, i, f) for i, f in enumerate(writes)])
    assert pg_store.batches == 2
    assert pg_store.batched_writes == 1 + len(writes)
    assert results == {f.run_id: f.run_id not in wrong for f in [first, *fences]}
    for i, f in enumerate(fences):
        kinds = await journal_kinds(pg_store, f.run_id)
        run = await pg_store.get_run(f.run_id)
        assert run is not None
        if f.run_id in wrong:  # nothing of a refused write was written
            assert kinds == ["run_created", "run_claimed"]
            assert run.state is RunState.RUNNING
        elif i % 3 == 0:
            assert kinds == ["run_created", "run_claimed", "run_completed"]
            assert (run.state, run.result) == (RunState.COMPLETED, i)
        else:
            assert kinds == ["run_created", "run_claimed", "value", "value"]
    assert await journal_kinds(pg_store, first.run_id) == ["run_created", "run_claimed",
                                                           "value"]


async def test_a_batch_whose_connection_dies_after_it_was_sent_is_unknown_to_every_caller(
        pg_url: str, pg_store: PostgresStore) -> None:
    first, *fences = await claimed(pg_store, 9)
    outcomes: dict[str, BaseException | bool] = {}

    async def append(f: Fence) -> None:
        try:
            outcomes[f.run_id] = await pg_store.append(f, [VALUE])
        except StoreError as exc:
            outcomes[f.run_id] = exc

    lock_first = await locker(pg_url, first.run_id)
    lock_last = await locker(pg_url, fences[-1].run_id)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(append, first)
            await poll(lambda: pg_store.batches == 1)
            for f in fences:
                tg.start_soon(append, f)
            await poll(lambda: len(pg_store._pending) == len(fences))
            await lock_first.commit()  # the first batch ends; the second waits on the last run
            pids = await poll(lambda: blocked_by(pg_url, lock_last))
            assert pg_store.batches == 2
            base, _ = split_url(pg_url)
            async with await psycopg.AsyncConnection.connect(base, autocommit=True) as admin:
                for pid in pids:
                    await admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
    finally:
        await lock_first.close()
        await lock_last.close()
    assert outcomes[first.run_id] is True
    for f in fences:
        error = outcomes[f.run_id]
        assert isinstance(error, StoreUnavailableError), (f.run_id, error)
        assert not isinstance(error, NotSentError), (f.run_id, error)
        # (here the statement was aborted: nothing was written, but the callers cannot know)
        assert await journal_kinds(pg_store, f.run_id) == ["run_created", "run_claimed"]
    # The store goes on: the next write gets a fresh connection.
    assert await pg_store.append(fences[0], [VALUE])


async def test_a_batch_the_server_refuses_is_sent_again_write_by_write(
        pg_url: str, pg_store: PostgresStore) -> None:
    first, *fences = await claimed(pg_store, 5)
    bad = fences[1]  # a step number PostgreSQL's integer column cannot hold
    too_big = JournalWrite(EntryKind.STEP_STARTED, step=2**40, step_key="x", name="x",
                           try_number=1)
    outcomes: dict[str, BaseException | bool] = {}

    async def append(f: Fence) -> None:
        try:
            outcomes[f.run_id] = await pg_store.append(f, [too_big if f == bad else VALUE])
        except StoreError as exc:
            outcomes[f.run_id] = exc

    lock = await locker(pg_url, first.run_id)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(append, first)
            await poll(lambda: pg_store.batches == 1)
            for f in fences:
                tg.start_soon(append, f)
            await poll(lambda: len(pg_store._pending) == len(fences))
            await lock.commit()
    finally:
        await lock.close()
    error = outcomes.pop(bad.run_id)
    assert isinstance(error, StoreError) and not isinstance(error, StoreUnavailableError)
    assert "out of range" in str(error)
    assert outcomes == {f.run_id: True for f in [first, *fences] if f != bad}
    assert await journal_kinds(pg_store, bad.run_id) == ["run_created", "run_claimed"]


async def test_a_lone_writer_does_not_wait_for_company(pg_store: PostgresStore) -> None:
    (only,) = await claimed(pg_store, 1)
    for _ in range(5):
        assert await pg_store.append(only, [VALUE])
    assert (pg_store.batches, pg_store.batched_writes) == (5, 5)
    assert await pg_store.finish(only, RunState.COMPLETED, result=1)
    assert not await pg_store.append(only, [VALUE])  # finished: the fence is gone


async def test_a_lone_write_cancelled_in_flight_still_commits_and_hands_the_lead_on(
        pg_url: str, pg_store: PostgresStore) -> None:
    """A write that found nothing in flight goes alone (PostgresStore._alone), shielded
    like any lead: its caller cancelled while the statement waits on the server still
    gets its answer (and the pool its connection back), and the writes queued behind
    it go in the next batch. Without the shield, psycopg cancels the statement."""
    first, second, third = await claimed(pg_store, 3)
    lone = anyio.CancelScope()
    left = anyio.Event()
    outcomes: dict[str, bool] = {}

    async def cancelled_lead() -> None:
        with lone:
            outcomes[first.run_id] = await pg_store.append(first, [VALUE])
        left.set()

    async def append(f: Fence) -> None:
        outcomes[f.run_id] = await pg_store.append(f, [VALUE])

    lock = await locker(pg_url, first.run_id)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(cancelled_lead)
            await poll(lambda: pg_store.batches == 1)
            await poll(lambda: blocked_by(pg_url, lock))  # sent: it waits on the row lock
            tg.start_soon(append, second)
            tg.start_soon(append, third)
            await poll(lambda: len(pg_store._pending) == 2)
            lone.cancel()
            await lock.commit()
            await left.wait()
    finally:
        await lock.close()
    assert outcomes == {first.run_id: True, second.run_id: True, third.run_id: True}
    assert (pg_store.batches, pg_store.batched_writes) == (2, 3)
    for f in (first, second, third):
        assert await journal_kinds(pg_store, f.run_id) == ["run_created", "run_claimed",
                                                           "value"]
    assert checked_out(pg_store) == 0


async def test_a_lone_write_whose_connection_dies_after_it_was_sent_is_unknown(
        pg_url: str, pg_store: PostgresStore) -> None:
    (only,) = await claimed(pg_store, 1)
    outcome: list[BaseException | bool] = []

    async def append() -> None:
        try:
            outcome.append(await pg_store.append(only, [VALUE]))
        except StoreError as exc:
            outcome.append(exc)

    lock = await locker(pg_url, only.run_id)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(append)
            pids = await poll(lambda: blocked_by(pg_url, lock))
            base, _ = split_url(pg_url)
            async with await psycopg.AsyncConnection.connect(base, autocommit=True) as admin:
                for pid in pids:
                    await admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
    finally:
        await lock.close()
    [error] = outcome
    assert isinstance(error, StoreUnavailableError) and not isinstance(error, NotSentError)
    assert await journal_kinds(pg_store, only.run_id) == ["run_created", "run_claimed"]
    assert await pg_store.append(only, [VALUE])  # the next write gets a fresh connection


async def test_a_cancelled_caller_whose_write_is_still_queued_sends_nothing(
        pg_url: str, pg_store: PostgresStore) -> None:
    first, second = await claimed(pg_store, 2)
    queued = anyio.CancelScope()
    cancelled = anyio.Event()

    async def cancellable() -> None:
        with queued:
            await pg_store.append(second, [VALUE])
        cancelled.set()

    lock = await locker(pg_url, first.run_id)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(pg_store.append, first, [VALUE])
            await poll(lambda: pg_store.batches == 1)
            tg.start_soon(cancellable)
            await poll(lambda: len(pg_store._pending) == 1)
            queued.cancel()
            await cancelled.wait()
            assert pg_store._pending == []
            await lock.commit()
    finally:
        await lock.close()
    assert (pg_store.batches, pg_store.batched_writes) == (1, 1)
    assert await journal_kinds(pg_store, second.run_id) == ["run_created", "run_claimed"]
    assert await pg_store.append(second, [VALUE])  # the store still leads new batches


async def test_a_lone_write_of_a_caller_already_cancelled_sends_nothing(
        pg_store: PostgresStore) -> None:
    """A write that finds no batch in flight goes out alone (_alone), shielded once sent;
    a caller cancelled before it sends nothing, and the store leads the next write."""
    [run] = await claimed(pg_store, 1)
    with anyio.CancelScope() as scope:
        scope.cancel()
        await pg_store.append(run, [VALUE])
    assert scope.cancelled_caught
    assert (pg_store.batches, pg_store.batched_writes) == (0, 0)
    assert await journal_kinds(pg_store, run.run_id) == ["run_created", "run_claimed"]
    assert await pg_store.append(run, [VALUE])

def test_group_commit_is_on_unless_the_url_turns_it_off(pg_url: str) -> None:
    store = store_from_url(pg_url)
    assert isinstance(store, PostgresStore) and store.group_commit
    off = store_from_url(pg_url.replace("?", "?group_commit=0&"))
    assert isinstance(off, PostgresStore) and not off.group_commit
    # an idle worker's claims ramp up with group commit only (Store.claim_ramp)
    assert store.claim_ramp is not None and off.claim_ramp is None
    assert "group_commit" not in off._conninfo
    with pytest.raises(ConfigError, match="group_commit must be 1 or 0"):
        store_from_url(pg_url + "&group_commit=maybe")


async def test_without_group_commit_writes_go_one_by_one(pg_url: str) -> None:
    store = store_from_url(pg_url.replace("?", "?group_commit=0&"))
    assert isinstance(store, PostgresStore)
    await store.open()
    try:
        fences = await claimed(store, 4)
        refused = Fence(fences[0].run_id, fences[0].epoch + 1)
        results = {}

        async def append(i: int, f: Fence) -> None:
            results[i] = await store.append(f, [VALUE])

        async with anyio.create_task_group() as tg:
            for i, f in enumerate([refused, *fences[1:]]):
                tg.start_soon(append, i, f)
        assert results == {0: False, 1: True, 2: True, 3: True}
        assert store.batches == 0
    finally:
        await store.aclose()


AWKWARD = ['{"q": "\\"quoted\\", back\\\\slash, {braces}, NULL"}', "ünï  cödé ✓", "",
           "a,b", 'NULL']


async def test_entries_travel_exactly_in_a_batch_and_alone(
        pg_url: str, pg_store: PostgresStore) -> None:
    """Array parameters go in PostgreSQL's binary format (Q's ``%(x)b``, not psycopg's
    quoted text literals): awkward strings, missing values and large numbers come back as
    they were written, in a batch statement and in a lone one."""
    assert not any(re.search(r"%\(\w+\)s::[a-z ]+\[\]", query) for query in Q.values())
    first, *fences = await claimed(pg_store, 4)
    entries = [JournalWrite(EntryKind.STEP_COMPLETED, step=2**31 - 1 - n, step_key=text,
                            name=None if n % 2 else text, try_number=None if n else 7,
                            data={"text": text, "big": 2**62, "none": None})
               for n, text in enumerate(AWKWARD)]
    lock = await locker(pg_url, first.run_id)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(pg_store.append, first, [VALUE])
            await poll(lambda: pg_store.batches == 1)
            for f in fences:
                tg.start_soon(pg_store.append, f, entries)
            await poll(lambda: len(pg_store._pending) == len(fences))
            await lock.commit()
    finally:
        await lock.close()
    assert pg_store.batched_writes - pg_store.batches == len(fences) - 1  # one batch of 3
    pg_store.group_commit = False
    assert await pg_store.append(first, entries)  # alone: the entries as arrays
    for entry in entries:  # alone, one entry each: scalars (Q_ONE_ENTRY)
        assert await pg_store.append(first, [entry])
    for at in range(0, len(entries), 2):  # two at a time: scalars (LONE_PAIR), the odd one
        assert await pg_store.append(first, entries[at:at + 2])  # alone at the end
    assert "b::" not in Q_ONE_ENTRY["append_entries"] + Q_ONE_ENTRY["finish_run"]
    for f in [first, *fences]:
        written = [e for e in await pg_store.journal(f.run_id)
                   if e.kind is EntryKind.STEP_COMPLETED]
        assert [(e.step, e.step_key, e.name, e.try_number, e.data) for e in written] == [
            (e.step, e.step_key, e.name, e.try_number, e.data)
            for e in (entries * 3 if f == first else entries)]


@pytest.mark.parametrize("entries", [1, 2, 3], ids=["one-entry", "two-entries", "three"])
@pytest.mark.parametrize("grouped", [True, False], ids=["grouped", "alone"])
async def test_an_append_behind_a_recovery_of_its_run_is_refused(
        pg_url: str, pg_store: PostgresStore, entries: int, grouped: bool) -> None:
    """The row lock of the fence (docs/postgres.md, *Why the row lock stays*): an append
    whose run a recovery has requeued, uncommitted, when the append's statement starts waits
    for the recovery, then sees the row's newest version and writes nothing. Without the
    lock, the statement's snapshot still shows the run running under the append's epoch,
    and the entry lands behind the recovery (the next attempt's) back."""
    pg_store.group_commit = grouped
    (f,) = await claimed(pg_store, 1)
    recovery = await locker(pg_url, f.run_id)
    outcome: list[bool] = []
    try:
        await recovery.execute(  # what recover_stale does to a run, not committed yet
            "UPDATE durable_runs SET state = 'queued', worker = NULL, lease_expires_at = NULL,"
            " recoveries = recoveries + 1 WHERE id = %s", (f.run_id,))
        async with anyio.create_task_group() as tg:
            async def append() -> None:
                outcome.append(await pg_store.append(f, [VALUE] * entries))

            tg.start_soon(append)
            await poll(lambda: blocked_by(pg_url, recovery))  # the append waits for it
            assert not outcome
            await recovery.commit()
    finally:
        await recovery.close()
    assert outcome == [False]
    assert await journal_kinds(pg_store, f.run_id) == ["run_created", "run_claimed"]


async def test_a_pooled_connection_keeps_its_cursor_but_not_a_large_result(
        pg_url: str) -> None:
    """The pool's connections keep one cursor for the store's statements (one fewer
    object per statement), but not one holding a large result while the connection idles."""
    from durable.store._postgres import KEPT_RESULT_ROWS, _Pooled

    store = PostgresStore(pg_url, pool_size=1)  # one connection: the same one each time
    await store.open()
    try:
        (only,) = await claimed(store, 1)
        assert await store.append(only, [VALUE])
        async with store._connection() as conn:
            assert isinstance(conn, _Pooled)
            kept = conn._cursor
            assert kept is not None
        assert await store.get_run(only.run_id) is not None  # a small result: kept
        async with store._connection() as conn:
            assert conn._cursor is kept
        assert await store.append(only, [VALUE] * (KEPT_RESULT_ROWS + 1))
        assert len(await store.journal(only.run_id)) > KEPT_RESULT_ROWS
        async with store._connection() as conn:
            assert conn._cursor is None  # dropped with its result
        assert await store.append(only, [VALUE])  # and made again
    finally:
        await store.aclose()


async def test_the_next_batch_is_sent_before_the_answered_batch_s_callers_go_on(
        pg_url: str, pg_store: PostgresStore) -> None:
    """When a batch is answered, the first write queued behind it is woken first, so the
    next batch is on its way to the server before the answered batch's callers run on (the
    server works on it meanwhile). Woken after them, it went out only once they had all
    run: the server idle while they ran, then the client idle while the server worked."""
    lone, lead, member, nxt, last = await claimed(pg_store, 5)
    seen: dict[str, int] = {}  # run id -> batches started when its caller got its answer

    async def append(f: Fence) -> None:
        assert await pg_store.append(f, [VALUE])
        seen[f.run_id] = pg_store.batches

    first_lock = await locker(pg_url, lone.run_id)
    second_lock = await locker(pg_url, lead.run_id)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(append, lone)  # alone: waits on the server for first_lock
            await poll(lambda: blocked_by(pg_url, first_lock))
            tg.start_soon(append, lead)
            tg.start_soon(append, member)
            await poll(lambda: len(pg_store._pending) == 2)
            await first_lock.commit()  # [lead, member] goes, and waits for second_lock
            await poll(lambda: blocked_by(pg_url, second_lock))
            assert pg_store.batches == 2
            tg.start_soon(append, nxt)
            tg.start_soon(append, last)
            await poll(lambda: len(pg_store._pending) == 2)
            await second_lock.commit()
    finally:
        await first_lock.close()
        await second_lock.close()
    assert pg_store.batches == 3
    # the lead of [lead, member] returns from its own _lead at once; the member, woken,
    # runs only after the next batch (nxt, last) was started
    assert seen[member.run_id] == 3
    assert seen[nxt.run_id] == seen[last.run_id] == 3


async def test_a_finish_batch_returns_whole_rows_only_when_a_run_is_waited_for_here(
        pg_store: PostgresStore) -> None:
    """finish_batch's rows are parsed only to hand a finished run to a wait in this process
    (the hub's settle): a batch none of whose runs is waited for asks for the job numbers
    alone; one with a waited run asks for the rows."""
    from durable import _wake

    fences = await claimed(pg_store, 2)

    def batch() -> str:
        group = [_Write(f, _entry_rows(()), ("completed", "1", None)) for f in fences]
        return pg_store._batch(group)[0]

    assert batch() == FINISH_BATCH_JOBS and "run.job FROM" in FINISH_BATCH_JOBS
    hub = _wake.hub(pg_store)
    hub.waiting(fences[1].run_id, +1)
    try:
        assert batch() == Q["finish_batch"]
    finally:
        hub.waiting(fences[1].run_id, -1)


@pytest.mark.parametrize("held", ["dl00", "dl01"])
@pytest.mark.parametrize("batch", ["append_batch", "finish_batch"])
async def test_a_renewal_and_a_batch_lock_the_runs_they_share_in_one_order(
        pg_store: PostgresStore, pg_url: str, batch: str, held: str) -> None:
    """A renewal and a group-commit batch that share runs lock them in id order, so
    neither can hold one row while it waits for the other's (a deadlock: the server aborts
    one of them; seen as renew_failed with 1,000 runs in flight). Forced here: the run
    with the larger id was created first (the renewal's index reads runs by creation), a
    third connection holds one of the two rows (each in turn), the renewal queues on it
    first, the batch behind it; then the row is let go."""
    await create(pg_store, "dl01")
    await create(pg_store, "dl00")
    runs = await pg_store.claim("w1", 300.0, 2)
    first, second = sorted((fence(r) for r in runs), key=lambda f: f.run_id)
    assert (first.run_id, second.run_id) == ("dl00", "dl01")
    hold = await locker(pg_url, held)
    try:
        writes = [_Write(f, _entry_rows([VALUE]),
                         ("completed", "1", None) if batch == "finish_batch" else None)
                  for f in (first, second)]
        query, params = pg_store._batch(writes)
        assert query in (Q[batch], FINISH_BATCH_JOBS)
        base, schema = split_url(pg_url)
        other = await psycopg.AsyncConnection.connect(
            base, autocommit=True, options=f"-c search_path={schema}")
        outcomes: dict[str, object] = {}

        async def renew() -> None:
            try:
                outcomes["renew"] = await pg_store.renew("w1", [first, second], 300.0)
            except Exception as exc:
                outcomes["renew"] = exc

        async def send_batch() -> None:
            try:
                cur = await other.execute(query, params)
                outcomes["batch"] = await cur.fetchall()
            except Exception as exc:
                outcomes["batch"] = exc

        async with anyio.create_task_group() as tg:
            tg.start_soon(renew)
            await poll(lambda: blocked_by(pg_url, hold), timeout=10)
            tg.start_soon(send_batch)
            await poll(lambda: _waits_for_a_lock(pg_url, other), timeout=10)
            await hold.commit()  # the second run's row is free: both go on
        await other.close()
    finally:
        await hold.close()
    assert not isinstance(outcomes["renew"], Exception), outcomes["renew"]
    assert not isinstance(outcomes["batch"], Exception), outcomes["batch"]
    assert len(outcomes["batch"]) == 2  # type: ignore[arg-type]


async def _waits_for_a_lock(url: str, conn: psycopg.AsyncConnection[tuple[object, ...]]) -> bool:
    """Whether ``conn``'s statement (the batch) now waits for a row lock (``hold``'s, or one
    the renewal queued ahead of it holds)."""
    base, _ = split_url(url)
    async with await psycopg.AsyncConnection.connect(base, autocommit=True) as watcher:
        cur = await watcher.execute(
            "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s",
            (conn.info.backend_pid,))
        row = await cur.fetchone()
        return row is not None and bool(row[0])


async def lapse(url: str, run_ids: set[str]) -> None:
    """Move the leases of ``run_ids`` an hour into the past: they ran out, nobody took the
    runs over (yet), and each attempt still believes it holds its run."""
    base, schema = split_url(url)
    async with await psycopg.AsyncConnection.connect(
            base, autocommit=True, options=f"-c search_path={schema}") as conn:
        await conn.execute("UPDATE durable_runs SET lease_expires_at = lease_expires_at - 3600"
                           " WHERE id = ANY (%s)", (sorted(run_ids),))


@pytest.mark.parametrize("grouped", [True, False], ids=["grouped", "alone"])
async def test_no_statement_a_write_goes_out_as_accepts_a_lease_that_ran_out(
        pg_url: str, pg_store: PostgresStore, grouped: bool) -> None:
    """The lease's deadline in every statement a fenced write goes out as, not only the
    epoch: alone, an append of one, two or three entries (append_entry, append_entry_pair,
    append_entries) and a finish of one or two (finish_run in its two forms); grouped, the
    batch statements (append_batch, finish_batch), whose refused jobs take nothing from the
    others. An attempt whose lease ran out writes nothing, though no one took its run yet."""
    # (finish?, entries): every form, each once with its lease run out and once not
    forms = [(False, 1), (False, 2), (False, 3), (True, 1), (True, 2)]
    first, *fences = await claimed(pg_store, 1 + 2 * len(forms))
    specs = dict(zip([f.run_id for f in fences], forms * 2, strict=True))
    lapsed = {f.run_id for f in fences[:len(forms)]}
    await lapse(pg_url, lapsed)
    results: dict[str, bool] = {}

    async def write(i: int, f: Fence) -> None:
        finish, entries = specs[f.run_id]
        if finish:
            done = JournalWrite(EntryKind.RUN_COMPLETED, data={"result": i})
            results[f.run_id] = await pg_store.finish(
                f, RunState.COMPLETED, result=i, entries=[VALUE] * (entries - 1) + [done])
        else:
            results[f.run_id] = await pg_store.append(f, [VALUE] * entries)

    if grouped:
        await in_one_batch(pg_url, pg_store, first, results,
                           [functools.partial(write, i, f) for i, f in enumerate(fences)])
        assert pg_store.batches == 2  # the others went out as one batch
    else:
        pg_store.group_commit = False
        results[first.run_id] = await pg_store.append(first, [VALUE])
        for i, f in enumerate(fences):
            await write(i, f)
    assert results == {f.run_id: f.run_id not in lapsed for f in [first, *fences]}
    for f in fences:
        run = await pg_store.get_run(f.run_id)
        assert run is not None
        if f.run_id in lapsed:  # nothing written: still running, its journal as it was
            assert await journal_kinds(pg_store, f.run_id) == ["run_created", "run_claimed"]
            assert run.state is RunState.RUNNING
