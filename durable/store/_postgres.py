"""The PostgreSQL store: for several machines sharing one database.

Driver: psycopg 3's async API with a ``psycopg_pool.AsyncConnectionPool`` (see
docs/postgres.md for why not asyncpg). psycopg's async driver needs an asyncio event loop:
on asyncio the store runs on the caller's loop; opened on trio, it runs on an asyncio loop
in a thread of its own (``durable/store/_loop.py``), and its public methods, called from
trio, run there (docs/postgres.md, *On asyncio and on trio*).

URL: ``postgresql://user:password@host:5432/dbname?schema=NAME``. ``schema`` (default
``public``) is this store's own option and is removed before connecting; every other query
option goes to libpq (``sslmode``, ``connect_timeout``, ...). The store creates the schema if
needed and sets the connections' ``search_path`` to it, so several independent stores (or
test runs) can share one database.

Semantics are those of the SQLite store, statement for statement: every claim and state
change is one conditional statement (writable CTEs write the journal entry with it), fenced
writes hold only while the run is running under the epoch with an unexpired lease, claims
lock their candidates with ``FOR UPDATE SKIP LOCKED`` so workers compete without blocking,
and epochs come from one sequence, so fencing tokens are globally monotonic and distinct.

Time: leases are written and judged by the server's clock, in SQL: ``%(now)s`` in
queries.sql stands for :data:`SERVER_NOW`, which is the server's ``statement_timestamp()``
(when the server received the statement; not ``now()``, the transaction's start) unless a
clock was injected (a :class:`durable.testing.FakeClock` in tests), whose time the store
then passes. So the
workers' and readers' own clocks take no part: a host whose clock is off or steps neither
recovers live runs nor writes past its lease. What remains is a step of the server's own
clock (docs/design.md, "Clocks").
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hashlib
import inspect
import json
import re
import select
import time
from collections.abc import AsyncIterator, Callable, Collection, Mapping, Sequence
from contextlib import aclosing, asynccontextmanager
from functools import partial
from typing import Any
from urllib.parse import unquote, urlsplit

import anyio
import attrs
import psycopg
import sniffio
from anyio.lowlevel import checkpoint_if_cancelled
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.rows import DictRow, dict_row
from psycopg_pool import AsyncConnectionPool, PoolClosed, PoolTimeout

from .. import _wake
from .._clock import Clock, WallClock
from .._errors import (
    ConfigError,
    NotSentError,
    StaleRecordError,
    StoreError,
    StoreUnavailableError,
)
from .._retention import PrunedRun
from .._schedules import Schedule, ScheduleSpec, schedule_params
from .._types import (
    JSON,
    UNSTORABLE,
    ClaimOutcome,
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
    list_unfinished_query,
    operator_data,
    run_filters,
)
from ._loop import LoopThread
from ._sql import load_migrations, load_queries

SERVER_NOW = "coalesce(%(now)s::double precision, extract(epoch from statement_timestamp()))"
"""What ``%(now)s`` in queries.sql becomes: the injected clock's time when the store passes
one, else (``now`` is None) the server's clock when it received the statement. One value for
the whole statement, and stable, so the planner uses it as an index bound: with the
volatile ``clock_timestamp()``, every claim scanned all delayed queued runs and every sweep
all running ones (tests/test_clock_postgres.py)."""

_ARRAY_PARAMETER = re.compile(r"%\((\w+)\)s(::[a-z ]+\[\])")


def _binary_arrays(query: str) -> str:
    """Array parameters (``%(x)s::text[]``) sent in PostgreSQL's binary format (``%(x)b``):
    psycopg builds a text array literal in Python, quoting each element (11 us per fenced
    write of a 240-write batch here, 3 us in binary; docs/postgres.md, *Group commit*)."""
    return _ARRAY_PARAMETER.sub(r"%(\1)b\2", query)


def _compact(query: str) -> str:
    """A statement as the store sends it: queries.sql's text without its comment lines and
    indentation. psycopg converts a statement's text once and keeps it only when it is at
    most 4,096 bytes long (``psycopg._queries.MAX_CACHED_STATEMENT_LENGTH``); a longer one
    (claim_with with its comments: 6,021) was parsed again on every call."""
    return "\n".join(line.strip() for line in query.splitlines()
                     if line.strip() and not line.lstrip().startswith("--"))


Q = {name: _compact(_binary_arrays(query.replace("%(now)s", SERVER_NOW)))
     for name, query in load_queries("postgres").items()}
for _name in ("claim", "claim_with", "claimable", "finish_batch"):  # shared parts
    Q[_name] = Q[_name].replace("/*claimable*/", Q["claimable_where"]).replace(
        "/*claimed*/", Q["claim_set"]).replace("/*finishes*/", Q["finishes"])
Q = {name: query.replace("/*done_payload*/", Q["done_payload"]) for name, query in Q.items()}

_BINARY_ARRAY = re.compile(r"%\((\w+)\)b(::[a-z ]+)\[\]")
Q_ONE_ENTRY = {"append_entries": Q["append_entry"],
               "finish_run": _BINARY_ARRAY.sub(r"ARRAY[%(\1)s\2]", Q["finish_run"])}
"""A lone append or finish of one journal entry (the usual: a step's entry, a run's end),
with scalar parameters. Dumping six one-element arrays cost more client CPU than the rest
of the call (a sequential fenced append used 225 us of CPU against a plain INSERT's 143 us
on a loaded machine; with scalars, 147 us: docs/postgres.md, *Group commit*). The append is
its own statement (append_entry: one INSERT from the locked row, without append_entries'
CTE and unnest, which cost the server more than the rest of the insert); the finish is
finish_run with each entry array built on the server from one scalar,
``ARRAY[%(kinds)s::text]``."""

_ALL_ROWS = "SELECT run.* FROM run, notified"
assert Q["finish_batch"].rstrip().endswith(_ALL_ROWS)
FINISH_BATCH_JOBS = Q["finish_batch"].replace(_ALL_ROWS, "SELECT run.job FROM run, notified")
"""finish_batch answering only which jobs finished their run: for a batch none of whose
runs is waited for in this process (nobody to hand the run to: _settle), the client parses
one column per finished run instead of the whole row. A wait that begins while the batch is
in flight reads the run itself (Client.wait), as it does for another process's finish."""


_NAMED_PARAMETER = re.compile(r"%\((\w+)\)s")


def _positional(query: str, order: tuple[str, ...]) -> str:
    """``query`` with its named parameters as positional ones (``%s``), which must come in
    ``order``: psycopg then takes a tuple as it is, where a dict costs the caller a dict
    and psycopg a reordering into a list on every call."""
    found = tuple(_NAMED_PARAMETER.findall(query))
    if found != order:
        raise AssertionError(f"the query's parameters are {found}, not {order}")
    return _NAMED_PARAMETER.sub("%s", query)


LONE_APPEND = _positional(Q["append_entry"], (
    "kinds", "steps", "step_keys", "names", "attempts", "now", "datas", "run_id", "epoch",
    "now"))
"""append_entry with positional parameters: a lone append of one entry is the hottest
statement of a sequential run (_one builds its tuple in this order)."""

LONE_PAIR = _positional(Q["append_entry_pair"], (
    "now", "kind1", "step1", "step_key1", "name1", "attempt1", "data1",
    "kind2", "step2", "step_key2", "name2", "attempt2", "data2", "run_id", "epoch", "now"))
"""append_entry_pair with positional parameters: a lone append of two entries (a step's
deferred completion and the next step's start), the other half of a sequential run's
appends. As arrays (append_entries: CTE and unnest) it cost 115 us of client CPU against
86 us, on one connection (docs/postgres.md, *Group commit*)."""

CHANNEL_BYTES = 63
"""The longest channel name PostgreSQL takes (NAMEDATALEN - 1): ``pg_notify`` refuses a
longer one, and LISTEN would truncate it."""


def channel_name(kind: str, schema: str) -> str:
    """The NOTIFY channel of ``kind`` (:data:`CHANNEL`, :data:`DONE_CHANNEL`) for one
    schema (schema 12): ``<kind>:<schema>``, or ``<kind>:<md5 of the schema's name>`` when
    that would be longer than :data:`CHANNEL_BYTES`. Migration 012's triggers name the
    work channel the same way, in SQL (a test holds them together); a store's schema name
    is ASCII (``_SCHEMA_NAME``), so its characters are its bytes on both sides."""
    name = f"{kind}:{schema}"
    if len(name.encode()) > CHANNEL_BYTES:
        name = f"{kind}:{hashlib.md5(schema.encode(), usedforsecurity=False).hexdigest()}"
    return name


TOLD_KEPT = 1024
"""How many starts :meth:`PostgresStore.told_here` remembers (a start forgotten costs its
worker one read of what is queued)."""

CHANNEL = "durable_work"
"""The kind of the NOTIFY channel of work (a schema's is :func:`channel_name`); the payload
begins with the schema of the store that has work."""

DONE_CHANNEL = "durable_done"
"""The kind of the NOTIFY channel of finished runs (a schema's is :func:`channel_name`),
sent by the statements that end a run (queries.sql); the payload is ``<schema> <the run's
row as JSON>``, or ``<schema> {"id": <run id>}`` when the row does not fit (schema 11;
``<schema> <run id>`` before, from a worker of an older version: :func:`_done_payload`)."""

POOL_TIMEOUT = 10.0
"""Seconds to wait for a pooled connection before the store counts as unavailable."""

HOT_FOR = 10.0
"""Seconds a connection may stay out of the pool as the store's hot connection
(:meth:`PostgresStore._put_back`) before it goes back to the pool, whose rules (its
lifetime, closing idle connections) then apply to it again."""

STATEMENT_TIMEOUT = 30.0
"""Seconds any statement may run (``statement_timeout`` of every connection): a statement
waiting on a lock, or a server busy with it, fails as a StoreError instead of hanging its
caller (a server that cannot be reached at all: :data:`DEAD_PEER`). One default lease: a
write that takes longer is pointless."""

DEAD_PEER = {"tcp_user_timeout": 10_000, "keepalives": 1, "keepalives_idle": 5,
             "keepalives_interval": 2, "keepalives_count": 3}
"""libpq's TCP settings of every connection, unless the URL sets them: a server that
vanished (its host dead, the network cut: packets dropped, nothing refused) closes the
connection within about 10 s of a request it never acknowledged (``tcp_user_timeout``, in
milliseconds, Linux) or of silence while an answer is awaited (keepalives), instead of the
kernel's ~15 minutes of retransmissions: a claim, renewal or write sent then fails as a
connection lost, and a worker's shutdown is not held up by it (docs/postgres.md,
*A network cut*). ``statement_timeout`` cannot do it: the server enforces it."""

