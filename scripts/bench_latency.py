"""Start -> result and operator cancel -> aborted request (issue 10, targets 3 and 6).

Each figure is printed beside its polling baseline measured in the same run:

- start -> result: ``client.start`` then ``client.wait``, 5 no-op steps, p50/p99 in ms,
  with the worker in this process (sharing the store: the in-process hub), on another
  store object in this process (the store's change signal, as another process sees it) and
  in a worker subprocess (``python -m durable worker --poll 60``). The "polling" baseline is
  the behaviour before the change signals: the worker's store does not signal (it claims
  at its 0.5 s poll) and the client reads the run every 50 ms.
- the chain: 200 runs of 5 steps, each started when the previous one's wait returned, in
  steps/s.
- operator cancel -> the loopback server sees the request's connection close, p50/p99 in
  ms; baseline: the cancel rides the 1 s lease renewal.

    python scripts/bench_latency.py [--runs 200] [--samples 50] [--pg URL]

PostgreSQL parts run when ``--pg`` is given (or 127.0.0.1:5432/test answers), on asyncio
(PostgreSQL on trio is measured by bench.py: docs/postgres.md).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import durable  # noqa: E402
from durable.store import Store, store_from_url  # noqa: E402
from durable.store._base import watch_finishes  # noqa: E402
from tests.httpserver import Rule, loopback_server  # noqa: E402

registry = durable.default_registry


@durable.activity(registry=registry)
async def noop(ctx: durable.ActivityContext, i: int) -> int:
    return i


@durable.workflow("lat.five", registry=registry)
async def five(ctx: durable.WorkflowContext) -> int:
    total = 0
    for i in range(5):
        total += await noop(ctx, i)
    return total


@durable.activity(registry=registry)
async def hang(ctx: durable.ActivityContext, url: str) -> None:
    await ctx.http.get(url)


@durable.workflow("lat.hang", registry=registry)
async def hanging(ctx: durable.WorkflowContext, url: str) -> None:
    await hang(ctx, url)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def row(label: str, values: list[float], beyond: list[float] | None = None) -> str:
    ms = [v * 1000 for v in values]
    text = f"{label:<58} p50 {pct(ms, 0.5):7.2f} ms  p99 {pct(ms, 0.99):8.2f} ms"
    if beyond:
        extra = [v * 1000 for v in beyond]
        text += f"  beyond the run's own time: p50 {pct(extra, 0.5):6.2f} ms"
    return text + f"  (n={len(ms)})"


async def beyond_own_time(client: durable.Client, ids: list[str],
                          latencies: list[float]) -> list[float]:
    """Start->result minus the run's own time (its claim to its completion, journaled on
    the store's one clock): what creating, claiming and delivering the result cost."""
    extra = []
    for run_id, latency in zip(ids, latencies, strict=True):
        at = {e.kind.value: e.at for e in await client.store.journal(run_id)}
        extra.append(latency - (at["run_completed"] - at["run_claimed"]))
    return extra


async def _poll_wait(client: durable.Client, run_id: str) -> durable.Run:
    """The wait before the change signals: read every 50 ms."""
    while True:
        run = await client.store.get_run(run_id)
        if run is not None and run.state.finished:
            return run
        await anyio.sleep(0.05)


@asynccontextmanager
async def worker_on(store: Store, *, signals: bool = True, poll: float = 0.5,
                    **options: Any) -> AsyncIterator[durable.Worker]:
    if not signals:
        store.pushes_changes = False  # type: ignore[misc]  # this store object only
    worker = durable.Worker(store, registry=registry, poll_interval=poll, **options)
    async with anyio.create_task_group() as tg:
        await tg.start(worker.run)
        try:
            yield worker
        finally:
            worker.shutdown(grace=0)


STORE_CALLS = ("now", "create_run", "get_run", "claim", "claim_with", "append", "finish",
               "release", "renew", "recover_stale", "cancels_requested", "next_due_in",
               "journal")
"""The store methods that reach the database (each one statement or transaction; not the
waits on a change signal, not notify_finished, which is no statement on either store)."""


