"""Claim throughput: worker processes draining one queue, SQLite beside PostgreSQL.

For every backend (``--backends sqlite,postgres``), claim batch (``--batches 32,1``) and
number of worker processes (``--processes 1,2,4``), on a fresh database each time:

1. ``--runs N`` queued runs (default 20,000; 200 with ``--quick``) are bulk-inserted with the
   columns ``create_run`` writes (the run, due at its creation time, and its
   ``run_created`` entry); the setup is not timed.
2. That many worker processes (subprocesses of this script, started once and reused) each
   open the store with ``store_from_url`` and wait for a common start signal.
3. Each process loops, as the engine's worker does with nothing to execute:
   ``claim(worker_id, lease, batch, workflows=[...])``, then ``finish`` every claimed run
   as completed (fenced, with its ``run_completed`` entry), the runs of a batch
   concurrently as the worker's tasks would, until nothing is queued. The *claim only*
   rows (largest batch) claim without finishing: the claim statement's own rate.
4. The journal is checked: exactly one ``run_claimed`` entry per run, distinct (run, epoch)
   pairs, every run completed (claim only: running) under the epoch of its one claim,
   every ``finish`` accepted, no run returned to two processes, and on PostgreSQL a
   distinct epoch per claim. ``OK`` or ``FAILED`` (exit status 1).

claims/s = runs / (last process done - first process started).

Baseline, in the same run and on the same kind of database: one raw conditional
``UPDATE durable_runs SET state = 'running', ... WHERE id = ? AND state = 'queued'`` per run
(autocommit, a commit per run) with plain ``sqlite3`` / plain ``psycopg``, the runs split
between the processes: what the database does for one claim without the store.

SQLite runs on a file in a temporary folder (WAL, ``synchronous=NORMAL``, the store's
default); PostgreSQL in a fresh schema per configuration on ``--pg-url`` (default
``postgresql://postgres@127.0.0.1:5432/test``), all dropped at the end, with a pool of
``min(batch + 3, 10)`` connections per process. An unreachable server skips the PostgreSQL
column with a one-line note (exit 0), unless ``--require-postgres`` (exit 2).

Run: ``python scripts/bench_claims.py`` (``--quick`` for a few seconds, ``--json`` for
machine-readable output). Figures and guidance: docs/benchmarks-claims.md.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import importlib.metadata
import json
import os
import platform
import resource
import select
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, TextIO

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

WORKFLOW = "bench.claims"
LEASE = 300.0  # seconds: long enough that no lease lapses during a run
RUNS = 20_000
QUICK_RUNS = 200
TARGET_CLAIMS = 2_000.0  # claims/s with 4 processes on PostgreSQL
TARGET_PROCESSES = 4
PG_URL = "postgresql://postgres@127.0.0.1:5432/test"
BACKENDS = ("sqlite", "postgres")
WORKER_TIMEOUT = 900.0  # seconds a configuration may take before the processes are killed
MAX_ERRORS = 50  # store errors a worker process tolerates (retrying) before giving up
POOL_CAP = 10  # PostgreSQL connections per process by default (see default_pool)
OPEN_ATTEMPTS = 5  # tries, a second apart, to open a store or drop the schemas

RAW_UPDATE_SQLITE = (
    "UPDATE durable_runs SET state = 'running', epoch = epoch + 1, attempt = attempt + 1,"
    " worker = ?, lease_expires_at = ?, heartbeat_at = ?, updated_at = ?"
    " WHERE id = ? AND state = 'queued'"
)
RAW_UPDATE_POSTGRES = RAW_UPDATE_SQLITE.replace("?", "%s")


def run_id(i: int) -> str:
    return f"claims-{i:06d}"


def seed_times(i: int, base: float, same_run_at: bool) -> tuple[float, float, float]:
    """(run_at, created_at, updated_at) of the i-th queued run, all in the past.

    As ``create_run`` without a delay writes them: due at its creation time, so run times
    are distinct and in creation order. ``same_run_at`` gives every run one run time (as
    a mass recovery or a schedule for one moment would).
    """
    created = base + i * 1e-6
    return (base if same_run_at else created), created, created


# -- the worker process ----------------------------------------------------------------------
def worker_main() -> int:
    """A worker process: runs the jobs the parent sends, one JSON line each, until EOF.

    Every job first answers ``{"ready": ...}``, then waits for the parent's ``go`` line, runs,
    and answers with its result. Only this protocol goes to stdout.
    """
    out = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
    sys.stdout = sys.stderr
    jobs = {"store": store_job, "raw_sqlite": raw_sqlite_job, "raw_postgres": raw_postgres_job}
    while True:
        line = sys.stdin.readline()
        if not line:
            return 0
        cmd = json.loads(line)
        try:
            result = jobs[cmd["op"]](cmd, out)
        except Exception as exc:  # reported to the parent, which fails the configuration
            result = {"error": f"{type(exc).__name__}: {' '.join(str(exc).split())}"}
        out.write(json.dumps(result) + "\n")


def _ready_then_wait(out: TextIO) -> None:
    out.write(json.dumps({"ready": os.getpid()}) + "\n")
    if sys.stdin.readline().strip() != "go":
        raise SystemExit("the parent went away")


def store_job(cmd: dict[str, Any], out: TextIO) -> dict[str, Any]:
    import anyio

    return anyio.run(_store_job, cmd, out, backend="asyncio")


async def _store_job(cmd: dict[str, Any], out: TextIO) -> dict[str, Any]:
    import anyio

    from durable import EntryKind, RunState, StoreError
    from durable._types import Fence, JournalWrite
    from durable.store import store_from_url

    store = store_from_url(cmd["url"], pool_size=cmd["pool_size"])
    for attempt in range(OPEN_ATTEMPTS):  # a busy shared server may refuse for a moment
        try:
            await store.open()
            break
        except StoreError:
            if attempt == OPEN_ATTEMPTS - 1:
                raise
            await anyio.sleep(1.0)
    worker, batch, concurrent = cmd["worker"], cmd["batch"], cmd["concurrent"]
    finishing = cmd["finish"]
    workflows = [WORKFLOW]
    pairs: list[tuple[str, int]] = []
    stats = {"claim_calls": 0, "empty_claims": 0, "refused": 0, "errors": 0,
             "claim_s": 0.0, "finish_s": 0.0}
    last_error = None
    completed = [JournalWrite(EntryKind.RUN_COMPLETED)]

    async def finish(fence: Fence) -> None:
        nonlocal last_error
        for _ in range(MAX_ERRORS):
            try:
                ok = await store.finish(fence, RunState.COMPLETED, result=None,
                                        entries=completed)
            except StoreError as exc:
                stats["errors"] += 1
                last_error = str(exc)
                await anyio.sleep(0.05)
                continue
            stats["refused"] += not ok
            return
        raise RuntimeError(f"finish kept failing: {last_error}")

    try:
        await anyio.to_thread.run_sync(_ready_then_wait, out)
        t0, cpu0 = time.monotonic(), _cpu()
        while True:
            started = time.perf_counter()
            try:
                runs = await store.claim(worker, LEASE, batch, workflows=workflows)
            except StoreError as exc:
                stats["errors"] += 1
                last_error = str(exc)
                if stats["errors"] > MAX_ERRORS:
                    raise
                await anyio.sleep(0.05)
                continue
            finally:
                stats["claim_s"] += time.perf_counter() - started
                stats["claim_calls"] += 1
            if not runs:
                stats["empty_claims"] += 1
                # Runs locked by another process' claim at this moment are skipped (SKIP
                # LOCKED); stop only when nothing at all is queued.
                if await store.next_run_at() is None:
                    break
                continue
            pairs.extend((run.id, run.epoch) for run in runs)
            if not finishing:
                continue
            started = time.perf_counter()
            fences = [Fence(run.id, run.epoch) for run in runs]
            if concurrent and len(fences) > 1:
                async with anyio.create_task_group() as tg:
                    for fence in fences:
                        tg.start_soon(finish, fence)
            else:
                for fence in fences:
                    await finish(fence)
            stats["finish_s"] += time.perf_counter() - started
        t1, cpu1 = time.monotonic(), _cpu()
    finally:
        with anyio.CancelScope(shield=True):
            await store.aclose()
    return {"t0": t0, "t1": t1, "cpu_s": cpu1 - cpu0, "pairs": pairs, "last_error": last_error,
            **stats}


def _cpu() -> float:
    """CPU seconds (user + system) this process has used."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def raw_sqlite_job(cmd: dict[str, Any], out: TextIO) -> dict[str, Any]:
    conn = sqlite3.connect(cmd["path"], timeout=60.0, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = NORMAL")
        return _raw_loop(cmd, out, conn.execute, RAW_UPDATE_SQLITE)
    finally:
        conn.close()


def raw_postgres_job(cmd: dict[str, Any], out: TextIO) -> dict[str, Any]:
    import psycopg

    with psycopg.connect(cmd["dsn"], autocommit=True) as conn:
        return _raw_loop(cmd, out, conn.execute, RAW_UPDATE_POSTGRES)


def _raw_loop(cmd: dict[str, Any], out: TextIO, execute: Any, query: str) -> dict[str, Any]:
    ids = [run_id(i) for i in range(cmd["index"], cmd["runs"], cmd["stride"])]
    worker = cmd["worker"]
    _ready_then_wait(out)
    claimed = 0
    t0, cpu0 = time.monotonic(), _cpu()
    for rid in ids:
        now = time.time()
        claimed += execute(query, (worker, now + LEASE, now, now, rid)).rowcount
    t1, cpu1 = time.monotonic(), _cpu()
    return {"t0": t0, "t1": t1, "cpu_s": cpu1 - cpu0, "claimed": claimed, "attempted": len(ids)}


# -- the parent: processes -------------------------------------------------------------------
class Workers:
    """Worker processes, started once and reused by every configuration."""

    def __init__(self, count: int) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
        self.procs: list[subprocess.Popen[str]] = []
        try:
            for _ in range(count):
                self.procs.append(subprocess.Popen(
                    [sys.executable, str(Path(__file__).resolve()), "--worker"],
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
                    cwd=ROOT, bufsize=1))
        except BaseException:
            self.close()
            raise

    def run(self, cmds: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        """Send one job to each of the first ``len(cmds)`` processes, start them together."""
        procs = self.procs[: len(cmds)]
        for proc, cmd in zip(procs, cmds, strict=True):
            self._send(proc, json.dumps(cmd))
        answers = [self._receive(proc) for proc in procs]
        errors = [a["error"] for a in answers if "error" in a]
        if errors:
            raise BenchError(f"a worker process could not start: {errors[0]}")
        for proc in procs:
            self._send(proc, "go")
        results = [self._receive(proc) for proc in procs]
        errors = [r["error"] for r in results if "error" in r]
        if errors:
            raise BenchError(f"a worker process failed: {errors[0]}")
        return results

    @staticmethod
    def _send(proc: subprocess.Popen[str], line: str) -> None:
        assert proc.stdin is not None
        proc.stdin.write(line + "\n")
        proc.stdin.flush()

    @staticmethod
    def _receive(proc: subprocess.Popen[str]) -> dict[str, Any]:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], WORKER_TIMEOUT)
        line = proc.stdout.readline() if ready else ""
        if not line:
            reason = "timed out" if not ready else f"exited with status {proc.poll()}"
            raise BenchError(f"worker process {proc.pid} {reason}")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def close(self) -> None:
        for proc in self.procs:
            with contextlib.suppress(OSError):
                if proc.stdin is not None:
                    proc.stdin.close()
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
            if proc.stdout is not None:
                proc.stdout.close()