LOOP_MESSAGE = "the PostgreSQL store runs on asyncio or trio, not on {library}"

CLAIM_RAMP = 100
"""Store.claim_ramp with group commit: claiming 1,000 runs at once took one statement of
74-82 ms here, the worker idle until it was answered."""

MAX_BATCH = 256
"""The most fenced writes (appends, finishes) sent as one statement by group commit."""

_SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")
_UNIQUE_ONE_RUNNING = "durable_runs_one_running_per_key"
# SQLSTATEs that mean the server cannot be reached or is going away.
_UNAVAILABLE_STATES = frozenset({"57P01", "57P02", "57P03", "53300"})

READ_ONLY = "25006"
"""read_only_sql_transaction: the server is a standby (or was made read-only)."""

_ABORTED = (psycopg.errors.DiskFull, psycopg.errors.DeadlockDetected,
            psycopg.errors.SerializationFailure, psycopg.errors.ReadOnlySqlTransaction)
"""Statements the server refuses, aborting their transaction, for a reason that may pass:
no room, a cycle of waits broken, a server turned read-only (NotSentError)."""

Conn = psycopg.AsyncConnection[DictRow]


KEPT_RESULT_ROWS = 64
"""A kept cursor (_Pooled) whose result had more rows than this is dropped after it was
read, so a pooled connection does not keep a large result while idle."""


class _Pooled(psycopg.AsyncConnection[DictRow]):
    """The pool's connections: each keeps one cursor for the store's statements whose
    rows are read at once (_rows, the fenced writes). ``conn.execute`` makes a cursor on
    every call, which cost 9 us of client CPU of a lone append's ~65 on one connection
    (docs/postgres.md, *Group commit*)."""

    _cursor: psycopg.AsyncCursor[DictRow] | None = None
    _left_pool = 0.0
    """When it was last taken from the pool (``time.monotonic()``): see HOT_FOR."""
    _unasked = False
    """The server sent something unasked (_alive): never used again, whatever libpq says
    of it once that input was read."""


def _cursor(conn: Conn) -> psycopg.AsyncCursor[DictRow]:
    """The connection's kept cursor (a new one on a connection not from the pool). Only
    for a statement whose rows are read before the connection runs another."""
    if type(conn) is not _Pooled:
        return conn.cursor()
    cur = conn._cursor
    if cur is None:
        cur = conn._cursor = conn.cursor()
    return cur


