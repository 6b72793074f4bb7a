"""Where a sequential run's time goes: its steps against the run's own cost (SQLite).

Runs of 1 step and of 9 steps (``--runs`` each, one at a time, ``scripts/bench.py``'s
engine workload with the store's sqlite3 calls timed), after a warm-up of each that is not
counted, alternating ``--repeat`` times; from
the medians, per step and per run besides its steps: the wall time, the part of it in
sqlite3's calls (in the event loop's thread), and the CPU time of the process.

Run: ``python scripts/bench_run_split.py`` (``--json`` for machine-readable output).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import anyio

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import bench  # noqa: E402  (scripts/bench.py: the engine workload)

SHORT, LONG = 1, 9
WARM_UP = 20
"""Runs of each length made, and not counted, before the measured ones."""
FIGURES = ("wall_ms", "sqlite_ms", "cpu_ms")


async def measure(runs: int, repeat: int) -> dict[str, Any]:
    bench.configure_logging()
    per_run: dict[int, list[dict[str, float]]] = {SHORT: [], LONG: []}
    with tempfile.TemporaryDirectory(prefix="durable-split-") as tmp:
        for steps in (SHORT, LONG):  # warm-up, not counted: the first runs of a process
            bench.STEPS = steps      # cost more (imports, caches, the first database)
            await bench.run_engine(f"sqlite:///{Path(tmp) / f'warm-{steps}.db'}",
                                   min(runs, WARM_UP), concurrency=1, start_at_once=False,
                                   label=f"warm{steps}", timed=True)
        for i in range(repeat):
            for steps in (SHORT, LONG):
                bench.STEPS = steps
                url = f"sqlite:///{Path(tmp) / f'{steps}-{i}.db'}"
                r = await bench.run_engine(url, runs, concurrency=1, start_at_once=False,
                                           label=f"split{steps}-{i}", timed=True)
                per_run[steps].append({"wall_ms": r["ms_per_step"] * steps,
                                       "sqlite_ms": r["sqlite_ms_per_step"] * steps,
                                       "cpu_ms": r["cpu_ms_per_step"] * steps})
    med = {steps: {k: statistics.median(row[k] for row in rows) for k in FIGURES}
           for steps, rows in per_run.items()}
    step = {k: (med[LONG][k] - med[SHORT][k]) / (LONG - SHORT) for k in FIGURES}
    run = {k: med[SHORT][k] - SHORT * step[k] for k in FIGURES}
    return {"runs": runs, "repeat": repeat, "per_run_of": {str(k): v for k, v in med.items()},
            "per_step": step, "per_run_besides_steps": run}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=300, help="runs of each length (300)")
    parser.add_argument("--repeat", type=int, default=3, help="alternations (3)")
    parser.add_argument("--backend", choices=["asyncio", "trio"], default="asyncio")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.runs < 1 or args.repeat < 1:
        parser.error("--runs and --repeat must be at least 1")
    report = anyio.run(measure, args.runs, args.repeat, backend=args.backend)
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"sequential runs of {SHORT} and {LONG} steps, {args.runs} each, "
          f"{args.repeat} alternations, {args.backend} (medians)")
    for label, key in (("per step", "per_step"),
                       ("per run besides its steps", "per_run_besides_steps")):
        f = report[key]
        print(f"  {label:<27} wall {f['wall_ms']:.3f} ms, of which sqlite3's calls "
              f"{f['sqlite_ms']:.3f} ms; CPU {f['cpu_ms']:.3f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