class BenchError(Exception):
    pass


# -- the parent: databases -------------------------------------------------------------------
def _open_and_close(url: str) -> None:
    """Create the store's schema the way a worker would (``open`` migrates)."""
    import anyio

    from durable.store import store_from_url

    async def go() -> None:
        store = store_from_url(url)
        await store.open()
        await store.aclose()

    anyio.run(go, backend="asyncio")


class SqliteBackend:
    name = "sqlite"
    label = "SQLite (file)"

    def __init__(self, same_run_at: bool = False) -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="durable-bench-claims-")
        self._count = 0
        self.same_run_at = same_run_at

    def version(self) -> str:
        return sqlite3.sqlite_version

    def new_database(self, runs: int) -> str:
        """A fresh migrated database with ``runs`` queued runs; returns its store URL."""
        self._count += 1
        path = Path(self._dir.name) / f"claims-{self._count}.db"
        url = f"sqlite:///{path}"
        _open_and_close(url)
        base = time.time() - 1
        conn = sqlite3.connect(path, isolation_level=None)
        try:
            conn.execute("BEGIN IMMEDIATE")
            conn.executemany(
                "INSERT INTO durable_runs (id, workflow, args, concurrency_key, state, epoch,"
                " attempt, run_at, created_at, updated_at, timeout)"
                " VALUES (?, ?, '[]', NULL, 'queued', 0, 0, ?, ?, ?, NULL)",
                ((run_id(i), WORKFLOW, *seed_times(i, base, self.same_run_at))
                 for i in range(runs)))
            conn.execute(
                "INSERT INTO durable_journal (run_id, epoch, kind, at, data)"
                " SELECT id, 0, 'run_created', created_at, json_object('workflow', workflow,"
                " 'args', json(args), 'key', concurrency_key, 'run_at', run_at)"
                " FROM durable_runs ORDER BY created_at")
            conn.execute("COMMIT")
            conn.execute("ANALYZE")
        finally:
            conn.close()
        return url

    def query(self, url: str, sql: str) -> tuple[Any, ...]:
        conn = sqlite3.connect(url[len("sqlite:///"):])
        try:
            return tuple(conn.execute(sql).fetchone())
        finally:
            conn.close()

    def raw_job(self, url: str) -> dict[str, Any]:
        return {"op": "raw_sqlite", "path": url[len("sqlite:///"):]}

    def close(self) -> None:
        self._dir.cleanup()


