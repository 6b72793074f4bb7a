"""Concurrent HTTP steps: N runs, each one step awaiting ``ctx.http.get`` on a loopback server.

The server (this script with ``--serve``, in its own process, asyncio streams) holds every
``/slow`` request until N of them are in flight at once, or until no new request has come
for ``--hold`` seconds, then answers them all; it records each request's arrival on
``time.monotonic()`` (CLOCK_MONOTONIC: one clock for every process of the host) and the
peak number in flight.

Two columns, measured one after the other in the same run, each on a fresh SQLite store
and one worker with ``concurrency=N``:

- **worker pool**: the worker's own transport (:class:`durable._pool.WorkerTransport`:
  ``http_connections`` per host, default the concurrency (at least 100), over small httpcore pools);
- **httpx default**: the same worker given ``transport=httpx.AsyncHTTPTransport()``, httpx's
  default limits (100 connections, one httpcore pool): the baseline.

And a third, the floor under both: **no engine**, the worker's transport alone: N
concurrent ``GET``s by one ``httpx.AsyncClient`` on ``WorkerTransport(N)``, started in the
worker's waves, under the worker's GC policy (as the worker's columns are), timed from their
start (where the columns above start at the claim) until they have all arrived, with the CPU
meanwhile; stopped at the first answer. Where the
worker's last request misses 1 s, this says whether httpx alone would have made it on the
same machine in the same run, and the difference is the engine's (claims, attempts, journal).

Printed for each: requests in flight at peak, the first and last arrival after the claim
returned (the worker claims all N in one statement and starts their attempts in waves),
when the last run finished, the full garbage collections between the claim and the last
request (the worker defers them while it runs: durable/_gc.py; ``--no-gc-policy`` runs the
workers with ``gc_policy=False``, CPython's defaults), the CPU time the benchmark's process
(the worker) used from the claim until the first request, the last request and the last run
finished (sampled every 5 ms: on a loaded machine it says how much of the wall time was this
process's own work), and how many pool waits the engine logged (``http_pool_wait``).
Targets: all N in flight at once, the first within 100 ms of the claim and the last within
1 s, with the worker pool.
``--repeat K`` measures the worker pool K times (a fresh store each) after the baseline and
prints each figure's range, and in how many of the K the targets were met; the load
average is printed before and after.

    PYTHONPATH=. python scripts/bench_http.py              # 1,000 runs, both columns
    PYTHONPATH=. python scripts/bench_http.py --repeat 5   # and four more of the worker pool
    PYTHONPATH=. python scripts/bench_http.py --runs 50 --json
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import datetime as dt
import gc
import json
import logging
import os
import platform
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import durable  # noqa: E402
from durable.store._base import watch_finishes  # noqa: E402

REGISTRY = durable.Registry()
TARGET_FIRST_MS = 100.0
TARGET_LAST_MS = 1000.0
CPU_SAMPLE = 0.005
"""Seconds between two samples of the process's CPU time during a measurement."""


# -- the loopback server (its own process) -----------------------------------------------
RESPONSE = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"


class Server:
    """Counts and holds ``/slow`` requests; a plain asyncio protocol, so that accepting and
    parsing a thousand connections costs the server little (the figures are the client's)."""

    def __init__(self, hold: float) -> None:
        self.hold = hold
        self.expect = 1
        self.arrivals: list[float] = []
        self.held: list[asyncio.Transport] = []
        self.peak = 0
        self.last = 0.0

    def answer_held(self) -> None:
        held, self.held = self.held, []
        body = b'{"ok": true}'
        for transport in held:
            if not transport.is_closing():
                transport.write(RESPONSE % (len(body), body))

    async def quiet_loop(self) -> None:
        while True:
            await asyncio.sleep(0.02)
            if self.held and time.monotonic() - self.last >= self.hold:
                self.answer_held()

    def request(self, target: str, transport: asyncio.Transport) -> None:
        if target.startswith("/slow"):
            now = time.monotonic()
            self.arrivals.append(now)
            self.last = now
            self.held.append(transport)
            self.peak = max(self.peak, len(self.held))
            if len(self.held) >= self.expect:
                self.answer_held()
            return
        if target.startswith("/reset"):
            self.expect = int(target.rsplit("=", 1)[1])
            self.arrivals, self.peak = [], 0
            body = b"{}"
        else:
            body = json.dumps({"arrivals": self.arrivals, "peak": self.peak}).encode()
        transport.write(RESPONSE % (len(body), body))