class PostgresStore(Store):
    """A store in a PostgreSQL schema, shared by any number of workers on any hosts."""

    def __init__(self, url: str, *, clock: Clock | None = None, pool_size: int = 10,
                 create: bool = True, upgrade: bool = True,
                 max_recoveries: int = DEFAULT_MAX_RECOVERIES,
                 statement_timeout: float = STATEMENT_TIMEOUT,
                 pool_timeout: float = POOL_TIMEOUT) -> None:
        url, grouped = _group_commit_option(url)
        if pool_size < 1:
            raise ConfigError(f"pool_size must be at least 1, got {pool_size}")
        if statement_timeout <= 0:
            raise ConfigError(f"statement_timeout must be positive, got {statement_timeout}")
        self._conninfo, self.schema, self.url, self._secrets = _parse_url(
            url, statement_timeout)
        self._work_channel = channel_name(CHANNEL, self.schema)
        self._done_channel = channel_name(DONE_CHANNEL, self.schema)
        self.max_recoveries = max_recoveries
        self._pool_timeout = pool_timeout
        # without an injected clock, time is the server's (SERVER_NOW); self.clock is then
        # only this host's estimate, for display
        self.clock = clock or WallClock()
        self._server_time = clock is None
        self.pool_size = pool_size
        self._create = create
        self._upgrade = upgrade
        self._pool: AsyncConnectionPool[Conn] | None = None
        self._listener: psycopg.AsyncConnection[Any] | None = None
        self._listen_lock: anyio.Lock | None = None
        self._done_listener: psycopg.AsyncConnection[Any] | None = None
        self._done: _wake.Beacon | None = None
        self._done_at: dict[str, int] = {}  # run id -> the beacon generation of its NOTIFY
        self._done_reading = False
        self._claim_seen: dict[str, Snapshot] = {}
        """Worker id -> the snapshot of its last claim through this store (any run, its
        workflows): a ``durable_work`` NOTIFY of a transaction that snapshot saw is no news
        to that worker's :meth:`wait_for_work` (the claim saw what it queued)."""
        self._created: collections.OrderedDict[str, int] = collections.OrderedDict()
        """Run id -> the transaction that created it through this store object (the last
        :data:`TOLD_KEPT`), for :meth:`told_here`."""
        self._told: collections.OrderedDict[int, None] = collections.OrderedDict()
        """The transactions of starts told to this process's workers directly (the last
        :data:`TOLD_KEPT`): their ``durable_work`` NOTIFY is no news to a worker here."""
        self._starts: set[int] = set()
        """The inserts of starts in flight (numbered): a NOTIFY of one may reach the
        listener before its answer reaches the start, which then tells its workers
        (:meth:`told_here`); a NOTIFY that is news only by that is judged after them."""
        self._start_count = 0
        self._start_done = _wake.Beacon()
        self._claiming: dict[str, int] = {}
        """Worker id -> its claims in flight: a NOTIFY that arrives meanwhile is judged
        against the snapshot of the claim that is under way, once it returns."""
        self._claimed = _wake.Beacon()
        # Group commit (_grouped), on unless the URL says ?group_commit=0 (or this is set
        # False before the store is used): the benchmark's baseline.
        self.group_commit = grouped
        # Claims ramp up with group commit only: without it, each of the worker's writes
        # takes a pooled connection, and a later claim waits for one behind them (the
        # baseline ran 22-31 % slower with the ramp: docs/benchmarks.md, target 7).
        self.claim_ramp = CLAIM_RAMP if grouped else None
        self._pending: list[_Write] = []
        self._leading = False
        self._hot: Conn | None = None
        """The connection last put back, kept for the next checkout (_put_back)."""
        self._getting = 0
        """Callers waiting in the pool's getconn: while any does, none is kept hot."""
        self.batches = 0
        """Batches of fenced writes sent by group commit (for benchmarks and tests)."""
        self.batched_writes = 0
        """Fenced writes those batches carried."""
        self._bridge: LoopThread | None = None
        """Opened on trio: the asyncio loop (a thread of its own) the store runs on."""

    # -- lifecycle ---------------------------------------------------------------------------
    async def open(self) -> None:
        try:
            library: str | None = sniffio.current_async_library()
        except sniffio.AsyncLibraryNotFoundError:
            library = None
        if library == "trio":
            await self._open_on_a_loop_thread()
            return
        if library != "asyncio":
            raise ConfigError(LOOP_MESSAGE.format(library=library))
        try:
            # A schema already current is only read (one autocommit SELECT: no transaction
            # id, no lock beyond the catalog's), so read commands open while a migration
            # or any other writer holds its locks; only a schema behind is migrated.
            version = await self._current_version()
            if version == 0 and not self._create:
                raise self._missing()
            if version != SCHEMA_VERSION:
                await self._migrate()
        except psycopg.Error as exc:
            message = _redact(str(exc), self._secrets)
            if isinstance(exc, psycopg.OperationalError) and _REFUSED_OPTION.search(message):
                # libpq refused an option's value before connecting: a mistake in the URL,
                # not an outage ("cannot reach" sent the user to look at the server)
                raise ConfigError(f"malformed PostgreSQL URL {self.url}: "
                                  f"{message.removeprefix('connection is bad: ')}") from exc
            raise self._translate(exc) from exc
        pool: AsyncConnectionPool[Conn] = AsyncConnectionPool(
            self._conninfo,
            connection_class=_Pooled,
            kwargs={"autocommit": True, "row_factory": dict_row},
            min_size=1,
            max_size=self.pool_size,
            open=False,
            timeout=self._pool_timeout,
            # No check query on every checkout: it cost a round trip per statement (+30 %
            # claims/s without it, docs/benchmarks-claims.md). _connection() finds a
            # connection the server dropped without a round trip (_alive) and replaces it
            # before sending anything. Idle connections are recycled after max_idle.
            max_idle=60.0,
            name=f"durable:{self.schema}",
        )
        try:
            await pool.open(wait=True, timeout=self._pool_timeout)
        except (psycopg.Error, PoolTimeout) as exc:
            with anyio.CancelScope(shield=True):
                await pool.close()
            raise self._translate(exc) from exc
        self._pool = pool
        self._listen_lock = anyio.Lock()

    async def _open_on_a_loop_thread(self) -> None:
        """Open on an asyncio loop of the store's own, and make the public methods of this
        object run there when called from the caller's loop (instance attributes over the
        class's methods: a caller on asyncio pays nothing for this)."""
        if self._bridge is not None:
            raise StoreError("the store is already open")
        _wake.hub(self)  # made here, on the caller's loop, before the store's loop reads it
        bridge = LoopThread(f"durable-postgres:{self.schema}")
        try:
            await bridge.call(type(self).open, self)
        except BaseException:
            await bridge.stop()
            raise
        self._bridge = bridge
        for name in BRIDGED:
            setattr(self, name, _bridged(bridge, getattr(self, name)))

    def _to_caller(self, fn: Callable[..., object], *args: Any) -> None:
        """``fn(*args)`` on the caller's loop (this process's hub of signals lives there)."""
        bridge = self._bridge
        if bridge is None:
            fn(*args)
        else:
            bridge.to_caller(fn, *args)

    async def aclose(self) -> None:
        bridge = self._bridge
        if bridge is not None and not bridge.here():
            try:
                await bridge.call(type(self).aclose, self)
            finally:
                self._bridge = None
                for name in BRIDGED:
                    self.__dict__.pop(name, None)
                await bridge.stop()
            return
        pool, self._pool = self._pool, None
        listener, self._listener = self._listener, None
        done, self._done_listener = self._done_listener, None
        hot, self._hot = self._hot, None
        with anyio.CancelScope(shield=True):
            if listener is not None:
                await listener.close()
            if done is not None:
                await done.close()
            if pool is not None:
                if hot is not None:
                    await pool.putconn(hot)
                await pool.close()

    async def _current_version(self) -> int:
        """The schema version, read on a connection of its own in autocommit (0: none yet);
        raises SchemaVersionError for a version newer than this durable's."""
        conn = await psycopg.AsyncConnection.connect(
            self._conninfo, row_factory=dict_row, autocommit=True)
        try:
            version = await self._read_version(conn, self.schema)
        finally:
            with anyio.CancelScope(shield=True):
                await conn.close()
        self._check_upgrade(version)
        return version

    def _missing(self) -> StoreUnavailableError:
        return StoreUnavailableError(
            f"no durable schema {self.schema!r} at {self.url}: check ?schema=, or "
            "create it with: durable migrate --db URL")

    def _check_upgrade(self, version: int) -> None:
        check_schema(version, self.url, self.url, upgrade=self._upgrade)

    async def _migrate(self) -> None:
        """Create or upgrade the schema in one transaction, under an advisory lock.

        Two processes opening a new database at once take turns on the lock; the second
        then finds the schema current. On a connection of its own, and the lock is the
        session's, taken *before* the migration's transaction begins: the version is read
        again in a transaction that starts after the lock was granted, so its snapshot and
        catalog lookups include whatever the previous holder committed. (A read-first open
        that re-read the version on the connection it had read with before, in the
        transaction of an ``xact`` lock it had waited for, failed the concurrent first-open
        test with DuplicateTable, or hung.) Closing the connection releases the lock,
        whatever happens.
        """
        conn = await psycopg.AsyncConnection.connect(
            self._conninfo, row_factory=dict_row, autocommit=True)
        try:
            await conn.execute("SELECT pg_advisory_lock(hashtextextended(%s, 0))",
                               (f"durable.migrate.{self.schema}",))
            await self._migrate_on(conn)
        finally:
            with anyio.CancelScope(shield=True):
                await conn.close()

    async def _migrate_on(self, conn: Conn) -> None:
        async with conn.transaction():
            version = await self._read_version(conn, self.schema)
            if version == 0 and not self._create:
                raise self._missing()
            await conn.execute(
                sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(self.schema))
            )
            self._check_upgrade(version)
            if version == 0:
                self.created = f"schema {self.schema!r} of {self.url}"
            for number, script in load_migrations("postgres"):
                if number <= version:
                    continue
                await conn.execute(script)
                await conn.execute(
                    "INSERT INTO durable_meta (key, value) VALUES ('schema_version', %s) "
                    "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                    (str(number),),
                )
                version = number

    @staticmethod
    async def _read_version(conn: Conn, schema: str) -> int:
        """The schema version in ``schema`` (0: no durable tables there), one SELECT by
        schema-qualified names (not through the search_path)."""
        table = sql.Identifier(schema, "durable_meta")
        cur = await conn.execute(
            "SELECT to_regclass(%s) IS NOT NULL AS present", (table.as_string(conn),))
        row = await cur.fetchone()
        if row is None or not row["present"]:
            return 0
        cur = await conn.execute(sql.SQL(
            "SELECT value FROM {} WHERE key = 'schema_version'").format(table))
        row = await cur.fetchone()
        return int(row["value"]) if row else 0

    async def schema_version(self) -> int:
        async with self._connection() as conn:
            return await self._read_version(conn, self.schema)

    # -- plumbing ----------------------------------------------------------------------------
    @asynccontextmanager
    async def _connection(self) -> AsyncIterator[Conn]:
        """A pooled connection (autocommit); driver errors become StoreErrors here.

        A connection whose server end is gone (``pg_terminate_backend``, a server restart)
        is found at checkout without a round trip, from what the server already sent, and
        replaced: a statement is never sent on it, so a write that was known not to run
        is not failed for it. A connection that breaks after the statement was sent fails
        it (its outcome is unknown).
        """
        pool = self._pool
        if pool is None:
            raise StoreError("the store is not open")
        conn = await self._checkout(pool)
        try:
            async with conn:
                yield conn
        except (psycopg.Error, PoolTimeout, PoolClosed) as exc:
            await _drop_if_read_only(conn, exc)
            raise self._translate(exc) from exc
        finally:
            with anyio.CancelScope(shield=True):
                await self._put_back(pool, conn)

    async def _checkout(self, pool: AsyncConnectionPool[Conn]) -> Conn:
        """A live pooled connection (see _connection), to be put back by the caller with
        _put_back: the hot connection if there is one, else one from the pool."""
        conn, self._hot = self._hot, None
        try:
            for _ in range(self.pool_size + 1):
                if conn is not None and _alive(conn):
                    return conn
                if conn is not None:
                    # broken: closed, the pool discards it (and opens another)
                    with anyio.CancelScope(shield=True):
                        await conn.close()
                        await pool.putconn(conn)
                self._getting += 1
                try:
                    conn = await pool.getconn()
                finally:
                    self._getting -= 1
                if isinstance(conn, _Pooled):
                    conn._left_pool = time.monotonic()
        except PoolTimeout as exc:  # nothing was sent: the caller may try again
            raise NotSentError(str(self._translate(exc))) from exc
        except (psycopg.Error, PoolClosed) as exc:
            raise self._translate(exc) from exc
        assert conn is not None
        return conn

    async def _put_back(self, pool: AsyncConnectionPool[Conn], conn: Conn) -> None:
        """A checked-out connection back: kept as the hot connection, which the next
        checkout takes without the pool, or put back into the pool.

        psycopg_pool hands its connections out in turn (first in, first out), each through
        its lock and bookkeeping: sequential statements (an attempt's steps, a chain of
        runs) went round all the pooled connections, each a server process of its own.
        The hot connection is the one just used, its server process and prepared statements
        warm: 5-16 us less client CPU a statement here, and sequential steps 15-25 % faster
        (docs/benchmarks.md, *The hot connection*). Kept only while the pool is
        open, no caller waits for a pooled connection (it would wait while the hot one
        idles), the connection is idle (no transaction left open) and it left the pool at
        most HOT_FOR seconds ago; otherwise into the pool, which rolls back, discards or
        keeps it."""
        if (self._hot is None and self._pool is pool and not self._getting
                and not conn.closed
                and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
                and isinstance(conn, _Pooled) and time.monotonic() - conn._left_pool < HOT_FOR):
            self._hot = conn
            return
        await pool.putconn(conn)

    async def _rows(self, query: str, params: Mapping[str, Any]) -> list[DictRow]:
        async with self._connection() as conn:
            cur = await _cursor(conn).execute(query, params)
            rows = await cur.fetchall()
            if len(rows) > KEPT_RESULT_ROWS and isinstance(conn, _Pooled):
                # a kept cursor keeps its last result (libpq's memory) until its next
                # statement: not a large one, on a connection that may stay idle
                conn._cursor = None
                await cur.close()
            return rows

    async def _row(self, query: str, params: Mapping[str, Any]) -> DictRow | None:
        rows = await self._rows(query, params)
        return rows[0] if rows else None

    async def _read(self, query: str, params: Mapping[str, Any]) -> list[DictRow]:
        """A statement that changes nothing, sent once more on another connection when the
        server ended the connection under it (``pg_terminate_backend``, a restart, an idle
        session timeout: the FATAL can reach the socket after the checkout looked, or
        while the statement runs). A write's outcome would be unknown then and it fails; a
        read's is never in doubt, so it is only late. Any other failure, or a second one,
        raises as a write's does, and so does a read that was never sent (NotSentError: no
        pooled connection within the pool's timeout, a PoolTimeout, which psycopg makes an
        OperationalError without a SQLSTATE, like a connection lost without a word: it was
        sent again, and waited out the timeout twice).

        A lookup by text PostgreSQL cannot hold (a NUL, a lone surrogate: the driver refuses
        it, a StoreError the console showed as an outage) is not sent: no such text is
        stored (every write refuses it, _types.UNSTORABLE), so it matches nothing, as it
        does on SQLite."""
        if _unstorable(params):
            return []
        try:
            return await self._rows(query, params)
        except StoreUnavailableError as exc:
            if isinstance(exc, NotSentError) or not _ended_by_server(exc.__cause__):
                raise
        return await self._rows(query, params)

    async def _read_row(self, query: str, params: Mapping[str, Any]) -> DictRow | None:
        rows = await self._read(query, params)
        return rows[0] if rows else None

    def _address(self) -> str:
        """``host:port`` the store connects to (libpq's defaults when the URL has none)."""
        params = conninfo_to_dict(self._conninfo)
        host = str(params.get("host") or params.get("hostaddr") or "the local socket")
        port = str(params.get("port") or "5432")
        return f"{host}:{port}" if "," not in host and not host.startswith("/") else (
            f"{host} port {port}")

    def _translate(self, exc: Exception) -> StoreError:
        """The one place where driver errors become durable's, without the password."""
        if isinstance(exc, PoolClosed):
            return StoreError("the store is closed")
        if isinstance(exc, PoolTimeout):
            return StoreUnavailableError(
                f"PostgreSQL at {self.url}: no connection within {self._pool_timeout:g} s (the "
                f"server is unreachable, or all {self.pool_size} pooled connections are busy)"
            )
        message = _redact(str(exc), self._secrets)
        if isinstance(exc, _ABORTED):
            # the server refused the statement and aborted its transaction: nothing was
            # written, and a write may be tried again (docs/design.md, *A full disk*); a
            # connection to a server turned read-only is dropped (_drop_if_read_only)
            standby = (" (the server is read-only: a standby?)"
                       if isinstance(exc, psycopg.errors.ReadOnlySqlTransaction) else "")
            return NotSentError(
                f"PostgreSQL at {self.url}: {message}{standby}; nothing was written")
        if isinstance(exc, psycopg.OperationalError) and (
            exc.sqlstate is None
            or exc.sqlstate.startswith("08")
            or exc.sqlstate in _UNAVAILABLE_STATES
        ):
            return StoreUnavailableError(
                f"cannot reach PostgreSQL at {self._address()} ({self.url}): {message}")
        return StoreError(f"PostgreSQL at {self.url}: {message}")

    # -- time ------------------------------------------------------------------------------
    def _now(self) -> float | None:
        """``%(now)s`` for a statement: None lets the server's clock judge (SERVER_NOW)."""
        return None if self._server_time else self.clock.now()

    async def now(self) -> float:
        if not self._server_time:
            return self.clock.now()
        row = await self._read_row(Q["now"], {"now": None})
        if row is None or row["now"] is None:
            raise StoreError("the server did not say what time it is")
        return float(row["now"])

    # -- runs --------------------------------------------------------------------------------
    async def create_run(self, new: NewRun) -> tuple[Run, bool]:
        now = self._now()
        run_at = now if new.run_at is None else new.run_at
        # run_at None (due at once, on the server's clock): the insert takes the server's
        # time itself and writes it into the entry's data, which then starts with
        # {"run_at":null (queries.sql, insert_run)
        data: dict[str, JSON] = {"run_at": None} if run_at is None else {}
        data |= {"workflow": new.workflow, "args": new.args, "key": new.key}
        if run_at is not None:
            data["run_at"] = run_at
        if new.headers:
            data["headers"] = dict(new.headers)
        if new.start_within is not None:
            data["start_within"] = new.start_within
        params = {
            "id": new.id,
            "workflow": new.workflow,
            "args": dumps(new.args, "workflow arguments", around=1),
            "key": new.key,
            "run_at": run_at,
            "timeout": new.timeout,
            "start_within": new.start_within,
            "now": now,
            "data": dumps(data, "journal data", around=2),
        }
        self._start_count += 1
        start = self._start_count
        self._starts.add(start)
        try:
            row = await self._row(Q["insert_run"], params)
        finally:
            # a judgement waiting for this start runs after the caller's next await: a
            # Client.start has told its workers (told_here) by then (no await between)
            self._starts.discard(start)
            self._start_done.fire()
        if row is not None:
            self._created[new.id] = int(row["txid"])
            if len(self._created) > TOLD_KEPT:
                self._created.popitem(last=False)
            return Run.from_row(row), True
        # The id exists (maybe committed by a concurrent call this statement waited for):
        # read it with a fresh snapshot.
        existing = await self._read_row(Q["get_run"], {"id": new.id})
        if existing is None:
            pruned = await self.get_pruned(new.id)
            if pruned is not None:  # the id named a run that was pruned: not used again
                raise pruned.reused()
            raise StoreError(f"run {new.id} was neither created nor found")
        return Run.from_row(existing), False

    async def get_run(self, run_id: str) -> Run | None:
        row = await self._read_row(Q["get_run"], {"id": run_id})
        return None if row is None else Run.from_row(row)

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
        where, params = run_filters(
            Q, state=state, workflow=workflow, key=key, before=before,
            created_from=created_from, created_to=created_to, id_prefix=id_prefix)
        params["limit"] = limit
        query = Q["list_runs"].replace("/*where*/", where)
        return [Run.from_row(r) for r in await self._read(query, params)]

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
        return [Run.from_row(r) for r in await self._read(query, params)]

    async def count_runs(
        self, *, workflow: str | None = None, key: str | None = None,
        created_from: float | None = None, created_to: float | None = None,
    ) -> dict[RunState, int]:
        where, params = run_filters(Q, workflow=workflow, key=key, created_from=created_from,
                                    created_to=created_to)
        counts = dict.fromkeys(RunState, 0)
        for row in await self._read(Q["count_runs"].replace("/*where*/", where), params):
            counts[RunState(row["state"])] = int(row["n"])
        return counts

    async def latest_run(self, workflow: str, key: str) -> Run | None:
        row = await self._read_row(Q["latest_run"], {"workflow": workflow, "key": key})
        return None if row is None else Run.from_row(row)

    async def next_run_at(self) -> float | None:
        row = await self._read_row(Q["next_run_at"], {})
        return None if row is None or row["run_at"] is None else float(row["run_at"])

    async def next_due_in(self, workflows: Sequence[str] | None = None) -> float | None:
        row = await self._read_row(Q["next_due"], {
            "now": self._now(), "workflows": None if workflows is None else list(workflows)})
        return None if row is None else float(row["due_in"])

    async def queue_stats(self) -> dict[str, tuple[int, float]]:
        rows = await self._read(Q["queue_stats"], {"now": self._now()})
        return {row["workflow"]: (int(row["n"]), max(0.0, float(row["age"]))) for row in rows}

    # -- attempts ----------------------------------------------------------------------------
    async def claim(
        self,
        worker: str,
        lease: float,
        limit: int,
        run_id: str | None = None,
        workflows: Sequence[str] | None = None,
    ) -> list[Run]:
        params = {"worker": worker, "lease": lease, "limit": limit, "run_id": run_id,
                  "workflows": None if workflows is None else list(workflows),
                  "now": self._now(), "data": dumps({"worker": worker})}
        whole = run_id is None  # a claim of one given run says nothing about the others
        if whole:
            self._claiming[worker] = self._claiming.get(worker, 0) + 1
        try:
            async with self._connection() as conn:
                try:
                    cur = await conn.execute(Q["claim"], params)
                except psycopg.errors.UniqueViolation as exc:
                    if exc.diag.constraint_name != _UNIQUE_ONE_RUNNING:
                        raise
                    # Another worker claimed a run of the same key at the same moment:
                    # this statement claimed nothing (and its snapshot counts for
                    # nothing); the next poll tries again.
                    return []
                rows = await cur.fetchall()
            if whole and rows:
                self._claim_seen[worker] = Snapshot.parse(rows[0]["seen"])
        finally:
            if whole:
                left = self._claiming[worker] - 1
                if left:
                    self._claiming[worker] = left
                else:
                    del self._claiming[worker]
                self._claimed.fire()
        return [Run.from_row(r) for r in rows if r["id"] is not None]

    # -- a claim riding on the first write (Store.claim_with) ------------------------------
    claims_ride_on_writes = True
    """One statement claims, appends the attempt's first entries and finishes the previous
    attempt (claim_with): one commit (and one WAL flush) where three were; the read before
    it (claimable) is a round trip without a commit (docs/design.md, *One commit per
    step*)."""

    async def claimable(
        self, worker: str, limit: int, workflows: Sequence[str] | None = None
    ) -> list[Run]:
        params = {"limit": limit, "now": self._now(),
                  "workflows": None if workflows is None else list(workflows)}
        return [Run.from_row(r) for r in await self._read(Q["claimable"], params)]

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
        """One statement (claim_with in queries.sql): the finishes, each fenced on its own,
        the claim of ``run_id`` and, as the caller expected it, the entries. If the claim
        breaks the one-running-run-per-key index (another worker claimed a run of its key
        at the same moment), the server rolls the statement back: the finishes then commit
        on their own, and nothing is claimed."""
        params = self._job_params([
            _finish_write(f.fence, f.state, f.result, f.error, f.entries) for f in finishes])
        params.update(worker=worker, lease=lease, run_id=run_id, attempt=attempt,
                      workflows=None if workflows is None else list(workflows),
                      data=dumps({"worker": worker}))
        claim_rows = _entry_rows(entries)
        for column, name in enumerate(_ENTRY_COLUMNS):
            params[f"claim_{name}"] = [row[column] for row in claim_rows]
        try:
            found = await self._rows(Q["claim_with"], params)
        except StoreError as exc:
            cause = exc.__cause__
            if not (isinstance(cause, psycopg.errors.UniqueViolation)
                    and cause.diag.constraint_name == _UNIQUE_ONE_RUNNING):
                raise
            return ClaimOutcome(tuple([
                await self.finish(f.fence, f.state, result=f.result, error=f.error,
                                  entries=f.entries) for f in finishes]), None, False)
        done = {int(r["job"]): r for r in found}
        finished = tuple(job in done for job in range(1, len(finishes) + 1))
        for job, ok in enumerate(finished, 1):
            if ok:
                self._settle(done[job])
        claimed = done.get(0)
        if claimed is None:
            return ClaimOutcome(finished, None, False)
        run = Run.from_row(claimed)
        # as the caller expected: the statement's own condition for writing the entries
        # (with none to write, the count alone would say so of any run it claimed)
        appended = (run.attempt == attempt and not run.cancel_requested
                    and int(claimed["written"]) == 1 + len(entries))
        return ClaimOutcome(finished, run, appended)

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
            "now": self._now(),
            "ids": [f.run_id for f in held],
            "epochs": [f.epoch for f in held],
            "details": dumps({k: dumps(v) for k, v in (details or {}).items()}),
        }
        return [
            Renewal(r["id"], int(r["epoch"]), bool(r["cancel_requested"]))
            for r in await self._rows(Q["renew"], params)
        ]

    async def append(self, fence: Fence, entries: Sequence[JournalWrite]) -> bool:
        if not entries:
            return True
        write = _Write(fence, _entry_rows(entries))
        if self.group_commit:
            if not self._leading:  # nothing in flight: nothing to join, it goes alone
                return await self._alone(write)
            return await self._grouped(write)
        async with self._connection() as conn:
            return await self._one(conn, write)

    async def finish(
        self,
        fence: Fence,
        state: RunState,
        *,
        result: JSON = None,
        error: str | None = None,
        entries: Sequence[JournalWrite] = (),
    ) -> bool:
        write = _finish_write(fence, state, result, error, entries)
        if self.group_commit:
            if not self._leading:
                return await self._alone(write)
            return await self._grouped(write)
        async with self._connection() as conn:
            return await self._one(conn, write)

    # -- group commit ------------------------------------------------------------------------
    # Concurrent fenced appends and finishes of many attempts share a statement (and so a
    # round trip and a commit): the first caller to find no batch in flight leads, sending
    # what is queued at that moment (it does not wait for company: alone, it sends its own
    # write by itself, as without group commit); callers arriving meanwhile queue, and the
    # first of them leads the next batch once this one is answered. Each write is fenced on
    # its own inside the batch statement (append_batch, finish_batch): a refused write
    # writes nothing and takes nothing from the others, and each caller gets its own
    # answer. Outcomes: no connection at checkout: NotSentError for every write of the
    # batch (nothing was sent); the connection lost after sending: StoreUnavailableError
    # for each (unknown: the batch may have committed); the server refused the statement
    # (it was rolled back): each write is sent again on its own, so one write's error is
    # its own.
    async def _alone(self, write: _Write) -> bool:
        """A write that found no batch in flight (so none forming either): it leads, as in
        _grouped, but a batch of itself alone needs none of the batch's machinery (the
        queue, the batch's lists, the chain of _lead, _flush and _send): one coroutine
        from the caller to the statement (a lone write's client CPU, docs/postgres.md,
        *Group commit*). Writes that arrive while it is in flight queue, and the first of
        them leads the next batch once it is answered, as after any batch."""
        pool = self._pool
        if pool is None:
            raise StoreError("the store is not open")
        await checkpoint_if_cancelled()  # a cancelled caller sends nothing
        if self._leading:  # (not after a checkpoint that did not yield; never, then)
            return await self._grouped(write)
        self._leading = True
        self.batches += 1
        self.batched_writes += 1
        try:
            # shielded like any lead: once sent, its outcome is awaited (and the
            # connection put back), whoever cancels the caller
            with anyio.CancelScope(shield=True):
                conn = await self._checkout(pool)  # NotSentError: nothing was sent
                try:
                    return await self._one(conn, write)
                except (psycopg.Error, PoolTimeout, PoolClosed) as exc:
                    # refused by the server, or the connection lost after sending (the
                    # outcome unknown): a StoreError either way, as from a batch of one;
                    # a connection a read-only server refused it on is not used again
                    await _drop_if_read_only(conn, exc)
                    raise self._translate(exc) from exc
                finally:
                    await self._put_back(pool, conn)
            raise StoreError("a lone write got no answer")  # (nothing cancels its scope)
        finally:
            self._hand_on_lead()  # queued meanwhile: the first of them leads the next batch

    def _hand_on_lead(self) -> None:
        """A batch (or a lone write) was answered: the first write queued meanwhile leads
        the next batch, else nothing leads."""
        if self._pending:
            head = self._pending[0]
            head.lead = True
            assert head.wake is not None  # a queued write waits on it
            head.wake.set()
        else:
            self._leading = False

    async def _grouped(self, write: _Write) -> bool:
        if self._pool is None:
            raise StoreError("the store is not open")
        await checkpoint_if_cancelled()  # a cancelled caller sends nothing
        self._pending.append(write)
        if not self._leading:
            self._leading = True
            with anyio.CancelScope(shield=True):  # the batch carries other callers' writes
                await self._lead()
            return write.outcome()
        # (the leader's own write needs none) asyncio's Event, not anyio's wrapper of it:
        # this code runs on asyncio only (on trio, on the store's loop thread), and the
        # wrapper cost a backend lookup and a call more per queued write
        wake = write.wake = asyncio.Event()
        try:
            await wake.wait()
        except BaseException:
            if write.lead:  # the lead was handed to this caller: others wait for it
                with anyio.CancelScope(shield=True):
                    await self._lead()
            elif not write.sent:  # still queued: nothing of it was sent
                self._pending.remove(write)
            raise  # (a write in flight is left to its batch; its outcome is abandoned)
        if write.lead:
            with anyio.CancelScope(shield=True):
                await self._lead()
        return write.outcome()

    async def _lead(self) -> None:
        """Send the queued writes (at most MAX_BATCH) as one batch; then hand the lead to
        the first write still queued, or end it."""
        batch = self._pending[:MAX_BATCH]
        del self._pending[:MAX_BATCH]
        for write in batch:
            write.sent = True
        try:
            await self._flush(batch)
        except BaseException as exc:  # never leave a caller waiting
            for write in batch:
                if write.ok is None and write.error is None:
                    write.error = exc if isinstance(exc, StoreError) else StoreError(
                        f"PostgreSQL at {self.url}: the batch failed: {exc!r}")
            raise
        finally:
            # The next lead first: the event loop runs woken tasks in the order they were
            # woken, so the next batch is sent before this batch's callers run on, and the
            # server works on it meanwhile (woken after them, it went out once they had all
            # run: the server idle while they ran, the client idle while it worked;
            # docs/benchmarks.md, target 7).
            self._hand_on_lead()
            for write in batch:
                if write.wake is not None:
                    write.wake.set()

    async def _flush(self, batch: list[_Write]) -> None:
        self.batches += 1
        self.batched_writes += len(batch)
        appends = [w for w in batch if w.finish is None]
        finishes = [w for w in batch if w.finish is not None]
        pool = self._pool
        try:
            if pool is None:
                raise StoreError("the store is not open")
            # The pooled connection without _connection's context managers (a lone write's
            # client CPU, docs/postgres.md, *Group commit*): _lead runs shielded, and an
            # autocommit connection has no transaction to end (the pool rolls back one
            # left open, and discards a broken connection).
            conn = await self._checkout(pool)
            try:
                for group in (appends, finishes):
                    refused = appends[0].error if appends else None
                    if group and conn.closed and isinstance(refused, NotSentError):
                        # the appends' read-only refusal closed it (_drop_if_read_only):
                        # the finishes were not sent, and would be refused the same way
                        for write in group:
                            write.error = NotSentError(str(refused))
                    elif group:
                        await self._send(conn, group)
            except (psycopg.Error, PoolTimeout, PoolClosed) as exc:
                raise self._translate(exc) from exc
            finally:
                await self._put_back(pool, conn)
        except StoreError as exc:
            # NotSentError: no connection could be had (nothing was sent). Any other: the
            # connection broke with a statement sent, whose outcome is unknown.
            for write in batch:
                if write.ok is None and write.error is None:
                    write.error = exc

    async def _send(self, conn: Conn, group: list[_Write]) -> None:
        """One statement for a group of appends (or of finishes); each write gets its own
        outcome. Raises (psycopg) only when the outcome is unknown (connection lost)."""
        try:
            if len(group) == 1:
                group[0].ok = await self._one(conn, group[0])
                return
            cur = await _cursor(conn).execute(*self._batch(group))
            done = {int(r["job"]): r for r in await cur.fetchall()}
        except psycopg.Error as exc:
            if not _refused(conn, exc):
                raise
            await _drop_if_read_only(conn, exc)
            if len(group) == 1 or not _retry_alone(exc):
                for write in group:
                    write.error = self._translate(exc)
                return
            # The server refused the whole statement (rolled back: nothing of it was
            # written), e.g. a deadlock: each write again on its own, with its own outcome.
            for write in group:
                try:
                    write.ok = await self._one(conn, write)
                except psycopg.Error as one:
                    if not _refused(conn, one):
                        raise
                    write.error = self._translate(one)
            return
        for job, write in enumerate(group, 1):
            write.ok = job in done
            if write.ok and write.finish is not None and "id" in done[job]:
                self._settle(done[job])  # (FINISH_BATCH_JOBS: nobody to hand it to)

    def _job_params(self, group: Sequence[_Write]) -> dict[str, Any]:
        """The parameters of one statement of many fenced writes, each a job (from 1):
        append_batch's, finish_batch's, claim_with's finishes. A group of finishes (or
        none) also carries each one's state, result and error."""
        params: dict[str, Any] = {
            "now": self._now(),
            "schema": self.schema,
            "done_channel": self._done_channel,
            "job_run_ids": [w.fence.run_id for w in group],
            "job_epochs": [w.fence.epoch for w in group],
            "entry_jobs": [job for job, w in enumerate(group, 1) for _ in w.rows],
        }
        for column, name in enumerate(_ENTRY_COLUMNS):
            params[name] = [row[column] for w in group for row in w.rows]
        ends = [w.finish for w in group if w.finish is not None]
        if len(ends) == len(group):
            params["job_states"] = [end[0] for end in ends]
            params["job_results"] = [end[1] for end in ends]
            params["job_errors"] = [end[2] for end in ends]
        return params

    def _batch(self, group: list[_Write]) -> tuple[str, dict[str, Any]]:
        params = self._job_params(group)
        if group[0].finish is None:
            return Q["append_batch"], params
        waited = _wake.hub(self).waited
        if waited and any(w.fence.run_id in waited for w in group):
            return Q["finish_batch"], params
        return FINISH_BATCH_JOBS, params

    async def _one(self, conn: Conn, write: _Write) -> bool:
        """One fenced append or finish, as its own statement."""
        fence, rows = write.fence, write.rows
        entries = len(rows)
        params: dict[str, Any]
        if entries == 1 and write.finish is None:  # LONE_APPEND's order
            kind, step, step_key, name, attempt, data = rows[0]
            now = self._now()
            cur = await _cursor(conn).execute(LONE_APPEND, (
                kind, step, step_key, name, attempt, now, data, fence.run_id, fence.epoch, now))
            return cur.rowcount == 1
        if entries == 2 and write.finish is None:  # LONE_PAIR's order
            now = self._now()
            cur = await _cursor(conn).execute(LONE_PAIR, (
                now, *rows[0], *rows[1], fence.run_id, fence.epoch, now))
            return cur.rowcount == 2
        if entries == 1:
            queries = Q_ONE_ENTRY
            params = dict(zip(_ENTRY_COLUMNS, rows[0], strict=True))
        else:
            queries = Q
            params = {name: [row[column] for row in rows]
                      for column, name in enumerate(_ENTRY_COLUMNS)}
        params.update(run_id=fence.run_id, epoch=fence.epoch, now=self._now())
        if write.finish is None:
            cur = await _cursor(conn).execute(queries["append_entries"], params)
            return cur.rowcount == entries
        state, result, error = write.finish
        cur = await _cursor(conn).execute(queries["finish_run"], params | {
            "state": state, "result": result, "error": error, "schema": self.schema,
            "done_channel": self._done_channel})
        row = await cur.fetchone()
        if row is None:
            return False
        self._settle(row)
        return True

    def _settle(self, row: DictRow) -> None:
        """Hand the row of a run this store just finished to this process's waits for it
        (durable/_wake.py, Hub.settle): they return it without reading it again."""
        signals = _wake.hub(self)
        if row["id"] in signals.waited:
            self._to_caller(signals.settle, Run.from_row(row))

    async def release(self, fence: Fence, entries: Sequence[JournalWrite] = (), *,
                      run_at: float | None = None, waiting_for: str | None = None,
                      seen_signals: int = 0) -> bool:
        params = _fence_params(fence, self._now()) | _entry_arrays(entries) | {
            "schema": self.schema, "done_channel": self._done_channel,
            "cancelled_error": CANCELLED_AT_RELEASE,
            "cancel_data": dumps({"by": "operator", "at": "release"}),
            "run_at": run_at, "waiting_for": waiting_for, "seen_signals": seen_signals}
        row = await self._row(Q["release_run"], params)
        return row is not None and row["done"] == 1

    async def recover_stale(
        self, run_id: str | None = None, epoch: int | None = None
    ) -> list[Fence]:
        params = {"run_id": run_id, "epoch": epoch, "now": self._now(),
                  "max_recoveries": self.max_recoveries,
                  "cancelled_error": CANCELLED_AT_RECOVERY,
                  "cancel_data": dumps({"by": "operator", "at": "recovery"})}
        return [Fence(r["id"], int(r["epoch"]))
                for r in await self._rows(Q["recover_stale"], params)]

    async def journal(self, run_id: str, after: int = 0) -> list[JournalEntry]:
        rows = await self._read(Q["journal"], {"run_id": run_id, "after": after})
        return [JournalEntry.from_row(r) for r in rows]

    # -- operator actions ---------------------------------------------------------------------
    async def request_cancel(
        self, run_id: str, by: Mapping[str, JSON] | None = None
    ) -> Run | None:
        data = dumps(operator_data({"by": "operator"}, by), "the origin of a cancel")
        params = {"run_id": run_id, "now": self._now(), "data": data, "schema": self.schema,
                  "done_channel": self._done_channel}
        row = await self._row(Q["request_cancel"], params)
        return None if row is None else Run.from_row(row)

    async def requeue(
        self,
        run_id: str,
        replay_from: int | None,
        doubt_policy: str | None,
        by: Mapping[str, JSON] | None = None,
    ) -> Run | None:
        data = operator_data({"from_step": replay_from, "in_doubt": doubt_policy}, by)
        params = {"run_id": run_id, "now": self._now(),
                  "data": dumps(data, "the origin of a replay")}
        row = await self._row(Q["requeue"], params)
        return None if row is None else Run.from_row(row)

    # -- signals -----------------------------------------------------------------------------
    async def send_signal(self, run_id: str, name: str, payload: JSON,
                          signal_id: str | None = None,
                          by: Mapping[str, JSON] | None = None) -> SignalSent:
        params = {"run_id": run_id, "name": name, "signal_id": signal_id,
                  "payload": dumps(payload, "a signal's payload"), "now": self._now(),
                  "origin": None if by is None else dumps(dict(by), "the origin of a signal"),
                  "data": dumps(operator_data({"name": name, "signal_id": signal_id}, by),
                                "the origin of a signal")}
        row = await self._row(Q["send_signal"], params)
        if row is None:
            return SignalSent(None, None)
        return SignalSent(RunState(row["state"]), None if row["seq"] is None else int(row["seq"]))

    async def next_signal(self, run_id: str, name: str,
                          after: int) -> tuple[int, Signal | None]:
        row = await self._read_row(Q["next_signal"], {"run_id": run_id, "name": name,
                                                 "after": after})
        if row is None:
            return 0, None
        count = 0 if row["count"] is None else int(row["count"])
        return count, None if row["seq"] is None else _signal(row)

    async def list_signals(self, run_id: str) -> list[Signal]:
        return [_signal(r) for r in await self._read(Q["list_signals"], {"run_id": run_id})]

    # -- records -----------------------------------------------------------------------------
    async def put_records(
        self,
        fence: Fence | None,
        records: Sequence[tuple[str, str, JSON]],
        entries: Sequence[JournalWrite] = (),
        *,
        expected: Mapping[tuple[str, str], int] | None = None,
    ) -> bool:
        now = self._now()
        # One row per key (the last value wins), as if written one after the other; upserted
        # in one order, by namespace and key, so that two writers of the same records take
        # their row locks in the same order (given in opposite orders, they deadlocked)
        latest = dict(sorted(
            {(ns, key): dumps(value, "record value") for ns, key, value in records}.items()))
        conditions = dict(expected or {})
        arrays = {
            "namespaces": [ns for ns, _ in latest],
            "keys": [key for _, key in latest],
            "values": list(latest.values()),
        }
        if fence is not None and not latest and not entries:
            return True
        try:
            async with self._connection() as conn, conn.transaction():
                if fence is None:
                    if not latest:
                        return True
                    cur = await conn.execute(Q["put_records_unfenced"], arrays | {"now": now})
                    written = [(r["namespace"], r["key"], int(r["version"]))
                               for r in await cur.fetchall()]
                else:
                    params = _fence_params(fence, now) | _entry_arrays(entries) | arrays
                    cur = await conn.execute(Q["put_records"], params)
                    row = await cur.fetchone()
                    if row is None or not row["held"] or row["entries"] != len(entries):
                        raise _Fenced
                    written = [(ns, key, int(v)) for ns, key, v in loads(row["versions"])]
                _check_versions(conditions, written)
        except _Fenced:
            return False
        return True

    async def get_record(self, namespace: str, key: str) -> Record | None:
        row = await self._read_row(Q["get_record"], {"namespace": namespace, "key": key})
        return None if row is None else _record(row)

    async def list_records(self, namespace: str) -> list[Record]:
        return [_record(r) for r in await self._read(Q["list_records"], {"namespace": namespace})]

    # -- waking idle workers and waiting clients ----------------------------------------------
    pushes_changes = True

    # notify_finished is the base class's no-op, not overridden (a worker skips calling a
    # store's that is not: the bound and the await it costs per run): the statements that
    # end a run (finish_run, finish_batch, a release_run or request_cancel that ends it
    # cancelled) NOTIFY ``durable_done:<schema>`` (:func:`channel_name`) with ``<schema> <run
    # id>`` themselves, delivered when they commit (no statement, no round trip of its own).

    async def wait_for_finished(self, run_id: str, timeout: float,
                                since: object = None) -> None:
        """Return when a NOTIFY says the run finished, or after ``timeout`` seconds.

        One listening connection per store serves every waiter: whichever waiter finds
        nobody reading reads, and hands over when it leaves. The first call (and the first
        after the connection was lost) subscribes and returns at once, so a caller that
        re-reads the run after every return misses nothing.
        """
        if self._pool is None:
            raise StoreError("the store is not open")
        if self._done is None:
            self._done = _wake.Beacon()
        done = self._done
        with anyio.move_on_after(timeout):
            while self._done_at.pop(run_id, None) is None:  # kept if it came before
                if self._done_reading:
                    await done.wait(done.generation)
                    continue
                self._done_reading = True
                try:
                    if await self._read_done():
                        return
                finally:
                    self._done_reading = False
                    done.fire()  # another waiter reads from here on

    async def _read_done(self) -> bool:
        """Read finished-run notifications until one arrives; True when the caller must
        re-read (a new subscription)."""
        assert self._done is not None
        listener = self._done_listener
        if listener is None or listener.closed:
            self._done_listener = await self._subscribe(self._done_channel)
            if self._done_listener is None:
                await anyio.sleep_forever()  # unreachable server: wait out the timeout
            return True
        prefix = f"{self.schema} "
        done = self._done

        def take(notify: psycopg.Notify) -> bool:
            if not notify.payload.startswith(prefix):
                return False
            run_id, row = _done_payload(notify.payload[len(prefix):])
            if len(self._done_at) > 10_000:
                self._done_at.clear()
            self._done_at[run_id] = done.generation + 1
            signals = _wake.hub(self)
            if row is not None and run_id in signals.waited:
                run = _ended(row)
                if run is not None:  # the waits here take it without a read
                    self._to_caller(signals.told, run)
            done.fire()
            return True

        try:
            return not await _read_notifies(listener, None, take)
        except psycopg.Error:
            self._done_listener = None
            with anyio.CancelScope(shield=True):
                await listener.close()
        return True

    async def cancels_requested(self, run_ids: Collection[str]) -> set[str]:
        if not run_ids:
            return set()
        rows = await self._read(Q["cancels_pending"], {})
        return {run_id for run_id in (str(r["id"]) for r in rows) if run_id in run_ids}

    async def wait_for_work(self, timeout: float, worker: str | None = None, *,
                            patient: bool = False) -> tuple[Run, ...] | None:
        """Return when work may be waiting, or after ``timeout`` seconds at the latest.

        Work is a run queued (created, requeued, released, recovered), a cancel requested,
        or a run with a concurrency key ending: the database sends NOTIFY on the schema's
        ``durable_work:<schema>`` (:func:`channel_name`) when such a change commits. The
        first call (and the first after the listening connection was lost) subscribes on a
        dedicated connection and returns at once, so a caller that polls after every return
        misses nothing. ``patient`` changes nothing here (a notification is sent, not looked for).
        Notifications that arrive while nobody waits are kept, and one return consumes
        all that are pending. Never raises for a lost connection: it waits out the timeout
        and subscribes again on the next call (plain polling meanwhile).

        With ``worker``, a notification of work whose transaction the snapshot of that
        worker's last claim (through this store) saw is skipped: that claim already
        looked at what it queued. One that arrives while the worker claims is judged
        against that claim's snapshot once it returns. A cancel requested always counts.

        Returns the runs the news was, as they were created, when it was only runs created
        queued whose NOTIFY carried their row (schema 11: the worker's claim can ride on
        their first write without a read); None when the caller must look (anything else
        was news, the timeout, a new subscription).

        Meant for one waiting task per store (the worker's); concurrent callers take turns.
        """
        lock = self._listen_lock
        if self._pool is None or lock is None:
            raise StoreError("the store is not open")
        with anyio.move_on_after(timeout):
            async with lock:
                listener = self._listener
                if listener is None or listener.closed:
                    self._listener = await self._subscribe(self._work_channel)
                    if self._listener is not None:
                        return None
                else:
                    try:
                        return await self._next_notification(listener, timeout, worker)
                    except psycopg.Error:
                        self._listener = None
                        with anyio.CancelScope(shield=True):
                            await listener.close()
                await anyio.sleep_forever()  # unreachable server: wait out the timeout
        return None

    async def _subscribe(self, channel: str) -> psycopg.AsyncConnection[Any] | None:
        try:
            # the store's TCP settings (DEAD_PEER: keepalives) turn a silently dead
            # listening connection into an error within about 11 s, so waiting falls back
            # to polling and the next call subscribes again
            conn = await psycopg.AsyncConnection.connect(self._conninfo, autocommit=True)
        except psycopg.Error:
            return None
        try:
            await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
        except BaseException as exc:
            with anyio.CancelScope(shield=True):
                await conn.close()
            if isinstance(exc, psycopg.Error):
                return None
            raise
        return conn

    def told_here(self, run_id: str) -> None:
        bridge = self._bridge
        if bridge is not None and not bridge.here():  # its state is the store loop's
            bridge.soon(self.told_here, run_id)
            return
        txid = self._created.pop(run_id, None)
        if txid is not None:
            self._told[txid] = None
            if len(self._told) > TOLD_KEPT:
                self._told.popitem(last=False)

    async def _next_notification(
        self, conn: psycopg.AsyncConnection[Any], timeout: float, worker: str | None
    ) -> tuple[Run, ...] | None:
        """Return after a notification of this schema that is news to ``worker`` (every
        one without a worker), or after ``timeout`` seconds without one (None). The news
        was only runs created, each carried by its NOTIFY: those runs; else None."""
        while True:
            news: list[_Work] = []
            await _read_notifies(conn, timeout, partial(self._work_notify, news))
            if not news:
                return None  # the timeout
            # Consume what else has already arrived: one wake-up covers it.
            async with aclosing(conn.notifies(timeout=0)) as pending:
                async for notify in pending:
                    self._work_payload(notify.payload, news)
            if worker is None or any(w.txid is None for w in news):
                return _carried(news)
            ahead = set(self._starts)  # starts in flight, whose hand-over may come next
            while not all(w.txid in self._told for w in news) and ahead & self._starts:
                await self._start_done.wait(self._start_done.generation)
            news = [w for w in news if w.txid not in self._told]
            if not news:
                continue  # starts this process's workers were told of (told_here)
            while worker in self._claiming:  # judged by the snapshot of the claim under way
                await self._claimed.wait(self._claimed.generation)
            seen = self._claim_seen.get(worker)
            if seen is not None:
                news = [w for w in news if w.txid is None or not seen.saw(w.txid)]
            if news:
                return _carried(news)

    def _work_notify(self, news: list[_Work], notify: psycopg.Notify) -> bool:
        return self._work_payload(notify.payload, news)

    def _work_payload(self, payload: str, news: list[_Work]) -> bool:
        """Add what a ``durable_work`` payload of this schema says to ``news`` (the
        transaction, None for a cancel or a payload naming none; the run it carries, if
        any); False: another schema's."""
        schema, _, rest = payload.partition(" ")
        if schema != self.schema:
            return False
        txid, _, row = rest.partition(" ")
        news.append(_Work(int(txid), row or None) if txid.isdigit() else _Work(None, None))
        return True

    # -- schedules (durable/_schedules.py) ----------------------------------------------------
    async def put_schedule(self, spec: ScheduleSpec, *, origin: str,
                           replace: bool) -> tuple[Schedule, bool]:
        params = {**schedule_params(spec), "origin": origin, "replace": replace,
                  "now": self._now()}
        row = await self._row(Q["put_schedule"], params)
        if row is not None:
            return Schedule.from_row(row), True
        found = await self.get_schedule(spec.name)
        if found is None:
            raise StoreError(f"schedule {spec.name} was neither written nor found")
        return found, False

    async def get_schedule(self, name: str) -> Schedule | None:
        row = await self._read_row(Q["get_schedule"], {"name": name})
        return None if row is None else Schedule.from_row(row)

    async def list_schedules(self) -> list[Schedule]:
        return [Schedule.from_row(r) for r in await self._read(Q["list_schedules"], {})]

    async def pause_schedule(self, name: str, paused: bool) -> Schedule | None:
        row = await self._row(Q["pause_schedule"],
                              {"name": name, "paused": paused, "now": self._now()})
        return None if row is None else Schedule.from_row(row)

    async def pause_workflow(self, workflow: str,
                             origin: Mapping[str, JSON] | None) -> PausedWorkflow | None:
        row = await self._row(Q["pause_workflow"], {
            "workflow": workflow, "now": self._now(),
            "origin": None if origin is None else dumps(dict(origin), "origin")})
        return None if row is None else PausedWorkflow.from_row(row)

    async def resume_workflow(self, workflow: str) -> PausedWorkflow | None:
        row = await self._row(Q["resume_workflow"], {"workflow": workflow})
        return None if row is None else PausedWorkflow.from_row(row)

    async def paused_workflows(self) -> list[PausedWorkflow]:
        return [PausedWorkflow.from_row(r) for r in await self._read(Q["paused_workflows"], {})]

    async def delete_schedule(self, name: str) -> bool:
        return await self._row(Q["delete_schedule"], {"name": name}) is not None

    async def fire_schedule(self, name: str, version: int, fire_at: float,
                            new: NewRun | None) -> bool:
        params: dict[str, Any] = {
            "name": name, "version": version, "fire_at": fire_at, "now": self._now(),
            "run_id": None, "workflow": None, "args": None, "key": None, "run_at": None,
            "timeout": None, "start_within": None, "data": None}
        if new is not None:
            params.update(
                run_id=new.id, workflow=new.workflow,
                args=dumps(new.args, "workflow arguments", around=1),
                key=new.key, run_at=new.run_at, timeout=new.timeout,
                start_within=new.start_within,
                data=dumps({"workflow": new.workflow, "args": new.args, "key": new.key,
                            "run_at": new.run_at}, "journal data", around=2))
        row = await self._row(Q["fire_schedule"], params)
        return row is not None and int(row["fired"]) == 1

    # -- retention (durable/_retention.py) ----------------------------------------------------
    async def prunable_runs(self, state: RunState, cutoff: float, limit: int,
                            after: tuple[float, str] | None = None) -> list[Run]:
        at, last = after if after is not None else (float("-inf"), "")
        rows = await self._read(Q["prunable_runs"], {
            "state": RunState(state).value, "cutoff": cutoff, "limit": limit,
            "after_at": at, "after_id": last})
        return [Run.from_row(r) for r in rows]

    async def prune_runs(self, state: RunState, cutoff: float, limit: int) -> list[PrunedRun]:
        params: dict[str, Any] = {"state": RunState(state).value, "cutoff": cutoff,
                                  "limit": limit, "now": self._now()}
        async with self._connection() as conn, conn.transaction():
            cur = await conn.execute(Q["prune_mark"], params)
            pruned = [PrunedRun.from_row(r) for r in await cur.fetchall()]
            if pruned:
                params["ids"] = [p.id for p in pruned]
                await conn.execute(Q["prune_journal"], params)
                await conn.execute(Q["prune_signals"], params)
                await conn.execute(Q["prune_delete_runs"], params)
        return pruned

    async def get_pruned(self, run_id: str) -> PrunedRun | None:
        row = await self._read_row(Q["get_pruned"], {"id": run_id})
        return None if row is None else PrunedRun.from_row(row)

    async def seed_finished(self, runs: Sequence[Mapping[str, Any]],
                            entries: Sequence[Mapping[str, Any]]) -> None:
        """Bulk rows of finished runs and their journals, in one transaction
        (``durable/store/_seed.py``: for tests and benchmarks of retention at scale)."""
        async with self._connection() as conn, conn.transaction():
            await conn.execute(Q["seed_run"], {
                "ids": [r["id"] for r in runs], "workflows": [r["workflow"] for r in runs],
                "keys": [r["key"] for r in runs], "states": [r["state"] for r in runs],
                "created": [r["created_at"] for r in runs],
                "ended": [r["ended_at"] for r in runs]})
            await conn.execute(Q["seed_entry"], {
                "ids": [e["id"] for e in entries], "epochs": [e["epoch"] for e in entries],
                "kinds": [e["kind"] for e in entries], "ats": [e["at"] for e in entries]})