class PostgresBackend:
    name = "postgres"
    label = "PostgreSQL"

    def __init__(self, url: str, same_run_at: bool = False) -> None:
        import psycopg

        self.same_run_at = same_run_at
        self._psycopg = psycopg
        from psycopg.conninfo import conninfo_to_dict, make_conninfo

        # Every URL option but ``schema`` goes to libpq, for the stores (which pass them on)
        # and for this script's own connections (search_path added to ``options``).
        base, _, query = url.partition("?")
        items = [i for i in query.split("&") if i and not i.startswith("schema=")]
        self.url = "?".join([base, "&".join(items)]) if items else base
        self._params = conninfo_to_dict(self.url)
        self._make_conninfo = make_conninfo
        self.prefix = f"durable_bench_{uuid.uuid4().hex[:8]}"
        self.schemas: list[str] = []

    def reachable(self) -> str | None:
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

    def new_database(self, runs: int) -> str:
        schema = f"{self.prefix}_{len(self.schemas) + 1}"
        self.schemas.append(schema)
        url = f"{self.url}{'&' if '?' in self.url else '?'}schema={schema}"
        _open_and_close(url)
        base = time.time() - 1
        with self._connect(schema) as conn, conn.transaction():
            times = [seed_times(i, base, self.same_run_at) for i in range(runs)]
            with conn.cursor().copy(
                "COPY durable_runs (id, workflow, args, state, epoch, attempt, run_at,"
                " created_at, updated_at) FROM STDIN"
            ) as copy:
                for i, (run_at, created, updated) in enumerate(times):
                    copy.write_row((run_id(i), WORKFLOW, "[]", "queued", 0, 0, run_at,
                                    created, updated))
            with conn.cursor().copy(
                "COPY durable_journal (run_id, epoch, kind, at, data) FROM STDIN"
            ) as copy:
                for i, (run_at, created, _) in enumerate(times):
                    data: dict[str, Any] = {"workflow": WORKFLOW, "args": [], "key": None,
                                            "run_at": run_at}
                    copy.write_row((run_id(i), 0, "run_created", created,
                                    json.dumps(data, separators=(",", ":"))))
        with self._connect(schema) as conn:
            conn.execute("ANALYZE durable_runs")
            conn.execute("ANALYZE durable_journal")
        return url

    def dsn(self, schema: str) -> str:
        """libpq connection string with the URL's options and ``search_path`` = schema."""
        options = " ".join(filter(None, [str(self._params.get("options") or ""),
                                         f"-c search_path={schema}"]))
        return str(self._make_conninfo(self.url, options=options))

    def _connect(self, schema: str) -> Any:
        return self._psycopg.connect(self.dsn(schema), autocommit=True)

    def query(self, url: str, sql: str) -> tuple[Any, ...]:
        with self._connect(url.rpartition("schema=")[2]) as conn:
            row = conn.execute(sql).fetchone()
            return tuple(row) if row else ()

    def raw_job(self, url: str) -> dict[str, Any]:
        return {"op": "raw_postgres", "dsn": self.dsn(url.rpartition("schema=")[2])}

    def close(self) -> None:
        """Drop every schema this run created (retrying a server that refuses for a moment)."""
        from psycopg import sql

        for attempt in range(OPEN_ATTEMPTS):
            if not self.schemas:
                return
            try:
                with self._psycopg.connect(self.url, autocommit=True) as conn:
                    while self.schemas:
                        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(
                            sql.Identifier(self.schemas[-1])))
                        self.schemas.pop()
            except self._psycopg.Error as exc:
                if attempt == OPEN_ATTEMPTS - 1:
                    print(f"bench_claims: could not drop schema(s) {', '.join(self.schemas)}: "
                          f"{' '.join(str(exc).split())}", file=sys.stderr)
                    return
                time.sleep(1.0)


