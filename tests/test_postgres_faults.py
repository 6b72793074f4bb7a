"""The PostgreSQL store under connection faults (asyncio only: psycopg's async driver).

Dropped pooled connections, a cancel racing a release, and statements bounded by
``statement_timeout``, on the machine's real server (tests/pg.py).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import anyio
import pytest

from durable._clock import FakeClock
from durable._errors import StoreError
from durable._types import EntryKind, JournalWrite, RunState
from durable.store import Store, store_from_url
from tests.helpers import poll
from tests.pg import connect_sync, pg_url, postgres_server
from tests.test_store_contract import claim_one, create, fence, journal_kinds

__all__ = ["pg_url", "postgres_server"]

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def pg_store(pg_url: str) -> AsyncIterator[Store]:
    store = store_from_url(pg_url, clock=FakeClock())
    await store.open()
    try:
        yield store
    finally:
        await store.aclose()


async def store_backends(store: Store) -> list[int]:
    """Server pids of the store's pooled connections (only this store's: other tests' and
    other processes' connections are left alone)."""
    pids = set()
    for _ in range(5):
        rows = await store._rows("SELECT pg_backend_pid() AS pid", {})  # type: ignore[attr-defined]
        pids.add(int(rows[0]["pid"]))
    return sorted(pids)


def terminate(url: str, pids: list[int]) -> None:
    with connect_sync(url) as conn:
        for pid in pids:
            conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
        deadline = time.monotonic() + 10
        while conn.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s)",
                           (pids,)).fetchone()[0]:
            assert time.monotonic() < deadline, "backends did not exit"
            time.sleep(0.01)


async def test_a_write_after_the_pools_connections_were_terminated_succeeds(
        pg_url: str, pg_store: Store) -> None:
    await create(pg_store, "r1")
    run = await claim_one(pg_store)
    assert await pg_store.append(fence(run), [JournalWrite(EntryKind.VALUE, data={"n": 1})])
    # Another store's connections are not ours: only this store's pool is terminated.
    pids = await store_backends(pg_store)
    assert pids
    await anyio.to_thread.run_sync(terminate, pg_url, pids)
    # The broken connections are found at checkout, before the statement is sent, and
    # replaced: the write is not lost and does not raise.
    assert await pg_store.append(fence(run), [JournalWrite(EntryKind.VALUE, data={"n": 2})])
    assert await pg_store.finish(fence(run), RunState.COMPLETED)
    assert (await journal_kinds(pg_store, "r1"))[-2:] == ["value", "value"]


async def test_request_cancel_during_a_release_never_says_nothing_to_cancel(
        pg_url: str, pg_store: Store) -> None:
    await create(pg_store, "r1")
    run = await claim_one(pg_store)
    # A release holds the run's row (uncommitted) while the operator cancels.
    conn = await anyio.to_thread.run_sync(connect_sync, pg_url)
    try:
        await anyio.to_thread.run_sync(conn.execute, "BEGIN")
        await anyio.to_thread.run_sync(
            conn.execute, "UPDATE durable_runs SET state = 'queued', worker = NULL, "
            "lease_expires_at = NULL WHERE id = 'r1'")
        answer: list[object] = []

        async def cancel() -> None:
            answer.append(await pg_store.request_cancel("r1"))

        async with anyio.create_task_group() as tg:
            tg.start_soon(cancel)

            def waiting() -> bool:
                with connect_sync(pg_url) as c:
                    return bool(c.execute(
                        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                        "AND query LIKE '%%durable_runs%%' AND application_name = 'durable'"
                    ).fetchone()[0])

            await poll(lambda: anyio.to_thread.run_sync(waiting))
            await anyio.to_thread.run_sync(conn.execute, "COMMIT")
    finally:
        await anyio.to_thread.run_sync(conn.close)
    assert answer[0] is not None, "a run that was queued or running said nothing to cancel"
    after = await pg_store.get_run("r1")
    assert after is not None and after.state is RunState.CANCELLED
    assert not await pg_store.append(fence(run), [JournalWrite(EntryKind.VALUE)])


async def test_a_statement_waiting_on_a_lock_is_bounded_by_statement_timeout(
        pg_url: str) -> None:
    store = store_from_url(pg_url, clock=FakeClock(), statement_timeout=0.3)
    await store.open()
    try:
        await create(store, "r1")
        conn = await anyio.to_thread.run_sync(connect_sync, pg_url)
        try:
            await anyio.to_thread.run_sync(conn.execute, "BEGIN")
            await anyio.to_thread.run_sync(
                conn.execute, "SELECT * FROM durable_runs WHERE id = 'r1' FOR UPDATE")
            with anyio.fail_after(10), pytest.raises(StoreError, match="statement timeout"):
                await store.request_cancel("r1")
        finally:
            await anyio.to_thread.run_sync(conn.close)
    finally:
        await store.aclose()


async def test_no_connection_at_checkout_is_not_sent_and_writes_nothing(pg_url: str) -> None:
    from durable._errors import NotSentError
    from durable.store._postgres import PostgresStore

    store = PostgresStore(pg_url, clock=FakeClock(), pool_size=1, pool_timeout=0.3)
    await store.open()
    try:
        await create(store, "r1")
        run = await claim_one(store)
        async with store._connection():
            with anyio.fail_after(10), pytest.raises(NotSentError, match="no connection"):
                await store.append(fence(run), [JournalWrite(EntryKind.VALUE, data={"n": 1})])
        assert "value" not in await journal_kinds(store, "r1")
        # tried again (within the lease), the write goes in once
        assert await store.append(fence(run), [JournalWrite(EntryKind.VALUE, data={"n": 1})])
        assert (await journal_kinds(store, "r1")).count("value") == 1
    finally:
        await store.aclose()