class _Fenced(Exception):
    """Raised inside a transaction whose fence failed, to roll it back."""


class _Write:
    """A fenced append (``finish`` None) or finish waiting for group commit."""

    __slots__ = ("error", "fence", "finish", "lead", "ok", "rows", "sent", "wake")

    def __init__(self, fence: Fence, rows: list[_EntryRow],
                 finish: tuple[str, str | None, str | None] | None = None) -> None:
        self.fence = fence
        self.rows = rows  # the entries, as the journal's columns (_ENTRY_COLUMNS)
        self.finish = finish  # (state, result JSON, error)
        self.ok: bool | None = None
        self.error: BaseException | None = None
        self.sent = False  # taken into a batch
        self.lead = False  # the lead of the next batch was handed to its caller
        self.wake: asyncio.Event | None = None  # set when the caller waits for a batch

    def outcome(self) -> bool:
        if self.error is not None:
            raise self.error
        if self.ok is None:
            raise StoreError("a batched write got no answer")
        return self.ok


def _finish_write(fence: Fence, state: RunState, result: JSON, error: str | None,
                  entries: Sequence[JournalWrite]) -> _Write:
    """A finish as a fenced write (finish, claim_with's carried finishes)."""
    return _Write(fence, _entry_rows(entries),
                  (state.value, dumps(result, "workflow result"), error))