Backend = SqliteBackend | PostgresBackend


# -- the parent: measurements ----------------------------------------------------------------
def default_pool(batch: int) -> int:
    """Pooled PostgreSQL connections per worker process unless ``--pool-size`` is given.

    The same as the worker CLI gives a worker of that concurrency
    (``min(concurrency + 3, 10)``, ``durable/_cli.py``): a pool of 35 would make four
    processes want 140 connections, more than PostgreSQL's default ``max_connections`` of
    100 (the pools' growth then fails with "sorry, too many clients already", for every
    other client of the server too); ``--pool-size 35`` measures it.
    """
    return min(batch + 3, POOL_CAP)


def measure_store(workers: Workers, backend: Backend, runs: int, processes: int, batch: int,
                  *, finish: bool = True, concurrent: bool = True,
                  pool_size: int | None = None) -> dict[str, Any]:
    url = backend.new_database(runs)
    pool = pool_size if pool_size is not None else default_pool(batch)
    cmds = [{"op": "store", "url": url, "batch": batch, "finish": finish,
             "concurrent": concurrent, "pool_size": pool,
             "worker": f"bench-{processes}x{batch}-{w}"}
            for w in range(processes)]
    results = workers.run(cmds)
    seconds = max(r["t1"] for r in results) - min(r["t0"] for r in results)
    problems = verify(backend, url, runs, results, finished=finish)
    calls = sum(r["claim_calls"] for r in results)
    claimed = sum(len(r["pairs"]) for r in results)
    config: dict[str, Any] = {
        "backend": backend.name, "kind": "store" if finish else "claim_only",
        "processes": processes, "batch": batch,
        "runs": runs, "seconds": round(seconds, 4),
        "claims_per_s": round(claimed / seconds, 1) if seconds > 0 else None,
        "check": "FAILED" if problems else "OK", "problems": problems,
        "claim_calls": calls,
        "empty_claims": sum(r["empty_claims"] for r in results),
        "runs_per_claim": round(claimed / max(1, calls - sum(r["empty_claims"] for r in results)),
                                1),
        "claim_ms": round(1000 * sum(r["claim_s"] for r in results) / max(1, calls), 3),
        "finish_ms_per_run": round(1000 * sum(r["finish_s"] for r in results)
                                   / max(1, claimed), 3),
        "client_cpu_ms_per_run": round(1000 * sum(r["cpu_s"] for r in results)
                                       / max(1, claimed), 3),
        "store_errors": sum(r["errors"] for r in results),
        "per_process": [len(r["pairs"]) for r in results],
    }
    if backend.name == "postgres":
        config["pool_size"] = pool
    errors = [r["last_error"] for r in results if r["last_error"]]
    if errors:
        config["last_error"] = errors[-1]
    return config


