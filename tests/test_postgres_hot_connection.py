"""The PostgreSQL store's hot connection (PostgresStore._put_back), tested on asyncio: its
tests hold the store's connections, which on trio live on the store's loop thread, where the
mechanism is the same (durable/store/_loop.py).

psycopg_pool hands its connections out in turn, so one caller after another went round
every pooled connection (a server process each), through the pool's lock and bookkeeping
each time. The connection a call puts back is kept for the next checkout instead: never
while another caller waits for the pool, never longer than HOT_FOR out of the pool, looked
at before use like any pooled connection, and closed with the store.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import psycopg
import pytest

import durable
from durable._errors import NotSentError
from durable._types import Fence, RunState
from durable.store import _postgres
from durable.store._postgres import PostgresStore
from tests.helpers import poll
from tests.pg import connect_sync, pg_url, postgres_server
from tests.test_postgres_faults import terminate
from tests.test_postgres_group_commit import (
    VALUE,
    blocked_by,
    checked_out,
    claimed,
    locker,
    pg_store,
)

__all__ = ["pg_store", "pg_url", "postgres_server"]

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def pool_requests(store: PostgresStore) -> int:
    """Connections the store has taken from its pool so far."""
    assert store._pool is not None
    return int(store._pool.get_stats().get("requests_num", 0))


async def test_one_call_after_another_is_served_by_one_connection(
        pg_store: PostgresStore) -> None:
    """An attempt's writes and reads, one after the other: one connection from the pool,
    then the same one each time (one server process); before, each call took the next
    connection from the pool (40 checkouts here)."""
    (only,) = await claimed(pg_store, 1)
    before = pool_requests(pg_store)
    pids = set()
    for _ in range(20):
        assert await pg_store.append(only, [VALUE])
        assert await pg_store.get_run(only.run_id) is not None
        assert pg_store._hot is not None
        pids.add(pg_store._hot.info.backend_pid)
    assert pool_requests(pg_store) - before <= 1
    assert len(pids) == 1
    assert checked_out(pg_store) == 0


async def test_the_hot_connection_goes_back_to_the_pool_after_its_time(
        pg_store: PostgresStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """Out of the pool for HOT_FOR at most (then the pool's lifetime and idle rules apply
    to it again): with no time at all, every call goes through the pool as before."""
    monkeypatch.setattr(_postgres, "HOT_FOR", 0.0)
    (only,) = await claimed(pg_store, 1)
    before = pool_requests(pg_store)
    for _ in range(5):
        assert await pg_store.append(only, [VALUE])
        assert pg_store._hot is None
    assert pool_requests(pg_store) - before == 5
    assert checked_out(pg_store) == 0


@asynccontextmanager
async def only_connection_taken(
        pg_url: str, pool_timeout: float
) -> AsyncIterator[tuple[PostgresStore, Fence, psycopg.AsyncConnection[Any]]]:
    """A store of one pooled connection, taken (in the block) by a write of run ``r00``
    that waits on the run's row lock; the lock's connection, to commit (the block's end
    commits it too: the write is shielded, and answered then)."""
    store = PostgresStore(pg_url, pool_size=1, pool_timeout=pool_timeout)
    await store.open()
    lock = None
    try:
        (only,) = await claimed(store, 1)
        lock = await locker(pg_url, only.run_id)
        async with anyio.create_task_group() as tg:
            async def write() -> None:
                assert await store.append(only, [VALUE])

            tg.start_soon(write)
            try:
                await poll(lambda: blocked_by(pg_url, lock))
                yield store, only, lock
            finally:
                await lock.commit()
    finally:
        if lock is not None:
            await lock.close()
        await store.aclose()


async def test_a_caller_waiting_for_the_pool_gets_the_connection_put_back(
        pg_url: str) -> None:
    """One pooled connection, held by a write that waits on a row lock; a read waits for
    the pool meanwhile. The write's connection goes to the waiting read when the write is
    answered: kept hot instead, it would idle while the read waited out the pool's
    timeout (NotSentError after 5 s here)."""
    read: list[durable.Run | None] = []
    async with only_connection_taken(pg_url, 5.0) as (store, only, lock):
        async with anyio.create_task_group() as tg:
            async def get() -> None:
                read.append(await store.get_run(only.run_id))

            tg.start_soon(get)
            await poll(lambda: store._getting == 1)  # the read waits for the pool
            await lock.commit()
    assert [None if run is None else run.state for run in read] == [RunState.RUNNING]


async def test_a_read_that_got_no_connection_from_the_pool_is_not_tried_again(
        pg_url: str) -> None:
    """No pooled connection within the pool's timeout: the read fails with NotSentError
    after one timeout. psycopg's PoolTimeout is an OperationalError without a SQLSTATE,
    which PostgresStore._read took for a connection lost under a read and sent it again:
    two waits for the pool (two of its request errors), twice the timeout."""
    async with only_connection_taken(pg_url, 0.5) as (store, only, _):
        assert store._pool is not None
        errors = store._pool.get_stats().get("requests_errors", 0)
        with pytest.raises(NotSentError, match=r"no connection within 0\.5 s"):
            await store.get_run(only.run_id)
        assert store._pool.get_stats().get("requests_errors", 0) - errors == 1


async def test_a_hot_connection_the_server_ended_is_replaced_before_anything_is_sent(
        pg_url: str, pg_store: PostgresStore) -> None:
    """The hot connection is looked at before use, like one from the pool: ended by the
    server while it idled (``pg_terminate_backend``), it is closed and another is taken,
    and the write goes out once, on that one (sent on the ended one, its outcome would be
    unknown: StoreUnavailableError)."""
    (only,) = await claimed(pg_store, 1)
    assert await pg_store.append(only, [VALUE])
    assert pg_store._hot is not None
    ended = pg_store._hot
    await anyio.to_thread.run_sync(terminate, pg_url, [ended.info.backend_pid])
    await poll(lambda: not _postgres._alive(ended))  # the FATAL reached its socket
    assert await pg_store.append(only, [VALUE])
    assert ended.closed
    assert pg_store._hot is not None and pg_store._hot is not ended
    assert await pg_store.finish(only, RunState.COMPLETED)


def notify(url: str, channel: str) -> None:
    with connect_sync(url) as conn:
        conn.execute(f"NOTIFY {channel}")


async def test_a_connection_the_server_sent_something_unasked_is_not_alive_at_any_later_look(
        pg_url: str, pg_store: PostgresStore) -> None:
    """Input the server sent unasked (a FATAL that came before the end of its stream;
    here a notification) makes the connection not alive at every later look, not only at
    the one that read it: once read, the socket has nothing more to read and libpq still
    calls the connection OK. (A look in a test's poll, then the store's own before use,
    once used a connection whose FATAL the first look had read.)"""
    (only,) = await claimed(pg_store, 1)
    assert await pg_store.append(only, [VALUE])
    hot = pg_store._hot
    assert hot is not None
    await hot.execute("LISTEN durable_unasked")
    await anyio.to_thread.run_sync(notify, pg_url, "durable_unasked")
    await poll(lambda: not _postgres._alive(hot))  # the first look reads it
    assert not _postgres._alive(hot)  # and the next says the same
    assert await pg_store.append(only, [VALUE])
    assert hot.closed and pg_store._hot is not hot


async def test_the_hot_connection_is_closed_with_the_store(pg_url: str) -> None:
    store = PostgresStore(pg_url)
    await store.open()
    (only,) = await claimed(store, 1)
    assert await store.append(only, [VALUE])
    hot = store._hot
    assert hot is not None
    await store.aclose()
    assert hot.closed