_ENTRY_COLUMNS = ("kinds", "steps", "step_keys", "names", "attempts", "datas")


def _refused(conn: Conn, exc: psycopg.Error) -> bool:
    """Whether the server answered the statement with an error (so it was rolled back and
    the connection is usable), as opposed to a connection lost with the outcome unknown."""
    state = exc.sqlstate
    return (not conn.broken and state is not None and not state.startswith("08")
            and state not in _UNAVAILABLE_STATES)


def _retry_alone(exc: psycopg.Error) -> bool:
    """Whether a refused batch is worth sending again write by write: not when it ran out
    of time (statement_timeout, lock_timeout: each write would wait as long again) or of
    room (disk_full: each would find the disk as full), nor when the server is read-only
    (the connection is dropped)."""
    return exc.sqlstate not in ("57014", "55P03", "53100", READ_ONLY)


async def _drop_if_read_only(conn: Conn, exc: BaseException) -> None:
    """A connection whose server refused a write as read-only is closed, so the pool opens
    another instead of handing this one out again: after a failover, a new connection
    reaches the new primary (a URL naming every host, with ``target_session_attrs=
    read-write``), where writes tried again succeed."""
    if isinstance(exc, psycopg.Error) and exc.sqlstate == READ_ONLY:
        with anyio.CancelScope(shield=True):
            await conn.close()


