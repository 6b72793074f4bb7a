"""What one state change of a run costs on SQLite: the claim and the finish, statement by statement.

On a fresh SQLite file (WAL, ``synchronous=NORMAL``, the store's defaults), the store creates
the schema (``SqliteStore.open``); then ``--history`` finished runs (default 100,000: 10
workflows, a third without a key, the rest over 1,000 keys; 85 % completed, 10 % failed, 5 %
cancelled; created 10 ms apart) are bulk-inserted with plain ``sqlite3`` (not timed), so
every index has the depth of a store in use, and ``--runs`` queued runs (default 2,000) are
inserted by the store's ``insert_run``.

Then, with plain ``sqlite3`` on that file and the store's own statements (``Q``: those of the
``durable`` package imported, so ``PYTHONPATH=<a checkout>`` measures that checkout's schema
and queries; this script does not put its own checkout first when PYTHONPATH is set):

- **one transaction per statement**: each run is claimed (``claim_run``) in one
  ``BEGIN IMMEDIATE ... COMMIT`` and finished (``finish_run``) in another, as a worker that
  commits each state change alone would. CPU (``time.process_time``) per claim and per finish,
  commit included, and the WAL frames (pages) each commit writes (``wal_autocheckpoint`` off
  meanwhile; the frame count is ``PRAGMA wal_checkpoint``'s, the WAL restarted before).
- **autocheckpoint**: ``--runs`` more runs claimed and finished one commit each, once with
  SQLite's default ``wal_autocheckpoint = 1000`` (the commit that takes the WAL past 1,000
  pages copies it into the database file, in the committing call) and once with 0 (never):
  CPU per state change, median and slowest commit (wall clock).
- **statements alone**: ``--runs`` more runs claimed in one transaction, then finished in one
  transaction: the CPU of the statement without its commit.
- **checkpoint**: what one checkpoint of the WAL those commits wrote costs (``PASSIVE``,
  CPU and wall clock), against the per-commit figures: with the default
  ``wal_autocheckpoint=1000`` that cost falls on the commit that crosses 1,000 pages.

``--pg-url postgresql://...`` (e.g. ``postgresql://postgres@127.0.0.1:5432/test``) also
measures PostgreSQL, in a fresh schema of that database (dropped at the end): the store
creates the schema, the same history is inserted by ``generate_series`` then ``VACUUM
ANALYZE``; each run is claimed by the store's ``claim`` statement (``run_id`` given, limit 1)
and finished by its ``finish_run``, one autocommit statement each on a plain (sync)
``psycopg`` connection: wall clock per statement (a loopback round trip and a commit
included) and the WAL bytes each writes (``pg_current_wal_lsn()`` before and after the
phase, so other sessions' writes to the same server count too: compare on a quiet server).

Each phase runs ``--repeat`` times (default 3, fresh runs each time on the same file); the
median is printed. The indexes of ``durable_runs`` are listed with the figures.

``--make-db PATH`` only creates a store at PATH with the ``--history`` (the schema, then the
finished runs) and exits: ``scripts/bench.py --db PATH`` then runs the engine's benchmark on
a store with history (a fresh copy of the file for each run of it).

Run: ``PYTHONPATH=. python scripts/bench_state_change.py`` (about half a minute);
``--history 1000 --runs 100 --repeat 1`` takes a second. Figures: docs/benchmarks.md
(issue 10, target 5).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio

ROOT = Path(__file__).resolve().parent.parent
if not os.environ.get("PYTHONPATH") and importlib.util.find_spec("durable") is None:
    sys.path.insert(0, str(ROOT))

import durable  # noqa: E402
from durable._clock import FakeClock  # noqa: E402
from durable.store._sqlite import Q, SqliteStore  # noqa: E402

START = 1_700_000_000.0
WORKFLOWS = [f"wf.{i}" for i in range(10)]
ENDED = ["completed"] * 85 + ["failed"] * 10 + ["cancelled"] * 5


def seed_history(path: Path, n: int, seed: int = 7) -> float:
    """Bulk-insert ``n`` finished runs; return the last created_at."""
    rnd = random.Random(seed)
    rows = []
    at = START
    for i in range(n):
        at += 0.01
        key = None if rnd.random() < 1 / 3 else f"slot-{rnd.randrange(1000)}"
        rows.append((f"old-{rnd.getrandbits(48):012x}", rnd.choice(WORKFLOWS), key,
                     rnd.choice(ENDED), i + 1, at, at, at + 1.0))
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("BEGIN")
        conn.executemany(
            "INSERT INTO durable_runs (id, workflow, args, concurrency_key, state, epoch, "
            "attempt, run_at, created_at, updated_at) VALUES (?, ?, '[]', ?, ?, ?, 1, ?, ?, ?)",
            rows)
        conn.execute("COMMIT")
    finally:
        conn.close()
    return at


def connect(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = NORMAL")
    return conn


def insert_runs(conn: sqlite3.Connection, prefix: str, n: int, now: float) -> list[str]:
    ids = [f"{prefix}-{i:06d}" for i in range(n)]
    conn.execute("BEGIN IMMEDIATE")
    for i, run_id in enumerate(ids):
        conn.execute(Q["insert_run"], {"id": run_id, "workflow": WORKFLOWS[i % 10], "args": "[]",
                                       "key": None, "run_at": now, "now": now, "timeout": None,
                                       "start_within": None})
    conn.execute("COMMIT")
    return ids


def wal_frames(conn: sqlite3.Connection) -> int:
    """The frames in the WAL now (a PASSIVE checkpoint reports them; it copies them too)."""
    return int(conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()[1])


def restart_wal(conn: sqlite3.Connection) -> None:
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")


def claim_params(run_id: str, now: float) -> dict[str, Any]:
    return {"worker": "w1", "now": now, "lease": 30.0, "run_id": run_id, "workflows": None}


def finish_params(run_id: str, epoch: int, now: float) -> dict[str, Any]:
    return {"state": "completed", "result": "1", "error": None, "now": now, "run_id": run_id,
            "epoch": epoch}


def one_per_commit(conn: sqlite3.Connection, ids: list[str], now: float) -> dict[str, float]:
    conn.execute("PRAGMA wal_autocheckpoint = 0")
    restart_wal(conn)
    epochs: dict[str, int] = {}
    t0 = time.process_time()
    for run_id in ids:
        conn.execute("BEGIN IMMEDIATE")
        row = conn.execute(Q["claim_run"], claim_params(run_id, now)).fetchone()
        conn.execute("COMMIT")
        epochs[run_id] = row["epoch"]
    claim_cpu = time.process_time() - t0
    claim_frames = wal_frames(conn)
    restart_wal(conn)
    t0 = time.process_time()
    for run_id in ids:
        conn.execute("BEGIN IMMEDIATE")
        cur = conn.execute(Q["finish_run"], finish_params(run_id, epochs[run_id], now + 1))
        assert cur.rowcount == 1, run_id
        conn.execute("COMMIT")
    finish_cpu = time.process_time() - t0
    finish_frames = wal_frames(conn)
    conn.execute("PRAGMA wal_autocheckpoint = 1000")
    n = len(ids)
    return {"claim_cpu_us": 1e6 * claim_cpu / n, "finish_cpu_us": 1e6 * finish_cpu / n,
            "claim_frames": claim_frames / n, "finish_frames": finish_frames / n}


def checkpoint_cost(path: Path, ids: list[str], now: float) -> dict[str, float]:
    """A WAL of ``len(ids)`` claims, one commit each, then one PASSIVE checkpoint, timed."""
    conn = connect(path)
    try:
        conn.execute("PRAGMA wal_autocheckpoint = 0")
        restart_wal(conn)
        for run_id in ids:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute(Q["claim_run"], claim_params(run_id, now))
            conn.execute("COMMIT")
        w0, c0 = time.perf_counter(), time.process_time()
        row = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        cpu, wall = time.process_time() - c0, time.perf_counter() - w0
        conn.execute("PRAGMA wal_autocheckpoint = 1000")
        return {"frames": float(row[1]), "checkpoint_cpu_ms": 1e3 * cpu,
                "checkpoint_wall_ms": 1e3 * wall}
    finally:
        conn.close()


def autocheckpoint(conn: sqlite3.Connection, ids: list[str], now: float,
                   pages: int) -> dict[str, float]:
    """Claim and finish each run, one commit each, under ``wal_autocheckpoint = pages``
    (0: never): CPU per state change, and the slowest commit (the one that checkpoints)."""
    restart_wal(conn)
    conn.execute(f"PRAGMA wal_autocheckpoint = {pages}")
    walls: list[float] = []
    c0 = time.process_time()
    for run_id in ids:
        w0 = time.perf_counter()
        conn.execute("BEGIN IMMEDIATE")
        row = conn.execute(Q["claim_run"], claim_params(run_id, now)).fetchone()
        conn.execute("COMMIT")
        w1 = time.perf_counter()
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(Q["finish_run"], finish_params(run_id, row["epoch"], now + 1))
        conn.execute("COMMIT")
        walls += [w1 - w0, time.perf_counter() - w1]
    cpu = time.process_time() - c0
    conn.execute("PRAGMA wal_autocheckpoint = 1000")
    walls.sort()
    tag = f"auto{pages}"
    return {f"{tag}_cpu_us": 1e6 * cpu / len(walls),
            f"{tag}_p50_wall_us": 1e6 * walls[len(walls) // 2],
            f"{tag}_max_wall_ms": 1e3 * walls[-1],
            f"{tag}_wal_frames_left": float(wal_frames(conn))}


def statements_alone(conn: sqlite3.Connection, ids: list[str], now: float) -> dict[str, float]:
    conn.execute("BEGIN IMMEDIATE")
    t0 = time.process_time()
    epochs = []
    for run_id in ids:
        row = conn.execute(Q["claim_run"], claim_params(run_id, now)).fetchone()
        epochs.append(row["epoch"])
    claim = time.process_time() - t0
    conn.execute("COMMIT")
    conn.execute("BEGIN IMMEDIATE")
    t0 = time.process_time()
    for run_id, epoch in zip(ids, epochs, strict=True):
        conn.execute(Q["finish_run"], finish_params(run_id, epoch, now + 1))
    finish = time.process_time() - t0
    conn.execute("COMMIT")
    n = len(ids)
    return {"claim_stmt_us": 1e6 * claim / n, "finish_stmt_us": 1e6 * finish / n}


def plain_commit_us(path: Path, n: int) -> float:
    """CPU per commit of one small INSERT in plain sqlite3 (the raw rate's unit), same file."""
    conn = connect(path)
    try:
        conn.execute("CREATE TABLE IF NOT EXISTS bench_raw (id INTEGER PRIMARY KEY, v TEXT)")
        t0 = time.process_time()
        for i in range(n):
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("INSERT INTO bench_raw (v) VALUES (?)", (f"{i:0100d}",))
            conn.execute("COMMIT")
        return 1e6 * (time.process_time() - t0) / n
    finally:
        conn.close()


def postgres_phase(url: str, history: int, runs: int, repeat: int) -> dict[str, float]:
    import uuid

    import psycopg
    from psycopg import sql

    from durable.store._postgres import Q as PQ

    schema = f"bench_state_{uuid.uuid4().hex[:10]}"

    async def create() -> None:
        async with durable.Client.connect(f"{url}?schema={schema}"):
            pass

    anyio.run(create, backend="asyncio")
    figures: dict[str, list[float]] = {}
    try:
        with psycopg.connect(url, autocommit=True,
                             options=f"-c search_path={schema}") as conn:
            conn.execute(
                "INSERT INTO durable_runs (id, workflow, args, concurrency_key, state, epoch,"
                " attempt, run_at, created_at, updated_at) SELECT 'old-' || md5(g::text),"
                " 'wf.' || (g %% 10), '[]', CASE WHEN g %% 3 = 0 THEN NULL"
                " ELSE 'slot-' || (g %% 1000) END, CASE WHEN g %% 100 < 85 THEN 'completed'"
                " WHEN g %% 100 < 95 THEN 'failed' ELSE 'cancelled' END, g, 1,"
                " %(start)s + g * 0.01, %(start)s + g * 0.01, %(start)s + g * 0.01 + 1"
                " FROM generate_series(1, %(n)s) AS g", {"start": START, "n": history})
            conn.execute("VACUUM ANALYZE durable_runs")
            now = START + history * 0.01 + 10.0

            def lsn() -> int:
                row = conn.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn").fetchone()
                return int(row[0])

            empty: dict[str, Any] = {"kinds": [], "steps": [], "step_keys": [], "names": [],
                                     "attempts": [], "datas": []}
            for rep in range(repeat):
                ids = [f"pg{rep}-{i:06d}" for i in range(runs)]
                for i, run_id in enumerate(ids):
                    conn.execute(PQ["insert_run"], {
                        "id": run_id, "workflow": WORKFLOWS[i % 10], "args": "[]",
                        "key": None, "run_at": now, "now": now, "timeout": None,
                        "start_within": None, "data": "{}"})
                epochs: dict[str, int] = {}
                w0, l0 = time.perf_counter(), lsn()
                for run_id in ids:
                    row = conn.execute(PQ["claim"], {
                        "now": now, "run_id": run_id, "workflows": None, "limit": 1,
                        "worker": "w1", "lease": 30.0, "data": None}).fetchone()
                    assert row is not None, run_id
                    epochs[run_id] = row[5]  # claimed.*: id, workflow, args, key, state, epoch
                w1, l1 = time.perf_counter(), lsn()
                for run_id in ids:
                    conn.execute(PQ["finish_run"], {
                        "state": "completed", "result": "1", "error": None, "now": now + 1,
                        "run_id": run_id, "epoch": epochs[run_id], "schema": schema} | empty)
                w2, l2 = time.perf_counter(), lsn()
                got = {"pg_claim_wall_us": 1e6 * (w1 - w0) / runs,
                       "pg_finish_wall_us": 1e6 * (w2 - w1) / runs,
                       "pg_claim_wal_bytes": (l1 - l0) / runs,
                       "pg_finish_wal_bytes": (l2 - l1) / runs}
                for name, value in got.items():
                    figures.setdefault(name, []).append(value)
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(
                sql.Identifier(schema)))
    return {name: statistics.median(values) for name, values in figures.items()}


