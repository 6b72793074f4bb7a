"""The engine's benchmark: journaled steps per second, and what they cost against baselines.

Workloads (each repetition on a fresh SQLite file unless ``--db`` is given):

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
``finish`` has committed.

Baselines measured in the same process, on the same file system:

- **plain async**: the same workflow function, its activities called as plain async calls
  (``ActivityContext.standalone()``): what the workflow costs without the engine.
- **sqlite3**: one small INSERT per commit on plain ``sqlite3`` in the calling thread (WAL,
  the same ``synchronous`` setting): the ceiling for any design that commits each write.
- **store thread**: the same insert, one transaction per await through the store's own
  database thread (``durable.store._thread.DbThread``): the cost of one thread hop.
- **aiosqlite**: one autocommit INSERT per ``await`` (asyncio only: aiosqlite does not run on
  trio).

Each workload runs ``--repeat`` times (default 3); the run with the median steps/s is
reported, and the JSON keeps every repetition's figure. The load average is printed: on a
shared machine, compare figures only between runs made under similar load.

Run: ``PYTHONPATH=. python3 scripts/bench.py`` (``--quick`` for a smoke run of a few seconds,
``--json`` for machine-readable output). docs/benchmarks.md has figures and what they mean.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import datetime as dt
import importlib.metadata
import json
import os
import platform
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, MutableMapping
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import structlog

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import durable  # noqa: E402
from durable.store._thread import DbThread  # noqa: E402

STEPS = 5
TARGET_SEQUENTIAL = 2_000.0  # journaled steps/s, one run at a time
TARGET_OVERHEAD_MS = 0.5  # per step, one run at a time
TARGET_CONCURRENT = 5_000.0  # journaled steps/s across concurrent runs
PAYLOAD = "x" * 100
SHOWN_WARNINGS = 3  # engine warnings printed per event name; the rest are only counted

REGISTRY = durable.Registry()


@durable.activity(name="bench.noop", registry=REGISTRY,
                  retry=durable.RetryPolicy(max_attempts=1))
async def noop(ctx: durable.ActivityContext, i: int) -> int:
    """Does nothing, idempotently (``on_doubt="retry"``, the default)."""
    return i


@durable.activity(name="bench.noop_strict", registry=REGISTRY, on_doubt="fail",
                  retry=durable.RetryPolicy(max_attempts=1))
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


def _count_warnings(_logger: Any, _name: str,
                    event_dict: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """Count the engine's warnings (and worse) by event; print only the first few of each."""
    event = str(event_dict.get("event"))
    WARNINGS[event] += 1
    if WARNINGS[event] > SHOWN_WARNINGS:
        raise structlog.DropEvent
    return event_dict


def configure_logging() -> None:
    durable.configure_logging(level="warning")
    processors = list(structlog.get_config()["processors"])
    structlog.configure(processors=[_count_warnings, *processors])


class _CountingConnection(sqlite3.Connection):
    """A sqlite3 connection that counts its commits (the engine's connections, via connect)."""

    commits = 0

    def commit(self) -> None:
        if self.in_transaction:
            _CountingConnection.commits += 1
        super().commit()


def _counting_connect(*args: Any, **kwargs: Any) -> sqlite3.Connection:
    kwargs.setdefault("factory", _CountingConnection)
    conn: sqlite3.Connection = _real_connect(*args, **kwargs)
    return conn


_real_connect = sqlite3.connect


class Counter:
    """Counts a store's jobs (round trips), how many ran inline, and its commits.

    Jobs are counted by wrapping the SQLite store's ``DbThread.run``, inline jobs read from
    its ``inline_jobs`` counter, commits by the connections' ``commit()`` (the engine's
    connections are opened while :func:`counting_commits` is active). Private API: a
    benchmark may peek; counts stay zero where there is nothing to count.
    """

    FIELDS = ("jobs", "write_jobs", "inline_jobs", "commits")

    def __init__(self) -> None:
        self.jobs = 0
        self.write_jobs = 0
        self._db: Any = None

    def attach(self, store: durable.Store) -> None:
        db = getattr(store, "_db", None)
        if db is None:
            return
        self._db = db
        counter = self
        run = db.run

        async def counting_run(fn: Any, *, write: bool = True) -> Any:
            counter.jobs += 1
            counter.write_jobs += write
            return await run(fn, write=write)

        db.run = counting_run

    def snapshot(self) -> dict[str, int]:
        return {"jobs": self.jobs, "write_jobs": self.write_jobs,
                "inline_jobs": int(getattr(self._db, "inline_jobs", 0)),
                "commits": _CountingConnection.commits}


@contextlib.contextmanager
def counting_commits() -> Iterator[None]:
    """Connections opened inside the block count their commits."""
    sqlite3.connect = _counting_connect  # type: ignore[assignment]
    try:
        yield
    finally:
        sqlite3.connect = _real_connect