def _group_commit_option(url: str) -> tuple[str, bool]:
    """The URL without its ``group_commit`` option, and the option (default on)."""
    base, _, query = url.partition("?")
    keep: list[str] = []
    grouped = True
    for item in filter(None, query.split("&")):
        name, _, value = item.partition("=")
        if unquote(name) != "group_commit":
            keep.append(item)
            continue
        choice = unquote(value).lower()
        if choice not in ("1", "0", "on", "off", "true", "false", "yes", "no"):
            raise ConfigError(f"group_commit must be 1 or 0 (on or off), not {value!r}")
        grouped = choice in ("1", "on", "true", "yes")
    return ("?".join([base, "&".join(keep)]) if keep else base), grouped


def _fence_params(fence: Fence, now: float | None) -> dict[str, Any]:
    return {"run_id": fence.run_id, "epoch": fence.epoch, "now": now}


_EntryRow = tuple[str, int | None, str | None, str | None, int | None, str | None]


def _entry_rows(entries: Sequence[JournalWrite]) -> list[_EntryRow]:
    """Journal entries as rows of the columns the queries take (_ENTRY_COLUMNS), in order."""
    return [(e.kind.value, e.step, e.step_key, e.name, e.attempt_column, e.data_json())
            for e in entries]


def _entry_arrays(entries: Sequence[JournalWrite]) -> dict[str, list[Any]]:
    """Journal entries as the parallel arrays the queries unnest, in order."""
    return {
        "kinds": [e.kind.value for e in entries],
        "steps": [e.step for e in entries],
        "step_keys": [e.step_key for e in entries],
        "names": [e.name for e in entries],
        "attempts": [e.attempt_column for e in entries],
        "datas": [e.data_json() for e in entries],
    }


