"""The SQLite store: the embedded default, for one machine (any number of processes).

Durability: WAL mode with ``synchronous=NORMAL`` by default. A committed transaction
survives the process being killed (SIGKILL, OOM); after a power loss or OS crash the last
few transactions may be lost, never half-applied, and the database is never corrupt.
``?synchronous=full`` in the URL makes every commit survive power loss too, at a cost
(see docs/benchmarks.md).
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import anyio

from .. import _liveness, _wake
from .._clock import BootClock, Clock, default_sqlite_clock
from .._errors import (
    NotSentError,
    RunConflictError,
    StaleRecordError,
    StoreError,
    StoreUnavailableError,
)
from .._lease import lazily_bounded
from .._retention import PrunedRun
from .._schedules import Schedule, ScheduleSpec, schedule_params
from .._types import (
    JSON,
    ClaimOutcome,
    EntryKind,
    Fence,
    Finish,
    JournalEntry,
    JournalWrite,
    NewRun,
    PausedWorkflow,
    Record,
    Renewal,
    Run,
    RunState,
    Signal,
    SignalSent,
    dumps,
    loads,
)
from ._base import (
    CANCELLED_AT_RECOVERY,
    CANCELLED_AT_RELEASE,
    DEFAULT_MAX_RECOVERIES,
    SCHEMA_VERSION,
    Cursor,
    Store,
    check_schema,
    ended_entry,
    list_unfinished_query,
    operator_data,
    run_filters,
)
from ._sql import load_migrations, load_queries
from ._thread import DbThread, retry_busy

T = TypeVar("T")
Q = load_queries("sqlite")
# one recovery statement, two ways of choosing the runs (queries.sql: recover_which_*)
Q["recover_stale"] = Q["recover"].replace("/*which*/", Q["recover_which_stale"])
Q["recover_dead"] = Q["recover"].replace("/*which*/", Q["recover_which_dead"])
# one claim statement, two ways of choosing the runs (claim_which_*), and one set of
# conditions for what a claim may take (claimable_where)
Q["claim_run"] = Q["claim"].replace("/*which*/", Q["claim_which_run"])
Q["claim"] = Q["claim"].replace("/*which*/", Q["claim_which_queue"])
for _name in ("claim", "claim_run", "claimable"):
    Q[_name] = Q[_name].replace("/*claimable*/", Q["claimable_where"])


_APPEND_SQL: dict[int, str] = {}


def _append_sql(n: int) -> str:
    """append_entries for ``n`` entries (made once per ``n``; sqlite3 caches the prepared
    statement by its text)."""
    sql = _APPEND_SQL.get(n)
    if sql is None:
        rows = ", ".join(
            "(" + ", ".join(f"?{4 + 6 * i + j}" for j in range(6)) + ")" for i in range(n))
        sql = _APPEND_SQL[n] = Q["append_entries"].replace("/*rows*/", rows)
    return sql


def _append_params(fence: Fence, entries: Sequence[JournalWrite], now: float) -> list[Any]:
    """append_entries' positional parameters, encoded now (the caller's thread)."""
    params: list[Any] = [fence.run_id, fence.epoch, now]
    for e in entries:
        params += (e.kind._value_, e.step, e.step_key, e.name, e.attempt_column,
                   e.data_json())
    return params


APPEND_CHUNK = 64
"""The most entries one append_entries statement takes (3 + 6 x 64 parameters, well under
SQLite's limit of 32,766; a longer append is several statements in its transaction)."""


def _append_fenced(conn: sqlite3.Connection, n: int, params: Sequence[Any]) -> None:
    """Run append_entries for ``n`` entries; raises _Fenced when the fence refuses it
    (the first statement writes nothing then, and the transaction is rolled back)."""
    if n <= APPEND_CHUNK:
        if n and conn.execute(_append_sql(n), params).rowcount != n:
            raise _Fenced
        return
    head = list(params[:3])
    for start in range(0, n, APPEND_CHUNK):
        size = min(APPEND_CHUNK, n - start)
        chunk = head + list(params[3 + 6 * start:3 + 6 * (start + size)])
        if conn.execute(_append_sql(size), chunk).rowcount != size:
            raise _Fenced


SAME_FILE_EVERY = 0.5
"""Seconds between two looks at whether the database's path still names the file this
store opened (:meth:`SqliteStore._same_file`): a call of the store looks when the last
look is older."""

LOW_SPACE = 1 << 20
"""Free bytes below which an I/O or disk-full error of SQLite says how few are left."""

PROBE_CAP = 512
"""Below this many ids in an id prefix's range, the range leads the list (its rows are read
and sorted); from it on, the list's order does (docs/list-queries.md, *An id prefix*). The
same for a key's runs of a workflow against its runs in a state (*A key with a long
history*)."""


def _entry_params(fence: Fence, entry: JournalWrite, now: float) -> dict[str, Any]:
    return {
        "run_id": fence.run_id,
        "epoch": fence.epoch,
        "kind": entry.kind._value_,
        "step": entry.step,
        "step_key": entry.step_key,
        "name": entry.name,
        "attempt": entry.attempt_column,
        "now": now,
        "data": entry.data_json(),
    }


_SHORT_OF_SPACE = ("I/O error", "full", "No space")
"""What SQLite says when the disk may be full (:meth:`SqliteStore._explain`)."""

_CANNOT_WRITE = ("unable to open", "readonly")
"""What SQLite says when it may not write beside the database (a read-only mount)."""


class SqliteStore(Store):
    """A store in one SQLite file, shared safely by several processes."""

    probe_cap: int = PROBE_CAP
    """How many rows an id prefix's range (or a key's runs of a workflow) may hold for it
    to lead the list (:func:`list_runs_statement`)."""

    def __init__(
        self,
        path: str,
        *,
        clock: Clock | None = None,
        synchronous: str = "NORMAL",
        busy_timeout: float = 5.0,
        create: bool = True,
        upgrade: bool = True,
        max_recoveries: int = DEFAULT_MAX_RECOVERIES,
    ) -> None:
        self.path = path
        self.url = f"sqlite:///{path}"
        # leases are judged on a clock that cannot step (durable/_clock.py, BootClock)
        self.clock = clock or default_sqlite_clock()
        if synchronous.upper() not in ("OFF", "NORMAL", "FULL", "EXTRA"):
            raise StoreUnavailableError(f"unknown synchronous setting {synchronous!r}")
        self._synchronous = synchronous.upper()
        self._busy_timeout = busy_timeout
        self._create = create
        self._upgrade = upgrade
        self.max_recoveries = max_recoveries
        # seconds an open (and a write) waits for other connections that hold the file
        self._open_wait = max(30.0, busy_timeout)
        self._db: DbThread | None = None
        self._watch: sqlite3.Connection | None = None
        """A connection of its own for :meth:`change_watcher` (read by its thread)."""
        self._watcher: _wake.ChangeWatcher | None = None
        self._file: tuple[int, int] | None = None
        """The opened file's (device, inode), to see it deleted or replaced (None: not
        looked at, or ``:memory:``)."""
        self._file_seen = 0.0
        self._file_gone: str | None = None
        """Why the path no longer names the opened file, once seen: every call says it."""

    # -- lifecycle ---------------------------------------------------------------------------
    def _connect(self, busy_timeout: float | None = None) -> sqlite3.Connection:
        busy = self._busy_timeout if busy_timeout is None else busy_timeout
        if self.path != ":memory:":
            self._check_path()
        try:
            conn = sqlite3.connect(
                self.path,
                timeout=busy,
                isolation_level=None,
                check_same_thread=False,
            )
        except sqlite3.DatabaseError as exc:
            raise StoreUnavailableError(
                f"cannot open SQLite database {self.path}: {self._explain(exc)}"
            ) from exc
        try:
            conn.row_factory = sqlite3.Row
            conn.execute(f"PRAGMA busy_timeout = {int(busy * 1000)}")
            mode = retry_busy(lambda: conn.execute("PRAGMA journal_mode = WAL").fetchone()[0],
                              self._open_wait)
            if self.path != ":memory:" and str(mode).lower() != "wal":
                raise StoreUnavailableError(f"cannot put {self.path} in WAL mode (got {mode})")
            conn.execute(f"PRAGMA synchronous = {self._synchronous}")
        except BaseException as exc:
            conn.close()
            if isinstance(exc, sqlite3.DatabaseError):
                raise StoreUnavailableError(
                    f"cannot open SQLite database {self.path}: {self._explain(exc)}"
                ) from exc
            raise
        return conn

    def _check_path(self) -> None:
        """Say plainly what is wrong with the file's path (SQLite only says "unable to open")."""
        target = Path(self.path).absolute()
        where = str(target) if Path(self.path).is_absolute() else (
            f"{target} (sqlite:///{self.path} is relative to the current folder)")
        if target.is_dir():
            raise StoreUnavailableError(
                f"cannot open SQLite database {where}: it is a folder, not a file; "
                f"name a file in it, e.g. sqlite:///{target / 'durable.db'}")
        if not target.exists():
            if not self._create:
                raise StoreUnavailableError(
                    f"no database at {where}; check --db (or DURABLE_DB)")
            if not target.parent.is_dir():
                raise StoreUnavailableError(
                    f"cannot create SQLite database {where}: folder {target.parent} "
                    "does not exist")
            if not os.access(target.parent, os.W_OK | os.X_OK):
                raise StoreUnavailableError(
                    f"cannot create SQLite database {where}: folder {target.parent} "
                    "is not writable")

    async def open(self) -> None:
        inline = self.path != ":memory:" and self._synchronous in ("OFF", "NORMAL")
        db = DbThread(self._connect, busy_retry=self._open_wait,
                      connect_inline=(lambda: self._connect(0.0)) if inline else None)
        try:
            # in a thread: connecting may wait for another process that creates the file
            await anyio.to_thread.run_sync(db.start)
        except StoreUnavailableError:
            raise
        except OSError as exc:
            raise StoreUnavailableError(
                f"cannot open SQLite database {self.path}: {self._explain(exc)}") from exc
        self._db = db
        if self.path != ":memory:":
            with contextlib.suppress(OSError):
                found = os.stat(self.path)
                self._file, self._file_seen = (found.st_dev, found.st_ino), time.monotonic()
        try:
            # a database already at this schema is opened with a read: read commands (list,
            # show, the console) never take the write lock; only an upgrade writes, and
            # those commands (upgrade=False) refuse a schema behind instead
            version = await self._run(self._current_schema, write=False)
            if version != SCHEMA_VERSION:
                if version is not None and not self._upgrade:
                    self._check_upgrade(version)
                await self._run(self._migrate)  # decided again under the write lock
            if isinstance(self.clock, BootClock):  # the host's one clock, anchored once a boot
                if not await self._run(self._adopt_clock, write=False):
                    await self._run(self._store_clock)
            await anyio.to_thread.run_sync(db.start_inline)
        except BaseException:
            await self.aclose()
            raise

    def _adopt_clock(self, conn: sqlite3.Connection) -> bool:
        """Adopt the anchor the database holds for this boot; False if it holds none."""
        assert isinstance(self.clock, BootClock)
        stored = dict(conn.execute(Q["clock_read"]).fetchall())
        boot_id = self.clock.current_boot()
        if stored.get("clock_boot_id") != boot_id or "clock_anchor" not in stored:
            return False
        self.clock.adopt(boot_id, float(stored["clock_anchor"]))
        return True

    def _store_clock(self, conn: sqlite3.Connection) -> bool:
        """Store this boot's anchor (in BEGIN IMMEDIATE, so one process per boot does), unless
        another process stored it since our read; a new boot expires every running lease."""
        assert isinstance(self.clock, BootClock)
        if self._adopt_clock(conn):
            return False
        previous = dict(conn.execute(Q["clock_read"]).fetchall()).get("clock_boot_id")
        boot_id, anchor = self.clock.current_boot(), self.clock.guess_anchor()
        conn.executemany(Q["clock_store"], [{"key": "clock_boot_id", "value": boot_id},
                                            {"key": "clock_anchor", "value": repr(anchor)}])
        self.clock.adopt(boot_id, anchor)
        if previous is not None:
            conn.execute(Q["expire_leases_of_another_boot"], {"now": self.clock.now()})
        return True

    async def aclose(self) -> None:
        db, self._db = self._db, None
        watcher, self._watcher = self._watcher, None
        if watcher is not None:
            await watcher.stop()
        watch, self._watch = self._watch, None
        if watch is not None:
            watch.close()
        if db is not None:
            # in a thread: the database thread may be waiting for another process's lock
            await anyio.to_thread.run_sync(db.stop)

    async def schema_version(self) -> int:
        return await self._run(self._read_version, write=False)

    @staticmethod
    def _read_version(conn: sqlite3.Connection) -> int:
        has_meta = conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'durable_meta'"
        ).fetchone()
        if not has_meta:
            tables = conn.execute(
                "SELECT count(*) FROM sqlite_master WHERE type = 'table'"
            ).fetchone()[0]
            if tables:
                raise StoreUnavailableError(
                    "the database holds other tables but no durable schema; "
                    "point --db at a new file or a durable database"
                )
            return 0
        row = conn.execute("SELECT value FROM durable_meta WHERE key = 'schema_version'").fetchone()
        return int(row[0]) if row else 0

    def _current_schema(self, conn: sqlite3.Connection) -> int | None:
        """The schema version by a read, or None when only the write lock can tell (a file
        another process is creating right now may show its tables before its schema)."""
        try:
            return self._read_version(conn)
        except StoreUnavailableError:
            return None

    def _check_upgrade(self, version: int) -> None:
        check_schema(version, self.path, self.url, upgrade=self._upgrade)

    def _migrate(self, conn: sqlite3.Connection) -> int:
        version = self._read_version(conn)
        self._check_upgrade(version)
        if version == 0 and self.path != ":memory:":
            self.created = str(Path(self.path).absolute())
        for number, script in load_migrations("sqlite"):
            if number <= version:
                continue
            for statement in _split_script(script):
                conn.execute(statement)
            conn.execute(
                "INSERT INTO durable_meta (key, value) VALUES ('schema_version', ?) "
                "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                (str(number),),
            )
            version = number
        return version

    async def _run(self, fn: Callable[[sqlite3.Connection], T], *, write: bool = True,
                   then_yield: bool = True) -> T:
        db = self._db
        if db is None:
            raise StoreError("the store is not open")
        self._same_file(write)
        try:
            return await db.run(fn, write=write, then_yield=then_yield)
        except sqlite3.DatabaseError as exc:
            message = str(exc)
            if "locked" in message or "busy" in message:
                # BEGIN IMMEDIATE waited its turn in vain: the transaction never began
                raise NotSentError(f"SQLite database {self.path}: {message}") from exc
            if getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL:
                # the disk is full: the transaction was rolled back, nothing was written
                # (a write may be tried again; docs/design.md, *A full disk*)
                raise NotSentError(f"SQLite database {self.path}: {self._explain(exc)}; "
                                   "nothing was written") from exc
            if "unable to open" in message:
                raise StoreUnavailableError(
                    f"SQLite database {self.path}: {self._explain(exc)}") from exc
            if "not a database" in message or "malformed" in message:
                raise StoreUnavailableError(
                    f"{self.path} is not a readable SQLite database: {message}"
                ) from exc
            raise StoreError(f"SQLite database {self.path}: {self._explain(exc)}") from exc

    def _same_file(self, write: bool) -> None:
        """Refuse every call once the database's path no longer names the file this store
        opened (looked at every :data:`SAME_FILE_EVERY` seconds): the file was deleted, or
        another put in its place (a backup moved over it). SQLite goes on with the file it
        has open, which nobody else sees any more: a worker would claim nothing that is
        started now, and its attempts' journal writes would reach no one while their
        activities went on acting. A write is refused before it is sent (NotSentError:
        nothing was written; an attempt whose journal write is refused is abandoned and runs
        no further step), a read as unavailable."""
        if self._file is not None and self._file_gone is None:
            now = time.monotonic()
            if now - self._file_seen >= SAME_FILE_EVERY:
                self._file_seen = now
                try:
                    found = os.stat(self.path)
                except FileNotFoundError:
                    self._file_gone = "was deleted"
                except OSError:
                    pass  # cannot tell (a permission, a lost mount): SQLite will say
                else:
                    if (found.st_dev, found.st_ino) != self._file:
                        self._file_gone = "was replaced by another file"
        if self._file_gone is not None:
            message = (f"SQLite database {self.path}: the file this process opened "
                       f"{self._file_gone} since; this process still sees the old one, "
                       "which nobody else does, so it writes and reads nothing more. Stop "
                       "this process; put the file back, or start it anew on the new one")
            raise NotSentError(message) if write else StoreUnavailableError(message)

    def _explain(self, exc: BaseException) -> str:
        """SQLite's error, and what it does not say. The free space left when it may be
        short of it: on a full disk SQLite says "database or disk is full" writing, but
        "disk I/O error" opening (WAL mode creates its shared-memory file at the first
        open, read commands too). A file system mounted read-only: SQLite says "unable to
        open database file" (or "attempt to write a readonly database")."""
        message = str(exc)
        short = any(word in message for word in _SHORT_OF_SPACE)
        if self.path == ":memory:" or not (short or any(word in message
                                                        for word in _CANNOT_WRITE)):
            return message
        folder = Path(self.path).absolute().parent
        try:
            st = os.statvfs(folder)
        except OSError:
            return message
        if st.f_flag & os.ST_RDONLY:
            name = Path(self.path).name
            return (f"{message}: the file system holding {folder} is mounted read-only, and "
                    f"SQLite in WAL mode writes {name}-wal and {name}-shm beside the database "
                    "to open it, to read it too; copy the file to a writable folder to read "
                    "it there")
        free = st.f_bavail * st.f_frsize
        if free >= LOW_SPACE or not short:
            return message
        return f"{message} (the file system holding it has {free:,} bytes free)"

    # -- change signals (durable/_wake.py) ----------------------------------------------------
    pushes_changes = True

    def change_watcher(self) -> _wake.ChangeWatcher | None:
        """Looks at ``PRAGMA data_version`` of a connection of its own every 2 ms in a
        thread: it changes when any other connection (this process's store thread too)
        commits; a read costs microseconds, no write, no lock, no disk I/O beyond the
        shared WAL index (docs/design.md, "Nothing waits for a poll")."""
        if self._db is None or self.path == ":memory:":
            return None
        if self._watcher is None:
            self._watcher = _wake.ChangeWatcher(self._watch_reader, self._own_writes)
        return self._watcher

    def _own_writes(self) -> int:
        """This process's write transactions through this store (its own commits change
        ``data_version`` for the watcher too)."""
        db = self._db
        return 0 if db is None else db.writes

    def _watch_reader(self) -> Callable[[], object]:
        if self._watch is not None:
            self._watch.close()
        conn = self._watch = sqlite3.connect(self.path, timeout=0.05, isolation_level=None,
                                             check_same_thread=False)
        return lambda: conn.execute("PRAGMA data_version").fetchone()[0]

    async def cancels_requested(self, run_ids: Collection[str]) -> set[str]:
        if not run_ids:
            return set()

        def read(conn: sqlite3.Connection) -> list[str]:
            return [r[0] for r in conn.execute(Q["cancels_pending"])]

        return {run_id for run_id in await self._run(read, write=False) if run_id in run_ids}

    # -- runs --------------------------------------------------------------------------------
    async def create_run(self, new: NewRun) -> tuple[Run, bool]:
        now = self.clock.now()
        dumps(new.args, "workflow arguments", around=1)  # refused before the transaction
        return await self._run(lambda conn: _insert_run(conn, new, now))

    async def get_run(self, run_id: str) -> Run | None:
        def read(conn: sqlite3.Connection) -> Run | None:
            row = conn.execute(Q["get_run"], {"id": run_id}).fetchone()
            return None if row is None else Run.from_row(row)

        return await self._run(read, write=False)

    async def list_runs(
        self,
        *,
        state: RunState | None = None,
        workflow: str | None = None,
        key: str | None = None,
        limit: int = 100,
        before: Cursor | None = None,
        created_from: float | None = None,
        created_to: float | None = None,
        id_prefix: str | None = None,
    ) -> list[Run]:
        filters: dict[str, Any] = dict(
            state=state, workflow=workflow, key=key, before=before,
            created_from=created_from, created_to=created_to, id_prefix=id_prefix)
        # a range of no more ids than the page leads: the order would read every entry
        cap = max(self.probe_cap, limit + 1)

        def read(conn: sqlite3.Connection) -> list[Run]:
            query, params = list_runs_statement(conn, cap, **filters)
            params["limit"] = limit
            return [Run.from_row(r) for r in conn.execute(query, params)]

        return await self._run(read, write=False)

    async def list_unfinished(
        self,
        *,
        workflow: str | None = None,
        key: str | None = None,
        limit: int = 100,
        before: Cursor | None = None,
    ) -> list[Run]:
        query, params = list_unfinished_query(Q, workflow=workflow, key=key, before=before)
        params["limit"] = limit

        def read(conn: sqlite3.Connection) -> list[Run]:
            return [Run.from_row(r) for r in conn.execute(query, params)]

        return await self._run(read, write=False)

    async def count_runs(
        self, *, workflow: str | None = None, key: str | None = None,
        created_from: float | None = None, created_to: float | None = None,
    ) -> dict[RunState, int]:
        query, params = count_runs_query(workflow=workflow, key=key,
                                         created_from=created_from, created_to=created_to)

        def read(conn: sqlite3.Connection) -> dict[RunState, int]:
            counts = dict.fromkeys(RunState, 0)
            for row in conn.execute(query, params):
                counts[RunState(row["state"])] = int(row["n"])
            return counts

        return await self._run(read, write=False)

    async def latest_run(self, workflow: str, key: str) -> Run | None:
        def read(conn: sqlite3.Connection) -> Run | None:
            row = conn.execute(Q["latest_run"], {"workflow": workflow, "key": key}).fetchone()
            return None if row is None else Run.from_row(row)

        return await self._run(read, write=False)

    async def next_run_at(self) -> float | None:
        def read(conn: sqlite3.Connection) -> float | None:
            row = conn.execute(Q["next_run_at"]).fetchone()
            return None if row is None or row[0] is None else float(row[0])

        return await self._run(read, write=False)

    async def next_due_in(self, workflows: Sequence[str] | None = None) -> float | None:
        params = {"now": self.clock.now(),
                  "workflows": None if workflows is None else json.dumps(list(workflows))}

        def read(conn: sqlite3.Connection) -> float | None:
            row = conn.execute(Q["next_due"], params).fetchone()
            return None if row is None else float(row[0])

        return await self._run(read, write=False)

    async def queue_stats(self) -> dict[str, tuple[int, float]]:
        now = self.clock.now()

        def read(conn: sqlite3.Connection) -> dict[str, tuple[int, float]]:
            return {row["workflow"]: (int(row["n"]), max(0.0, float(row["age"])))
                    for row in conn.execute(Q["queue_stats"], {"now": now})}

        return await self._run(read, write=False)

    # -- attempts ----------------------------------------------------------------------------
    async def claim(
        self,
        worker: str,
        lease: float,
        limit: int,
        run_id: str | None = None,
        workflows: Sequence[str] | None = None,
    ) -> list[Run]:
        now = self.clock.now()
        params = {"worker": worker, "lease": lease, "limit": limit, "run_id": run_id,
                  "now": now,
                  "workflows": None if workflows is None else json.dumps(list(workflows))}

        def tx(conn: sqlite3.Connection) -> list[Run]:
            runs = [Run.from_row(r) for r in conn.execute(Q["claim"], params).fetchall()]
            for run in runs:
                _journal_claim(conn, run, worker, now)
            return runs

        return await self._run(tx)

    # -- a claim riding on the first write (Store.claim_with) ------------------------------
    claims_ride_on_writes = True

    async def claimable(
        self, worker: str, limit: int, workflows: Sequence[str] | None = None
    ) -> list[Run]:
        params = {"limit": limit, "now": self.clock.now(),
                  "workflows": None if workflows is None else json.dumps(list(workflows))}

        def read(conn: sqlite3.Connection) -> list[Run]:
            return [Run.from_row(r) for r in conn.execute(Q["claimable"], params)]

        # no yield after an inline read: the worker starts the attempts read and waits for
        # their claims right after (durable/_claims.py), or claims, or waits for work
        return await self._run(read, write=False, then_yield=False)

    async def claim_with(
        self,
        worker: str,
        lease: float,
        run_id: str,
        attempt: int,
        entries: Sequence[JournalWrite] = (),
        finishes: Sequence[Finish] = (),
        workflows: Sequence[str] | None = None,
    ) -> ClaimOutcome:
        """One transaction: each finish (its fenced update first: a refused one writes
        nothing, so it needs no savepoint), then the claim, then the entries (only with the
        claim as expected)."""
        now = self.clock.now()
        done = [self._finish_tx(f.fence, f.state, f.result, f.error, f.entries, now)
                for f in finishes]
        params = {"worker": worker, "lease": lease, "run_id": run_id, "now": now,
                  "workflows": None if workflows is None else json.dumps(list(workflows))}

        def tx(conn: sqlite3.Connection) -> ClaimOutcome:
            finished = []
            for finish in done:
                try:
                    finished.append(finish(conn))
                except _Fenced:  # its update was refused before it wrote anything
                    finished.append(False)
            row = conn.execute(Q["claim_run"], params).fetchone()
            if row is None:
                return ClaimOutcome(tuple(finished), None, False)
            run = Run.from_row(row)
            _journal_claim(conn, run, worker, now)
            if run.attempt != attempt or run.cancel_requested:
                return ClaimOutcome(tuple(finished), run, False)
            fence = Fence(run.id, run.epoch)
            for entry in entries:
                conn.execute(Q["append_unfenced"], _entry_params(fence, entry, now))
            return ClaimOutcome(tuple(finished), run, True)

        return await self._run(tx)

    async def renew(
        self,
        worker: str,
        held: Sequence[Fence],
        lease: float,
        details: Mapping[str, JSON] | None = None,
    ) -> list[Renewal]:
        if not held:
            return []
        params = {
            "worker": worker,
            "lease": lease,
            "now": self.clock.now(),
            "held": json.dumps([[f.run_id, f.epoch] for f in held]),
            "details": json.dumps({k: dumps(v) for k, v in (details or {}).items()}),
        }

        def tx(conn: sqlite3.Connection) -> list[Renewal]:
            return [
                Renewal(r["id"], int(r["epoch"]), bool(r["cancel_requested"]))
                for r in conn.execute(Q["renew"], params).fetchall()
            ]

        return await self._run(tx)

    @lazily_bounded  # it waits only in DbThread.run, which arms the bound first
    async def append(self, fence: Fence, entries: Sequence[JournalWrite]) -> bool:
        n = len(entries)
        params = _append_params(fence, entries, self.clock.now())

        def tx(conn: sqlite3.Connection) -> bool:
            _append_fenced(conn, n, params)
            return True

        return await self._fenced(tx)

    async def _fenced(self, tx: Callable[[sqlite3.Connection], bool]) -> bool:
        try:
            return await self._run(tx)
        except _Fenced:
            return False

    async def finish(
        self,
        fence: Fence,
        state: RunState,
        *,
        result: JSON = None,
        error: str | None = None,
        entries: Sequence[JournalWrite] = (),
    ) -> bool:
        return await self._fenced(
            self._finish_tx(fence, state, result, error, entries, self.clock.now()))

    @staticmethod
    def _finish_tx(fence: Fence, state: RunState, result: JSON, error: str | None,
                   entries: Sequence[JournalWrite],
                   now: float) -> Callable[[sqlite3.Connection], bool]:
        """The statements of :meth:`finish`, encoded now; raises _Fenced, having written
        nothing, when the fence refuses it.

        The fenced update of the run comes first, so the entries that follow need no fence
        of their own (``append_unfenced``, in the same transaction, under the write lock)
        and a refused finish leaves nothing to roll back: a carried finish needs no
        savepoint in the claim's transaction (:meth:`claim_with`)."""
        rows = [_entry_params(fence, e, now) for e in entries]
        params = {
            "run_id": fence.run_id,
            "epoch": fence.epoch,
            "state": state.value,
            "result": dumps(result, "workflow result"),
            "error": error,
            "now": now,
        }

        def tx(conn: sqlite3.Connection) -> bool:
            if conn.execute(Q["finish_run"], params).rowcount != 1:
                raise _Fenced
            for entry in rows:
                conn.execute(Q["append_unfenced"], entry)
            return True

        return tx

    async def release(self, fence: Fence, entries: Sequence[JournalWrite] = (), *,
                      run_at: float | None = None, waiting_for: str | None = None,
                      seen_signals: int = 0) -> bool:
        now = self.clock.now()
        n = len(entries)
        rows = _append_params(fence, entries, now)
        params = {"run_id": fence.run_id, "epoch": fence.epoch, "now": now,
                  "cancelled_error": CANCELLED_AT_RELEASE, "run_at": run_at,
                  "waiting_for": waiting_for, "seen_signals": seen_signals}

        def tx(conn: sqlite3.Connection) -> bool:
            _append_fenced(conn, n, rows)
            row = conn.execute(Q["release_run"], params).fetchone()
            if row is None:
                raise _Fenced
            self._journal_end(conn, row, "release", now)
            return True

        return await self._fenced(tx)

    @staticmethod
    def _journal_end(conn: sqlite3.Connection, row: Mapping[str, Any], when: str,
                     now: float) -> None:
        """The entry of a run that a release or a recovery ended instead of requeueing."""
        entry = ended_entry(RunState(row["state"]), row, when)
        if entry is not None:
            conn.execute(Q["append_unfenced"],
                         _entry_params(Fence(row["id"], int(row["epoch"])), entry, now))

    async def recover_stale(
        self, run_id: str | None = None, epoch: int | None = None
    ) -> list[Fence]:
        now = self.clock.now()
        params = {"run_id": run_id, "epoch": epoch, "now": now,
                  "max_recoveries": self.max_recoveries,
                  "cancelled_error": CANCELLED_AT_RECOVERY}

        def tx(conn: sqlite3.Connection) -> list[Fence]:
            conn.execute(Q["journal_recovery"], params)
            rows = conn.execute(Q["recover_stale"], params).fetchall()
            for row in rows:
                self._journal_end(conn, row, "recovery", now)
            return [Fence(r["id"], int(r["epoch"])) for r in rows]

        def any_expired(conn: sqlite3.Connection) -> bool:
            return conn.execute(Q["any_expired"], params).fetchone() is not None

        if run_id is None and not await self._run(any_expired, write=False):
            return []  # an idle sweep is a read: no write lock taken
        return await self._run(tx)

    # -- liveness (durable/_liveness.py) ------------------------------------------------------
    def liveness_dir(self) -> Path | None:
        if self.path == ":memory:" or self.path.startswith("file:"):
            return None
        return _liveness.lock_dir(self.path)

    async def running_workers(self) -> list[tuple[Fence, str]]:
        def read(conn: sqlite3.Connection) -> list[tuple[Fence, str]]:
            return [(Fence(r["id"], int(r["epoch"])), str(r["worker"]))
                    for r in conn.execute(Q["running_workers"])]

        return await self._run(read, write=False)

    async def recover_dead(self, run_id: str, epoch: int, worker: str) -> list[Fence]:
        now = self.clock.now()
        params = {"run_id": run_id, "epoch": epoch, "worker": worker, "now": now,
                  "max_recoveries": self.max_recoveries,
                  "cancelled_error": CANCELLED_AT_RECOVERY}

        def tx(conn: sqlite3.Connection) -> list[Fence]:
            conn.execute(Q["journal_death"], params)
            rows = conn.execute(Q["recover_dead"], params).fetchall()
            for row in rows:
                self._journal_end(conn, row, "recovery", now)
            return [Fence(r["id"], int(r["epoch"])) for r in rows]

        return await self._run(tx)

    async def journal(self, run_id: str, after: int = 0) -> list[JournalEntry]:
        def read(conn: sqlite3.Connection) -> list[JournalEntry]:
            return [
                JournalEntry.from_row(r)
                for r in conn.execute(Q["journal"], {"run_id": run_id, "after": after})
            ]

        return await self._run(read, write=False)

    # -- operator actions ---------------------------------------------------------------------
    async def request_cancel(
        self, run_id: str, by: Mapping[str, JSON] | None = None
    ) -> Run | None:
        now = self.clock.now()
        params = {"run_id": run_id, "now": now}
        data = operator_data({"by": "operator"}, by)
        dumps(data, "the origin of a cancel")  # refused before anything is written

        def tx(conn: sqlite3.Connection) -> Run | None:
            row = conn.execute(Q["request_cancel"], params).fetchone()
            if row is None:
                return None
            run = Run.from_row(row)
            kind = (EntryKind.RUN_CANCELLED if run.state is RunState.CANCELLED
                    else EntryKind.RUN_CANCEL_REQUESTED)
            conn.execute(
                Q["append_unfenced"],
                _entry_params(Fence(run.id, run.epoch),
                              JournalWrite(kind, data=data), now),
            )
            return run

        return await self._run(tx)

    async def requeue(
        self,
        run_id: str,
        replay_from: int | None,
        doubt_policy: str | None,
        by: Mapping[str, JSON] | None = None,
    ) -> Run | None:
        now = self.clock.now()
        params = {"run_id": run_id, "now": now}
        data = operator_data({"from_step": replay_from, "in_doubt": doubt_policy}, by)
        dumps(data, "the origin of a replay")  # refused before anything is written

        def tx(conn: sqlite3.Connection) -> Run | None:
            row = conn.execute(Q["requeue"], params).fetchone()
            if row is None:
                return None
            run = Run.from_row(row)
            conn.execute(
                Q["append_unfenced"],
                _entry_params(
                    Fence(run.id, run.epoch),
                    JournalWrite(EntryKind.RUN_REPLAYED, data=data),
                    now,
                ),
            )
            return run

        return await self._run(tx)

    # -- signals -----------------------------------------------------------------------------
    async def send_signal(self, run_id: str, name: str, payload: JSON,
                          signal_id: str | None = None,
                          by: Mapping[str, JSON] | None = None) -> SignalSent:
        now = self.clock.now()
        params = {"run_id": run_id, "name": name, "signal_id": signal_id,
                  "payload": dumps(payload, "a signal's payload"), "now": now,
                  "origin": None if by is None else dumps(dict(by), "the origin of a signal")}

        def tx(conn: sqlite3.Connection) -> SignalSent:
            run = conn.execute(Q["signal_run"], params).fetchone()
            if run is None:
                return SignalSent(None, None)
            state = RunState(run["state"])
            if state.finished:
                return SignalSent(state, None)
            row = conn.execute(Q["insert_signal"], params).fetchone()
            if row is None:
                return SignalSent(state, None)
            seq = int(row["seq"])
            conn.execute(Q["signal_wakes"], params)
            data = operator_data({"name": name, "seq": seq, "signal_id": signal_id}, by)
            conn.execute(Q["append_unfenced"], _entry_params(
                Fence(run_id, int(run["epoch"])), JournalWrite(EntryKind.SIGNAL_SENT, data=data),
                now))
            return SignalSent(state, seq)

        return await self._run(tx)

    async def next_signal(self, run_id: str, name: str,
                          after: int) -> tuple[int, Signal | None]:
        params = {"run_id": run_id, "name": name, "after": after}

        def read(conn: sqlite3.Connection) -> tuple[int, Signal | None]:
            # the count first: a signal committed between the two reads is either found
            # or counted, so a release on this count never sleeps through it
            counted = conn.execute(Q["signal_count"], params).fetchone()
            row = conn.execute(Q["next_signal"], params).fetchone()
            return (0 if counted is None else int(counted[0]),
                    None if row is None else _signal(row))

        return await self._run(read, write=False)

    async def list_signals(self, run_id: str) -> list[Signal]:
        def read(conn: sqlite3.Connection) -> list[Signal]:
            return [_signal(r) for r in conn.execute(Q["list_signals"], {"run_id": run_id})]

        return await self._run(read, write=False)

    # -- records -----------------------------------------------------------------------------
    async def put_records(
        self,
        fence: Fence | None,
        records: Sequence[tuple[str, str, JSON]],
        entries: Sequence[JournalWrite] = (),
        *,
        expected: Mapping[tuple[str, str], int] | None = None,
    ) -> bool:
        now = self.clock.now()
        run_id = None if fence is None else fence.run_id
        epoch = 0 if fence is None else fence.epoch
        # One write per key (the last value wins), as if written one after the other.
        latest = {(ns, key): dumps(value, "record value") for ns, key, value in records}
        rows = [
            {"namespace": ns, "key": key, "value": value, "epoch": epoch, "run_id": run_id,
             "now": now}
            for (ns, key), value in latest.items()
        ]
        journal = 0 if fence is None else len(entries)
        journal_rows = [] if fence is None else _append_params(fence, entries, now)
        conditions = dict(expected or {})

        def tx(conn: sqlite3.Connection) -> bool:
            if fence is not None and conn.execute(
                    Q["fence_holds"], _entry_params(fence, JournalWrite(EntryKind.VALUE),
                                                    now)).fetchone() is None:
                raise _Fenced
            _append_fenced(conn, journal, journal_rows)
            for (ns, key), version in conditions.items():
                found = conn.execute(Q["record_version"],
                                     {"namespace": ns, "key": key}).fetchone()
                actual = 0 if found is None else int(found[0])
                if actual != version:
                    raise StaleRecordError(ns, key, version, actual)
            query = Q["put_record"] if fence is not None else Q["put_record_unfenced"]
            for params in rows:
                conn.execute(query, params)
            return True

        return await self._fenced(tx)

    async def get_record(self, namespace: str, key: str) -> Record | None:
        def read(conn: sqlite3.Connection) -> Record | None:
            row = conn.execute(Q["get_record"], {"namespace": namespace, "key": key}).fetchone()
            return None if row is None else _record(row)

        return await self._run(read, write=False)

    async def list_records(self, namespace: str) -> list[Record]:
        def read(conn: sqlite3.Connection) -> list[Record]:
            return [_record(r) for r in conn.execute(Q["list_records"], {"namespace": namespace})]

        return await self._run(read, write=False)

    # -- schedules (durable/_schedules.py) ----------------------------------------------------
    async def put_schedule(self, spec: ScheduleSpec, *, origin: str,
                           replace: bool) -> tuple[Schedule, bool]:
        params = {**schedule_params(spec), "origin": origin, "replace": int(replace),
                  "now": self.clock.now()}

        def tx(conn: sqlite3.Connection) -> tuple[Schedule, bool]:
            row = conn.execute(Q["put_schedule"], params).fetchone()
            if row is not None:
                return Schedule.from_row(row), True
            found = conn.execute(Q["get_schedule"], {"name": spec.name}).fetchone()
            return Schedule.from_row(found), False

        return await self._run(tx)

    async def get_schedule(self, name: str) -> Schedule | None:
        def read(conn: sqlite3.Connection) -> Schedule | None:
            row = conn.execute(Q["get_schedule"], {"name": name}).fetchone()
            return None if row is None else Schedule.from_row(row)

        return await self._run(read, write=False)

    async def list_schedules(self) -> list[Schedule]:
        def read(conn: sqlite3.Connection) -> list[Schedule]:
            return [Schedule.from_row(r) for r in conn.execute(Q["list_schedules"])]

        return await self._run(read, write=False)

    async def pause_schedule(self, name: str, paused: bool) -> Schedule | None:
        params = {"name": name, "paused": int(paused), "now": self.clock.now()}

        def tx(conn: sqlite3.Connection) -> Schedule | None:
            row = conn.execute(Q["pause_schedule"], params).fetchone()
            return None if row is None else Schedule.from_row(row)

        return await self._run(tx)

    async def pause_workflow(self, workflow: str,
                             origin: Mapping[str, JSON] | None) -> PausedWorkflow | None:
        params = {"workflow": workflow, "now": self.clock.now(),
                  "origin": None if origin is None else dumps(dict(origin), "origin")}

        def tx(conn: sqlite3.Connection) -> PausedWorkflow | None:
            row = conn.execute(Q["pause_workflow"], params).fetchone()
            return None if row is None else PausedWorkflow.from_row(row)

        return await self._run(tx)

    async def resume_workflow(self, workflow: str) -> PausedWorkflow | None:
        def tx(conn: sqlite3.Connection) -> PausedWorkflow | None:
            row = conn.execute(Q["resume_workflow"], {"workflow": workflow}).fetchone()
            return None if row is None else PausedWorkflow.from_row(row)

        return await self._run(tx)

    async def paused_workflows(self) -> list[PausedWorkflow]:
        def read(conn: sqlite3.Connection) -> list[PausedWorkflow]:
            return [PausedWorkflow.from_row(r) for r in conn.execute(Q["paused_workflows"])]

        return await self._run(read, write=False)

    async def delete_schedule(self, name: str) -> bool:
        def tx(conn: sqlite3.Connection) -> bool:
            return bool(conn.execute(Q["delete_schedule"], {"name": name}).rowcount)

        return await self._run(tx)

    async def fire_schedule(self, name: str, version: int, fire_at: float,
                            new: NewRun | None) -> bool:
        now = self.clock.now()
        params = {"name": name, "version": version, "fire_at": fire_at, "now": now,
                  "run_id": None if new is None else new.id}
        if new is not None:
            dumps(new.args, "workflow arguments", around=1)

        def tx(conn: sqlite3.Connection) -> bool:
            if conn.execute(Q["fire_schedule"], params).rowcount != 1:
                return False
            if new is not None:
                with contextlib.suppress(RunConflictError):  # a pruned id: moved past it
                    _insert_run(conn, new, now)
            return True

        return await self._run(tx)

    # -- retention (durable/_retention.py) ----------------------------------------------------
    async def prunable_runs(self, state: RunState, cutoff: float, limit: int,
                            after: tuple[float, str] | None = None) -> list[Run]:
        at, last = after if after is not None else (float("-inf"), "")
        params = {"state": RunState(state).value, "cutoff": cutoff, "limit": limit,
                  "after_at": at, "after_id": last}

        def read(conn: sqlite3.Connection) -> list[Run]:
            return [Run.from_row(r) for r in conn.execute(Q["prunable_runs"], params)]

        return await self._run(read, write=False)

    async def prune_runs(self, state: RunState, cutoff: float, limit: int) -> list[PrunedRun]:
        params = {"state": RunState(state).value, "cutoff": cutoff, "limit": limit,
                  "now": self.clock.now()}

        def tx(conn: sqlite3.Connection) -> list[PrunedRun]:
            pruned = [PrunedRun.from_row(r)
                      for r in conn.execute(Q["prune_mark"], params).fetchall()]
            if pruned:
                ids = json.dumps([p.id for p in pruned])
                conn.execute(Q["prune_journal"], {"ids": ids})
                conn.execute(Q["prune_signals"], {"ids": ids})
                conn.execute(Q["prune_delete_runs"], {**params, "ids": ids})
            return pruned

        return await self._run(tx)

    async def get_pruned(self, run_id: str) -> PrunedRun | None:
        def read(conn: sqlite3.Connection) -> PrunedRun | None:
            row = conn.execute(Q["get_pruned"], {"id": run_id}).fetchone()
            return None if row is None else PrunedRun.from_row(row)

        return await self._run(read, write=False)