def store_url(path: Path, synchronous: str) -> str:
    url = f"sqlite:///{path}"
    return url if synchronous == "normal" else f"{url}?synchronous={synchronous}"


def rate(count: float, seconds: float) -> float:
    return count / seconds if seconds > 0 else float("inf")


# -- the engine ----------------------------------------------------------------------------
async def run_engine(url: str, runs: int, *, concurrency: int, start_at_once: bool,
                     label: str, strict: bool = False) -> dict[str, Any]:
    """Queue ``runs`` runs, then drain them with one worker; time both phases."""
    prefix = f"bench-{label}-{uuid.uuid4().hex[:8]}-"
    store = durable.store_from_url(url)
    with counting_commits():  # the store opens its connections here (and only here)
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
        original_finish = store.finish

        async def finish(*args: Any, **kwargs: Any) -> bool:
            nonlocal finished
            ok = await original_finish(*args, **kwargs)
            finished += 1
            if finished >= runs:
                done.set()
            return ok

        store.finish = finish  # type: ignore[method-assign]
        worker = durable.Worker(store, registry=REGISTRY, concurrency=concurrency,
                                poll_interval=0.05)
        async with anyio.create_task_group() as tg:
            t_start = time.perf_counter()
            await tg.start(worker.run)
            t1, cpu1 = time.perf_counter(), time.process_time()
            before = counter.snapshot()
            with anyio.fail_after(max(120.0, runs * 0.05)):
                await done.wait()
            run_s = time.perf_counter() - t1
            cpu_s = time.process_time() - cpu1
            after = counter.snapshot()
            worker.shutdown()
    finally:
        await store.aclose()

    counts = {name: after[name] - before[name] for name in Counter.FIELDS}
    completed, journaled = verify(url, prefix)
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
        "inline_jobs_per_step": counts["inline_jobs"] / steps,
        "commits_per_step": counts["commits"] / steps,
        "write_jobs_per_commit": (counts["write_jobs"] / counts["commits"]
                                  if counts["commits"] else 0.0),
    }


def verify(url: str, prefix: str) -> tuple[int, int]:
    """Count the completed runs and journaled steps of one workload, with plain sqlite3."""
    path = url[len("sqlite:///"):].partition("?")[0]
    conn = sqlite3.connect(path)
    try:
        completed = conn.execute(
            "SELECT count(*) FROM durable_runs WHERE id LIKE ? AND state = 'completed'",
            (prefix + "%",)).fetchone()[0]
        journaled = conn.execute(
            "SELECT count(*) FROM durable_journal WHERE run_id LIKE ? AND kind = 'step_completed'",
            (prefix + "%",)).fetchone()[0]
    finally:
        conn.close()
    return int(completed), int(journaled)