def _signal(row: Mapping[str, Any]) -> Signal:
    return Signal(int(row["seq"]), row["name"], loads(row["payload"]), float(row["created_at"]),
                  row.get("signal_id"), loads(row["origin"]))


def _record(row: Mapping[str, Any]) -> Record:
    return Record(row["namespace"], row["key"], loads(row["value"]), int(row["epoch"]),
                  float(row["updated_at"]), int(row["version"]))


def _check_versions(expected: Mapping[tuple[str, str], int],
                    written: Sequence[tuple[str, str, int]]) -> None:
    """Raise StaleRecordError (rolling the caller's transaction back) unless every record
    written under a condition had the expected version just before this write.

    Each write adds one under the upsert's row lock, and an insert starts at 1, so the
    version before the write is the returned one minus 1 (0: the record was absent).
    """
    for ns, key, version in written:
        want = expected.get((ns, key))
        if want is not None and version - 1 != want:
            raise StaleRecordError(ns, key, want, version - 1)


def _ended_by_server(exc: BaseException | None) -> bool:
    """Whether ``exc`` says the server ended the connection (terminated by an operator, a
    shutdown, a crash: SQLSTATE 57P01-57P03), or that it closed without a word."""
    return isinstance(exc, psycopg.OperationalError) and (
        exc.sqlstate is None or exc.sqlstate in ("57P01", "57P02", "57P03"))