def list_runs_query(**filters: Any) -> tuple[str, dict[str, Any]]:
    """The list statement for the filters given (see :func:`run_filters`) and its parameters."""
    where, params = run_filters(Q, **filters)
    return Q["list_runs"].replace("/*where*/", where), params


def list_runs_statement(conn: sqlite3.Connection, cap: int, **filters: Any
                        ) -> tuple[str, dict[str, Any]]:
    """The list statement for the filters given, led by the index that reads fewer rows
    where no statistics tell SQLite which: an id prefix's range if it holds fewer than
    ``cap`` ids (counted in the primary key's index, up to ``cap``), else the list's order,
    the prefix checked on each index entry; with a key, a workflow and a state, the key's
    runs of the workflow if fewer than ``cap``, else its runs in the state. Otherwise
    :func:`list_runs_query`."""
    leads: dict[str, bool] = {}
    if filters.get("id_prefix"):
        where, params = run_filters(Q, id_prefix=filters["id_prefix"])
        probe = Q["id_prefix_rows"].replace("/*prefix*/", where.removeprefix("WHERE "))
        leads["prefix_leads"] = conn.execute(probe, params | {"cap": cap}).fetchone()[0] < cap
    if not leads.get("prefix_leads") and all(  # (a leading range checks all the rest)
            filters.get(f) is not None for f in ("key", "workflow", "state")):
        rows = conn.execute(Q["key_workflow_rows"], {
            "key": filters["key"], "workflow": filters["workflow"], "cap": cap}).fetchone()[0]
        leads["pair_leads"] = rows < cap
    return list_runs_query(**leads, **filters)


