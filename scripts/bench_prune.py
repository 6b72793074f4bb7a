"""Retention at scale: how long ``durable prune`` holds the write lock, and what another
writer waits meanwhile (SQLite; PostgreSQL too with ``--pg-url``).

On a fresh database (SQLite: a file in a temporary folder, the store's defaults):

1. ``--runs`` finished runs (default 100,000) are written with their journals (three entries
   each: created, claimed, ended) by ``durable/store/_seed.py``, in one transaction (not
   timed): 70 % ended 40 days ago (to prune), 30 % a day ago (kept).
2. **Idle**: a second store on the same database (as another worker process would have its
   own connection) starts ``--starts`` runs one after the other (``Store.create_run``, one
   transaction each); each start's latency is kept.
3. **During prune**: ``prune(store, 30 days)`` runs (batches of ``--batch`` runs, one
   transaction each; each batch timed) while the second store starts runs the same way,
   until the prune ends.

The table gives the prune's total time and rate, its batches' durations (the time a batch
holds the write lock, thread hop included) and the starts' latencies idle and during the
prune, as p50 / p99 / max, and their ratio. Figures: docs/benchmarks.md ("Retention").

Run: ``python scripts/bench_prune.py`` (about 15 s on a quiet machine); ``--runs 3000
--starts 50`` takes a second.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from durable._clock import WallClock  # noqa: E402
from durable._retention import prune  # noqa: E402
from durable._types import NewRun, RunState  # noqa: E402
from durable.store import Store, store_from_url  # noqa: E402
from durable.store._seed import Seed, seed_finished_runs  # noqa: E402

DAY = 86400.0


def seeds(n: int, now: float) -> list[Seed]:
    return [Seed(f"seed-{i:07d}", "bench.flow",
                 RunState.COMPLETED if i % 10 < 8 else RunState.FAILED,
                 now - (40 if i % 10 < 7 else 1) * DAY + i * 1e-4)
            for i in range(n)]


def stats(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    if not ordered:
        return {"n": 0, "p50": 0.0, "p99": 0.0, "max": 0.0}
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return {"n": len(ordered), "p50": statistics.median(ordered), "p99": p99,
            "max": ordered[-1]}


async def start_one(store: Store, name: str) -> float:
    began = time.perf_counter()
    await store.create_run(NewRun(name, "bench.flow", [], None, 0.0))
    return (time.perf_counter() - began) * 1000


async def measure(url: str, runs: int, starts: int, batch: int) -> dict[str, Any]:
    clock = WallClock()
    pruner, writer = store_from_url(url, clock=clock), store_from_url(url, clock=clock)
    await pruner.open()
    await writer.open()
    try:
        now = clock.now()
        await seed_finished_runs(pruner, seeds(runs, now))
        idle = [await start_one(writer, f"idle-{i}") for i in range(starts)]

        batches: list[float] = []
        original = pruner.prune_runs

        async def timed(state: RunState, cutoff: float, limit: int) -> Any:
            began = time.perf_counter()
            try:
                return await original(state, cutoff, limit)
            finally:
                batches.append((time.perf_counter() - began) * 1000)

        pruner.prune_runs = timed  # type: ignore[method-assign]
        during: list[float] = []
        done = anyio.Event()

        async def write() -> None:
            i = 0
            while not done.is_set():
                during.append(await start_one(writer, f"during-{i}"))
                i += 1

        async with anyio.create_task_group() as tg:
            tg.start_soon(write)
            began = time.perf_counter()
            pruned = await prune(pruner, 30 * DAY, batch=batch)
            elapsed = time.perf_counter() - began
            done.set()
        left = await pruner.count_runs()
    finally:
        await writer.aclose()
        await pruner.aclose()
    return {"runs": runs, "pruned": pruned, "kept": sum(left.values()) - len(idle) - len(during),
            "seconds": elapsed, "runs_per_s": pruned / elapsed if elapsed else 0.0,
            "entries_per_s": 3 * pruned / elapsed if elapsed else 0.0,
            "batch": batch, "batches_ms": stats(batches), "idle_start_ms": stats(idle),
            "during_start_ms": stats(during)}


def table(name: str, r: dict[str, Any]) -> str:
    def row(label: str, s: dict[str, float]) -> str:
        return (f"| {label} | {s['n']:,} | {s['p50']:.2f} | {s['p99']:.2f} | "
                f"{s['max']:.2f} |")

    idle, during = r["idle_start_ms"], r["during_start_ms"]
    ratio = during["p99"] / idle["p99"] if idle["p99"] else 0.0
    return "\n".join([
        f"{name}: {r['runs']:,} finished runs, {r['pruned']:,} pruned in {r['seconds']:.2f} s "
        f"({r['runs_per_s']:,.0f} runs/s, {r['entries_per_s']:,.0f} journal entries/s), "
        f"{r['kept']:,} kept",
        "",
        "| | count | p50 ms | p99 ms | max ms |",
        "|---|---:|---:|---:|---:|",
        row(f"prune batch ({r['batch']} runs, one transaction)", r["batches_ms"]),
        row("a start by another store, idle", idle),
        row("a start by another store, during the prune", during),
        "",
        f"a start's p99 during the prune / idle: {ratio:.1f}x",
    ])


async def main(args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as folder:
        results["sqlite"] = await measure(f"sqlite:///{Path(folder) / 'prune.db'}", args.runs,
                                          args.starts, args.batch)
    if args.pg_url:
        results["postgres"] = await measure(args.pg_url, args.runs, args.starts, args.batch)
    load = os.getloadavg()
    print(f"bench_prune: load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} "
          f"({os.cpu_count()} cores)\n")
    for name, r in results.items():
        print(table(name, r) + "\n")
    return {"load": load, **results}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=100_000, help="finished runs seeded")
    parser.add_argument("--starts", type=int, default=300,
                        help="starts timed on the idle database")
    parser.add_argument("--batch", type=int, default=500, help="runs per prune batch")
    parser.add_argument("--pg-url", help="also on this PostgreSQL store URL (a schema of "
                                         "its own: ?schema=...; it must be empty)")
    parser.add_argument("--json", metavar="FILE", help="write the figures as JSON")
    options = parser.parse_args()
    figures = anyio.run(main, options)
    if options.json:
        Path(options.json).write_text(json.dumps(figures, indent=2))