def verify(backend: Backend, url: str, runs: int, results: list[dict[str, Any]],
           finished: bool = True) -> list[str]:
    """What is wrong with the drained queue (empty: every run claimed once and completed).

    With ``finished=False`` (claims only), every run must be running under its one claim.
    """
    state, outcome = ("completed", "run_completed") if finished else ("running", None)
    problems: list[str] = []
    pairs = [tuple(p) for r in results for p in r["pairs"]]
    reported = Counter(p[0] for p in pairs)
    twice = [rid for rid, n in reported.items() if n > 1]
    if twice:
        problems.append(f"{len(twice)} runs were returned by more than one claim "
                        f"(e.g. {twice[0]})")
    if len(reported) != runs:
        problems.append(f"the processes claimed {len(reported)} distinct runs, not {runs}")
    refused = sum(r["refused"] for r in results)
    if refused:
        problems.append(f"{refused} fenced finishes were refused")
    total, = backend.query(url, "SELECT count(*) FROM durable_runs")
    completed, = backend.query(
        url, f"SELECT count(*) FROM durable_runs WHERE state = '{state}'")
    entries, claimed_runs, claimed_pairs = backend.query(
        url, "SELECT count(*), count(DISTINCT run_id), count(DISTINCT run_id || ':' || epoch)"
             " FROM durable_journal WHERE kind = 'run_claimed'")
    outcome_join = (" JOIN durable_journal AS f ON f.run_id = r.id"
                    f" AND f.kind = '{outcome}' AND f.epoch = r.epoch") if outcome else ""
    matched, = backend.query(
        url, "SELECT count(*) FROM durable_runs AS r"
             " JOIN durable_journal AS c ON c.run_id = r.id AND c.kind = 'run_claimed'"
             "  AND c.epoch = r.epoch" + outcome_join +
             f" WHERE r.state = '{state}'")
    expected = {"runs in the table": (total, runs), f"{state} runs": (completed, runs),
                "run_claimed entries": (entries, runs),
                "runs with a run_claimed entry": (claimed_runs, runs),
                "distinct (run, epoch) claims": (claimed_pairs, runs),
                f"runs {state} under the epoch they were claimed with": (matched, runs)}
    for what, (got, want) in expected.items():
        if got != want:
            problems.append(f"{what}: {got}, expected {want}")
    journal_pairs = len(pairs)
    if journal_pairs != entries:
        problems.append(f"processes reported {journal_pairs} claims, the journal {entries}")
    if backend.name == "postgres":
        epochs, = backend.query(url, "SELECT count(DISTINCT epoch) FROM durable_journal"
                                     " WHERE kind = 'run_claimed'")
        if epochs != runs:
            problems.append(f"{epochs} distinct epochs for {runs} claims (the sequence "
                            "should give every claim its own)")
    return problems