class _Connection(asyncio.Protocol):
    """HTTP/1.1 requests without bodies (GET), kept alive."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.buffer = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while b"\r\n\r\n" in self.buffer:
            head, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
            assert self.transport is not None
            self.server.request(head.split(b" ", 2)[1].decode(), self.transport)


async def serve(hold: float) -> None:
    server = Server(hold)
    loop = asyncio.get_running_loop()
    listener = await loop.create_server(lambda: _Connection(server), "127.0.0.1", 0,
                                        backlog=4096)
    port = listener.sockets[0].getsockname()[1]
    print(port, flush=True)
    quiet = asyncio.ensure_future(server.quiet_loop())
    try:
        await loop.run_in_executor(None, sys.stdin.read)  # until the benchmark closes stdin
    finally:
        quiet.cancel()
        listener.close()


@contextlib.contextmanager
def server_process(hold: float) -> Iterator[str]:
    proc = subprocess.Popen([sys.executable, __file__, "--serve", "--hold", str(hold)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        yield f"http://127.0.0.1:{port}"
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# -- the workload ------------------------------------------------------------------------
@durable.activity(name="bench_http.get", registry=REGISTRY,
                  retry=durable.RetryPolicy(max_tries=1))
async def get(ctx: durable.ActivityContext, url: str) -> int:
    response = await ctx.http.get(url)
    return response.status_code


@durable.workflow("bench_http.one", registry=REGISTRY)
async def one_request(ctx: Any, url: str) -> int:
    return int(await get(ctx, url))


WARNINGS: collections.Counter[str] = collections.Counter()


def _count(record: logging.LogRecord) -> bool:
    event = str(getattr(record, "event", record.getMessage()))
    WARNINGS[event] += 1
    return WARNINGS[event] <= 3


async def measure(base: str, runs: int, *, default_transport: bool,
                  workdir: Path, timeout: float, gc_policy: bool = True) -> dict[str, Any]:
    async with httpx.AsyncClient() as control:
        await control.get(f"{base}/reset?n={runs}")
    WARNINGS.clear()
    url = f"sqlite:///{workdir / f'http-{uuid.uuid4().hex[:8]}.db'}"
    store = durable.store_from_url(url)
    await store.open()
    transport = httpx.AsyncHTTPTransport() if default_transport else None
    try:
        client = durable.Client(store, registry=REGISTRY)
        for i in range(runs):
            await client.start(one_request, f"{base}/slow", id=f"http-{i:06d}")
        claimed_at: list[float] = []
        cpu: list[tuple[float, float]] = []  # (monotonic, process CPU) from the claim on
        original_claim = store.claim
        finished = 0
        done = anyio.Event()
        last_finish = 0.0

        async def claim(*args: Any, **kwargs: Any) -> list[durable.Run]:
            got = await original_claim(*args, **kwargs)
            if got and not claimed_at:
                claimed_at.append(time.monotonic())
                cpu.append((claimed_at[0], time.process_time()))
            return got

        def finish(fence: Any, ok: bool) -> None:
            nonlocal finished, last_finish
            finished += 1
            last_finish = time.monotonic()
            if finished >= runs:
                done.set()

        store.claim = claim  # type: ignore[method-assign]
        watch_finishes(store, finish)  # also those carried by the next run's claim
        worker = durable.Worker(store, registry=REGISTRY, concurrency=runs,
                                poll_interval=0.05, transport=transport, gc_policy=gc_policy)
        async def sample_cpu() -> None:
            while True:
                if cpu:
                    cpu.append((time.monotonic(), time.process_time()))
                await anyio.sleep(CPU_SAMPLE)

        with full_collections(lambda: bool(claimed_at)) as full_gcs:
            async with anyio.create_task_group() as tg:
                tg.start_soon(sample_cpu)
                await tg.start(worker.run)
                with anyio.move_on_after(timeout):
                    await done.wait()
                cpu.append((time.monotonic(), time.process_time()))
                worker.shutdown(grace=0)
                tg.cancel_scope.cancel()
        completed = (await store.count_runs()).get(durable.RunState.COMPLETED, 0)
    finally:
        await store.aclose()
        if transport is not None:
            await transport.aclose()
    figures = await _arrivals(base, runs, claimed_at[0] if claimed_at else None, cpu)
    figures.update({
        "completed": completed,
        "finished_s": (last_finish - claimed_at[0]) if finished and claimed_at else None,
        "cpu_to_finished_ms": _cpu_ms_until(cpu, last_finish) if finished else None,
        "full_gcs_to_last": _until(full_gcs, figures["last_at"]),
        "pool_waits_logged": WARNINGS["http_pool_wait"],
    })
    return figures


@contextlib.contextmanager
def full_collections(counting: Callable[[], bool]) -> Iterator[list[float]]:
    """When each full garbage collection of this process started, while ``counting()``."""
    starts: list[float] = []

    def on_gc(phase: str, info: dict[str, Any]) -> None:
        if phase == "start" and info["generation"] == 2 and counting():
            starts.append(time.monotonic())

    gc.callbacks.append(on_gc)
    try:
        yield starts
    finally:
        gc.callbacks.remove(on_gc)


def _until(moments: list[float], last_at: float | None) -> int | None:
    return None if last_at is None else sum(1 for t in moments if t <= last_at)


def _cpu_ms_until(cpu: list[tuple[float, float]], moment: float) -> float | None:
    """CPU of this process from the first sample (the claim) to the first sample at or after
    ``moment`` (an upper bound: the samples are CPU_SAMPLE apart, or later on a loaded
    machine)."""
    after = [c for t, c in cpu if t >= moment]
    return 1000 * (after[0] - cpu[0][1]) if cpu and after else None


async def _arrivals(base: str, runs: int, t0: float | None,
                    cpu: list[tuple[float, float]]) -> dict[str, Any]:
    """The server's record of one measurement: its requests against ``t0`` (the claim, or
    the start of the plain requests) and this process's CPU from ``t0`` to them."""
    async with httpx.AsyncClient() as control:
        stats = (await control.get(f"{base}/stats")).json()
    arrivals = sorted(stats["arrivals"])
    start = float("nan") if t0 is None else t0
    return {
        "runs": runs,
        "requests": len(arrivals),
        "peak_in_flight": stats["peak"],
        "first_ms": 1000 * (arrivals[0] - start) if arrivals else None,
        "last_ms": 1000 * (arrivals[-1] - start) if arrivals else None,
        "last_at": arrivals[-1] if arrivals else None,
        "cpu_to_first_ms": _cpu_ms_until(cpu, arrivals[0]) if arrivals else None,
        "cpu_to_last_ms": _cpu_ms_until(cpu, arrivals[-1]) if arrivals else None,
    }