@asynccontextmanager
async def counting_calls(store: Store) -> AsyncIterator[dict[str, int]]:
    """Count the calls of :data:`STORE_CALLS` on ``store`` within the block."""
    calls: dict[str, int] = {}
    originals = {name: getattr(store, name) for name in STORE_CALLS}
    own = {name for name in STORE_CALLS if name in vars(store)}  # already wrapped here

    def counted(name: str, method: Any) -> Any:
        async def call(*args: Any, **kwargs: Any) -> Any:
            calls[name] = calls.get(name, 0) + 1
            return await method(*args, **kwargs)
        return call

    for name, method in originals.items():
        setattr(store, name, counted(name, method))
    try:
        yield calls
    finally:
        for name, method in originals.items():
            if name in own:
                setattr(store, name, method)
            else:
                delattr(store, name)  # the class's method again


def calls_row(label: str, calls: dict[str, int], runs: int) -> str:
    parts = ", ".join(f"{name} {calls[name] / runs:.2f}" for name in STORE_CALLS
                      if calls.get(name))
    return (f"{label:<58} {sum(calls.values()) / runs:5.2f} per run ({parts}; client and "
            "worker, the run's own journal read after the chain left out)")


@asynccontextmanager
async def opened(url: str) -> AsyncIterator[Store]:
    store = store_from_url(url)
    await store.open()
    try:
        yield store
    finally:
        await store.aclose()


async def start_to_result(client: durable.Client, n: int, *, polled: bool,
                          prefix: str, woken: durable.Worker | None = None,
                          calls: dict[str, int] | None = None
                          ) -> tuple[list[float], float, list[float]]:
    """Latencies of ``n`` start+wait in a chain, the chain's steps/s, and each latency
    beyond the run's own time (``calls``, counted meanwhile, is taken before that read)."""
    latencies: list[float] = []
    ids: list[str] = []
    began = time.perf_counter()
    for i in range(n):
        t0 = time.perf_counter()
        run = await client.start("lat.five", id=f"{prefix}-{i}")
        if woken is not None:
            woken.wake()
        done = await (_poll_wait(client, run.id) if polled else client.wait(run.id, poll=5.0))
        assert done.state is durable.RunState.COMPLETED, done
        latencies.append(time.perf_counter() - t0)
        ids.append(run.id)
    rate = n * 5 / (time.perf_counter() - began)
    counted = dict(calls or {})
    extra = await beyond_own_time(client, ids, latencies)
    if calls is not None:
        calls.clear()
        calls.update(counted)
    return latencies, rate, extra


async def bench_start(url: str, runs: int, label: str, out: Callable[[str], None],
                      *, subprocess_worker: bool = True) -> dict[str, float]:
    figures: dict[str, float] = {}
    async with opened(url) as store:
        client = durable.Client(store, registry=registry)
        committed: dict[str, float] = {}

        def timed_finish(fence: Any, ok: bool) -> None:
            committed[fence.run_id] = time.perf_counter()

        unwatch = watch_finishes(store, timed_finish)  # also those carried by a claim
        returned: dict[str, float] = {}
        wait = client.wait

        async def timed_wait(run_id: str, **kwargs: Any) -> durable.Run:
            run = await wait(run_id, **kwargs)
            returned[run_id] = time.perf_counter()
            return run

        client.wait = timed_wait  # type: ignore[method-assign]
        async with worker_on(store, poll=60.0), counting_calls(store) as calls:
            lat, rate, extra = await start_to_result(client, runs, polled=False, prefix="in",
                                                     calls=calls)
        unwatch()
        client.wait = wait  # type: ignore[method-assign]
        out(row(f"{label} start->result, worker in this process", lat, extra))
        out(row(f"{label} finish committed -> wait returned, worker in this process",
                [returned[i] - committed[i] for i in committed if i in returned]))
        out(calls_row(f"{label} store calls, worker in this process", calls, runs))
        figures["inproc_chain"] = rate
        async with opened(url) as other:
            async with worker_on(other, poll=60.0):
                lat, rate, extra = await start_to_result(client, runs, polled=False, prefix="x")
            out(row(f"{label} start->result, worker on another store", lat, extra))
            figures["cross_chain"] = rate
            async with worker_on(other, signals=False, poll=0.5) as polling:
                lat, rate_b, extra = await start_to_result(client, max(10, runs // 4), polled=True,
                                                    prefix="b", woken=polling)
            out(row(f"{label} start->result, POLLING BASELINE (woken, 50 ms wait)", lat, extra))
            figures["baseline_chain"] = rate_b
        if subprocess_worker:
            with worker_process(url):
                await client.wait((await client.start("lat.five", id="warm")).id, timeout=30)
                lat, rate, extra = await start_to_result(client, runs, polled=False, prefix="p")
            out(row(f"{label} start->result, worker in another process", lat, extra))
            figures["process_chain"] = rate
    out(f"{label} chain of {runs} x 5 steps: in-process {figures['inproc_chain']:.0f} steps/s, "
        f"another store {figures['cross_chain']:.0f}, "
        + (f"another process {figures['process_chain']:.0f}, " if subprocess_worker else "")
        + f"polling baseline {figures['baseline_chain']:.0f} steps/s")
    return figures


class worker_process:
    def __init__(self, url: str) -> None:
        self.url = url
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> worker_process:
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "durable", "worker", "--db", self.url, "--import",
             str(Path(__file__).resolve()), "--poll", "60", "--log-level", "error"],
            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return self

    def __exit__(self, *exc: object) -> None:
        assert self.proc is not None
        self.proc.terminate()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