def count_runs_query(**filters: Any) -> tuple[str, dict[str, Any]]:
    """The count statement for the filters given and its parameters. With a time window,
    every state is named (``runs_any_state``), so each state's range of the window is
    counted in a covering index (the states' own, the workflow's or the key's) where
    SQLite read the window's rows from the table, or every entry of the states' index."""
    where, params = run_filters(Q, **filters)
    timed = any(filters.get(k) is not None for k in ("created_from", "created_to"))
    if timed:
        where = where.replace("WHERE ", f"WHERE {Q['runs_any_state']}\n  AND ", 1)
    return Q["count_runs"].replace("/*where*/", where), params


def _journal_claim(conn: sqlite3.Connection, run: Run, worker: str, now: float) -> None:
    conn.execute(Q["append_unfenced"], _entry_params(
        Fence(run.id, run.epoch),
        JournalWrite(EntryKind.RUN_CLAIMED, attempt=run.attempt, data={"worker": worker}),
        now))


class _Fenced(Exception):
    """Raised inside a transaction whose fence failed, to roll it back."""


def _insert_run(conn: sqlite3.Connection, new: NewRun, now: float) -> tuple[Run, bool]:
    """Create a queued run with its ``run_created`` entry, unless the id exists (then the
    existing run, and False): the create path of :meth:`SqliteStore.create_run` and of a
    schedule's fire."""
    run_at = now if new.run_at is None else new.run_at  # None: due at once
    params = {"id": new.id, "workflow": new.workflow,
              "args": dumps(new.args, "workflow arguments", around=1), "key": new.key,
              "run_at": run_at, "timeout": new.timeout, "start_within": new.start_within,
              "now": now}
    row = conn.execute(Q["insert_run"], params).fetchone()
    if row is None:
        existing = conn.execute(Q["get_run"], {"id": new.id}).fetchone()
        if existing is None:  # the id named a run that was pruned: not used again
            pruned = conn.execute(Q["get_pruned"], {"id": new.id}).fetchone()
            raise PrunedRun.from_row(pruned).reused()
        return Run.from_row(existing), False
    run = Run.from_row(row)
    data: dict[str, JSON] = {"workflow": new.workflow, "args": new.args, "key": new.key,
                             "run_at": run_at}
    if new.headers:
        data["headers"] = dict(new.headers)
    if new.start_within is not None:
        data["start_within"] = new.start_within
    conn.execute(Q["append_unfenced"],
                 _entry_params(Fence(run.id, 0), JournalWrite(EntryKind.RUN_CREATED, data=data),
                               now))
    return run, True


def _signal(row: Mapping[str, Any]) -> Signal:
    keys = row.keys()
    return Signal(int(row["seq"]), row["name"], loads(row["payload"]), float(row["created_at"]),
                  row["signal_id"] if "signal_id" in keys else None, loads(row["origin"]))


def _record(row: Mapping[str, Any]) -> Record:
    return Record(row["namespace"], row["key"], loads(row["value"]), int(row["epoch"]),
                  float(row["updated_at"]), int(row["version"]))


def _split_script(script: str) -> list[str]:
    """Split a migration into statements, keeping trigger bodies whole."""
    statements: list[str] = []
    current: list[str] = []
    for line in script.splitlines():
        stripped = line.strip()
        if not current and (not stripped or stripped.startswith("--")):
            continue
        current.append(line)
        joined = "\n".join(current)
        if stripped.endswith(";") and sqlite3.complete_statement(joined):
            statements.append(joined)
            current = []
    if current and "\n".join(current).strip():
        statements.append("\n".join(current))
    return statements