def _alive(conn: Conn) -> bool:
    """Whether a pooled connection may still be used, without a round trip.

    An idle connection's socket has nothing to read. After ``pg_terminate_backend`` or a
    server shutdown it holds a FATAL error and the end of the stream: then (or whenever
    the server sent something unasked) the connection is not used.
    """
    if conn.closed or conn.broken or getattr(conn, "_unasked", False):
        return False
    pgconn = conn.pgconn
    try:
        readable, _, _ = select.select([pgconn.socket], [], [], 0)
    except (OSError, ValueError, psycopg.OperationalError):
        return False
    if readable:
        # the same answer at every look: once the input is read (a FATAL, before the end
        # of the stream comes), the socket has nothing more to read and libpq may still
        # call the connection OK
        if isinstance(conn, _Pooled):
            conn._unasked = True
        with contextlib.suppress(psycopg.OperationalError):
            pgconn.consume_input()
        return False
    return bool(pgconn.status == psycopg.pq.ConnStatus.OK)


_WHOLE_NUMBERS = ("connect_timeout", *DEAD_PEER)
"""libpq's options that take a whole number, which it reads only when it connects (and
then refuses as a connection failure): checked with the URL, a mistake, not an outage."""

_WHOLE_NUMBER = re.compile(r"\s*[-+]?\d+\s*")

_REFUSED_OPTION = re.compile(
    r'invalid \w+ value: "|invalid port number: "|invalid integer value "[^"]*" for '
    r'connection option "|could not match \d+ (?:host names|port numbers) to \d+')
"""libpq's words (fe-connect.c) for an option value it refuses before it connects: an
``sslmode``, ``target_session_attrs``, ``channel_binding``, ``gssencmode``... it does not
know, a port that is not a port, lists of hosts and ports that do not pair up."""


def _parse_url(url: str, statement_timeout: float = STATEMENT_TIMEOUT
               ) -> tuple[str, str, str, tuple[str, ...]]:
    """(libpq conninfo, schema, URL safe to show, secrets to hide) from a postgresql:// URL.

    The URL is handed to libpq as written (its own percent-decoding, no ``+`` for space):
    only the ``schema`` item is taken out of the query string.
    """
    base, _, query = url.partition("?")
    parts = urlsplit(base)
    schema = "public"
    rest: list[str] = []
    shown_rest: list[str] = []
    secrets = [unquote(parts.password)] if parts.password else []
    for item in filter(None, query.split("&")):
        name, _, value = item.partition("=")
        if unquote(name) == "schema":
            schema = unquote(value)
            continue
        rest.append(item)
        if unquote(name) == "password":
            secrets += [unquote(value), value]
            item = f"{name}=***"
        shown_rest.append(item)
    if not _SCHEMA_NAME.fullmatch(schema):
        raise ConfigError(
            f"schema must be a lowercase SQL name (letters, digits, _; at most 63), "
            f"not {schema!r}"
        )
    shown_base = base
    if parts.password is not None:
        userinfo, _, hosts = parts.netloc.rpartition("@")
        shown_base = base.replace(parts.netloc, f"{userinfo.partition(':')[0]}:***@{hosts}", 1)
    if schema != "public":
        shown_rest.append(f"schema={schema}")
    shown = "?".join([shown_base, "&".join(shown_rest)]) if shown_rest else shown_base
    stripped = "?".join([base, "&".join(rest)]) if rest else base
    hidden = tuple(sorted({x for x in secrets if x}, key=len, reverse=True))
    try:
        params = conninfo_to_dict(stripped)
    except psycopg.Error as exc:
        raise ConfigError(
            f"malformed PostgreSQL URL {shown}: {_redact(str(exc), hidden)}") from exc
    for name in _WHOLE_NUMBERS:
        given = params.get(name)
        if given and not _WHOLE_NUMBER.fullmatch(str(given)):
            raise ConfigError(f"malformed PostgreSQL URL {shown}: {name} must be a whole "
                              f"number, not {given!r}")
    settings = f"-c search_path={schema}"
    if "statement_timeout" not in str(params.get("options") or ""):  # the URL's own wins
        settings += f" -c statement_timeout={max(1, round(statement_timeout * 1000))}"
    extra: dict[str, Any] = {
        "options": f"{params['options']} {settings}" if params.get("options")
        else settings,
    }
    if not params.get("connect_timeout"):
        extra["connect_timeout"] = 10
    for setting, default in DEAD_PEER.items():  # the URL's own win
        if not params.get(setting):
            extra[setting] = default
    if not params.get("application_name"):
        extra["application_name"] = "durable"
    return make_conninfo(stripped, **extra), schema, shown, hidden


def _redact(message: str, secrets: tuple[str, ...]) -> str:
    """One line, without any of the secrets."""
    message = " ".join(message.split())
    for secret in secrets:
        message = message.replace(secret, "***")
    return message


@attrs.frozen
class Snapshot:
    """A PostgreSQL snapshot (``txid_current_snapshot()``): which transactions it saw."""

    xmin: int
    xmax: int
    running: frozenset[int]

    @classmethod
    def parse(cls, text: str) -> Snapshot:
        """From ``xmin:xmax:xip,...`` (the text form of ``txid_snapshot``)."""
        xmin, xmax, xip = text.split(":")
        return cls(int(xmin), int(xmax), frozenset(int(x) for x in xip.split(",") if x))

    def saw(self, txid: int) -> bool:
        """Whether a transaction that committed was visible to this snapshot: it ended
        before the snapshot was taken (PostgreSQL's ``txid_visible_in_snapshot``)."""
        return txid < self.xmin or (txid < self.xmax and txid not in self.running)


@attrs.frozen
class _Work:
    """What one ``durable_work`` NOTIFY said: the transaction (None: a cancel, or no
    transaction named) and the run it carried, as created (schema 11: its row as JSON,
    read only if it is news)."""

    txid: int | None
    row: str | None


def _carried(news: Sequence[_Work]) -> tuple[Run, ...] | None:
    """The runs the news carried when it was nothing else (schema 11); None: look (a row
    that is not understood is news all the same, to be read)."""
    runs = []
    for work in news:
        if work.row is None:
            return None
        try:
            runs.append(Run.from_row(json.loads(work.row)))
        except (ValueError, TypeError, KeyError):
            return None
    return tuple(runs)


def _unstorable(params: Mapping[str, Any]) -> bool:
    """Whether a statement's text parameter (or one in a list of them) holds a character
    PostgreSQL's text cannot."""
    return any(UNSTORABLE.search(text) is not None for value in params.values()
               for text in ([value] if isinstance(value, str) else
                            value if isinstance(value, list | tuple) else ())
               if isinstance(text, str))


async def _read_notifies(conn: psycopg.AsyncConnection[Any], timeout: float | None,
                         take: Callable[[psycopg.Notify], bool]) -> bool:
    """Hand ``conn``'s notifications to ``take`` until it says one was news (True) and the
    others read with it were handed over too, or until ``timeout`` seconds passed without
    news. True: there was news.

    psycopg reads what has arrived (the NOTIFYs of several commits, sent at once) and
    yields it one by one: leaving its generator after the first would drop the rest of that
    read with it, and a run's start or end read behind another's was then waited for until
    a poll. So the read is left only at its next wait for the server, where the cancel
    lands (nothing of a read is taken until it is awaited: what is not read stays for the
    next call)."""
    news = False
    with anyio.CancelScope() as enough:
        async with aclosing(conn.notifies(timeout=timeout)) as notifies:
            async for notify in notifies:
                if take(notify) and not news:
                    news = True
                    enough.cancel()  # lands at the next wait: this read is handed over
    return news


def _done_payload(text: str) -> tuple[str, dict[str, Any] | None]:
    """The run id a ``durable_done`` payload (after its schema) names, and the run's row
    when the payload carries it. A payload that is not a JSON object with an ``id`` is a
    run id alone, as a statement of a version before schema 11 sends it."""
    if text.startswith("{"):
        try:
            row = json.loads(text)
        except ValueError:
            row = None
        if isinstance(row, dict) and isinstance(row.get("id"), str):
            return row["id"], row if "state" in row else None
    return text, None


def _ended(row: Mapping[str, Any]) -> Run | None:
    """The run a ``durable_done`` payload carried, if it is understood and finished."""
    try:
        run = Run.from_row(row)
    except (ValueError, TypeError, KeyError):
        return None  # the waits read the run
    return run if run.state.finished else None


BRIDGED: tuple[str, ...] = tuple(sorted(
    name for name in dir(PostgresStore)
    if not name.startswith("_") and name not in ("open", "aclose")
    and inspect.iscoroutinefunction(getattr(PostgresStore, name))))
"""The store's public coroutine methods: opened on trio, each runs on the store's loop
(``open`` and ``aclose`` see to themselves)."""


def _bridged(bridge: LoopThread, method: Callable[..., Any]) -> Callable[..., Any]:
    async def on_the_store_loop(*args: Any, **kwargs: Any) -> Any:
        return await bridge.call(method, *args, **kwargs)

    on_the_store_loop.__name__ = on_the_store_loop.__qualname__ = method.__name__
    on_the_store_loop.__doc__ = method.__doc__
    return on_the_store_loop
