"""The engine's benchmark: journaled steps per second, and what they cost against baselines.

Stores (``--backends sqlite,postgres``, default both, in the same run): each on each event
loop of ``--backend`` (PostgreSQL, ``--pg-url``, on trio runs on an asyncio loop of its own,
in a thread: durable/store/_loop.py; its psycopg baseline on asyncio). An unreachable
PostgreSQL server prints one note and skips that column (exit 0) unless
``--require-postgres`` (exit 2).

Workloads (each repetition on a fresh SQLite file unless ``--db`` is given, or a fresh
PostgreSQL schema, every schema dropped at the end, also on failure):

- **sequential**: ``--sequential N`` runs (default 200) of a workflow of 5 no-op activities,
  queued up front and executed by one worker with ``concurrency=1``: one run at a time, so
  every journal write waits for the one before it.
- **concurrent**: ``--concurrent N`` runs (default 1,000) started at once (all ``client.start``
  calls in flight together), then executed by one worker whose concurrency limit is N.

A *journaled step* is one activity call. The engine journals it twice (``step_started`` before
the activity runs, ``step_completed`` after). For an idempotent activity (``on_doubt="retry"``,
the default here) the completion is committed with the run's next journal write;
``--on-doubt fail`` declares the activities not safe to repeat, and then every completion is
committed before the workflow goes on. A run also costs a claim, a journal read and a final
``finish`` transaction, all counted in. The clock
starts once the worker is up (its start-up is reported apart) and stops when the last run's
``finish`` has committed. Afterwards every run is checked to have completed and every step
to be journaled, with plain ``sqlite3`` or plain (sync) ``psycopg``; otherwise the script
exits non-zero.

Baselines measured in the same process, on the same file system:

- **plain async**: the same workflow function, its activities called as plain async calls
  (``ActivityContext.standalone()``): what the workflow costs without the engine.
- **sqlite3**: one small INSERT per commit on plain ``sqlite3`` in the calling thread (WAL,
  the same ``synchronous`` setting): the ceiling for any design that commits each write.
- **store thread**: the same insert, one transaction per await through the store's own
  database thread (``durable.store._thread.DbThread``): the cost of one thread hop.
- **aiosqlite**: one autocommit INSERT per ``await`` (asyncio only: aiosqlite does not run on
  trio).
- **psycopg** (PostgreSQL column): one autocommit INSERT per ``await`` on one async
  connection: a round trip and a commit, the floor under any fenced write of that store.

Each workload runs ``--repeat`` times (default 3); the run with the median steps/s is
reported, and the JSON keeps every repetition's figure. The load average is printed: on a
shared machine, compare figures only between runs made under similar load.

Run: ``PYTHONPATH=. python3 scripts/bench.py`` (``--quick`` for a smoke run of a few seconds,
``--json`` for machine-readable output). docs/benchmarks.md has figures and what they mean.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import datetime as dt
import importlib.metadata
import json
import logging
import os
import platform
import re
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Coroutine, Iterator
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import anyio
import sniffio

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import durable  # noqa: E402
from durable.store._base import watch_finishes  # noqa: E402
from durable.store._thread import DbThread  # noqa: E402

STEPS = 5
T = TypeVar("T")
TARGET_SEQUENTIAL = 2_000.0  # journaled steps/s, one run at a time
TARGET_OVERHEAD_MS = 0.5  # per step, one run at a time
TARGET_CONCURRENT = 5_000.0  # journaled steps/s across concurrent runs
TARGET_RAW_SHARE = 0.15  # sequential steps/s over the raw single-thread commit rate
TARGET_COMMITS_PER_STEP = 1.0  # sequential, one run at a time
PG_URL = "postgresql://postgres@127.0.0.1:5432/test"
STORES = ("sqlite", "postgres")
NA = "-"  # a figure that does not apply to the column
PAYLOAD = "x" * 100
SHOWN_WARNINGS = 3  # engine warnings printed per event name; the rest are only counted

REGISTRY = durable.Registry()


@durable.activity(name="bench.noop", registry=REGISTRY,
                  retry=durable.RetryPolicy(max_tries=1))
async def noop(ctx: durable.ActivityContext, i: int) -> int:
    """Does nothing, idempotently (``on_doubt="retry"``, the default)."""
    return i


@durable.activity(name="bench.noop_strict", registry=REGISTRY, on_doubt="fail",
                  retry=durable.RetryPolicy(max_tries=1))
async def noop_strict(ctx: durable.ActivityContext, i: int) -> int:
    """Does nothing, declared not safe to repeat (``on_doubt="fail"``)."""
    return i


@durable.workflow("bench.steps", registry=REGISTRY)
async def steps_workflow(ctx: Any, n: int, strict: bool) -> int:
    """``n`` no-op steps one after another. Called as plain async code by the baseline."""
    act = noop_strict if strict else noop
    total = 0
    for i in range(n):
        total += await act(ctx, i)
    return total


# -- instrumentation -------------------------------------------------------------------------
WARNINGS: collections.Counter[str] = collections.Counter()


def _count_warnings(record: logging.LogRecord) -> bool:
    """Count the engine's warnings (and worse) by event; print only the first few of each."""
    event = str(getattr(record, "event", record.getMessage()))
    WARNINGS[event] += 1
    return WARNINGS[event] <= SHOWN_WARNINGS


