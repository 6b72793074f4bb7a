"""The runs list and counts of the console at scale: SQLite, every filter shape, timed.

For every size (``--sizes 1000,100000``, the default), on a fresh SQLite file in a temporary
folder (WAL, ``synchronous=NORMAL``, the store's defaults):

1. The store creates the schema (``SqliteStore.open``); then N runs are bulk-inserted with
   plain ``sqlite3`` into ``durable_runs``, in one transaction (not timed): 10 workflows,
   1,000 concurrency keys (a third of the runs have none), states as a busy system has them
   (80 % completed, 10 % failed, 5 % cancelled, 4 % queued, 1 % running), one key ("hot")
   on a fifth of the runs, ids
   ``run-<12 hex>``, created 10 ms apart with every third run sharing its predecessor's
   ``created_at`` (ties, which the keyset cursor must order by id). No journal rows: the
   list and the counts never read the journal. No ``ANALYZE``: the store never runs it, so
   the plans are the ones SQLite picks without statistics.
2. Each shape (below) runs ``--repeats`` times (default 21) through the store's own API
   (``list_runs(limit=50, ...)`` / ``count_runs(...)``, the database thread hop included);
   the table shows the median, in milliseconds.

``--plans`` prints SQLite's ``EXPLAIN QUERY PLAN`` of every shape (at the largest size).
Figures and plans: docs/list-queries.md.

Run: ``python scripts/bench_list.py`` (about a minute); ``--sizes 2000 --repeats 3`` takes a
second or two.
"""

from __future__ import annotations

import argparse
import random
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from durable._clock import FakeClock  # noqa: E402
from durable._types import RunState  # noqa: E402
from durable.store._sqlite import (  # noqa: E402
    PROBE_CAP,
    SqliteStore,
    count_runs_query,
    list_runs_statement,
)

START = 1_700_000_000.0
WORKFLOWS = [f"wf.{i}" for i in range(10)]
STATES = ([RunState.COMPLETED] * 80 + [RunState.FAILED] * 10 + [RunState.CANCELLED] * 5
          + [RunState.QUEUED] * 4 + [RunState.RUNNING])
LIMIT = 50