def measure_raw(workers: Workers, backend: Backend, runs: int,
                processes: int) -> dict[str, Any]:
    url = backend.new_database(runs)
    cmds = [backend.raw_job(url) | {"index": w, "stride": processes, "runs": runs,
                                    "worker": f"raw-{processes}-{w}"}
            for w in range(processes)]
    results = workers.run(cmds)
    seconds = max(r["t1"] for r in results) - min(r["t0"] for r in results)
    claimed = sum(r["claimed"] for r in results)
    running, = backend.query(url, "SELECT count(*) FROM durable_runs WHERE state = 'running'")
    problems = []
    if claimed != runs or running != runs:
        problems.append(f"{claimed} updates took effect, {running} runs running, "
                        f"expected {runs}")
    return {"backend": backend.name, "kind": "raw", "processes": processes, "batch": None,
            "runs": runs, "seconds": round(seconds, 4),
            "claims_per_s": round(claimed / seconds, 1) if seconds > 0 else None,
            "client_cpu_ms_per_run": round(1000 * sum(r["cpu_s"] for r in results)
                                           / max(1, claimed), 3),
            "check": "FAILED" if problems else "OK", "problems": problems}


# -- report ----------------------------------------------------------------------------------
def machine() -> dict[str, Any]:
    def version(dist: str) -> str | None:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            return None

    return {"python": platform.python_version(), "cpus": os.cpu_count(),
            "platform": platform.platform(), "sqlite": sqlite3.sqlite_version,
            "psycopg": version("psycopg"), "psycopg_pool": version("psycopg-pool"),
            "anyio": version("anyio")}