def configure_logging() -> None:
    durable.configure_logging(level="warning").addFilter(_count_warnings)


class _CountingConnection(sqlite3.Connection):
    """A sqlite3 connection that counts its commits (the engine's connections, via connect)."""

    commits = 0

    def commit(self) -> None:
        if self.in_transaction:
            _CountingConnection.commits += 1
        super().commit()


def _timed(method: Callable[..., Any]) -> Callable[..., Any]:
    """``method`` of a connection, its wall time added to :class:`_TimedConnection`'s."""

    def timed(self: sqlite3.Connection, *args: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return method(self, *args)
        finally:
            _TimedConnection._add(t0)

    return timed


class _TimedConnection(_CountingConnection):
    """Also adds up the wall time spent in sqlite3's own calls (statements, commits) in
    the event loop's thread (the main thread here), for the timed run of the sequential
    workload: SQLite's share of a step, measured on the engine's real statements. The
    database thread's calls (its WAL checkpoints, in parallel) are left out. The wrappers
    cost the engine a few microseconds a call, so the untimed runs' figures stand apart."""

    seconds = 0.0

    @staticmethod
    def _add(t0: float) -> None:
        if threading.current_thread() is threading.main_thread():
            _TimedConnection.seconds += time.perf_counter() - t0

    execute = _timed(_CountingConnection.execute)
    executemany = _timed(_CountingConnection.executemany)
    commit = _timed(_CountingConnection.commit)
    rollback = _timed(_CountingConnection.rollback)


_FACTORY: list[type[sqlite3.Connection]] = [_CountingConnection]


def _counting_connect(*args: Any, **kwargs: Any) -> sqlite3.Connection:
    kwargs.setdefault("factory", _FACTORY[0])
    conn: sqlite3.Connection = _real_connect(*args, **kwargs)
    return conn


_real_connect = sqlite3.connect


class Counter:
    """Counts a store's jobs (round trips), how many ran inline, and its commits.

    Jobs are counted by wrapping the SQLite store's ``DbThread.run``, inline jobs read from
    its ``inline_jobs`` counter, commits by the connections' ``commit()`` (the engine's
    connections are opened while :func:`counting_commits` is active). On PostgreSQL a job
    is one checkout of a pooled connection (``PostgresStore._checkout``). Private API: a
    benchmark may peek; counts stay zero where there is nothing to count.
    """

    FIELDS = ("jobs", "write_jobs", "inline_jobs", "commits")

    def __init__(self) -> None:
        self.jobs = 0
        self.write_jobs = 0
        self._db: Any = None

    def attach(self, store: durable.Store) -> None:
        checkout = getattr(store, "_checkout", None)
        if getattr(store, "_db", None) is None and checkout is not None:
            self._attach_pool(store, checkout)
            return
        db = getattr(store, "_db", None)
        if db is None:
            return
        self._db = db
        counter = self
        run = db.run

        async def counting_run(fn: Any, *, write: bool = True, **options: Any) -> Any:
            counter.jobs += 1
            counter.write_jobs += write
            return await run(fn, write=write, **options)

        db.run = counting_run

    def _attach_pool(self, store: durable.Store, checkout: Any) -> None:
        """PostgreSQL: a job is one checkout of a pooled connection (a statement, or a
        group commit's batch statement). Nothing runs inline there; its commits are counted
        by the server (:func:`pg_next_xid`)."""
        counter = self

        async def counting_checkout(pool: Any) -> Any:
            counter.jobs += 1
            return await checkout(pool)

        store._checkout = counting_checkout  # type: ignore[attr-defined]

    def snapshot(self) -> dict[str, int]:
        return {"jobs": self.jobs, "write_jobs": self.write_jobs,
                "inline_jobs": int(getattr(self._db, "inline_jobs", 0)),
                "commits": _CountingConnection.commits}


@contextlib.contextmanager
def counting_commits(timed: bool = False) -> Iterator[None]:
    """Connections opened inside the block count their commits (``timed``: and add up the
    time of their sqlite3 calls in ``_TimedConnection.seconds``)."""
    sqlite3.connect = _counting_connect  # type: ignore[assignment]
    _FACTORY[0] = _TimedConnection if timed else _CountingConnection
    try:
        yield
    finally:
        sqlite3.connect = _real_connect
        _FACTORY[0] = _CountingConnection


def store_url(path: Path, synchronous: str) -> str:
    url = f"sqlite:///{path}"
    return url if synchronous == "normal" else f"{url}?synchronous={synchronous}"


def rate(count: float, seconds: float) -> float:
    return count / seconds if seconds > 0 else float("inf")


# -- the engine ----------------------------------------------------------------------------
async def run_engine(url: str, runs: int, *, concurrency: int, start_at_once: bool,
                     label: str, strict: bool = False, timed: bool = False) -> dict[str, Any]:
    """Queue ``runs`` runs, then drain them with one worker; time both phases.

    ``timed`` (SQLite): also time the store's sqlite3 calls while the worker drains
    (``sqlite_ms_per_step``)."""
    prefix = f"bench-{label}-{uuid.uuid4().hex[:8]}-"
    postgres = is_postgres(url)
    # The pool the worker CLI gives a worker of this concurrency (SQLite ignores it).
    store = durable.store_from_url(url, pool_size=min(concurrency + 3, 10))
    with counting_commits(timed):  # the store opens its connections here (and only here)
        await store.open()
    try:
        client = durable.Client(store, registry=REGISTRY)
        counter = Counter()
        counter.attach(store)

        t0 = time.perf_counter()
        if start_at_once:
            async with anyio.create_task_group() as tg:
                for i in range(runs):
                    tg.start_soon(partial(client.start, steps_workflow, STEPS, strict,
                                          id=f"{prefix}{i:06d}"))
        else:
            for i in range(runs):
                await client.start(steps_workflow, STEPS, strict, id=f"{prefix}{i:06d}")
        enqueue_s = time.perf_counter() - t0

        # Count finished runs as the worker records them: no polling, no extra reads.
        done = anyio.Event()
        finished = 0

        def finish(fence: Any, ok: bool) -> None:
            nonlocal finished
            finished += 1
            if finished >= runs:
                done.set()

        watch_finishes(store, finish)  # also those carried by the next run's claim
        worker = durable.Worker(store, registry=REGISTRY, concurrency=concurrency,
                                poll_interval=0.05)
        xids = await pg_next_xid(url) if postgres else 0  # before the worker's first write
        async with anyio.create_task_group() as tg:
            t_start = time.perf_counter()
            await tg.start(worker.run)
            t1, cpu1 = time.perf_counter(), time.process_time()
            before = counter.snapshot()
            sql_before = _TimedConnection.seconds
            with anyio.fail_after(max(120.0, runs * 0.05)):
                await done.wait()
            run_s = time.perf_counter() - t1
            cpu_s = time.process_time() - cpu1
            sql_s = _TimedConnection.seconds - sql_before
            after = counter.snapshot()
            if postgres:
                xids = await pg_next_xid(url) - xids
            worker.shutdown()
    finally:
        await store.aclose()

    counts = {name: after[name] - before[name] for name in Counter.FIELDS}
    completed, journaled = verify(url, prefix)
    server_xids = None
    if postgres:  # the server's count: the transactions that journaled the workload's
        # entries (their rows' xmin), and its XID counter's growth (every write
        # transaction on the server, the worker's start-up and other clients' too)
        counts["commits"], server_xids = pg_journal_transactions(url, prefix), xids
    if completed != runs or journaled != runs * STEPS:
        raise SystemExit(f"{label}: expected {runs} completed runs and {runs * STEPS} "
                         f"journaled steps, found {completed} and {journaled}")
    steps = runs * STEPS
    return {
        "runs": runs,
        "steps": steps,
        "concurrency": concurrency,
        "enqueue_s": enqueue_s,
        "starts_per_s": rate(runs, enqueue_s),
        "worker_start_ms": 1000 * (t1 - t_start),
        "run_s": run_s,
        "steps_per_s": rate(steps, run_s),
        "runs_per_s": rate(runs, run_s),
        "ms_per_step": 1000 * run_s / steps,
        "cpu_ms_per_step": 1000 * cpu_s / steps,
        "db_jobs_per_step": counts["jobs"] / steps,
        "inline_jobs_per_step": None if postgres else counts["inline_jobs"] / steps,
        "commits_per_step": counts["commits"] / steps,
        "server_xids_per_step": None if server_xids is None else server_xids / steps,
        "write_jobs_per_commit": (None if postgres else
                                  counts["write_jobs"] / counts["commits"]
                                  if counts["commits"] else 0.0),
        "sqlite_ms_per_step": 1000 * sql_s / steps if timed and not postgres else None,
    }


COUNT_COMPLETED = "SELECT count(*) FROM durable_runs WHERE id LIKE {} AND state = 'completed'"
COUNT_JOURNALED = ("SELECT count(*) FROM durable_journal WHERE run_id LIKE {} "
                   "AND kind = 'step_completed'")
# PostgreSQL: the write transactions that journaled a workload's entries, but for its
# starts (before the worker: not counted). Every write of the worker's path journals (a
# claim its run_claimed, a step its entries, a finish its end), and an entry is never
# updated, so its xmin is the transaction that committed it.
COUNT_JOURNAL_XACTS = ("SELECT count(DISTINCT xmin::text) FROM durable_journal "
                       "WHERE run_id LIKE %s AND kind <> 'run_created'")


def pg_dsn(url: str) -> str:
    """Plain psycopg's connection string for a store URL: its schema as ``search_path``,
    without the store's own option (``group_commit``, which libpq would refuse)."""
    from durable.store._postgres import _group_commit_option

    base, _, schema = _group_commit_option(url)[0].rpartition("schema=")
    return PgServer.dsn_for(base.rstrip("?&"), schema)


def pg_journal_transactions(url: str, prefix: str) -> int:
    import psycopg

    with psycopg.connect(pg_dsn(url)) as pg:
        row = pg.execute(COUNT_JOURNAL_XACTS, (prefix + "%",)).fetchone()
    return int(row[0] if row else 0)


async def on_asyncio(make: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """``await make()`` for psycopg's async API, from either loop: on trio, on a fresh
    asyncio loop in a worker thread (the store itself does the same with a loop thread of
    its own, durable/store/_loop.py)."""
    if sniffio.current_async_library() == "asyncio":
        return await make()
    return await anyio.to_thread.run_sync(lambda: asyncio.run(make()))


async def pg_next_xid(url: str) -> int:
    """The transaction id PostgreSQL gives next (read on a connection of its own, without
    taking one): its growth counts the server's write transactions, each of them a commit
    (a read-only statement gets no id). Every write transaction on the server counts,
    whoever sends it: on a shared server, other clients' too (an upper bound; the
    commits per step are counted from the journal, :func:`pg_journal_transactions`)."""
    return await on_asyncio(partial(_pg_next_xid, url))


async def _pg_next_xid(url: str) -> int:
    import psycopg

    # the server's counter: the URL without its query (the store's options, its schema)
    async with await psycopg.AsyncConnection.connect(url.partition("?")[0],
                                                     autocommit=True) as conn:
        cur = await conn.execute("SELECT txid_snapshot_xmax(txid_current_snapshot())")
        row = await cur.fetchone()
    return int(row[0]) if row else 0


def is_postgres(url: str) -> bool:
    return url.startswith(("postgresql:", "postgres:"))


def verify(url: str, prefix: str) -> tuple[int, int]:
    """Count the completed runs and journaled steps of one workload, with plain sqlite3 or
    plain (sync) psycopg."""
    if is_postgres(url):
        import psycopg

        with psycopg.connect(pg_dsn(url)) as pg:
            completed = pg.execute(COUNT_COMPLETED.format("%s"), (prefix + "%",)).fetchone()
            journaled = pg.execute(COUNT_JOURNALED.format("%s"), (prefix + "%",)).fetchone()
        return int(completed[0] if completed else 0), int(journaled[0] if journaled else 0)
    path = url[len("sqlite:///"):].partition("?")[0]
    conn = sqlite3.connect(path)
    try:
        completed = conn.execute(COUNT_COMPLETED.format("?"), (prefix + "%",)).fetchone()[0]
        journaled = conn.execute(COUNT_JOURNALED.format("?"), (prefix + "%",)).fetchone()[0]
    finally:
        conn.close()
    return int(completed), int(journaled)


async def workload(args: argparse.Namespace, url_for: Callable[[str], str], name: str,
                   runs: int, concurrency: int, at_once: bool, label: str) -> dict[str, Any]:
    """Repeat one workload; return the median repetition (by steps/s) with all figures."""
    results = [
        await run_engine(url_for(f"{name}-{i}"), runs,
                         concurrency=concurrency, start_at_once=at_once, label=f"{label}{i}",
                         strict=args.on_doubt == "fail")
        for i in range(args.repeat)
    ]
    results.sort(key=lambda r: r["steps_per_s"])
    chosen = dict(results[len(results) // 2])
    chosen["repeats_steps_per_s"] = [r["steps_per_s"] for r in results]
    return chosen


# -- baselines -----------------------------------------------------------------------------
async def plain_async(runs: int, at_once: bool, strict: bool) -> float:
    """Seconds to run the workflow ``runs`` times as plain async calls (no engine)."""
    ctx = durable.ActivityContext.standalone()

    async def one_run() -> None:
        await steps_workflow.fn(ctx, STEPS, strict)

    t0 = time.perf_counter()
    if at_once:
        async with anyio.create_task_group() as tg:
            for _ in range(runs):
                tg.start_soon(one_run)
    else:
        for _ in range(runs):
            await one_run()
    return time.perf_counter() - t0


def connect_raw(path: Path, synchronous: str) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute(f"PRAGMA synchronous = {synchronous.upper()}")
    conn.execute("CREATE TABLE IF NOT EXISTS t (id INTEGER PRIMARY KEY, data TEXT NOT NULL)")
    return conn


def sqlite3_commits(path: Path, synchronous: str, n: int) -> float:
    """Commits/s: plain sqlite3 in the calling thread, one autocommit INSERT per commit."""
    conn = connect_raw(path, synchronous)
    try:
        t0 = time.perf_counter()
        for _ in range(n):
            conn.execute("INSERT INTO t (data) VALUES (?)", (PAYLOAD,))
        return rate(n, time.perf_counter() - t0)
    finally:
        conn.close()


async def store_thread_commits(path: Path, synchronous: str, n: int) -> float:
    """Commits/s through the store's database thread, one transaction per await."""
    db = DbThread(lambda: connect_raw(path, synchronous), busy_retry=5.0)
    db.start()
    try:
        def insert(conn: sqlite3.Connection) -> None:
            conn.execute("INSERT INTO t (data) VALUES (?)", (PAYLOAD,))

        await db.run(insert)  # warm up
        t0 = time.perf_counter()
        for _ in range(n):
            await db.run(insert)
        return rate(n, time.perf_counter() - t0)
    finally:
        db.stop()


async def aiosqlite_commits(path: Path, synchronous: str, n: int) -> float | None:
    """Commits/s with aiosqlite, one autocommit INSERT per await (asyncio only)."""
    import sniffio

    if sniffio.current_async_library() != "asyncio":
        return None
    import aiosqlite

    connect_raw(path, synchronous).close()
    async with aiosqlite.connect(path, isolation_level=None) as db:
        await db.execute(f"PRAGMA synchronous = {synchronous.upper()}")
        await db.execute("INSERT INTO t (data) VALUES (?)", (PAYLOAD,))
        t0 = time.perf_counter()
        for _ in range(n):
            await db.execute("INSERT INTO t (data) VALUES (?)", (PAYLOAD,))
        return rate(n, time.perf_counter() - t0)


async def psycopg_commits(pg: PgServer, n: int) -> float:
    """Commits/s: one autocommit INSERT per await on one async psycopg connection (on
    asyncio, whichever loop the column runs on)."""
    return await on_asyncio(partial(_psycopg_commits, pg, n))


async def _psycopg_commits(pg: PgServer, n: int) -> float:
    import psycopg
    from psycopg import sql

    schema = pg.new_schema()
    table = sql.Identifier(schema, "t")
    async with await psycopg.AsyncConnection.connect(pg.url, autocommit=True) as conn:
        await conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
        await conn.execute(sql.SQL("CREATE TABLE {} (id bigserial PRIMARY KEY, "
                                   "data text NOT NULL)").format(table))
        insert = sql.SQL("INSERT INTO {} (data) VALUES (%s)").format(table)
        await conn.execute(insert, (PAYLOAD,))
        t0 = time.perf_counter()
        for _ in range(n):
            await conn.execute(insert, (PAYLOAD,))
        return rate(n, time.perf_counter() - t0)


# -- the PostgreSQL server -------------------------------------------------------------------
class PgServer:
    """The server of ``--pg-url``: fresh schemas for the workloads, all dropped at the end."""

    def __init__(self, url: str) -> None:
        import psycopg

        self._psycopg = psycopg
        base, _, query = url.partition("?")
        # ``schema`` is the store's option; this script picks its own schemas.
        items = [i for i in query.split("&") if i and not i.startswith("schema=")]
        self.url = f"{base}?{'&'.join(items)}" if items else base
        self.prefix = f"durable_bench_{uuid.uuid4().hex[:8]}"
        self.schemas: list[str] = []

    @staticmethod
    def dsn_for(url: str, schema: str) -> str:
        """libpq connection string: the URL's options, ``search_path`` set to ``schema``."""
        from psycopg.conninfo import conninfo_to_dict, make_conninfo

        options = " ".join(filter(None, [str(conninfo_to_dict(url).get("options") or ""),
                                         f"-c search_path={schema}"]))
        return str(make_conninfo(url, options=options))

    def unreachable(self) -> str | None:
        """None when the server answers, else why not (one line)."""
        try:
            with self._psycopg.connect(self.url, connect_timeout=3):
                return None
        except self._psycopg.Error as exc:
            return " ".join(str(exc).split())

    def version(self) -> str:
        with self._psycopg.connect(self.url) as conn:
            row = conn.execute("SHOW server_version").fetchone()
            return str(row[0]).split()[0] if row else "?"

    def new_schema(self) -> str:
        self.schemas.append(f"{self.prefix}_{len(self.schemas) + 1}")
        return self.schemas[-1]

    def new_url(self) -> str:
        """A store URL on a schema of its own (the store creates it when it opens)."""
        return f"{self.url}{'&' if '?' in self.url else '?'}schema={self.new_schema()}"

    def close(self) -> None:
        """Drop every schema this run named (those never created are skipped)."""
        from psycopg import sql

        if not self.schemas:
            return
        try:
            with self._psycopg.connect(self.url, autocommit=True, connect_timeout=10) as conn:
                while self.schemas:
                    conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(
                        sql.Identifier(self.schemas[-1])))
                    self.schemas.pop()
        except self._psycopg.Error as exc:
            print(f"bench: could not drop PostgreSQL schema(s) {', '.join(self.schemas)}: "
                  f"{' '.join(str(exc).split())}", file=sys.stderr)


# -- one column ----------------------------------------------------------------------------
async def bench_backend(args: argparse.Namespace, workdir: Path, backend: str,
                        sqlite3_rate: float, pg: PgServer | None = None) -> dict[str, Any]:
    """One column: SQLite, or PostgreSQL if ``pg``, on the event loop ``backend``."""
    store = "postgres" if pg else "sqlite"

    def fresh(name: str) -> Path:
        path = workdir / f"{backend}-{name}.db"
        for suffix in ("", "-wal", "-shm"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)
        return path

    def url_for(name: str) -> str:
        if pg is not None:
            return pg.new_url()
        return store_url(Path(args.db) if args.db else fresh(name), args.synchronous)

    warnings_before = WARNINGS.copy()
    # Warm up imports, code paths and the file system or server once (not timed).
    await run_engine(pg.new_url() if pg else store_url(fresh("warmup"), args.synchronous), 5,
                     concurrency=1, start_at_once=False, label=f"{store}-{backend}-warmup",
                     strict=args.on_doubt == "fail")

    seq = await workload(args, url_for, "sequential", args.sequential, 1, False,
                         f"{store}-{backend}-seq")
    con = await workload(args, url_for, "concurrent", args.concurrent,
                         args.concurrency or args.concurrent, True, f"{store}-{backend}-con")
    if pg is None:
        # One more sequential run with the sqlite3 calls timed: where a step's time goes
        # (SQLite's calls against the engine's own Python), on the engine's real statements.
        timed = await run_engine(url_for("sequential-timed"), args.sequential, concurrency=1,
                                 start_at_once=False, label=f"{store}-{backend}-seq-timed",
                                 strict=args.on_doubt == "fail", timed=True)
        seq["sqlite_ms_per_step"] = timed["sqlite_ms_per_step"]
        seq["timed_ms_per_step"] = timed["ms_per_step"]

    strict = args.on_doubt == "fail"
    plain_seq_s = min([await plain_async(args.sequential, False, strict) for _ in range(3)])
    plain_con_s = min([await plain_async(args.concurrent, True, strict) for _ in range(3)])
    for result, plain_s in ((seq, plain_seq_s), (con, plain_con_s)):
        result["plain_steps_per_s"] = rate(result["steps"], plain_s)
        result["overhead_ms_per_step"] = 1000 * (result["run_s"] - plain_s) / result["steps"]

    baselines: dict[str, Any] = {
        "plain_async_sequential_steps_per_s": seq["plain_steps_per_s"],
        "plain_async_concurrent_steps_per_s": con["plain_steps_per_s"],
    }
    if pg is not None:
        baselines["psycopg_commits_per_s"] = statistics.median([
            await psycopg_commits(pg, max(1, args.commits // 5)) for _ in range(args.repeat)])
    else:
        thread_rate = statistics.median([
            await store_thread_commits(fresh(f"thread-{i}"), args.synchronous, args.commits)
            for i in range(args.repeat)])
        aio_rates = [await aiosqlite_commits(fresh(f"aiosqlite-{i}"), args.synchronous,
                                             args.commits)
                     for i in range(args.repeat)]
        measured = [r for r in aio_rates if r is not None]
        baselines.update({
            "sqlite3_commits_per_s": sqlite3_rate,
            "store_thread_commits_per_s": thread_rate,
            "aiosqlite_commits_per_s": statistics.median(measured) if measured else None,
        })
    # the raw single-thread commit rate of the same database (plain sqlite3, or psycopg)
    raw = baselines.get("psycopg_commits_per_s" if pg is not None else "sqlite3_commits_per_s")
    seq["raw_commit_share"] = seq["steps_per_s"] / raw if raw else None
    sqlite_ms = seq.get("sqlite_ms_per_step")
    # the rate if a step cost only its sqlite3 calls (the engine's Python taking no time)
    seq["sqlite_only_steps_per_s"] = 1000 / sqlite_ms if sqlite_ms else None
    seq["sqlite_only_raw_share"] = (seq["sqlite_only_steps_per_s"] / raw
                                    if sqlite_ms and raw else None)
    return {
        "store": store,
        "loop": backend,
        "sequential": seq,
        "concurrent": con,
        "baselines": baselines,
        "targets": {
            "sequential_steps_per_s": seq["steps_per_s"] >= TARGET_SEQUENTIAL,
            "sequential_overhead_ms": seq["overhead_ms_per_step"] <= TARGET_OVERHEAD_MS,
            "concurrent_steps_per_s": con["steps_per_s"] >= TARGET_CONCURRENT,
            "sequential_raw_commit_share": (seq["raw_commit_share"] or 0) >= TARGET_RAW_SHARE,
            "sequential_commits_per_step":
                seq["commits_per_step"] <= TARGET_COMMITS_PER_STEP + 0.005,
        },
        "warnings": dict(WARNINGS - warnings_before),
    }


# -- output --------------------------------------------------------------------------------
def fmt(value: Any, digits: int = 0) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "met" if value else "MISSED"
    return f"{value:,.{digits}f}"


def columns(report: dict[str, Any]) -> list[tuple[str, dict[str, Any] | str]]:
    """(header, figures) per column: SQLite per event loop, then PostgreSQL (asyncio; its
    trio column is the string that says why not)."""
    cols: list[tuple[str, dict[str, Any] | str]] = [
        (f"sqlite {loop}", result) for loop, result in report["backends"].items()]
    cols += [(f"postgres {loop}", result)
             for loop, result in (report.get("postgres") or {}).get("columns", {}).items()]
    return cols


def render(report: dict[str, Any]) -> str:
    cols = columns(report)
    m, c = report["machine"], report["config"]
    pg = report.get("postgres")
    lines = [
        f"durable benchmark, {report['date']}: {m['cpus']} CPUs, Python {m['python']}, "
        f"SQLite {m['sqlite']}"
        + (f", PostgreSQL {pg['server_version']} ({pg['url']}, psycopg {m['psycopg']})"
           if pg else "")
        + f", synchronous={c['synchronous']}, {STEPS} no-op steps per run "
        f"(on_doubt={c['on_doubt']}), median of {c['repeat']}",
        f"load average before/after: {m['loadavg_before']} / {m['loadavg_after']}",
    ]
    lines += [f"note: PostgreSQL column skipped: {why}" for why in report["skipped"].values()]
    lines.append("")
    width = 44
    widths = [max(14, len(head) + 2, len(fig) + 2 if isinstance(fig, str) else 0)
              for head, fig in cols]

    def row(label: str, get: Callable[[dict[str, Any]], Any], digits: int = 0) -> None:
        def cell(fig: dict[str, Any] | str) -> str:
            if isinstance(fig, str):
                return fig
            try:
                return fmt(get(fig), digits)
            except KeyError:
                return NA

        cells = "".join(f"{cell(fig):>{w}}" for (_, fig), w in zip(cols, widths, strict=True))
        lines.append(f"  {label:<{width}}{cells}")

    def engine_rows(name: str) -> None:
        row("journaled steps/s", lambda r: r[name]["steps_per_s"])
        row("ms per step (wall clock)", lambda r: r[name]["ms_per_step"], 3)
        row("per-step overhead vs plain async (ms)",
            lambda r: r[name]["overhead_ms_per_step"], 3)
        row("CPU ms per step (this process)", lambda r: r[name]["cpu_ms_per_step"], 3)
        row("runs/s", lambda r: r[name]["runs_per_s"])
        row("store jobs per step", lambda r: r[name]["db_jobs_per_step"], 2)
        row("  of which inline (no thread hop)", lambda r: r[name]["inline_jobs_per_step"], 2)
        row("commits per step", lambda r: r[name]["commits_per_step"], 2)
        if name == "sequential":
            row("steps/s as % of the raw commit rate",
                lambda r: 100 * (r[name]["raw_commit_share"] or 0), 1)

            def pct(value: float | None) -> float | None:
                return None if value is None else 100 * value

            # a run of its own with sqlite3's calls timed (SQLite only)
            row("timed run: ms per step in sqlite3 calls",
                lambda r: r[name].get("sqlite_ms_per_step"), 3)
            row("timed run: ms per step in all",
                lambda r: r[name].get("timed_ms_per_step"), 3)
            row("  steps/s if only sqlite3's calls took time",
                lambda r: r[name].get("sqlite_only_steps_per_s"))
            row("  as % of the raw commit rate",
                lambda r: pct(r[name].get("sqlite_only_raw_share")), 1)
        row("write jobs per commit", lambda r: r[name]["write_jobs_per_commit"], 1)
        row("starts/s", lambda r: r[name]["starts_per_s"])
        row("worker start-up (ms, not counted above)",
            lambda r: r[name]["worker_start_ms"], 1)

    lines.append(f"  {'':<{width}}" + "".join(
        f"{head:>{w}}" for (head, _), w in zip(cols, widths, strict=True)))
    lines.append(f"sequential: {c['sequential']} runs, one at a time (worker concurrency 1)")
    engine_rows("sequential")
    lines.append(f"concurrent: {c['concurrent']} runs started at once, worker concurrency "
                 f"{c['concurrency'] or c['concurrent']}")
    engine_rows("concurrent")
    lines.append("baselines (same run)")
    row("plain async calls, steps/s (sequential)",
        lambda r: r["baselines"]["plain_async_sequential_steps_per_s"])
    row("plain async calls, steps/s (concurrent)",
        lambda r: r["baselines"]["plain_async_concurrent_steps_per_s"])
    row("plain sqlite3, commits/s", lambda r: r["baselines"]["sqlite3_commits_per_s"])
    row("store thread, 1 tx per await, commits/s",
        lambda r: r["baselines"]["store_thread_commits_per_s"])
    row("aiosqlite, 1 autocommit per await, commits/s",
        lambda r: r["baselines"]["aiosqlite_commits_per_s"])
    row("psycopg, 1 autocommit per await, commits/s",
        lambda r: r["baselines"]["psycopg_commits_per_s"])
    lines.append(f"targets (sequential >= {TARGET_SEQUENTIAL:,.0f} steps/s and <= "
                 f"{TARGET_OVERHEAD_MS} ms/step overhead; concurrent >= "
                 f"{TARGET_CONCURRENT:,.0f} steps/s)")
    row("sequential steps/s", lambda r: r["targets"]["sequential_steps_per_s"])
    row("sequential per-step overhead", lambda r: r["targets"]["sequential_overhead_ms"])
    row("concurrent steps/s", lambda r: r["targets"]["concurrent_steps_per_s"])
    lines.append(f"targets (sequential: <= {TARGET_COMMITS_PER_STEP:g} commit per step, steps/s "
                 f">= {100 * TARGET_RAW_SHARE:.0f} % of the raw single-thread commit rate: "
                 "plain sqlite3, or psycopg)")
    row("sequential commits per step", lambda r: r["targets"]["sequential_commits_per_step"])
    row("sequential share of raw commits",
        lambda r: r["targets"]["sequential_raw_commit_share"])
    for head, fig in cols:
        warned = fig["warnings"] if isinstance(fig, dict) else {}
        if warned:
            listed = ", ".join(f"{event} x{n}" for event, n in sorted(warned.items()))
            lines.append(f"engine warnings on {head}: {listed}")
    return "\n".join(lines)


def machine() -> dict[str, Any]:
    def version(name: str) -> str | None:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return None

    return {
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        "anyio": version("anyio"),
        "trio": version("trio"),
        "aiosqlite": version("aiosqlite"),
        "psycopg": version("psycopg"),
    }


def loadavg() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def _stores(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in STORES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"expected a comma-separated list of {', '.join(STORES)}, got {text!r}")
    return [n for n in STORES if n in names]


def redact(url: str) -> str:
    """The URL with its password, if any, shown as ***."""
    return re.sub(r"(://[^:/@?]*:)[^@/?]*@", r"\1***@", url)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Benchmark durable: journaled steps/s against plain async and SQLite.")
    parser.add_argument("--backend", choices=["asyncio", "trio", "both"], default="both",
                        help="event loop(s) to measure, one after the other (default both)")
    parser.add_argument("--db", help="SQLite file for the workloads (default: a fresh temp "
                        "file per repetition; baselines always use temp files beside it)")
    parser.add_argument("--sequential", type=int, metavar="N", default=None,
                        help="runs executed one at a time (default 200, --quick 20)")
    parser.add_argument("--concurrent", type=int, metavar="N", default=None,
                        help="runs started at once (default 1000, --quick 100)")
    parser.add_argument("--concurrency", type=int, metavar="N", default=None,
                        help="worker concurrency limit for the concurrent workload "
                        "(default: as many as runs)")
    parser.add_argument("--commits", type=int, metavar="N", default=None,
                        help="commits per SQLite baseline (default 5000, --quick 300)")
    parser.add_argument("--repeat", type=int, metavar="N", default=None,
                        help="repetitions of each workload; the median is reported "
                        "(default 3, --quick 1)")
    parser.add_argument("--synchronous", choices=["normal", "full"], default="normal",
                        help="SQLite synchronous setting for the engine and the baselines")
    parser.add_argument("--on-doubt", choices=["retry", "fail"], default="retry",
                        help="the activities' on_doubt: retry (idempotent, the default) or "
                        "fail (not safe to repeat: each completion is committed on its own)")
    parser.add_argument("--backends", type=_stores, default=list(STORES),
                        help="stores to measure, side by side: sqlite,postgres (default "
                        "both)")
    parser.add_argument("--pg-url", default=PG_URL,
                        help=f"PostgreSQL server (default {PG_URL}); a fresh schema per "
                        "repetition, all dropped at the end")
    parser.add_argument("--require-postgres", action="store_true",
                        help="exit 2 instead of skipping the PostgreSQL column when the "
                        "server is unreachable")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument("--quick", action="store_true",
                        help="small numbers: a smoke run of a few seconds")
    args = parser.parse_args(argv)
    defaults = {"sequential": (200, 20), "concurrent": (1000, 100), "commits": (5000, 300),
                "repeat": (3, 1)}
    for name, (full, quick) in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
    if args.concurrency is not None and args.concurrency < 1:
        parser.error("--concurrency must be at least 1")
    if args.db:
        args.db = str(Path(args.db.removeprefix("sqlite:///").partition("?")[0]).resolve())
        if not Path(args.db).parent.is_dir():
            parser.error(f"--db: folder {Path(args.db).parent} does not exist")
    return args


def open_postgres(args: argparse.Namespace) -> tuple[PgServer | None, str | None]:
    """The server to measure, or None and why it is skipped."""
    try:
        pg = PgServer(args.pg_url)
    except ImportError:
        return None, "psycopg is not installed (pip install 'durable-fenced[postgres]')"
    why = pg.unreachable()
    if why:
        return None, f"no PostgreSQL server reachable at {redact(pg.url)}: {why}"
    return pg, None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    configure_logging()
    backends = ["asyncio", "trio"] if args.backend == "both" else [args.backend]
    skipped: dict[str, str] = {}
    pg: PgServer | None = None
    if "postgres" in args.backends:
        pg, why = open_postgres(args)
        if why:
            if args.require_postgres:
                print(f"bench: error: {why}", file=sys.stderr)
                return 2
            skipped["postgres"] = why
            if args.json:  # the text report carries the note itself
                print(f"note: PostgreSQL column skipped: {why}", file=sys.stderr)
    load_before = loadavg()
    base = Path(args.db).parent if args.db else None
    results: dict[str, Any] = {}
    postgres: dict[str, Any] | None = None
    try:
        with tempfile.TemporaryDirectory(prefix="durable-bench-", dir=base) as tmp:
            workdir = Path(tmp)
            sqlite3_rate = 0.0
            if "sqlite" in args.backends:
                sqlite3_commits(workdir / "warmup-sqlite3.db", args.synchronous, 100)
                sqlite3_rate = statistics.median(
                    sqlite3_commits(workdir / f"sqlite3-{i}.db", args.synchronous,
                                    args.commits)
                    for i in range(args.repeat))
                for backend in backends:
                    results[backend] = anyio.run(bench_backend, args, workdir, backend,
                                                 sqlite3_rate, backend=backend)
            if pg is not None:
                postgres = {"server_version": pg.version(), "url": redact(pg.url),
                            "schema_prefix": pg.prefix, "columns": {}}
                for backend in backends:  # on trio, the store runs on a loop thread
                    postgres["columns"][backend] = anyio.run(
                        bench_backend, args, workdir, backend, sqlite3_rate, pg,
                        backend=backend)
    finally:
        if pg is not None:
            pg.close()
    report = {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": {**machine(), "loadavg_before": load_before, "loadavg_after": loadavg()},
        "config": {
            "steps_per_run": STEPS,
            "sequential": args.sequential,
            "concurrent": args.concurrent,
            "concurrency": args.concurrency,
            "repeat": args.repeat,
            "synchronous": args.synchronous,
            "on_doubt": args.on_doubt,
            "db": args.db,
            "quick": args.quick,
            "stores": args.backends,
        },
        "targets": {"sequential_steps_per_s": TARGET_SEQUENTIAL,
                    "sequential_overhead_ms": TARGET_OVERHEAD_MS,
                    "concurrent_steps_per_s": TARGET_CONCURRENT,
                    "sequential_raw_commit_share": TARGET_RAW_SHARE,
                    "sequential_commits_per_step": TARGET_COMMITS_PER_STEP},
        "backends": results,  # SQLite, by event loop
        "postgres": postgres,  # {"columns": {"asyncio": {...}, "trio": {...}}}
        "skipped": skipped,
    }
    print(json.dumps(report, indent=2) if args.json else render(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
