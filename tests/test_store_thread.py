"""The SQLite database thread under faults: group commit isolates jobs, the thread survives
savepoint errors, and closing never blocks the event loop. Real SQLite files, asyncio and trio.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path

import anyio
import anyio.lowlevel
import pytest

from durable._clock import FakeClock
from durable._errors import StoreError
from durable._lease import Lease
from durable._types import EntryKind, JournalWrite
from durable.store._sqlite import SqliteStore
from durable.store._thread import DbThread
from tests.helpers import poll
from tests.test_store_contract import claim_one, create, fence

pytestmark = pytest.mark.anyio


def connector(path: Path) -> Callable[[], sqlite3.Connection]:
    def connect() -> sqlite3.Connection:
        conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA journal_mode = WAL")
        return conn
    return connect


def make_table(path: Path) -> None:
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE t (name TEXT PRIMARY KEY)")


def names(path: Path) -> list[str]:
    with sqlite3.connect(path) as conn:
        return sorted(r[0] for r in conn.execute("SELECT name FROM t"))


def insert(name: str, *, fail: bool = False) -> Callable[[sqlite3.Connection], str]:
    def job(conn: sqlite3.Connection) -> str:
        conn.execute("INSERT INTO t (name) VALUES (?)", (name,))
        if fail:
            raise ValueError(f"{name} fails after writing")
        return name
    return job


async def run_batch(db: DbThread, jobs: list[Callable[[sqlite3.Connection], str]]
                    ) -> list[str | BaseException]:
    """Run jobs concurrently so they are committed as one group."""
    results: list[str | BaseException] = [""] * len(jobs)

    async def one(i: int) -> None:
        try:
            results[i] = await db.run(jobs[i])
        except BaseException as exc:
            results[i] = exc

    async with anyio.create_task_group() as tg:
        for i in range(len(jobs)):
            tg.start_soon(one, i)
    return results


@pytest.mark.parametrize("inline", [True, False], ids=["inline", "thread"])
async def test_a_failing_job_of_a_group_commit_leaves_nothing(tmp_path: Path,
                                                              inline: bool) -> None:
    path = tmp_path / "g.db"
    make_table(path)
    gate = threading.Event()
    db = DbThread(connector(path), busy_retry=5.0,
                  connect_inline=connector(path) if inline else None)
    await anyio.to_thread.run_sync(db.start)
    await anyio.to_thread.run_sync(db.start_inline)
    try:
        if not inline:  # hold the thread so the three jobs queue up into one batch
            def hold(conn: sqlite3.Connection) -> str:
                gate.wait(10)
                return "held"
            async with anyio.create_task_group() as tg:
                tg.start_soon(db.run, hold)
                await anyio.lowlevel.checkpoint()
                batch = anyio.Event()

                async def jobs() -> None:
                    nonlocal got
                    got = await run_batch(db, [insert("a"), insert("b", fail=True),
                                               insert("c")])
                    batch.set()
                got: list[str | BaseException] = []
                tg.start_soon(jobs)
                await anyio.lowlevel.checkpoint()
                await anyio.lowlevel.checkpoint()
                gate.set()
                await batch.wait()
        else:
            got = await run_batch(db, [insert("a"), insert("b", fail=True), insert("c")])
            assert db.inline_jobs == 3  # one batch on the inline connection
    finally:
        gate.set()
        await anyio.to_thread.run_sync(db.stop)
    assert got[0] == "a" and got[2] == "c"
    assert isinstance(got[1], ValueError)
    assert names(path) == ["a", "c"]  # b's insert was rolled back to its savepoint


@pytest.mark.parametrize("inline", [True, False], ids=["inline", "thread"])
async def test_a_savepoint_error_fails_the_batch_and_the_thread_survives(
        tmp_path: Path, inline: bool) -> None:
    path = tmp_path / "s.db"
    make_table(path)
    db = DbThread(connector(path), busy_retry=5.0,
                  connect_inline=connector(path) if inline else None)
    await anyio.to_thread.run_sync(db.start)
    await anyio.to_thread.run_sync(db.start_inline)

    def breaks_savepoint(conn: sqlite3.Connection) -> str:
        conn.execute("RELEASE job")  # the batch's own RELEASE then fails: no such savepoint
        return "broke"

    try:
        with anyio.fail_after(10):
            got = await run_batch(db, [insert("a"), breaks_savepoint, insert("c")])
            assert all(isinstance(g, BaseException) for g in got), got
            # the database is usable afterwards, on both paths
            assert await db.run(insert("after")) == "after"
            if inline:  # the thread path too
                db._inline = None
            assert await db.run(insert("thread")) == "thread"
    finally:
        await anyio.to_thread.run_sync(db.stop)
    assert "after" in names(path) and "thread" in names(path)


async def test_a_dead_database_thread_fails_calls_instead_of_hanging(tmp_path: Path) -> None:
    path = tmp_path / "d.db"
    make_table(path)
    db = DbThread(connector(path), busy_retry=5.0)
    await anyio.to_thread.run_sync(db.start)
    db._queue.put(None)
    assert db._thread is not None
    await anyio.to_thread.run_sync(db._thread.join)
    with anyio.fail_after(5), pytest.raises(StoreError, match="database thread"):
        await db.run(insert("x"))


async def test_aclose_does_not_block_the_event_loop(tmp_path: Path) -> None:
    path = tmp_path / "c.db"
    clock = FakeClock()
    store = SqliteStore(str(path), clock=clock, busy_timeout=0.1)
    await store.open()
    await create(store, "r1")
    run = await claim_one(store)

    # Another process's connection holds the write lock until the event loop has shown it
    # keeps running while aclose waits for the database thread.
    locked = threading.Event()
    release = threading.Event()

    def other_process() -> None:
        conn = sqlite3.connect(path, isolation_level=None)
        conn.execute("BEGIN IMMEDIATE")
        locked.set()
        release.wait(10)  # bounded: a blocked loop can never set it
        conn.execute("COMMIT")
        conn.close()

    holder = threading.Thread(target=other_process)
    holder.start()
    await anyio.to_thread.run_sync(locked.wait)
    db = store._db
    assert db is not None
    sent = db.thread_jobs
    state = {"closed": False, "closed_when_ticked": True, "ticks": 0}
    try:
        async with anyio.create_task_group() as tg:
            async def write_then_close() -> None:
                async with anyio.create_task_group() as inner:
                    # the write misses inline (locked) and waits in the database thread
                    inner.start_soon(store.append, fence(run),
                                     [JournalWrite(EntryKind.VALUE, data={"x": 1})])
                    await poll(lambda: db.thread_jobs > sent)
                    tg.start_soon(ticker)
                    await store.aclose()
                    state["closed"] = True

            async def ticker() -> None:
                for _ in range(20):  # the loop runs while aclose waits for the thread
                    state["ticks"] += 1
                    await anyio.lowlevel.checkpoint()
                state["closed_when_ticked"] = state["closed"]
                release.set()

            tg.start_soon(write_then_close)
    finally:
        release.set()
        await anyio.to_thread.run_sync(holder.join)
    assert state["ticks"] == 20 and state["closed"]
    assert state["closed_when_ticked"] is False


async def test_a_lease_lost_while_the_first_writer_gathers_its_batch_still_commits_it(
        tmp_path: Path) -> None:
    """The first writer of a batch yields (so other runs join) inside an attempt's lazy
    shielded write scope; the lease is lost during that yield, by the task that joins. The
    batch, the other run's write with it, is committed all the same, and only then does
    the lost lease's cancel go on: nobody waits for a batch that nobody flushes."""
    path = tmp_path / "lost.db"
    make_table(path)
    db = DbThread(connector(path), busy_retry=5.0, connect_inline=connector(path))
    await anyio.to_thread.run_sync(db.start)
    await anyio.to_thread.run_sync(db.start_inline)
    lease = Lease(30.0, anyio.current_time())
    joining = anyio.Event()
    got: dict[str, object] = {}

    async def first() -> None:
        with lease.shielded(10.0, lazy=True) as scope:
            joining.set()  # the other task runs during the yield below
            got["a"] = await db.run(insert("a"))
        got["a cancelled"] = scope.cancelled_caught

    async def other() -> None:
        await joining.wait()
        lease.lose("lost while the batch gathers")
        got["b"] = await db.run(insert("b"))

    try:
        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                tg.start_soon(other)
                await anyio.lowlevel.checkpoint()  # other waits for joining
                tg.start_soon(first)
    finally:
        await anyio.to_thread.run_sync(db.stop)
    assert got["b"] == "b"
    assert names(path) == ["a", "b"]


