"""Crash → resumed: SIGKILL a worker process mid-run, time until another worker claims it.

Issue 10, target 4. For each kill, on one SQLite file (WAL, ``synchronous=NORMAL``):

1. A *victim* worker process (this script with ``--victim``) claims a fresh run whose only
   step never ends in the victim (it waits forever), so the run is held mid-step.
2. A *taker* worker starts in this process (the engine's defaults: 1 s renewal, sweep every
   min(lease / 2, 1 s), liveness probe every 0.25 s), with the same lease.
3. After a random pause of 0 to 1 s (a crash is not in step with the taker's probes), the
   victim is SIGKILLed; the time is read on the store's clock just before the kill.
4. The figure is the ``run_claimed`` entry of the new attempt (its ``at``, on the same
   clock) minus the kill: SIGKILL → the new attempt's claim. The taker then finishes the
   run (the step returns at once outside the victim).

Three rows, in the same run:

- **liveness**: the victim holds its lock (durable/_liveness.py); the taker finds it dead at
  its next probe and recovers the run by ``recover_dead``, whatever the lease.
- **lease only** (the baseline, as before liveness and as on PostgreSQL): the victim holds
  no lock (its store's ``liveness_dir`` returns None), so the run waits for its lease to
  lapse and the stale sweep.
- **PostgreSQL, lease only** (``--backends`` includes ``postgres``, the default; a fresh schema
  on ``--pg-url``, dropped at the end; an unreachable server skips the row with a one-line
  note): the same kill with the baseline's lease; times on the server's clock.

Each takeover is checked: in the liveness row the run's ``run_recovered`` entry says the
worker died and the claim came before the old lease's expiry; in the baseline row it came
after. ``OK`` or ``FAILED`` (exit status 1).

Run: ``python scripts/bench_takeover.py`` (20 kills with a 30 s lease, then 2 lease-only
kills with the same lease on each backend: about 3 minutes); ``--quick`` for a few seconds
(3 kills, 1 lease-only kill with a 2 s lease); ``--json`` for machine-readable output;
``--backends sqlite`` for SQLite only. Figures: docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import anyio

SCRIPT = Path(__file__).resolve()
ROOT = SCRIPT.parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import durable  # noqa: E402
import durable.testing  # noqa: E402
from durable.store import store_from_url  # noqa: E402

VICTIM_ENV = "DURABLE_BENCH_TAKEOVER_VICTIM"
rng = random.Random(10)
registry = durable.Registry()


@durable.activity("bench.takeover.hold", on_doubt="retry", registry=registry)
async def hold(ctx: durable.ActivityContext) -> str:
    if os.environ.get(VICTIM_ENV):
        await anyio.sleep_forever()  # held mid-step until the SIGKILL
    return "resumed"


@durable.workflow("bench.takeover", registry=registry)
async def takeover(ctx: durable.WorkflowContext) -> str:
    return str(await hold(ctx))


# -- the victim process ---------------------------------------------------------------------
async def victim(url: str, lease: float, liveness: bool) -> None:
    store = store_from_url(url)
    if not liveness:
        store.liveness_dir = lambda: None  # type: ignore[method-assign]  # as on PostgreSQL
    await store.open()
    try:
        worker = durable.Worker(store, registry=registry, concurrency=1, lease=lease,
                                poll_interval=0.01, worker_id=f"victim:{os.getpid()}")
        await worker.run()
    finally:
        await store.aclose()


# -- the measurement ------------------------------------------------------------------------
def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    rank = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[rank]


def start_victim(url: str, lease: float, liveness: bool, log: Path) -> subprocess.Popen[bytes]:
    """The victim worker process, in this script's process group (so a test that kills the
    group kills the victims too), output appended to ``log``."""
    env = dict(os.environ, **{VICTIM_ENV: "1"})
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    args = [sys.executable, str(SCRIPT), "--victim", url, "--lease", str(lease)]
    if not liveness:
        args.append("--no-liveness")
    with open(log, "ab") as out:
        return subprocess.Popen(args, cwd=ROOT, env=env,
                                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)


async def one_kill(client: durable.Client, url: str, run_id: str, lease: float,
                   liveness: bool, log: Path) -> dict[str, Any]:
    proc = start_victim(url, lease, liveness, log)
    try:
        await client.start("bench.takeover", id=run_id)
        with anyio.fail_after(60):
            while True:
                before = await client.store.get_run(run_id)
                if before is not None and before.state.value == "running":
                    break
                await anyio.sleep(0.005)
        assert before.lease_expires_at is not None
        async with durable.testing.running_worker(client, registry=registry, lease=lease,
                                                  concurrency=1):
            # a crash comes at any moment: not in step with the taker's probes or renewals
            await anyio.sleep(rng.uniform(0.0, 1.0))
            killed_at = await client.store.now()  # the clock the journal's times are on
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
            with anyio.fail_after(lease * 2 + 30):
                while True:
                    run = await client.store.get_run(run_id)
                    if run is not None and run.epoch > before.epoch:
                        break
                    await anyio.sleep(0.002)
            done = await client.wait(run_id, timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    journal = await client.store.journal(run_id)
    [claim] = [e for e in journal if e.kind.value == "run_claimed" and e.epoch == run.epoch]
    recovered = [e for e in journal if e.kind.value == "run_recovered"]
    died = bool(recovered) and bool((recovered[-1].data or {}).get("worker_died"))
    return {"run": run_id, "seconds": claim.at - killed_at, "worker_died": died,
            "before_lease_expired": claim.at < before.lease_expires_at,
            "completed": done.state.value == "completed" and done.result == "resumed"}


ROWS = (("liveness", "liveness (the kernel's lock)", "sqlite", True),
        ("lease_only", "lease only (baseline)", "sqlite", False),
        ("postgres_lease", "PostgreSQL: lease only", "postgres", False))


async def measure(kills: int, lease: float, baseline_kills: int, baseline_lease: float,
                  folder: Path, pg_url: str | None) -> dict[str, Any]:
    urls = {"sqlite": f"sqlite:///{folder / 'takeover.db'}", "postgres": pg_url}
    rows: dict[str, Any] = {}
    problems: list[str] = []
    for name, _, backend, liveness in ROWS:
        url = urls[backend]
        if url is None:
            continue
        n, row_lease = (kills, lease) if liveness else (baseline_kills, baseline_lease)
        async with durable.Client.connect(url, registry=registry) as client:
            samples = [await one_kill(client, url, f"{name}-{i}", row_lease, liveness,
                                      folder / "victims.log") for i in range(n)]
        seconds = [s["seconds"] for s in samples]
        for s in samples:
            if not s["completed"]:
                problems.append(f"{s['run']}: not completed after the takeover")
            if s["worker_died"] != liveness or s["before_lease_expired"] != liveness:
                problems.append(f"{s['run']}: taken over by the wrong path ({s})")
        rows[name] = {"backend": backend, "kills": n, "lease": row_lease,
                      "median_s": statistics.median(seconds),
                      "p99_s": percentile(seconds, 0.99), "max_s": max(seconds),
                      "min_s": min(seconds), "samples": seconds}
    return {"rows": rows, "problems": problems, "check": "FAILED" if problems else "OK"}


def postgres_schema(server: str) -> tuple[str | None, str | None]:
    """(a store URL in a fresh schema, None), or (None, why the PostgreSQL row is skipped)."""
    try:
        import psycopg
    except ImportError:
        return None, "psycopg is not installed"
    try:
        with psycopg.connect(server, connect_timeout=3):
            pass
    except psycopg.Error as exc:
        return None, f"no PostgreSQL server reachable at {server}: {' '.join(str(exc).split())}"
    return f"{server}?schema=durable_takeover_{uuid.uuid4().hex[:10]}", None


def drop_schema(url: str) -> None:
    import psycopg
    from psycopg import sql

    server, _, query = url.partition("?schema=")
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(query)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--lease", type=float, default=30.0)
    parser.add_argument("--baseline-kills", type=int, default=2)
    parser.add_argument("--baseline-lease", type=float, default=None,
                        help="lease of the lease-only row (default: --lease)")
    parser.add_argument("--quick", action="store_true", help="3 kills, a 2 s baseline lease")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--backends", default="sqlite,postgres",
                        help="sqlite always; postgres adds its lease-only row")
    parser.add_argument("--pg-url", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--victim", help=argparse.SUPPRESS)
    parser.add_argument("--no-liveness", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.victim:
        anyio.run(victim, args.victim, args.lease, not args.no_liveness)
        return 0
    if args.quick:
        args.kills, args.baseline_kills = 3, 1
        args.baseline_lease = args.baseline_lease or 2.0
    baseline_lease = args.baseline_lease or args.lease
    if args.kills < 1 or args.baseline_kills < 1 or args.lease <= 0 or baseline_lease <= 0:
        print("bench_takeover: kills must be at least 1 and leases positive", file=sys.stderr)
        return 2
    skipped: dict[str, str] = {}
    pg_url = None
    if "postgres" in args.backends.split(","):
        pg_url, why = postgres_schema(args.pg_url)
        if why is not None:
            skipped["postgres"] = why
            print(f"bench_takeover: PostgreSQL row skipped: {why}", file=sys.stderr)
    started = time.monotonic()
    try:
        with tempfile.TemporaryDirectory(prefix="durable-takeover-") as tmp:
            report = anyio.run(measure, args.kills, args.lease, args.baseline_kills,
                               baseline_lease, Path(tmp), pg_url)
    finally:
        if pg_url is not None:
            drop_schema(pg_url)
    report["skipped"] = skipped
    report.update(machine=f"{platform.machine()}, {os.cpu_count()} cores",
                  python=platform.python_version(), durable=durable.__version__,
                  elapsed_s=round(time.monotonic() - started, 1))
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print("crash -> resumed: SIGKILL -> the new attempt's claim")
        print(f"{'takeover':<34} {'kills':>5} {'lease':>7} {'median':>9} {'p99':>9} "
              f"{'max':>9}")
        for name, label, _, _ in ROWS:
            if name not in report["rows"]:
                continue
            r = report["rows"][name]
            print(f"{label:<34} {r['kills']:>5} {r['lease']:>6.0f}s {_t(r['median_s']):>9} "
                  f"{_t(r['p99_s']):>9} {_t(r['max_s']):>9}")
        print(f"check: {report['check']}")
        for problem in report["problems"]:
            print(f"  {problem}")
    return 0 if report["check"] == "OK" else 1


def _t(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms" if seconds < 10 else f"{seconds:.1f} s"


if __name__ == "__main__":
    raise SystemExit(main())