async def bench_cancel(url: str, samples: int, label: str,
                       out: Callable[[str], None]) -> None:
    async with loopback_server() as server, opened(url) as store, opened(url) as other:
        server.on("/hang", Rule(hang=True))
        client = durable.Client(store, registry=registry)
        for signals, name in ((True, "change signal"), (False, "RENEWAL BASELINE")):
            lat: list[float] = []
            async with worker_on(other, signals=signals, poll=0.01, lease=30.0):
                for i in range(samples if signals else max(5, samples // 5)):
                    before = len(server.seen("/hang"))
                    run = await client.start("lat.hang", f"{server.url}/hang",
                                             id=f"c-{name[:3]}-{i}")
                    await server.wait_for(lambda b=before: len(server.seen("/hang")) > b,
                                          timeout=30)
                    seen = server.seen("/hang")[-1]
                    await client.cancel(run.id)
                    asked = time.time()
                    await server.wait_for(lambda s=seen: s.disconnected_at is not None,
                                          timeout=30)
                    assert seen.disconnected_at is not None
                    lat.append(seen.disconnected_at - asked)
                    await client.wait(run.id, timeout=30)
            other.pushes_changes = True  # type: ignore[misc]
            out(row(f"{label} cancel->connection closed, {name}", lat))


def idle_cpu(url: str, seconds: float, out: Callable[[str], None]) -> None:
    """CPU seconds per second of an idle worker process (looking at data_version)."""
    with worker_process(url) as w:
        assert w.proc is not None
        time.sleep(2.0)  # started
        pid = w.proc.pid

        def cpu() -> float:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

        c0 = cpu()
        time.sleep(seconds)
        out(f"idle worker process: {100 * (cpu() - c0) / seconds:.1f} % of one core "
            f"(over {seconds:g} s)")


async def pg_available(url: str) -> bool:
    """Whether the server answers: a plain connection, not a store (opening a store on
    ``url`` would create or migrate its default schema, which other checkouts share)."""
    try:
        import psycopg

        async with await psycopg.AsyncConnection.connect(url, connect_timeout=3):
            return True
    except Exception:
        return False


async def main(args: argparse.Namespace) -> None:
    out = print
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'lat.db'}"
        async with opened(url):
            pass
        await bench_start(url, args.runs, "sqlite", out)
        await bench_cancel(url, args.samples, "sqlite", out)
        if args.idle:
            idle_cpu(url, args.idle, out)
    pg = args.pg
    if pg and await pg_available(pg):
        schema = f"lat_{os.getpid()}"
        pg_url = f"{pg}{'&' if '?' in pg else '?'}schema={schema}"
        try:
            await bench_start(pg_url, args.runs, "postgres", out)
            await bench_cancel(pg_url, args.samples, "postgres", out)
        finally:
            import psycopg
            async with await psycopg.AsyncConnection.connect(pg, autocommit=True) as conn:
                await conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    elif pg:
        out(f"postgres: {pg} unreachable, skipped")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--samples", type=int, default=50)
    parser.add_argument("--idle", type=float, default=5.0,
                        help="seconds to measure an idle worker's CPU (0: skip)")
    parser.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432/test")
    anyio.run(main, parser.parse_args())