async def test_inline_commits_are_checkpointed_every_checkpoint_every_and_counted(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every CHECKPOINT_EVERY inline write transactions, the database thread checkpoints
    the WAL (the inline connection never does: its autocheckpoint is off); every write
    transaction, inline or in the thread, counts in ``writes`` (the change watcher's sign
    that the process commits)."""
    from durable.store import _thread

    monkeypatch.setattr(_thread, "CHECKPOINT_EVERY", 3)
    path = tmp_path / "t.db"
    make_table(path)
    db = DbThread(connector(path), busy_retry=1.0, connect_inline=connector(path))
    db.start()
    db.start_inline()
    try:
        for i in range(2):
            await db.run(insert(f"a{i}"))
        assert db.writes == 2 and db.thread_jobs == 0
        assert in_database_file(path) == []  # in the WAL only
        await db.run(insert("a2"))  # the third: the thread checkpoints
        assert db.writes == 3 and db.thread_jobs == 1
        await poll(lambda: in_database_file(path) == ["a0", "a1", "a2"], timeout=10)
        assert await db.run(lambda conn: conn.execute("SELECT 1").fetchone()[0],
                            write=False) == 1
        assert db.writes == 3  # a read is no write
    finally:
        await anyio.to_thread.run_sync(db.stop)
    assert names(path) == ["a0", "a1", "a2"]


async def test_the_wal_is_emptied_under_writes_that_never_pause(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Inline writes one after another, each adding pages to the WAL while the thread's
    checkpoint copies the earlier ones: a passive checkpoint alone never saw every frame
    copied, so SQLite never started the WAL over and the file grew by every commit (here
    to about 30 MB). Past WAL_RESET_FRAMES the checkpoint also empties it, the inline
    writes waiting behind it meanwhile (here it stays under 0.4 MB)."""
    from durable.store import _thread

    monkeypatch.setattr(_thread, "CHECKPOINT_EVERY", 10)
    monkeypatch.setattr(_thread, "WAL_RESET_FRAMES", 40)
    path = tmp_path / "t.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE b (name TEXT PRIMARY KEY, data BLOB NOT NULL)")

    def inline() -> sqlite3.Connection:  # as the store's: busy at once, never waiting
        conn = sqlite3.connect(path, timeout=0, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA journal_mode = WAL")
        return conn

    def put(i: int) -> Callable[[sqlite3.Connection], None]:
        def job(conn: sqlite3.Connection) -> None:
            conn.execute("INSERT INTO b VALUES (?, ?)", (f"r{i}", bytes(8000)))  # 3 pages
        return job

    db = DbThread(connector(path), busy_retry=5.0, connect_inline=inline)
    db.start()
    db.start_inline()
    wal = Path(f"{path}-wal")
    sizes = []
    try:
        for i in range(1500):
            await db.run(put(i))
            sizes.append(wal.stat().st_size)
    finally:
        await anyio.to_thread.run_sync(db.stop)
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT count(*) FROM b").fetchone()[0] == 1500
    # 1,000 commits of 3 pages or more each: 12 MB and more if the WAL never started over
    assert max(sizes[500:]) < 2_000_000, max(sizes[500:])


def in_database_file(path: Path) -> list[str] | None:
    """The rows in the database file itself, the WAL left unread (what a checkpoint moved);
    None if the read met the file half-written by a checkpoint under way."""
    conn = sqlite3.connect(f"file:{path}?immutable=1", uri=True)
    try:
        return sorted(r[0] for r in conn.execute("SELECT name FROM t"))
    except sqlite3.DatabaseError:
        return None
    finally:
        conn.close()


async def concurrent_writes(db: DbThread, jobs: list[Callable[[sqlite3.Connection], str]]
                            ) -> list[str | BaseException]:
    with anyio.fail_after(10):
        return await run_batch(db, jobs)


async def test_a_begin_the_database_refuses_fails_every_writer_of_the_inline_batch(
        tmp_path: Path) -> None:
    """The inline connection's BEGIN IMMEDIATE refused for another reason than a lock held
    elsewhere (here a read-only connection: "attempt to write a readonly database"): no
    transaction began, and every writer of the batch is told so; none is told it
    committed."""
    path = tmp_path / "ro.db"
    make_table(path)

    def read_only() -> sqlite3.Connection:
        conn = connector(path)()
        conn.execute("PRAGMA query_only = ON")
        return conn

    db = DbThread(connector(path), busy_retry=5.0, connect_inline=read_only)
    await anyio.to_thread.run_sync(db.start)
    await anyio.to_thread.run_sync(db.start_inline)
    try:
        got = await concurrent_writes(db, [insert("a"), insert("b")])
        assert db.inline_jobs == 2  # one batch, on the inline connection
    finally:
        await anyio.to_thread.run_sync(db.stop)
    assert all(isinstance(g, sqlite3.OperationalError) and "readonly" in str(g)
               for g in got), got
    assert names(path) == []


async def test_an_inline_connection_that_fails_fails_every_writer_of_its_batch(
        tmp_path: Path) -> None:
    """The inline connection itself fails (closed under the store: BEGIN raises
    ProgrammingError, not an OperationalError): every writer of the batch gets that error,
    none a result, and nothing is written."""
    path = tmp_path / "closed.db"
    make_table(path)
    opened: list[sqlite3.Connection] = []

    def kept() -> sqlite3.Connection:
        conn = connector(path)()
        opened.append(conn)
        return conn

    db = DbThread(connector(path), busy_retry=5.0, connect_inline=kept)
    await anyio.to_thread.run_sync(db.start)
    await anyio.to_thread.run_sync(db.start_inline)
    opened[0].close()
    try:
        got = await concurrent_writes(db, [insert("a"), insert("b")])
    finally:
        await anyio.to_thread.run_sync(db.stop)
    assert all(isinstance(g, sqlite3.ProgrammingError) for g in got), got
    assert names(path) == []


async def test_a_batch_whose_begin_waited_in_vain_fails_every_writer_in_the_thread(
        tmp_path: Path) -> None:
    """Another process holds the write lock longer than the thread's busy retry: the
    thread's BEGIN IMMEDIATE gives up, and every write of its batch is told the database
    was locked (nothing began), none that it committed."""
    path = tmp_path / "busy.db"
    make_table(path)

    def impatient() -> sqlite3.Connection:  # (the file is in WAL mode already)
        return sqlite3.connect(path, timeout=0, isolation_level=None, check_same_thread=False)

    holder = connector(path)()
    holder.execute("BEGIN IMMEDIATE")
    db = DbThread(impatient, busy_retry=0.05)
    await anyio.to_thread.run_sync(db.start)
    try:
        got = await concurrent_writes(db, [insert("a"), insert("b")])
    finally:
        holder.rollback()
        holder.close()
        await anyio.to_thread.run_sync(db.stop)
    assert all(isinstance(g, sqlite3.OperationalError) and "locked" in str(g)
               for g in got), got
    assert names(path) == []


@pytest.mark.parametrize("path_of_writes", ["inline", "thread"])
async def test_a_write_of_a_caller_already_cancelled_writes_nothing(
        tmp_path: Path, path_of_writes: str) -> None:
    """A caller passes a checkpoint before its write joins a batch, on the inline fast path
    and on the database thread's (the only one with ``synchronous=FULL``): one cancelled
    before it writes nothing, the database is not touched."""
    path = tmp_path / "cancelled.db"
    make_table(path)
    inline = path_of_writes == "inline"
    db = DbThread(connector(path), busy_retry=5.0,
                  connect_inline=connector(path) if inline else None)
    await anyio.to_thread.run_sync(db.start)
    if inline:
        await anyio.to_thread.run_sync(db.start_inline)
    try:
        with anyio.CancelScope() as scope:
            scope.cancel()
            await db.run(insert("a"))
        assert scope.cancelled_caught
        assert await db.run(insert("b")) == "b"
    finally:
        await anyio.to_thread.run_sync(db.stop)
    assert names(path) == ["b"]