def render(report: dict[str, Any]) -> str:
    configs = report["configurations"]
    backends = [b for b in report["backends"] if any(c["backend"] == b for c in configs)]
    labels = {"sqlite": "SQLite (file)", "postgres": "PostgreSQL"}
    m = report["machine"]
    width = 34
    lines = [
        f"durable claim throughput: {report['runs']:,} queued runs per configuration, drained "
        "by worker processes",
        f"{m['cpus']} CPUs, load {report['load_before'][0]:.1f} before / "
        f"{report['load_after'][0]:.1f} after, Python {m['python']}, SQLite {m['sqlite']}"
        + (f", PostgreSQL {report['postgres_version']}, psycopg {m['psycopg']}"
           if report.get("postgres_version") else ""),
        "claims/s = runs claimed / wall time; ms/claim = mean time of one claim call;",
        "cpu = client CPU ms per run (worker processes only, not the database server)",
        "",
        f"{'':24}" + "".join(f"{labels[b]:>{width}}" for b in backends),
        f"{'':24}" + "".join(f"{'claims/s  ms/claim    cpu  check':>{width}}"
                             for _ in backends),
    ]

    def row(title: str, kind: str, processes: int, batch: int | None) -> str:
        cells = []
        for b in backends:
            match = [c for c in configs if (c["backend"], c["kind"], c["processes"],
                                            c["batch"]) == (b, kind, processes, batch)]
            if not match:
                cells.append(f"{'-':>{width}}")
                continue
            c = match[0]
            ms = f"{c['claim_ms']:.2f}" if "claim_ms" in c else "-"
            cells.append(f"{c['claims_per_s']:>{width - 24},.0f}{ms:>10}"
                         f"{c['client_cpu_ms_per_run']:>7.3f}{c['check']:>7}")
        return f"{title:24}" + "".join(cells)

    def plural(p: int) -> str:
        return f"  {p} process{'es' if p > 1 else ''}"

    processes = sorted({c["processes"] for c in configs})
    sections = [(f"claim + finish, batch {b}", "store", b) for b in sorted(
        {c["batch"] for c in configs if c["kind"] == "store"}, reverse=True)]
    sections += [(f"claim only, batch {b}", "claim_only", b) for b in sorted(
        {c["batch"] for c in configs if c["kind"] == "claim_only"}, reverse=True)]
    if any(c["kind"] == "raw" for c in configs):
        sections.append(("raw UPDATE per run", "raw", None))
    for title, kind, batch in sections:
        lines.append(title)
        lines += [row(plural(p), kind, p, batch) for p in processes]
    lines += ["", "details: claim calls (empty), runs per claim, finish ms/run (wall, per "
              "process), store errors, runs per process"]
    for c in configs:
        if c["kind"] == "raw":
            continue
        extra = f", pool {c['pool_size']}" if "pool_size" in c else ""
        lines.append(
            f"  {c['backend']:8} {c['kind']:10} batch {c['batch']:>3} x{c['processes']}: "
            f"{c['claim_calls']:,} ({c['empty_claims']}), {c['runs_per_claim']}, "
            f"{c['finish_ms_per_run']:.3f}, {c['store_errors']}{extra}, {c['per_process']}")
    for c in configs:
        for problem in c["problems"]:
            lines.append(f"  FAILED {c['backend']} {c['kind']} x{c['processes']} "
                         f"batch {c['batch']}: {problem}")
    for backend, reason in report["skipped"].items():
        lines.append(f"{labels.get(backend, backend)} column skipped: {reason}")
    lines.append("")
    lines.append(f"no run claimed twice: {report['double_claim_check']}")
    target = report.get("target")
    if target:
        only = (f" (claims alone: {target['claim_only']:,.0f}/s)"
                if target.get("claim_only") else "")
        lines.append(
            f"target >= {target['claims_per_s']:,.0f} claims/s with {target['processes']} "
            f"processes on PostgreSQL: {target['measured']:,.0f} claims/s with finish, "
            f"batch {target['batch']}{only}: {'met' if target['met'] else 'MISSED'}")
    return "\n".join(lines)