async def make_schema(path: Path) -> None:
    store = SqliteStore(str(path), clock=FakeClock(start=START))
    await store.open()
    await store.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--history", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=2_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--pg-url", help="also measure PostgreSQL, in a fresh schema here")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--make-db", metavar="PATH",
                        help="only create a store at PATH with the --history, and exit")
    args = parser.parse_args()
    if args.make_db:
        made = Path(args.make_db)
        if made.exists():
            parser.error(f"{made} exists")
        anyio.run(make_schema, made)
        seed_history(made, args.history)
        print(f"{made}: a store with {args.history:,} finished runs")
        return
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "state.db"
        anyio.run(make_schema, path)
        now = seed_history(path, args.history) + 10.0
        conn = connect(path)
        conn.row_factory = sqlite3.Row
        indexes = [r[0] for r in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'durable_runs'"
            " ORDER BY name")]
        figures: dict[str, list[float]] = {}
        for rep in range(args.repeat):
            ids = insert_runs(conn, f"one{rep}", args.runs, now)
            got = one_per_commit(conn, ids, now)
            got |= checkpoint_cost(path, insert_runs(conn, f"ck{rep}", args.runs, now), now)
            got |= statements_alone(conn, insert_runs(conn, f"all{rep}", args.runs, now), now)
            got["plain_commit_us"] = plain_commit_us(path, args.runs)
            for pages in (1000, 0):  # the default (a checkpoint every ~1,000 pages), never
                got |= autocheckpoint(conn, insert_runs(conn, f"a{pages}-{rep}", args.runs, now),
                                      now, pages)
            for name, value in got.items():
                figures.setdefault(name, []).append(value)
        conn.close()
    med = {name: statistics.median(values) for name, values in figures.items()}
    if args.pg_url:
        med |= postgres_phase(args.pg_url, args.history, args.runs, args.repeat)
    report = {"durable": str(Path(durable.__file__).parent.parent),
              "sqlite": sqlite3.sqlite_version, "history": args.history, "runs": args.runs,
              "repeat": args.repeat,
              "indexes": indexes, "median": med, "all": figures,
              "loadavg": os.getloadavg()}
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(f"durable from {report['durable']}, SQLite {sqlite3.sqlite_version}, "
          f"{args.history:,} finished runs, {args.runs:,} runs per phase, median of "
          f"{args.repeat}, load {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"indexes of durable_runs ({len(indexes)}): {', '.join(indexes)}")
    rows = [
        ("claim_run + its commit, CPU us", med["claim_cpu_us"]),
        ("finish_run + its commit, CPU us", med["finish_cpu_us"]),
        ("claim_run alone (one transaction), CPU us", med["claim_stmt_us"]),
        ("finish_run alone (one transaction), CPU us", med["finish_stmt_us"]),
        ("plain sqlite3 insert + commit, CPU us", med["plain_commit_us"]),
        ("WAL frames per claim commit", med["claim_frames"]),
        ("WAL frames per finish commit", med["finish_frames"]),
        (f"checkpoint of {med['frames']:.0f} frames, CPU ms", med["checkpoint_cpu_ms"]),
        (f"checkpoint of {med['frames']:.0f} frames, wall ms", med["checkpoint_wall_ms"]),
    ]
    for pages in (1000, 0):
        rows += [
            (f"wal_autocheckpoint={pages}: CPU us per state change", med[f"auto{pages}_cpu_us"]),
            (f"wal_autocheckpoint={pages}: commit p50 wall us", med[f"auto{pages}_p50_wall_us"]),
            (f"wal_autocheckpoint={pages}: slowest commit, ms", med[f"auto{pages}_max_wall_ms"]),
        ]
    if args.pg_url:
        rows += [("PostgreSQL claim (autocommit), wall us", med["pg_claim_wall_us"]),
                 ("PostgreSQL finish_run (autocommit), wall us", med["pg_finish_wall_us"]),
                 ("PostgreSQL WAL bytes per claim", med["pg_claim_wal_bytes"]),
                 ("PostgreSQL WAL bytes per finish", med["pg_finish_wal_bytes"])]
    for label, value in rows:
        print(f"  {label:<52} {value:9.2f}")


if __name__ == "__main__":
    main()