async def workload(args: argparse.Namespace, path_for: Callable[[str], Path], name: str,
                   runs: int, concurrency: int, at_once: bool, label: str) -> dict[str, Any]:
    """Repeat one workload; return the median repetition (by steps/s) with all figures."""
    results = [
        await run_engine(store_url(path_for(f"{name}-{i}"), args.synchronous), runs,
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


# -- one backend ---------------------------------------------------------------------------
async def bench_backend(args: argparse.Namespace, workdir: Path, backend: str,
                        sqlite3_rate: float) -> dict[str, Any]:
    def fresh(name: str) -> Path:
        path = workdir / f"{backend}-{name}.db"
        for suffix in ("", "-wal", "-shm"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)
        return path

    def path_for(name: str) -> Path:
        return Path(args.db) if args.db else fresh(name)

    warnings_before = WARNINGS.copy()
    # Warm up imports, code paths and the file system once (not timed).
    await run_engine(store_url(fresh("warmup"), args.synchronous), 5, concurrency=1,
                     start_at_once=False, label=f"{backend}-warmup",
                     strict=args.on_doubt == "fail")

    seq = await workload(args, path_for, "sequential", args.sequential, 1, False,
                         f"{backend}-seq")
    con = await workload(args, path_for, "concurrent", args.concurrent,
                         args.concurrency or args.concurrent, True, f"{backend}-con")

    strict = args.on_doubt == "fail"
    plain_seq_s = min([await plain_async(args.sequential, False, strict) for _ in range(3)])
    plain_con_s = min([await plain_async(args.concurrent, True, strict) for _ in range(3)])
    for result, plain_s in ((seq, plain_seq_s), (con, plain_con_s)):
        result["plain_steps_per_s"] = rate(result["steps"], plain_s)
        result["overhead_ms_per_step"] = 1000 * (result["run_s"] - plain_s) / result["steps"]

    thread_rate = statistics.median([
        await store_thread_commits(fresh(f"thread-{i}"), args.synchronous, args.commits)
        for i in range(args.repeat)])
    aio_rates = [await aiosqlite_commits(fresh(f"aiosqlite-{i}"), args.synchronous, args.commits)
                 for i in range(args.repeat)]
    measured = [r for r in aio_rates if r is not None]
    aio_rate = statistics.median(measured) if measured else None
    return {
        "sequential": seq,
        "concurrent": con,
        "baselines": {
            "plain_async_sequential_steps_per_s": seq["plain_steps_per_s"],
            "plain_async_concurrent_steps_per_s": con["plain_steps_per_s"],
            "sqlite3_commits_per_s": sqlite3_rate,
            "store_thread_commits_per_s": thread_rate,
            "aiosqlite_commits_per_s": aio_rate,
        },
        "targets": {
            "sequential_steps_per_s": seq["steps_per_s"] >= TARGET_SEQUENTIAL,
            "sequential_overhead_ms": seq["overhead_ms_per_step"] <= TARGET_OVERHEAD_MS,
            "concurrent_steps_per_s": con["steps_per_s"] >= TARGET_CONCURRENT,
        },
        "warnings": dict(WARNINGS - warnings_before),
    }


# -- output --------------------------------------------------------------------------------
def fmt(value: Any, digits: int = 0) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, bool):
        return "met" if value else "MISSED"
    return f"{value:,.{digits}f}"


def render(report: dict[str, Any]) -> str:
    backends = list(report["backends"])
    m, c = report["machine"], report["config"]
    lines = [
        f"durable benchmark, {report['date']}: {m['cpus']} CPUs, Python {m['python']}, "
        f"SQLite {m['sqlite']}, synchronous={c['synchronous']}, {STEPS} no-op steps per run "
        f"(on_doubt={c['on_doubt']}), median of {c['repeat']}",
        f"load average before/after: {m['loadavg_before']} / {m['loadavg_after']}",
        "",
    ]
    width = 46

    def row(label: str, get: Callable[[dict[str, Any]], Any], digits: int = 0) -> None:
        cells = "".join(f"{fmt(get(report['backends'][b]), digits):>14}" for b in backends)
        lines.append(f"  {label:<{width}}{cells}")

    def engine_rows(name: str) -> None:
        row("journaled steps/s", lambda r: r[name]["steps_per_s"])
        row("ms per step (wall clock)", lambda r: r[name]["ms_per_step"], 3)
        row("per-step overhead vs plain async (ms)",
            lambda r: r[name]["overhead_ms_per_step"], 3)
        row("CPU ms per step (all threads)", lambda r: r[name]["cpu_ms_per_step"], 3)
        row("runs/s", lambda r: r[name]["runs_per_s"])
        row("store jobs per step", lambda r: r[name]["db_jobs_per_step"], 2)
        row("  of which inline (no thread hop)", lambda r: r[name]["inline_jobs_per_step"], 2)
        row("commits per step", lambda r: r[name]["commits_per_step"], 2)
        row("write jobs per commit", lambda r: r[name]["write_jobs_per_commit"], 1)
        row("starts/s", lambda r: r[name]["starts_per_s"])
        row("worker start-up (ms, not counted above)",
            lambda r: r[name]["worker_start_ms"], 1)

    lines.append(f"  {'':<{width}}" + "".join(f"{b:>14}" for b in backends))
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
    lines.append(f"targets (sequential >= {TARGET_SEQUENTIAL:,.0f} steps/s and <= "
                 f"{TARGET_OVERHEAD_MS} ms/step overhead; concurrent >= "
                 f"{TARGET_CONCURRENT:,.0f} steps/s)")
    row("sequential steps/s", lambda r: r["targets"]["sequential_steps_per_s"])
    row("sequential per-step overhead", lambda r: r["targets"]["sequential_overhead_ms"])
    row("concurrent steps/s", lambda r: r["targets"]["concurrent_steps_per_s"])
    for b in backends:
        warned = report["backends"][b]["warnings"]
        if warned:
            listed = ", ".join(f"{event} x{n}" for event, n in sorted(warned.items()))
            lines.append(f"engine warnings on {b}: {listed}")
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
    }


def loadavg() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


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


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    configure_logging()
    backends = ["asyncio", "trio"] if args.backend == "both" else [args.backend]
    load_before = loadavg()
    base = Path(args.db).parent if args.db else None
    with tempfile.TemporaryDirectory(prefix="durable-bench-", dir=base) as tmp:
        workdir = Path(tmp)
        sqlite3_commits(workdir / "warmup-sqlite3.db", args.synchronous, 100)
        sqlite3_rate = statistics.median(
            sqlite3_commits(workdir / f"sqlite3-{i}.db", args.synchronous, args.commits)
            for i in range(args.repeat))
        results: dict[str, Any] = {}
        for backend in backends:
            results[backend] = anyio.run(bench_backend, args, workdir, backend, sqlite3_rate,
                                         backend=backend)
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
        },
        "targets": {"sequential_steps_per_s": TARGET_SEQUENTIAL,
                    "sequential_overhead_ms": TARGET_OVERHEAD_MS,
                    "concurrent_steps_per_s": TARGET_CONCURRENT},
        "backends": results,
    }
    print(json.dumps(report, indent=2) if args.json else render(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