def fill(path: Path, n: int, seed: int = 7) -> list[tuple[float, str]]:
    """Bulk-insert ``n`` runs; return their (created_at, id) in creation order."""
    rnd = random.Random(seed)
    rows: list[tuple[Any, ...]] = []
    made: list[tuple[float, str]] = []
    at = START
    for i in range(n):
        if i % 3 != 2:
            at += 0.01
        state = rnd.choice(STATES)
        # a running run holds its key (one running run per key): running runs have none here
        # and one key, "hot", that a fifth of the runs share (a resource every run touches)
        draw = rnd.random()
        key = None if state is RunState.RUNNING or draw < 1 / 3 else (
            "hot" if draw < 1 / 3 + 1 / 5 else f"slot-{rnd.randrange(1000)}")
        run_id = f"run-{rnd.getrandbits(48):012x}"
        running = state is RunState.RUNNING
        rows.append((run_id, rnd.choice(WORKFLOWS), "[]", key, state.value,
                     0 if state is RunState.QUEUED else i + 1,
                     0 if state is RunState.QUEUED else 1, at, at, at,
                     "w1" if running else None, at + 3600 if running else None))
        made.append((at, run_id))
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("BEGIN")
        conn.executemany(
            "INSERT INTO durable_runs (id, workflow, args, concurrency_key, state, epoch, "
            "attempt, run_at, created_at, updated_at, worker, lease_expires_at) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
        conn.execute("COMMIT")
    finally:
        conn.close()
    return made


def shapes(made: list[tuple[float, str]]) -> list[tuple[str, str, dict[str, Any]]]:
    """(name, "list" or "count", filters) of every shape measured."""
    middle = made[len(made) // 2]
    early = made[len(made) // 10][0]
    late = made[len(made) // 10 + max(1, len(made) // 100)][0]  # a window of ~1 % of the runs
    prefix = made[len(made) // 3][1][:6]  # "run-ab": about 1/256 of the runs
    q, f = RunState.QUEUED, RunState.FAILED
    return [
        ("newest (no filter)", "list", {}),
        ("state=failed", "list", {"state": f}),
        ("state=running (1 %)", "list", {"state": RunState.RUNNING}),
        ("workflow", "list", {"workflow": "wf.3"}),
        ("key", "list", {"key": "slot-42"}),
        ("workflow+key", "list", {"workflow": "wf.3", "key": "slot-42"}),
        ("state+workflow", "list", {"state": q, "workflow": "wf.3"}),
        ("state+key", "list", {"state": f, "key": "slot-42"}),
        ("state+workflow+key", "list", {"state": f, "workflow": "wf.3", "key": "slot-42"}),
        ("time window (~1 %)", "list", {"created_from": early, "created_to": late}),
        ("state+time window", "list", {"state": f, "created_from": early, "created_to": late}),
        ("page in the middle (before)", "list", {"before": middle}),
        ("state+before", "list", {"state": f, "before": middle}),
        ("workflow+before", "list", {"workflow": "wf.3", "before": middle}),
        ("id prefix (~1/256)", "list", {"id_prefix": prefix}),
        ("id prefix, one run", "list", {"id_prefix": middle[1]}),
        ("state+id prefix", "list", {"state": f, "id_prefix": prefix}),
        ("id prefix of every run", "list", {"id_prefix": "run-"}),
        ("id prefix (~1/16)", "list", {"id_prefix": prefix[:5]}),
        ("state=completed+one run", "list", {"state": RunState.COMPLETED,
                                             "id_prefix": middle[1]}),
        ("state=completed+no match", "list", {"state": RunState.COMPLETED,
                                              "id_prefix": "zzz"}),
        ("before+every run's prefix", "list", {"before": middle, "id_prefix": "run-"}),
        ("hot key (1/5 of the runs)", "list", {"key": "hot"}),
        ("state=running+hot key", "list", {"state": RunState.RUNNING, "key": "hot"}),
        ("state=queued+hot key", "list", {"state": q, "key": "hot"}),
        ("workflow+hot key", "list", {"workflow": "wf.3", "key": "hot"}),
        ("no such workflow+hot key", "list", {"workflow": "wf.none", "key": "hot"}),
        ("state+workflow+hot key", "list", {"state": f, "workflow": "wf.3", "key": "hot"}),
        ("state+no such workflow+hot", "list", {"state": f, "workflow": "wf.none",
                                                "key": "hot"}),
        ("counts", "count", {}),
        ("counts by workflow", "count", {"workflow": "wf.3"}),
        ("counts by key", "count", {"key": "slot-42"}),
        ("counts by workflow+key", "count", {"workflow": "wf.3", "key": "slot-42"}),
        ("counts by hot key", "count", {"key": "hot"}),
    ]


async def median_ms(call: Callable[[], Awaitable[object]], repeats: int) -> float:
    await call()  # warm the page cache and the statement cache
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        await call()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def plan(path: Path, kind: str, filters: dict[str, Any]) -> list[str]:
    conn = sqlite3.connect(path)
    try:
        # a list's statement as the store picks it (with an id prefix: which index leads)
        query, params = (list_runs_statement(conn, PROBE_CAP, **filters)
                         if kind == "list" else count_runs_query(**filters))
        return [row[3] for row in conn.execute("EXPLAIN QUERY PLAN " + query,
                                               params | {"limit": LIMIT})]
    finally:
        conn.close()


async def measure(size: int, repeats: int, folder: Path, want_plans: bool
                  ) -> tuple[dict[str, float], dict[str, list[str]]]:
    path = folder / f"list-{size}.db"
    store = SqliteStore(str(path), clock=FakeClock(START))
    await store.open()
    await store.aclose()
    made = fill(path, size)
    store = SqliteStore(str(path), clock=FakeClock(START + size))
    await store.open()
    figures: dict[str, float] = {}
    plans: dict[str, list[str]] = {}
    try:
        for name, kind, filters in shapes(made):
            if kind == "list":
                def call(f: dict[str, Any] = filters) -> Awaitable[object]:
                    return store.list_runs(limit=LIMIT, **f)
            else:
                def call(f: dict[str, Any] = filters) -> Awaitable[object]:
                    return store.count_runs(**f)
            figures[name] = await median_ms(call, repeats)
            if want_plans:
                plans[name] = plan(path, kind, filters)
    finally:
        await store.aclose()
    return figures, plans


CONSOLE_PATHS = [
    ("GET /runs (first page, counts)", "/runs"),
    ("GET /runs?state=failed", "/runs?state=failed"),
    ("GET /runs?workflow&key", "/runs?workflow=wf.3&key=slot-42"),
    ("GET /live/runs (the 2 s refresh)", "/live/runs"),
    ("GET /api/runs?q=<prefix>", "/api/runs?q=run-ab"),
    ("GET /api/status?workflow&key", "/api/status?workflow=wf.3&key=slot-42"),
]


async def measure_console(size: int, repeats: int, folder: Path) -> dict[str, float]:
    """The console's pages over real HTTP on loopback (Hypercorn, httpx), at ``size`` runs."""
    import httpx

    from durable import Client
    from durable.console import bind_socket, create_app, serve

    path = folder / f"list-{size}.db"
    store = SqliteStore(str(path), clock=FakeClock(START + size))
    await store.open()
    figures: dict[str, float] = {}
    try:
        sock = bind_socket("127.0.0.1", 0)
        app = create_app(Client(store))
        async with anyio.create_task_group() as tg:
            url = await tg.start(serve, app, sock)
            async with httpx.AsyncClient(base_url=url, timeout=30) as http:
                for name, target in CONSOLE_PATHS:
                    async def call(t: str = target) -> object:
                        response = await http.get(t)
                        response.raise_for_status()
                        return response
                    figures[name] = await median_ms(call, repeats)
            tg.cancel_scope.cancel()
    finally:
        await store.aclose()
    return figures


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,100000",
                        help="numbers of runs, comma-separated (default 1000,100000)")
    parser.add_argument("--repeats", type=int, default=21, help="timed calls per shape")
    parser.add_argument("--console", action="store_true",
                        help="also time the console's pages over HTTP (needs the console "
                             "extra)")
    parser.add_argument("--plans", action="store_true",
                        help="print each shape's query plan (at the largest size)")
    args = parser.parse_args()
    try:
        sizes = [int(s) for s in args.sizes.split(",")]
    except ValueError:
        print(f"bench_list: --sizes must be whole numbers, e.g. 1000,100000, not "
              f"{args.sizes!r}", file=sys.stderr)
        return 2
    if not sizes or min(sizes) < 100 or args.repeats < 1:
        print("bench_list: each size must be at least 100 and --repeats at least 1",
              file=sys.stderr)
        return 2
    results: dict[int, dict[str, float]] = {}
    plans: dict[str, list[str]] = {}
    with tempfile.TemporaryDirectory(prefix="durable-bench-list-") as tmp:
        for size in sizes:
            results[size], found = await measure(size, args.repeats, Path(tmp),
                                                 args.plans and size == max(sizes))
            plans = found or plans
            if args.console:
                results[size].update(await measure_console(size, args.repeats, Path(tmp)))
    print(f"SQLite {sqlite3.sqlite_version}, limit {LIMIT}, median of {args.repeats} "
          "calls, ms")
    names = list(results[sizes[0]])
    width = max(len(n) for n in names)
    print(f"| {'shape':<{width}} | " + " | ".join(f"{s:>9,} runs" for s in sizes) + " |")
    print(f"|{'-' * (width + 2)}|" + "|".join("-" * 16 for _ in sizes) + "|")
    for name in names:
        print(f"| {name:<{width}} | "
              + " | ".join(f"{results[s][name]:>14.3f}" for s in sizes) + " |")
    for name, steps in plans.items():
        print(f"\n{name}:")
        for step in steps:
            print(f"    {step}")
    return 0


if __name__ == "__main__":
    sys.exit(anyio.run(main))
