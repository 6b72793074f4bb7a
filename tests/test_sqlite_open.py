"""Opening a fresh SQLite file while other connections create or lock it never fails.

``PRAGMA journal_mode = WAL`` on a new file does not call SQLite's busy handler: while
another connection held a lock on the file, the switch failed at once with "database is
locked" (about one first open in fifteen when a worker and a ``start`` began together).
"""

from __future__ import annotations

import multiprocessing
import sqlite3
import threading
from pathlib import Path

import anyio
import pytest

import durable
from durable.store import SCHEMA_VERSION, store_from_url

from .helpers import at_schema

ROUNDS = 20
PROCESSES = 4


@pytest.mark.anyio
async def test_open_waits_for_a_connection_that_holds_a_fresh_file(tmp_path: Path) -> None:
    path = tmp_path / "fresh.db"
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")  # a write lock on the new, still empty file
    # The holder commits a little later, as a concurrent first open would. The store's open
    # must wait for it, not fail: with the lock held, SQLite refuses the WAL switch at once.
    release = threading.Timer(0.3, holder.rollback)
    release.start()
    try:
        store = store_from_url(f"sqlite:///{path}")
        with anyio.fail_after(20):
            await store.open()
        try:
            assert await store.schema_version() >= 1
        finally:
            await store.aclose()
    finally:
        release.cancel()
        release.join()
        holder.close()
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        conn.close()


def _open_each(paths: list[str], barrier: multiprocessing.synchronize.Barrier,
               results: multiprocessing.Queue[str | None]) -> None:
    async def open_close(path: str) -> None:
        store = store_from_url(f"sqlite:///{path}")
        await store.open()
        await store.aclose()

    for path in paths:
        barrier.wait(timeout=60)  # every process opens the same fresh file at the same time
        try:
            anyio.run(open_close, path)
        except Exception as exc:
            results.put(f"{path}: {type(exc).__name__}: {exc}")
    results.put(None)


def test_concurrent_first_opens_from_several_processes_all_succeed(tmp_path: Path) -> None:
    paths = [str(tmp_path / f"fresh-{i}.db") for i in range(ROUNDS)]
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(PROCESSES)
    results: multiprocessing.Queue[str | None] = ctx.Queue()
    procs = [ctx.Process(target=_open_each, args=(paths, barrier, results))
             for _ in range(PROCESSES)]
    for proc in procs:
        proc.start()
    errors: list[str] = []
    finished = 0
    try:
        while finished < PROCESSES:
            message = results.get(timeout=120)
            if message is None:
                finished += 1
            else:
                errors.append(message)
    finally:
        for proc in procs:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
    assert errors == []
    assert all(proc.exitcode == 0 for proc in procs)
    for path in paths:
        conn = sqlite3.connect(path)
        try:
            assert conn.execute(
                "SELECT value FROM durable_meta WHERE key = 'schema_version'").fetchone()
        finally:
            conn.close()


@pytest.mark.anyio
async def test_opening_a_current_database_takes_no_write_lock(tmp_path: Path) -> None:
    """Read commands (list, show, the console) open without a write transaction: they open
    and answer while another process holds the write lock."""
    url = f"sqlite:///{tmp_path / 'd.db'}"
    async with durable.Client.connect(url) as client:  # creates and migrates: writes
        await client.store.schema_version()
    writer = sqlite3.connect(tmp_path / "d.db", isolation_level=None)
    try:
        writer.execute("BEGIN IMMEDIATE")  # the write lock, held for the whole block
        with anyio.fail_after(10):
            async with durable.Client.connect(url, create=False) as client:
                assert await client.list() == []
    finally:
        writer.execute("ROLLBACK")
        writer.close()


@pytest.mark.anyio
async def test_a_read_open_refuses_an_older_schema_without_the_write_lock(
        tmp_path: Path) -> None:
    """A read command (``upgrade=False``) on a schema behind its own refuses it by a read,
    at once, while a worker of the older durable holds the write lock: it neither waits for
    the lock nor takes it (a refusal only decided under the lock waited out the busy time,
    then said "database is locked" instead of naming ``durable migrate``)."""
    url = f"sqlite:///{tmp_path / 'd.db'}"
    at_schema(url, SCHEMA_VERSION - 1)
    writer = sqlite3.connect(tmp_path / "d.db", isolation_level=None)
    try:
        writer.execute("BEGIN IMMEDIATE")  # the older worker's write, held for the block
        with anyio.fail_after(10), pytest.raises(durable.SchemaVersionError,
                                                 match=r"older than .*durable migrate"):
            async with durable.Client.connect(url, create=False, upgrade=False):
                pass
    finally:
        writer.execute("ROLLBACK")
        writer.close()