# -- main ------------------------------------------------------------------------------------
def _ints(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected numbers separated by commas: {text}") from exc
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive numbers: {text}")
    return values


def _backends(text: str) -> list[str]:
    names = [x.strip() for x in text.split(",") if x.strip()]
    unknown = set(names) - set(BACKENDS)
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"backends are {', '.join(BACKENDS)}: {text}")
    return names


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true",
                        help=f"{QUICK_RUNS} runs per configuration (a few seconds)")
    parser.add_argument("--runs", type=int, help=f"queued runs per configuration "
                        f"(default {RUNS:,}, {QUICK_RUNS} with --quick)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--backends", type=_backends, default=list(BACKENDS),
                        help="sqlite,postgres (default both)")
    parser.add_argument("--processes", type=_ints, default=[1, 2, 4],
                        help="worker process counts (default 1,2,4)")
    parser.add_argument("--batches", type=_ints, default=[32, 1],
                        help="claim batch sizes (default 32,1)")
    parser.add_argument("--pg-url", default=PG_URL,
                        help=f"PostgreSQL server (default {PG_URL}); a fresh schema is "
                             "created per configuration and dropped at the end")
    parser.add_argument("--require-postgres", action="store_true",
                        help="fail (exit 2) instead of skipping when PostgreSQL is unreachable")
    parser.add_argument("--pool-size", type=int, default=None,
                        help=f"PostgreSQL pool per process (default min(batch + 3, {POOL_CAP}))")
    parser.add_argument("--sequential-finish", action="store_true",
                        help="finish the runs of a batch one after another (default: "
                             "concurrently, as the worker's tasks do)")
    parser.add_argument("--no-baseline", action="store_true", help="skip the raw UPDATE rows")
    parser.add_argument("--no-claim-only", action="store_true",
                        help="skip the claim-only rows (claims without finishing the runs)")
    parser.add_argument("--same-run-at", action="store_true",
                        help="queue every run with one run_at (default: each its creation "
                             "time, as create_run does)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.runs is None:
        args.runs = QUICK_RUNS if args.quick else RUNS
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    return args


@contextlib.contextmanager
def _closing(backends: list[Backend]) -> Iterator[list[Backend]]:
    try:
        yield backends
    finally:
        for backend in backends:
            backend.close()


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        return worker_main()
    report: dict[str, Any] = {
        "when": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "runs": args.runs, "lease_s": LEASE, "same_run_at": args.same_run_at,
        "backends": args.backends,
        "processes": args.processes, "batches": args.batches,
        "finish": "sequential" if args.sequential_finish else "concurrent",
        "machine": machine(), "load_before": [round(x, 2) for x in os.getloadavg()],
        "configurations": [], "skipped": {},
    }
    backends: list[Backend] = []
    for name in args.backends:
        if name == "sqlite":
            backends.append(SqliteBackend(args.same_run_at))
            continue
        try:
            pg = PostgresBackend(args.pg_url, args.same_run_at)
        except ImportError:
            reason = "psycopg is not installed (pip install 'durable-fenced[postgres]')"
        else:
            reason = pg.reachable() or ""
            if not reason:
                backends.append(pg)
                report["postgres_version"] = pg.version()
                continue
            reason = f"no PostgreSQL server reachable at {pg.url}: {reason}"
        if args.require_postgres:
            print(f"bench_claims: error: {reason}", file=sys.stderr)
            return 2
        report["skipped"]["postgres"] = reason
        print(f"PostgreSQL column skipped: {reason}", file=sys.stderr)

    def progress(text: str) -> None:
        if not args.json:
            print(text, file=sys.stderr, flush=True)

    with _closing(backends):
        workers = Workers(max(args.processes))
        try:
            for backend in backends:
                for batch in args.batches:
                    for processes in args.processes:
                        progress(f"{backend.name}: claim + finish, batch {batch}, "
                                 f"{processes} process(es)...")
                        report["configurations"].append(measure_store(
                            workers, backend, args.runs, processes, batch,
                            concurrent=not args.sequential_finish,
                            pool_size=args.pool_size))
                if not args.no_claim_only:
                    batch = max(args.batches)
                    for processes in args.processes:
                        progress(f"{backend.name}: claim only, batch {batch}, "
                                 f"{processes} process(es)...")
                        report["configurations"].append(measure_store(
                            workers, backend, args.runs, processes, batch, finish=False,
                            pool_size=args.pool_size))
                if not args.no_baseline:
                    for processes in args.processes:
                        progress(f"{backend.name}: raw UPDATE, {processes} process(es)...")
                        report["configurations"].append(
                            measure_raw(workers, backend, args.runs, processes))
        except BenchError as exc:
            print(f"bench_claims: error: {exc}", file=sys.stderr)
            return 1
        finally:
            workers.close()
    report["load_after"] = [round(x, 2) for x in os.getloadavg()]

    failed = [c for c in report["configurations"] if c["check"] != "OK"]
    report["double_claim_check"] = "FAILED" if failed else "OK"
    goal = [c for c in report["configurations"] if c["backend"] == "postgres"
            and c["kind"] == "store" and c["processes"] == TARGET_PROCESSES]
    if goal:
        best = max(goal, key=lambda c: c["claims_per_s"] or 0)
        only = [c["claims_per_s"] for c in report["configurations"]
                if c["backend"] == "postgres" and c["kind"] == "claim_only"
                and c["processes"] == TARGET_PROCESSES]
        report["target"] = {"claims_per_s": TARGET_CLAIMS, "processes": TARGET_PROCESSES,
                            "batch": best["batch"], "measured": best["claims_per_s"],
                            "claim_only": only[0] if only else None,
                            "met": (best["claims_per_s"] or 0) >= TARGET_CLAIMS
                            and best["check"] == "OK"}
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(render(report))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
