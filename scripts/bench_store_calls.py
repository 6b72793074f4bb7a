"""SQLite's own time in a sequential run, through the store's API alone (no engine).

The calls a worker makes for ``--runs`` five-step runs executed one at a time (issue 10,
target 5), made directly on a :class:`~durable.store.SqliteStore`: the read of what to
claim (``claimable``), the claim riding on the first step's start and carrying the
previous run's finish (``claim_with``), four appends of a step's completion and the next
step's start, and the last run's ``finish``. Every ``sqlite3`` call of the store's
connections in this thread is timed and grouped by statement (a ``COMMIT`` by the statement
before it, so the claim's transaction stands apart from the steps'); the wall time of the
loop is the store's Python and SQLite together. ``--drop-index NAME`` (repeatable) drops an
index of ``durable_runs`` from the fresh file first: what a state change writes, measured by
taking some of it away.

Run: ``python scripts/bench_store_calls.py`` (``--json`` for machine-readable output).
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import anyio

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import bench  # noqa: E402  (scripts/bench.py: its workflow, and its checkout on sys.path)

import durable  # noqa: E402
from durable._types import EntryKind, Fence, Finish, JournalWrite, RunState  # noqa: E402

STEPS = bench.STEPS
WORKFLOW = "bench.steps"  # bench.steps_workflow: STEPS idempotent no-op steps
ACTIVITY = "bench.noop"


class _Timing:
    """The time of each statement kind (its first words) in this thread, while ``on``."""

    def __init__(self) -> None:
        self.on = False
        self.last = ""
        self.figures: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])

    def add(self, key: str, seconds: float) -> None:
        if self.on and threading.current_thread() is threading.main_thread():  # not the
            # database thread's (its WAL checkpoints run beside the loop)
            figure = self.figures[key]
            figure[0] += 1
            figure[1] += seconds


TIMING = _Timing()


def _kind(sql: str) -> str:
    """A statement's name: its first comment line, or its first words."""
    first = sql.strip().splitlines()[0]
    if first.startswith("--"):
        return first.lstrip("- ")[:60]
    return " ".join(sql.split()[:4])


class _TimedConnection(sqlite3.Connection):
    def execute(self, sql: str, *args: Any) -> sqlite3.Cursor:  # type: ignore[override]
        t0 = time.perf_counter()
        try:
            return super().execute(sql, *args)
        finally:
            seconds = time.perf_counter() - t0  # before the statement's name is made
            if threading.current_thread() is threading.main_thread():
                kind = _kind(sql)
                TIMING.add(kind, seconds)
                TIMING.last = kind

    def commit(self) -> None:
        t0 = time.perf_counter()
        try:
            super().commit()
        finally:
            TIMING.add(f"COMMIT after: {TIMING.last[:40]}", time.perf_counter() - t0)


def _step_entries(step: int) -> list[JournalWrite]:
    """A step's completion (the one before) and the next step's start, as the engine makes
    them for an idempotent activity (its completion deferred to the next write)."""
    done = JournalWrite(EntryKind.STEP_COMPLETED, step - 1, None, ACTIVITY, 1,
                        {"result": step - 1, "summary": None, "ended_at": time.time()})
    started = JournalWrite(EntryKind.STEP_STARTED, step, None, ACTIVITY, 1,
                           {"args": [step]})
    return [done, started]


async def measure(runs: int, drop: list[str]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="durable-calls-") as tmp:
        path = Path(tmp) / "calls.db"
        store = durable.store_from_url(f"sqlite:///{path}")
        await store.open()
        await store.aclose()
        with sqlite3.connect(path) as conn:
            for name in drop:
                conn.execute(f'DROP INDEX "{name}"')
        real_connect = sqlite3.connect

        def timed_connect(*args: Any, **kwargs: Any) -> sqlite3.Connection:
            kwargs.setdefault("factory", _TimedConnection)
            return real_connect(*args, **kwargs)

        sqlite3.connect = timed_connect  # type: ignore[assignment]
        try:
            store = durable.store_from_url(f"sqlite:///{path}")
            await store.open()
        finally:
            sqlite3.connect = real_connect
        try:
            client = durable.Client(store, registry=bench.REGISTRY)
            for i in range(runs):
                await client.start(bench.steps_workflow, STEPS, False, id=f"calls-{i:06d}")
            workflows = [WORKFLOW]
            carried: tuple[Finish, ...] = ()
            TIMING.on = True
            t0 = time.perf_counter()
            for _ in range(runs):
                [run] = await store.claimable("bench", 1, workflows=workflows)
                first = [JournalWrite(EntryKind.STEP_STARTED, 1, None, ACTIVITY, 1,
                                      {"args": [1]})]
                outcome = await store.claim_with("bench", 30.0, run.id, run.attempt + 1,
                                                 first, carried, workflows)
                assert outcome.appended and outcome.run is not None, outcome
                fence = Fence(outcome.run.id, outcome.run.epoch)
                for step in range(2, STEPS + 1):
                    assert await store.append(fence, _step_entries(step))
                last = _step_entries(STEPS + 1)[0]
                carried = (Finish(fence, RunState.COMPLETED, STEPS, None, (last,)),)
            finish = carried[0]
            assert await store.finish(finish.fence, finish.state, result=finish.result,
                                      entries=finish.entries)
            seconds = time.perf_counter() - t0
            TIMING.on = False
            counts = await store.count_runs()
        finally:
            await store.aclose()
    if counts.get(RunState.COMPLETED) != runs:
        raise SystemExit(f"expected {runs} completed runs, found {counts}")
    steps = runs * STEPS
    statements = {key: {"per_run": n / runs, "us_each": 1e6 * t / n,
                        "us_per_step": 1e6 * t / steps}
                  for key, (n, t) in sorted(TIMING.figures.items(), key=lambda kv: -kv[1][1])}
    sqlite_s = sum(t for _, t in TIMING.figures.values())
    return {"runs": runs, "steps_per_run": STEPS, "dropped": drop,
            "us_per_step": 1e6 * seconds / steps,
            "sqlite_us_per_step": 1e6 * sqlite_s / steps,
            "steps_per_s": steps / seconds, "statements": statements}


def render(report: dict[str, Any]) -> str:
    lines = [
        f"{report['runs']} runs of {report['steps_per_run']} steps through the store's API "
        f"alone (SQLite{', without ' + ', '.join(report['dropped']) if report['dropped'] else ''})",
        f"  per step: {report['us_per_step']:.1f} us in all, "
        f"{report['sqlite_us_per_step']:.1f} us in sqlite3's calls "
        f"({report['steps_per_s']:,.0f} steps/s)",
    ]
    for key, fig in report["statements"].items():
        lines.append(f"  {fig['per_run']:5.2f} per run  {fig['us_each']:7.1f} us each  "
                     f"{fig['us_per_step']:6.1f} us per step  {key}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1000, help="runs (1,000)")
    parser.add_argument("--drop-index", action="append", default=[], metavar="NAME",
                        help="drop this index of the fresh file first (repeatable)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    try:
        report = anyio.run(measure, args.runs, args.drop_index)
    except sqlite3.OperationalError as exc:
        print(f"bench_store_calls: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(report, indent=2) if args.json else render(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
