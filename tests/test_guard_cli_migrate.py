"""Opening a store and migrating it: a migration is all or nothing, and an open that may not
migrate (a schema missing, newer, or behind for a read command) refuses by a read, without
waiting for the migration's lock; one that waited for it judges the schema again.

Real SQLite files and the machine's PostgreSQL (a schema of its own per test).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

import durable
from durable.store import SCHEMA_VERSION, store_from_url
from durable.store._sql import load_migrations
from tests.helpers import at_schema, poll
from tests.pg import connect_sync, pg_url, postgres_server, split_url

__all__ = ["pg_url", "postgres_server"]  # fixtures

pytestmark = pytest.mark.anyio
postgres_only = pytest.mark.parametrize("anyio_backend", ["asyncio"])
FAILING = "\nSELECT * FROM durable_no_such_table;\n"


def failing_last(load: Callable[[str], list[tuple[int, str]]]
                 ) -> Callable[[str], list[tuple[int, str]]]:
    """The real migrations, the last one ending with a statement that fails."""
    def migrations(dialect: str) -> list[tuple[int, str]]:
        found = load(dialect)
        number, script = found[-1]
        return [*found[:-1], (number, script + FAILING)]
    return migrations


def lock_migrations(url: str) -> Any:
    """A session holding the migration's advisory lock of ``url``'s schema (as a migrating
    process does)."""
    _, schema = split_url(url)
    holder = connect_sync(url)
    holder.execute("SELECT pg_advisory_lock(hashtextextended(%s, 0))",
                   (f"durable.migrate.{schema}",))
    return holder


async def test_a_sqlite_migration_that_fails_leaves_nothing_behind(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "d.db"
    monkeypatch.setattr("durable.store._sqlite.load_migrations", failing_last(load_migrations))
    with pytest.raises(durable.StoreError, match="durable_no_such_table"):
        async with durable.Client.connect(f"sqlite:///{path}"):
            pass
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("SELECT name FROM sqlite_master").fetchall() == []
    finally:
        conn.close()
    monkeypatch.undo()
    async with durable.Client.connect(f"sqlite:///{path}") as client:
        assert await client.store.schema_version() == SCHEMA_VERSION


@postgres_only
async def test_a_postgres_migration_that_fails_leaves_nothing_behind(
        pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every migration of an open runs in one transaction: one that fails leaves the
    database as it was (here: no schema at all), never some migrations applied and
    recorded; the next open migrates from there."""
    monkeypatch.setattr("durable.store._postgres.load_migrations",
                        failing_last(load_migrations))
    with pytest.raises(durable.StoreError, match="durable_no_such_table"):
        async with durable.Client.connect(pg_url):
            pass
    _, schema = split_url(pg_url)
    with connect_sync(pg_url) as conn:
        assert conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s",
                            (schema,)).fetchone() is None
    monkeypatch.undo()
    async with durable.Client.connect(pg_url) as client:
        assert await client.store.schema_version() == SCHEMA_VERSION


@postgres_only
async def test_a_postgres_open_that_may_not_migrate_refuses_without_the_migration_lock(
        pg_url: str) -> None:
    """While a migration holds its lock: a read command's open (``create=False``,
    ``upgrade=False``) of a missing schema or of one behind, and any open of a newer
    schema, refuse at once in one line by a read; none waits for the lock."""
    holder = lock_migrations(pg_url)
    try:
        with anyio.fail_after(10), pytest.raises(durable.StoreUnavailableError,
                                                 match="no durable schema"):
            await store_from_url(pg_url, create=False, upgrade=False).open()
        at_schema(pg_url, SCHEMA_VERSION - 1)
        with anyio.fail_after(10), pytest.raises(durable.SchemaVersionError,
                                                 match=r"older than .*durable migrate"):
            await store_from_url(pg_url, create=False, upgrade=False).open()
        holder.execute("UPDATE durable_meta SET value = '99' WHERE key = 'schema_version'")
        with anyio.fail_after(10), pytest.raises(durable.SchemaVersionError,
                                                 match="newer than this durable"):
            await store_from_url(pg_url).open()
    finally:
        holder.close()


@postgres_only
async def test_a_schema_a_newer_durable_migrated_while_an_open_waited_is_refused(
        pg_url: str) -> None:
    """An open that found the schema behind waits for the migration's lock; the process
    that held it (a newer durable) took the schema past this durable's version. The open
    judges the version again under the lock: it refuses, and migrates nothing."""
    at_schema(pg_url, SCHEMA_VERSION - 1)
    holder = lock_migrations(pg_url)
    try:
        pid = holder.info.backend_pid
        store = store_from_url(pg_url)
        refused: list[BaseException] = []

        async def open_store() -> None:
            try:
                await store.open()
            except durable.SchemaVersionError as exc:
                refused.append(exc)
            else:
                await store.aclose()

        def waiting() -> bool:
            row = holder.execute("SELECT count(*) FROM pg_stat_activity "
                                 "WHERE %s = ANY(pg_blocking_pids(pid))", (pid,)).fetchone()
            return bool(row[0])

        with anyio.fail_after(20):
            async with anyio.create_task_group() as tg:
                tg.start_soon(open_store)
                await poll(waiting)  # the open waits for the lock
                holder.execute(
                    "UPDATE durable_meta SET value = '99' WHERE key = 'schema_version'")
                holder.execute("SELECT pg_advisory_unlock_all()")
        assert len(refused) == 1 and "newer than this durable" in str(refused[0])
        version = holder.execute(
            "SELECT value FROM durable_meta WHERE key = 'schema_version'").fetchone()
        assert version[0] == "99"
    finally:
        holder.close()
