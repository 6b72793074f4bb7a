"""A dedicated database thread that runs whole transactions in one hop, on asyncio and trio.

Why not aiosqlite: its public API costs one thread hop per statement, so a fenced
transaction (BEGIN IMMEDIATE, a few conditional statements, COMMIT) costs four or five hops,
and it does not run on trio at all (it calls asyncio directly). Here a transaction is one
Python callable run in the database thread, and the caller is woken through its own event
loop (``call_soon_threadsafe`` on asyncio, the trio token on trio).

Group commit: write jobs that queue up while the thread is busy run in one transaction,
each inside its own SAVEPOINT so one failing job cannot undo another's work. A lone job pays
one commit; a thousand concurrent runs share commits.

The inline fast path: handing a job to a thread and being woken costs about 0.1 ms here (two
GIL hand-offs and a self-pipe write), while a WAL commit with ``synchronous=NORMAL`` costs
about 0.015 ms. So when it can, a job runs right in the event loop's thread on a second
connection whose busy timeout is zero: if another connection holds the write lock, it gives
up at once (nothing done) and the job goes to the database thread, which waits its turn.
Inline jobs never wait on a lock and never fsync (the fast path is off for
``synchronous=FULL``), so they cannot stall the event loop; the caller still passes a
checkpoint before (a cancelled caller writes nothing) and after (others get to run: a
write's is shielded, since it committed; a read's is not, it only loses what it read).
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import sqlite3
import threading
import time
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import anyio
import sniffio
from anyio.lowlevel import cancel_shielded_checkpoint, checkpoint, checkpoint_if_cancelled

from .._errors import StoreError
from .._lease import arm_bound, in_lazy_bound

T = TypeVar("T")

MAX_BATCH = 512
"""The most write jobs committed in one transaction."""


WAL_RESET_FRAMES = 4096
"""WAL frames (pages: 16 MiB at SQLite's default 4 KiB) past which the periodic checkpoint
also empties the WAL (docs/design.md, *The WAL stays bounded*)."""

WAL_RESET_WAIT_MS = 20
"""Milliseconds that emptying the WAL may wait for other connections' readers and writers
(this process's writes wait behind it meanwhile); when they keep it waiting longer it gives
up until the next checkpoint."""


def _passive_checkpoint(conn: sqlite3.Connection) -> int:
    """A passive checkpoint (it copies what it can, waiting for nobody); the WAL's frames."""
    row = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
    return 0 if row is None else int(row[1])


def _truncating_checkpoint(conn: sqlite3.Connection) -> None:
    """Copy the rest of the WAL and empty the file, waiting at most WAL_RESET_WAIT_MS for
    other connections' readers and writers (then it gives up: the WAL is left as it is)."""
    waited = conn.execute("PRAGMA busy_timeout").fetchone()[0]
    conn.execute(f"PRAGMA busy_timeout = {WAL_RESET_WAIT_MS}")
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
    finally:
        conn.execute(f"PRAGMA busy_timeout = {int(waited)}")


class _Job(Generic[T]):
    __slots__ = ("_event", "error", "fn", "result", "wake", "write")

    def __init__(self, fn: Callable[[sqlite3.Connection], T], write: bool) -> None:
        self.fn = fn
        self.write = write
        self.result: T | None = None
        self.error: BaseException | None = None
        self._event: anyio.Event | None = None
        self.wake: Callable[[], None] = self._set  # replaced when handed to the thread

    @property
    def event(self) -> anyio.Event:
        """Set when the job is done; made on first use (in the event loop's thread): the
        writer that commits its own batch inline never waits for one."""
        if self._event is None:
            self._event = anyio.Event()
        return self._event

    def _set(self) -> None:
        self.event.set()

    def outcome(self) -> T:
        if self.error is not None:
            raise self.error
        return self.result  # type: ignore[return-value]


def _waker(event: anyio.Event) -> Callable[[], None]:
    """A function that sets ``event`` from another thread, on the caller's event loop."""
    library = sniffio.current_async_library()
    if library == "trio":
        import trio

        token = trio.lowlevel.current_trio_token()

        def wake_trio() -> None:
            try:
                token.run_sync_soon(event.set)
            except trio.RunFinishedError:
                pass

        return wake_trio
    import asyncio

    loop = asyncio.get_running_loop()

    def wake_asyncio() -> None:
        try:
            loop.call_soon_threadsafe(event.set)
        except RuntimeError:  # the loop is closed: nobody waits any more
            pass

    return wake_asyncio


CHECKPOINT_EVERY = 500
"""Inline commits between two WAL checkpoints (run by the database thread)."""


def _busy(exc: sqlite3.Error) -> bool:
    """SQLITE_BUSY or SQLITE_LOCKED (any extended code): another connection holds a lock."""
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
    text = str(exc)
    return "locked" in text or "busy" in text


def retry_busy(fn: Callable[[], T], seconds: float) -> T:
    """``fn()``, tried again while the database is busy, for at most ``seconds``.

    For ``BEGIN IMMEDIATE`` (to wait longer than the connection's busy timeout) and for
    ``PRAGMA journal_mode = WAL``, for which SQLite never calls its busy handler: while
    another connection held a lock on a new file, the switch failed at once, and two
    processes opening a fresh file together failed about one time in fifteen.
    """
    deadline = time.monotonic() + seconds
    while True:
        try:
            return fn()
        except sqlite3.OperationalError as exc:
            if not _busy(exc) or time.monotonic() >= deadline:
                raise
        time.sleep(0.005)  # only ever in a thread of ours: no event loop waits here


class _Miss(Exception):
    """The inline attempt found the database busy and did nothing."""


class DbThread:
    """Owns one sqlite3 connection in a thread of its own (and maybe one inline)."""

    def __init__(
        self,
        connect: Callable[[], sqlite3.Connection],
        busy_retry: float,
        connect_inline: Callable[[], sqlite3.Connection] | None = None,
    ) -> None:
        self._connect = connect
        self._connect_inline = connect_inline
        self._busy_retry = busy_retry
        self._queue: queue.SimpleQueue[_Job[Any] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._conn: sqlite3.Connection | None = None
        self._inline: sqlite3.Connection | None = None
        self._pending: list[_Job[Any]] = []
        self._flushing = False
        # held to hand a job to the thread, and by the thread when it ends: no job is
        # queued after the thread stopped taking them (it would wait forever)
        self._handoff = threading.Lock()
        self._ended = False
        self.inline_jobs = 0
        self.thread_jobs = 0
        # write transactions begun, inline and in the thread (each counter moved by one
        # thread only): the change watcher's sign that this process is committing
        self._inline_writes = 0
        self._thread_writes = 0
        # set by the thread while it empties the WAL: inline writes go to the thread
        # meanwhile, behind the checkpoint, instead of keeping it waiting (_checkpoint)
        self._diverted = False

    @property
    def writes(self) -> int:
        """Write transactions begun so far through this thread, inline or not (each one
        commits, or rolls back and wrote nothing)."""
        return self._inline_writes + self._thread_writes

    def start(self) -> None:
        """Connect in the calling thread (errors surface here), then start the thread."""
        conn = self._connect()
        self._conn = conn
        self._thread = threading.Thread(target=self._main, name="durable-sqlite", daemon=True)
        self._thread.start()

    def start_inline(self) -> None:
        """Open the inline connection (after migrations: it never changes the schema)."""
        if self._connect_inline is not None:
            self._inline = self._connect_inline()
            self._inline.execute("PRAGMA wal_autocheckpoint = 0")

    def stop(self) -> None:
        """Close the connections; waits for the thread's current job (call it in a thread:
        that job may be waiting for another process's write lock)."""
        if self._inline is not None:
            self._inline.close()
            self._inline = None
        if self._thread is None:
            return
        self._queue.put(None)
        self._thread.join()
        self._thread = None

    def _read_inline(self, conn: sqlite3.Connection, fn: Callable[[sqlite3.Connection], T]) -> T:
        try:
            return fn(conn)
        except sqlite3.OperationalError as exc:
            if _busy(exc):
                raise _Miss from exc
            raise

    def _flush_inline(self, conn: sqlite3.Connection, batch: list[_Job[Any]]) -> bool:
        """Commit a batch of write jobs in one transaction; False if the database was busy
        (or the thread is emptying the WAL)."""
        if self._diverted:
            return False
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            if _busy(exc):
                return False
            for job in batch:
                job.error = exc
            return True
        self._inline_writes += 1
        _run_batch(conn, batch)
        if self._inline_writes % CHECKPOINT_EVERY == 0:
            self._to_thread(_Job(self._checkpoint, write=False))
        return True

    def _checkpoint(self, conn: sqlite3.Connection) -> None:
        """The periodic checkpoint (in the thread): a passive one; then, if the WAL has
        grown past WAL_RESET_FRAMES, a truncating one, with this process's inline writes
        sent to the thread meanwhile (they queue behind this job).

        A passive checkpoint alone never let the WAL start over under steady writes:
        SQLite rewinds the WAL only when a writer finds every frame copied, and the inline
        connection committed new frames while the thread copied the old ones, so the file
        grew by every commit's pages for as long as the writes went on (769 MB after 6,000
        five-step runs, for an 11 MB database). The truncating checkpoint needs a moment
        with no writer: the inline writer, which would otherwise take the lock again
        between two of the checkpoint's tries, holds off instead (docs/design.md, *The WAL
        stays bounded*)."""
        if _passive_checkpoint(conn) < WAL_RESET_FRAMES:
            return
        self._diverted = True
        try:
            _truncating_checkpoint(conn)
        finally:
            self._diverted = False

    def _to_thread(self, job: _Job[Any]) -> None:
        job.wake = _waker(job.event)
        self.thread_jobs += 1
        with self._handoff:
            if not self._ended:
                self._queue.put(job)
                return
        job.error = StoreError("the store's database thread is not running (the store was "
                               "closed)")
        job.event.set()

    async def run(self, fn: Callable[[sqlite3.Connection], T], *, write: bool = True,
                  then_yield: bool = True) -> T:
        """Run ``fn(conn)``; writes run inside a transaction.

        Inline (in the event loop's thread) when the database is free: a write joins the
        batch that the first writer of this loop iteration commits for everyone (group
        commit). Otherwise in the database thread. If the caller is cancelled while the job
        runs in the thread, the job still runs to its end; only the wait is abandoned.

        ``then_yield=False``: a read done inline returns without letting others run first,
        for a caller that waits right after anyway (the worker's read of what to claim:
        one event-loop iteration less per run).
        """
        if self._thread is None or self._ended:
            raise StoreError("the store's database thread is not running (the store was "
                             "closed)")
        inline = self._inline
        if inline is None:
            await checkpoint_if_cancelled()  # a cancelled caller writes nothing (as inline)
            job: _Job[T] = _Job(fn, write)
            self._to_thread(job)
            arm_bound()
            await job.event.wait()
            return job.outcome()
        await checkpoint_if_cancelled()
        if not write:
            try:
                result = self._read_inline(inline, fn)
            except _Miss:
                job = _Job(fn, write)
                self._to_thread(job)
                arm_bound()
                await job.event.wait()
                return job.outcome()
            self.inline_jobs += 1
            if then_yield:
                # others get to run; a cancel that lands here only loses what was read (a
                # read writes nothing), so no shielded scope of its own is needed
                await checkpoint()
            return result
        job = _Job(fn, write)
        self._pending.append(job)
        if self._flushing:
            arm_bound()
            await job.event.wait()  # the writer that came first commits this one too
            return job.outcome()
        self._flushing = True
        flushed = False
        stopped: BaseException | None = None
        try:
            # let the other runs add their writes
            if in_lazy_bound() and sniffio.current_async_library() == "asyncio":
                # Inside an attempt's shielded write scope (durable._lease): nothing but
                # that scope's own cancel (a lost lease) can land here, so a plain yield
                # does, without anyio's second shielded scope; if it lands, the batch is
                # still committed for everyone in it, then the cancel goes on.
                try:
                    await asyncio.sleep(0)
                except BaseException as exc:
                    stopped = exc
            else:
                await cancel_shielded_checkpoint()
            batch, self._pending = self._pending, []
            try:
                done = self._flush_inline(inline, batch)
            except BaseException as exc:  # the connection itself failed: nobody may hang
                with contextlib.suppress(sqlite3.Error):
                    inline.rollback()
                for other in batch:
                    other.error = exc
                done = True
            if done:
                flushed = True
                self.inline_jobs += len(batch)
                for other in batch:
                    if other is not job:
                        other.event.set()
            else:  # another connection holds the write lock: the thread waits its turn
                for other in batch:
                    self._to_thread(other)
        finally:
            self._flushing = False
        if stopped is not None:
            raise stopped
        if not flushed:
            arm_bound()
            await job.event.wait()
        return job.outcome()

    # -- in the thread --------------------------------------------------------------------------
    def _main(self) -> None:
        conn = self._conn
        assert conn is not None
        try:
            while True:
                job = self._queue.get()
                if job is None:
                    return
                batch = [job]
                stop = False
                while len(batch) < MAX_BATCH:
                    try:
                        more = self._queue.get_nowait()
                    except queue.Empty:
                        break
                    if more is None:
                        stop = True
                        break
                    batch.append(more)
                try:
                    reads = [j for j in batch if not j.write]
                    writes = [j for j in batch if j.write]
                    for j in reads:
                        self._run_read(conn, j)
                    if writes:
                        self._run_writes(conn, writes)
                except BaseException as exc:  # never die with callers waiting
                    with contextlib.suppress(sqlite3.Error):
                        conn.rollback()
                    for j in batch:
                        if j.error is None and j.result is None:
                            j.error = exc
                finally:
                    for j in batch:
                        j.wake()
                if stop:
                    return
        finally:
            with self._handoff:
                self._ended = True
            while True:  # fail whatever is still queued
                try:
                    left = self._queue.get_nowait()
                except queue.Empty:
                    break
                if left is not None:
                    left.error = StoreError("the store's database thread ended")
                    left.wake()
            conn.close()

    @staticmethod
    def _run_read(conn: sqlite3.Connection, job: _Job[Any]) -> None:
        try:
            job.result = job.fn(conn)
        except BaseException as exc:
            job.error = exc

    def _begin(self, conn: sqlite3.Connection) -> None:
        retry_busy(lambda: conn.execute("BEGIN IMMEDIATE"), self._busy_retry)

    def _run_writes(self, conn: sqlite3.Connection, jobs: list[_Job[Any]]) -> None:
        try:
            self._begin(conn)
        except BaseException as exc:
            for j in jobs:
                j.error = exc
            return
        self._thread_writes += 1
        _run_batch(conn, jobs)


def _run_batch(conn: sqlite3.Connection, jobs: list[_Job[Any]]) -> None:
    """Run write jobs inside the open transaction, each in a savepoint, then commit.

    If the transaction itself fails (a SAVEPOINT, ROLLBACK TO, RELEASE or COMMIT raises),
    it is rolled back and every job of the batch fails with that error: none of them was
    committed.
    """
    try:
        if len(jobs) == 1:
            job = jobs[0]
            try:
                job.result = job.fn(conn)
            except BaseException as exc:
                job.error = exc
                conn.rollback()
                return
        else:
            for job in jobs:
                conn.execute("SAVEPOINT job")
                try:
                    job.result = job.fn(conn)
                except BaseException as exc:
                    job.error = exc
                    conn.execute("ROLLBACK TO job")
                conn.execute("RELEASE job")
        conn.commit()
    except BaseException as exc:
        with contextlib.suppress(sqlite3.Error):
            conn.rollback()
        for job in jobs:
            job.error = exc
            job.result = None