async def measure_plain(base: str, runs: int, *, timeout: float,
                        gc_policy: bool = True) -> dict[str, Any]:
    """The floor under the worker's figures: the same requests and the same transport (the
    worker's, :class:`durable._pool.WorkerTransport`, ``runs`` connections per host) with
    no engine and no store: ``runs`` concurrent ``GET``s by one ``httpx.AsyncClient``,
    started in the worker's waves (``SPAWN_WAVE`` tasks, then a checkpoint), timed from
    their start (where the worker's columns start at the claim). Stopped at the first
    answer (the server answers only once all are in flight, or after ``--hold`` seconds
    without a new one): what is measured is how soon httpx alone has sent them on this
    machine, and its CPU meanwhile. Under the worker's GC policy when ``gc_policy`` (as
    the worker's columns are), else CPython's thresholds."""
    from durable._gc import worker_policy
    from durable._pool import WorkerTransport
    from durable._worker import SPAWN_WAVE

    async with httpx.AsyncClient() as control:
        await control.get(f"{base}/reset?n={runs}")
    cpu: list[tuple[float, float]] = []
    answered = anyio.Event()

    async def one(client: httpx.AsyncClient) -> None:
        await client.get(f"{base}/slow")
        answered.set()

    async def sample_cpu() -> None:
        while True:
            cpu.append((time.monotonic(), time.process_time()))
            await anyio.sleep(CPU_SAMPLE)

    with worker_policy(gc_policy), full_collections(lambda: True) as full_gcs:
        young = gc.get_threshold()[0]  # the collector's first threshold meanwhile
        async with httpx.AsyncClient(transport=WorkerTransport(runs),
                                     timeout=timeout) as client:
            async with anyio.create_task_group() as tg:
                t0 = time.monotonic()
                cpu.append((t0, time.process_time()))
                tg.start_soon(sample_cpu)
                for i in range(runs):
                    if i and i % SPAWN_WAVE == 0:
                        await anyio.lowlevel.checkpoint()
                    tg.start_soon(one, client)
                with anyio.move_on_after(timeout):
                    await answered.wait()
                cpu.append((time.monotonic(), time.process_time()))
                tg.cancel_scope.cancel()
    figures = await _arrivals(base, runs, t0, cpu)
    figures["full_gcs_to_last"] = _until(full_gcs, figures["last_at"])
    figures["gc_young_threshold"] = young
    return figures


def targets(row: dict[str, Any]) -> dict[str, bool]:
    arrived = row["first_ms"] is not None
    return {"all_in_flight": row["peak_in_flight"] >= row["runs"],
            "first_within_100_ms": arrived and row["first_ms"] <= TARGET_FIRST_MS,
            "last_within_1_s": arrived and row["last_ms"] <= TARGET_LAST_MS}


def met(row: dict[str, Any]) -> bool:
    return all(targets(row).values())


def fmt(value: Any, digits: int = 0) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return f"{value:,}"


def _load(values: list[float]) -> str:
    return " ".join(f"{v:.2f}" for v in values)


def report_text(report: dict[str, Any]) -> str:
    pool, base, plain = report["worker_pool"], report["httpx_default"], report["no_engine"]
    lines = [
        f"durable HTTP benchmark, {report['when']}: {report['cpus']} CPUs, Python "
        f"{report['python']}, httpx {report['httpx']}, httpcore {report['httpcore']}, "
        f"{report['backend']}, GC policy {'on' if report['gc_policy'] else 'off'}; "
        f"load average {_load(report['load_before'])} before, "
        f"{_load(report['load_after'])} after",
        f"{report['runs']} runs, one step each awaiting ctx.http.get(loopback /slow); the "
        f"server holds each request until {report['runs']} are in flight or "
        f"{report['hold']:g} s pass without a new one",
        "",
        f"{'':44}{'worker pool':>16}{'httpx default':>16}{'no engine':>16}",
    ]
    rows = [
        ("requests in flight at peak", "peak_in_flight", 0),
        ("requests received", "requests", 0),
        ("first request after the claim (ms)", "first_ms", 1),
        ("last request after the claim (ms)", "last_ms", 1),
        ("last run finished after the claim (s)", "finished_s", 2),
        ("CPU, claim to the first request (ms)", "cpu_to_first_ms", 0),
        ("CPU, claim to the last request (ms)", "cpu_to_last_ms", 0),
        ("CPU, claim to the last run finished (ms)", "cpu_to_finished_ms", 0),
        ("full GCs, claim to the last request", "full_gcs_to_last", 0),
        ("runs completed", "completed", 0),
        ("pool waits logged (http_pool_wait)", "pool_waits_logged", 0),
    ]
    for label, key, digits in rows:
        lines.append(f"  {label:42}{fmt(pool[key], digits):>16}{fmt(base[key], digits):>16}"
                     f"{fmt(plain.get(key), digits):>16}")
    lines.append(f"targets (all {report['runs']} in flight, first <= {TARGET_FIRST_MS:g} ms, "
                 f"last <= {TARGET_LAST_MS:g} ms after the claim)")
    labels = {"all_in_flight": f"all {report['runs']} in flight at once",
              "first_within_100_ms": f"first within {TARGET_FIRST_MS:g} ms",
              "last_within_1_s": f"last within {TARGET_LAST_MS:g} ms"}
    columns = [targets(pool), targets(base), targets(plain)]
    for key, label in labels.items():
        lines.append(f"  {label:42}" + "".join(
            f"{'met' if column[key] else 'MISSED':>16}" for column in columns))
    lines.append("  (no engine: the worker's transport alone, from the start of its requests "
                 "instead of a claim)")
    repeats = report["worker_pool_repeats"]
    if len(repeats) > 1:
        lines += ["", f"worker pool, {len(repeats)} measurements (the first is the column "
                      "above): min / median / max"]
        for label, key, digits in rows[:9]:
            values = sorted(r[key] for r in repeats if r[key] is not None)
            if values:
                shown = " / ".join(fmt(float(values[i]), digits) for i in
                                   (0, len(values) // 2, -1))
                lines.append(f"  {label:42}{shown:>32}")
        met_in = sum(met(r) for r in repeats)
        lines.append(f"  {'all three targets met':42}{f'{met_in} of {len(repeats)}':>32}")
    return "\n".join(lines)


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    load_before = list(os.getloadavg())
    with tempfile.TemporaryDirectory(prefix="durable-bench-http-") as tmp, \
            server_process(args.hold) as base:
        workdir = Path(tmp)
        policy = not args.no_gc_policy
        pool = await measure(base, args.runs, default_transport=False, workdir=workdir,
                             timeout=args.timeout, gc_policy=policy)
        default = await measure(base, args.runs, default_transport=True, workdir=workdir,
                                timeout=args.timeout, gc_policy=policy)
        plain = await measure_plain(base, args.runs, timeout=args.timeout, gc_policy=policy)
        repeats = [pool]
        for _ in range(args.repeat - 1):
            repeats.append(await measure(base, args.runs, default_transport=False,
                                         workdir=workdir, timeout=args.timeout,
                                         gc_policy=policy))
    import httpcore
    return {
        "when": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "cpus": os.cpu_count(), "python": platform.python_version(),
        "httpx": httpx.__version__, "httpcore": httpcore.__version__,
        "backend": args.backend, "runs": args.runs, "hold": args.hold,
        "gc_policy": not args.no_gc_policy,
        "worker_pool": pool, "httpx_default": default, "no_engine": plain,
        "worker_pool_repeats": repeats,
        "targets": targets(pool),
        "targets_met": met(pool),
        "targets_met_in": sum(met(r) for r in repeats),
        "load_before": load_before, "load_after": list(os.getloadavg()),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1000, help="runs (default 1000)")
    parser.add_argument("--hold", type=float, default=0.5,
                        help="seconds the server waits for a new request before it answers "
                             "the ones it holds (default 0.5)")
    parser.add_argument("--timeout", type=float, default=120.0,
                        help="seconds each column may take (default 120)")
    parser.add_argument("--repeat", type=int, default=1, metavar="K",
                        help="measure the worker pool K times in all and print the ranges "
                             "(default 1)")
    parser.add_argument("--backend", choices=("asyncio", "trio"), default="asyncio")
    parser.add_argument("--no-gc-policy", action="store_true",
                        help="run the workers with gc_policy=False (CPython's GC thresholds)")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        asyncio.run(serve(args.hold))
        return 0
    if args.runs < 1 or args.hold <= 0 or args.timeout <= 0 or args.repeat < 1:
        print("bench_http: --runs, --repeat, --hold and --timeout must be positive",
              file=sys.stderr)
        return 2
    durable.configure_logging(level="warning").addFilter(_count)
    report = anyio.run(main_async, args, backend=args.backend)
    print(json.dumps(report, indent=2) if args.json else report_text(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
