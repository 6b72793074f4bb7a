"""durable side by side with DBOS Transact (SQLite system database), in one run of this script.

Every workload runs in a child process of its own (``--child``), one engine per process, so
neither engine's imports, threads or caches touch the other's figures; the parent starts them
one after another, never two at once, and prints one markdown table:

- **sequential**: ``--sequential`` workflows (200) of ``--steps`` no-op steps (5), one after
  another. durable: all runs queued, then one worker with concurrency 1 drains them; DBOS: each
  workflow awaited in turn (``await wf(n)``). The clock covers the starts too, on both sides.
- **concurrent**: ``--concurrent`` workflows (1,000) at once. durable: all ``client.start``
  calls in flight together, then a worker of that concurrency; DBOS: ``asyncio.gather`` of the
  workflow calls.
- **HTTP**: ``--http`` workflows (1,000) started at once, each one step that GETs a loopback
  server (a process of its own) which holds every request until all have arrived or
  ``--hold`` seconds pass. Reported: requests in flight at the peak, the first and last
  arrival after the first start. durable's step uses ``ctx.http`` (the worker's pool); the
  DBOS step uses one module-level ``httpx.AsyncClient`` whose pool is sized to the workload
  (httpx's default of 100 connections would cap it at 100).
- **deadline -> abort**: a step whose timeout is ``DEADLINE`` s awaits a request the server
  never answers; the figure is the time from the deadline (the step's entry + its timeout,
  read in the step) until the server sees the connection close (the same machine-wide
  monotonic clock in both processes). durable on asyncio and trio (activity
  ``timeout=``), DBOS on asyncio (``@DBOS.step(timeout_seconds=...)``).
- **operator cancel -> abort**: the same hung request, cancelled through the API once the
  server has it (durable ``Client.cancel``; DBOS ``cancel_workflow_async`` with a
  ``preemptible=True`` step, the only kind DBOS cancels in flight); time from the call until
  the server sees the close (capped at ``CANCEL_CAP`` s).
- **memory**: RSS growth of a process holding ``--memory`` workflows (1,000) parked in a step
  (awaiting an event that never fires), against the same process warmed up with one workflow.
- **list/show**: ``--list-runs`` (100,000) runs bulk-inserted with plain ``sqlite3`` (durable:
  ``scripts/bench_list.py``'s ``fill``; DBOS: copies of one real ``workflow_status`` row), then
  the median of 21 calls: newest 50 (``Client.list`` / ``list_workflows_async``), 50 failed
  ones, and one 5-step run's steps (``Client.journal`` / ``list_workflow_steps_async``).
- **crash -> resumed**: a process is SIGKILLed while its workflow is inside step 2; a new
  process starts (DBOS with the same executor id, which recovers that executor's pending
  workflows at launch; durable: a new worker, which takes over once the dead worker's lease
  has lapsed, ``--lease``, 30 s by default). Time from the SIGKILL until step 2 runs again.

Durability: each side at its own default and at equal durability (both WAL with
``synchronous=NORMAL``; both WAL with ``synchronous=FULL``, an fsync per commit). durable's
default is WAL + NORMAL; DBOS's SQLite default is a rollback journal (``journal_mode=DELETE``)
with SQLite's default ``synchronous=FULL``; DBOS takes WAL and the pragma through a
``system_database_engine`` of ours that otherwise does what DBOS's own engine does (IMMEDIATE
transactions, ``busy_timeout=30000``, ``foreign_keys=ON``). Commits and fsyncs per step come
from a second, smaller pass of the no-op workloads (``--count-scale``, a quarter by default),
never from the timed one: commits counted by a trace callback on every SQLite connection
(``COMMIT`` statements), fsyncs by ``strace -f --seccomp-bpf -ttt -e trace=fsync,fdatasync``,
both only inside each workload's timed window (set-up and schema creation excluded); fsyncs
are "n/a" with a note where strace is missing.

Run: ``python scripts/bench_peer.py --plots docs/bench`` (about 5 minutes on 2 cores);
``--quick`` for a smoke run. Figures: docs/benchmarks.md, "Side by side with DBOS Transact".
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import importlib.util
import json
import os
import platform
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

DEADLINE = 0.2  # seconds: the step timeout of the deadline workload
CANCEL_CAP = 5.0  # seconds: a cancel not seen as a close by then is reported as such
DURABILITIES = ("default", "normal", "full")
DURABILITY_LABEL = {
    "default": "own default",
    "normal": "WAL + NORMAL",
    "full": "WAL + FULL (fsync per commit)",
}
ENGINE_DEFAULT = {"durable": "WAL + NORMAL", "dbos": "rollback journal + FULL"}
SKIP_NO_DBOS = "dbos is not installed (pip install dbos==3.4.0)"


def now() -> float:
    """CLOCK_MONOTONIC: one clock for every process of this machine (server and children)."""
    return time.monotonic()


def rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


# -- the loopback server (a process of its own) ------------------------------------------------
class HoldServer:
    """``/hold/B?n=N&t=T`` holds each request of batch B until N have arrived or T seconds
    passed since the first; ``/hang/K`` never answers and records when the client closed;
    ``/_wait/K/arrive|close`` answers once that happened; ``/_stats/B`` reports a batch."""

    def __init__(self) -> None:
        self.batches: dict[str, dict[str, Any]] = {}
        self.hung: dict[str, dict[str, float]] = {}
        self.changed = asyncio.Event()

    def _notify(self) -> None:
        self.changed.set()
        self.changed = asyncio.Event()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                target = head.split(b" ", 2)[1].decode()
                status, body = await self.route(target, reader)
                data = json.dumps(body).encode()
                writer.write(b"HTTP/1.1 %d OK\r\ncontent-type: application/json\r\n"
                             b"content-length: %d\r\n\r\n%s" % (status, len(data), data))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()

    async def route(self, target: str, reader: asyncio.StreamReader) -> tuple[int, Any]:
        path, _, query = target.partition("?")
        params = dict(p.split("=", 1) for p in query.split("&") if "=" in p)
        parts = path.strip("/").split("/")
        if parts[0] == "hold":
            return await self.hold(parts[1], int(params["n"]), float(params["t"]))
        if parts[0] == "hang":
            return await self.hang(parts[1], reader)
        if parts[0] == "_wait":
            return await self.wait(parts[1], parts[2], float(params.get("t", "10")))
        if parts[0] == "_stats":
            batch = self.batches.get(parts[1])
            if batch is None:
                return 404, {}
            return 200, {k: v for k, v in batch.items() if k != "event"}
        return 404, {}

    async def hold(self, name: str, n: int, timeout: float) -> tuple[int, Any]:
        batch = self.batches.setdefault(name, {"arrivals": [], "in_flight": 0, "peak": 0,
                                               "released_at": None, "event": asyncio.Event()})
        batch["arrivals"].append(now())
        batch["in_flight"] += 1
        batch["peak"] = max(batch["peak"], batch["in_flight"])
        event: asyncio.Event = batch["event"]
        if len(batch["arrivals"]) >= n:
            batch["released_at"] = now()
            event.set()
        try:
            first = batch["arrivals"][0]
            await asyncio.wait_for(event.wait(), max(0.0, first + timeout - now()))
        except TimeoutError:
            if batch["released_at"] is None:
                batch["released_at"] = now()
            event.set()
        finally:
            batch["in_flight"] -= 1
        return 200, {"ok": True}

    async def hang(self, key: str, reader: asyncio.StreamReader) -> tuple[int, Any]:
        self.hung[key] = {"arrive": now()}
        self._notify()
        with contextlib.suppress(ConnectionError):
            while await reader.read(65536):
                pass
        self.hung[key]["close"] = now()
        self._notify()
        raise ConnectionResetError  # no answer: the client went away

    async def wait(self, key: str, what: str, timeout: float) -> tuple[int, Any]:
        deadline = now() + timeout
        while what not in self.hung.get(key, {}):
            left = deadline - now()
            if left <= 0:
                return 504, {"at": None}
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.changed.wait(), left)
        return 200, {"at": self.hung[key][what]}


async def serve() -> None:
    server = HoldServer()
    listener = await asyncio.start_server(server.handle, "127.0.0.1", 0, backlog=4096)
    port = listener.sockets[0].getsockname()[1]
    print(port, flush=True)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_reader(sys.stdin.fileno(), stop.set)  # the parent closing stdin also stops it
    async with listener:
        await stop.wait()


# -- durable (children) ------------------------------------------------------------------------
def durable_side() -> Any:
    """durable's workflows, registered on a registry of their own (imported lazily so the DBOS
    children never import durable)."""
    import anyio

    import durable
    from durable.store._base import watch_finishes

    reg = durable.Registry()
    once = durable.RetryPolicy(max_tries=1)
    ns: dict[str, Any] = {"durable": durable, "anyio": anyio, "registry": reg,
                          "watch_finishes": watch_finishes,
                          "parked_event": None, "crash_mode": "run",
                          "entered": {}}

    @durable.activity(name="peer.noop", registry=reg, retry=once)
    async def noop(ctx: durable.ActivityContext, i: int) -> int:
        return i

    @durable.workflow("peer.steps", registry=reg)
    async def steps(ctx: durable.WorkflowContext, n: int) -> int:
        total = 0
        for i in range(n):
            total += await noop(ctx, i)
        return total

    @durable.activity(name="peer.get", registry=reg, retry=once, timeout=120)
    async def get(ctx: durable.ActivityContext, url: str) -> int:
        return (await ctx.http.get(url)).status_code

    @durable.workflow("peer.http", registry=reg)
    async def http(ctx: durable.WorkflowContext, url: str) -> int:
        return await get(ctx, url)

    @durable.activity(name="peer.hang_deadline", registry=reg, retry=once, timeout=DEADLINE)
    async def hang_deadline(ctx: durable.ActivityContext, url: str) -> int:
        ns["entered"][url] = now()
        return (await ctx.http.get(url)).status_code

    @durable.workflow("peer.deadline", registry=reg)
    async def deadline(ctx: durable.WorkflowContext, url: str) -> int:
        return await hang_deadline(ctx, url)

    @durable.activity(name="peer.hang", registry=reg, retry=once, timeout=60)
    async def hang(ctx: durable.ActivityContext, url: str) -> int:
        return (await ctx.http.get(url)).status_code

    @durable.workflow("peer.cancel", registry=reg)
    async def cancel(ctx: durable.WorkflowContext, url: str) -> int:
        return await hang(ctx, url)

    @durable.activity(name="peer.park", registry=reg, retry=once)
    async def park(ctx: durable.ActivityContext, i: int) -> int:
        ns["parked_n"] += 1
        if ns["parked_event"] is not None and ns["parked_n"] >= ns["parked_target"]:
            ns["parked_event"].set()
        if i < 0:
            return i  # the warm-up run
        await anyio.sleep_forever()
        return i

    @durable.workflow("peer.park", registry=reg)
    async def parked(ctx: durable.WorkflowContext, i: int) -> int:
        return await park(ctx, i)

    @durable.activity(name="peer.crash_step", registry=reg,
                      retry=durable.RetryPolicy(max_tries=3))
    async def crash_step(ctx: durable.ActivityContext) -> int:
        if ns["crash_mode"] == "run":
            emit({"ready": now()})
            await anyio.sleep_forever()
        emit({"resumed": now()})
        return 2

    @durable.workflow("peer.crash", registry=reg)
    async def crash(ctx: durable.WorkflowContext) -> int:
        return await noop(ctx, 1) + await crash_step(ctx)

    ns.update(steps=steps, http=http, deadline=deadline, cancel=cancel, parked=parked,
              crash=crash, parked_n=0)
    return ns


def durable_url(path: Path, durability: str) -> str:
    return f"sqlite:///{path}" + ("?synchronous=full" if durability == "full" else "")


@contextlib.asynccontextmanager
async def durable_engine(url: str, concurrency: int, *, lease: float = 30.0) -> Any:
    """(ns, store, client, worker, finished): a running worker; ``finished`` counts finishes."""
    ns = durable_side()
    durable, anyio = ns["durable"], ns["anyio"]
    store = durable.store_from_url(url)
    await store.open()
    client = durable.Client(store, registry=ns["registry"])
    tracker: dict[str, Any] = {"finished": 0, "target": None, "event": anyio.Event()}

    def finish(fence: Any, ok: bool) -> None:
        tracker["finished"] += 1
        if tracker["target"] is not None and tracker["finished"] >= tracker["target"]:
            tracker["event"].set()

    ns["watch_finishes"](store, finish)  # also those carried by the next run's claim
    worker = durable.Worker(store, registry=ns["registry"], concurrency=concurrency,
                            poll_interval=0.05, grace=0.5, lease=lease)
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(worker.run)
            yield ns, store, client, worker, tracker
            worker.shutdown()
    finally:
        await store.aclose()


async def durable_wait_finished(tracker: dict[str, Any], target: int, timeout: float) -> None:
    import anyio

    tracker["target"] = target
    if tracker["finished"] >= target:
        return
    with anyio.fail_after(timeout):
        await tracker["event"].wait()


async def durable_noop_one(url: str, runs: int, at_once: bool,
                           opts: dict[str, Any]) -> dict[str, Any]:
    import anyio

    ns = durable_side()
    durable = ns["durable"]
    store = durable.store_from_url(url)
    await store.open()
    steps = opts["steps"]
    try:
        client = durable.Client(store, registry=ns["registry"])
        finished = {"n": 0}
        done = anyio.Event()

        def finish(fence: Any, ok: bool) -> None:
            finished["n"] += 1
            if finished["n"] >= runs:
                done.set()

        ns["watch_finishes"](store, finish)  # also those carried by the next run's claim
        worker = durable.Worker(store, registry=ns["registry"],
                                concurrency=runs if at_once else 1, poll_interval=0.05)
        start = mark()
        async with anyio.create_task_group() as tg:
            if at_once:
                await tg.start(worker.run)
                start = mark()
                async with anyio.create_task_group() as starts:
                    for _ in range(runs):
                        starts.start_soon(client.start, ns["steps"], steps)
            else:
                for _ in range(runs):
                    await client.start(ns["steps"], steps)
                await tg.start(worker.run)
            with anyio.fail_after(max(120.0, runs * 0.1)):
                await done.wait()
            result = figures(runs * steps, start)
            worker.shutdown()
    finally:
        await store.aclose()
    return result


def mark() -> tuple[float, float, int, float]:
    """The start of a timed window: monotonic, CPU, commits so far, wall clock (strace's)."""
    return now(), time.process_time(), COMMITS["n"], time.time()


def figures(steps: int, start: tuple[float, float, int, float]) -> dict[str, Any]:
    elapsed, cpu = now() - start[0], time.process_time() - start[1]
    return {"steps": steps, "seconds": elapsed, "steps_per_s": steps / elapsed,
            "cpu_ms_per_step": 1000 * cpu / steps, "commits": COMMITS["n"] - start[2],
            "wall": [start[3], time.time()]}


async def durable_latency(opts: dict[str, Any]) -> dict[str, Any]:
    import anyio
    import httpx

    base = opts["server"]
    folder = Path(opts["folder"])
    tag = f"d{opts['backend']}{os.getpid()}"
    out: dict[str, Any] = {}
    async with httpx.AsyncClient(timeout=30) as control:
        async with durable_engine(durable_url(folder / f"durable-lat-{tag}.db", "default"),
                                  max(opts["http"], 8)) as (ns, _store, client, _w, tracker):
            # deadline -> abort
            samples = []
            for i in range(opts["samples"]):
                key = f"{tag}-dl-{i}"
                url = f"{base}/hang/{key}"
                await client.start(ns["deadline"], url)
                closed = (await control.get(f"{base}/_wait/{key}/close?t=10")).json()["at"]
                samples.append(None if closed is None
                               else closed - ns["entered"][url] - DEADLINE)
            out["deadline"] = samples
            # operator cancel -> abort
            samples = []
            for i in range(opts["samples"]):
                key = f"{tag}-cx-{i}"
                run = await client.start(ns["cancel"], f"{base}/hang/{key}")
                await control.get(f"{base}/_wait/{key}/arrive?t=10")
                t0 = now()
                await client.cancel(run.id)
                reply = await control.get(f"{base}/_wait/{key}/close?t={CANCEL_CAP}")
                at = reply.json()["at"]
                samples.append(None if at is None else at - t0)
            out["cancel"] = samples
            # concurrent HTTP steps
            if opts["http"] and opts["backend"] == "asyncio":
                n, batch = opts["http"], f"{tag}-http"
                base_finished = tracker["finished"]
                t0 = now()
                async with anyio.create_task_group() as tg:
                    for _ in range(n):
                        tg.start_soon(client.start, ns["http"],
                                      f"{base}/hold/{batch}?n={n}&t={opts['hold']}")
                await durable_wait_finished(tracker, base_finished + n, opts["hold"] + 120)
                elapsed = now() - t0
                stats = (await control.get(f"{base}/_stats/{batch}")).json()
                out["http"] = http_figures(stats, t0, elapsed, n)
    return out


def http_figures(stats: dict[str, Any], t0: float, elapsed: float, n: int) -> dict[str, Any]:
    arrivals = stats["arrivals"]
    return {"n": n, "arrived": len(arrivals), "peak_in_flight": stats["peak"],
            "first_ms": 1000 * (min(arrivals) - t0), "last_ms": 1000 * (max(arrivals) - t0),
            "released_ms": 1000 * (stats["released_at"] - t0), "total_s": elapsed}


async def durable_memory(opts: dict[str, Any]) -> dict[str, Any]:
    import anyio

    folder = Path(opts["folder"])
    n = opts["memory"]
    async with durable_engine(durable_url(folder / "durable-mem.db", "default"),
                              n + 1) as (ns, _store, client, _w, tracker):
        await client.start(ns["parked"], -1)  # warm-up: every code path once
        await durable_wait_finished(tracker, 1, 30)
        before = rss_kib()
        ns["parked_event"] = anyio.Event()
        ns["parked_target"] = ns["parked_n"] + n
        async with anyio.create_task_group() as tg:
            for i in range(n):
                tg.start_soon(client.start, ns["parked"], i)
        with anyio.fail_after(120):
            await ns["parked_event"].wait()
        after = rss_kib()
        emit({"memory": {"n": n, "rss_before_kib": before, "rss_after_kib": after}})
        os._exit(0)  # the parked runs would wait out the worker's grace; nothing to keep
    return {}


async def durable_list(opts: dict[str, Any]) -> dict[str, Any]:
    from bench_list import fill

    folder = Path(opts["folder"])
    path = folder / "durable-list.db"
    async with durable_engine(durable_url(path, "default"), 1) as (ns, _s, client, _w, tracker):
        run = await client.start(ns["steps"], 5)
        await durable_wait_finished(tracker, 1, 30)
        fill(path, opts["list_runs"] - 1)
        return {
            "list newest 50": await median_ms(lambda: client.list(limit=50)),
            "list failed, 50": await median_ms(lambda: client.list(state="failed", limit=50)),
            "show one run's steps": await median_ms(lambda: client.journal(run.id)),
        }


async def median_ms(call: Any, repeats: int = 21) -> float:
    await call()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        await call()
        times.append(1000 * (time.perf_counter() - t0))
    return statistics.median(times)


async def durable_crash(opts: dict[str, Any]) -> dict[str, Any]:
    ns = durable_side()
    ns_mode = opts["crash_mode"]
    url = durable_url(Path(opts["folder"]) / "durable-crash.db", "default")
    durable, anyio = ns["durable"], ns["anyio"]
    store = durable.store_from_url(url)
    await store.open()
    try:
        client = durable.Client(store, registry=ns["registry"])
        if ns_mode == "run":
            await client.start(ns["crash"], id="crash-1")
        worker = durable.Worker(store, registry=ns["registry"], concurrency=4,
                                poll_interval=0.05, lease=opts["lease"], grace=0.5)
        _patch_crash_mode(ns, ns_mode)
        async with anyio.create_task_group() as tg:
            await tg.start(worker.run)
            run = await client.wait("crash-1", timeout=opts["lease"] + 60, poll=0.01)
            emit({"state": run.state.value})
            worker.shutdown()
    finally:
        await store.aclose()
    return {}


def _patch_crash_mode(ns: dict[str, Any], mode: str) -> None:
    ns["crash_mode"] = mode


# -- DBOS (children) ---------------------------------------------------------------------------
def dbos_side(opts: dict[str, Any], executor_id: str | None = None) -> Any:
    import httpx
    import sqlalchemy as sa
    from dbos import DBOS

    folder = Path(opts["folder"])
    path = folder / f"dbos-{opts['durability']}-{opts.get('tag', 'x')}.sqlite"
    url = f"sqlite:///{path}"
    config: dict[str, Any] = {"name": "bench-peer", "system_database_url": url,
                              "log_level": "WARNING", "enable_otlp": False}
    if executor_id:
        config["executor_id"] = executor_id
    if opts["durability"] != "default":
        engine = sa.create_engine(url)
        sync = opts["durability"].upper()

        @sa.event.listens_for(engine, "connect")
        def pragmas(dbapi_conn: Any, _record: Any) -> None:
            dbapi_conn.isolation_level = "IMMEDIATE"  # as DBOS's own engine does
            dbapi_conn.execute("PRAGMA busy_timeout=30000")
            dbapi_conn.execute("PRAGMA foreign_keys=ON")
            dbapi_conn.execute("PRAGMA journal_mode=WAL")
            dbapi_conn.execute(f"PRAGMA synchronous={sync}")

        config["system_database_engine"] = engine
    ns: dict[str, Any] = {"DBOS": DBOS, "parked_n": 0, "parked_target": None,
                          "parked_event": None, "crash_mode": opts.get("crash_mode", "run"),
                          "entered": {},
                          "path": path}
    limit = max(opts.get("http", 0), 100)
    ns["http_client"] = httpx.AsyncClient(
        timeout=120, limits=httpx.Limits(max_connections=limit,
                                         max_keepalive_connections=limit))

    @DBOS.step()
    async def noop(i: int) -> int:
        return i

    @DBOS.workflow()
    async def steps(n: int) -> int:
        total = 0
        for i in range(n):
            total += await noop(i)
        return total

    @DBOS.step()
    async def get(url: str) -> int:
        return (await ns["http_client"].get(url)).status_code

    @DBOS.workflow()
    async def http(url: str) -> int:
        return await get(url)

    @DBOS.step(timeout_seconds=DEADLINE)
    async def hang_deadline(url: str) -> int:
        ns["entered"][url] = now()
        return (await ns["http_client"].get(url)).status_code

    @DBOS.workflow()
    async def deadline(url: str) -> int:
        try:
            return await hang_deadline(url)
        except Exception:
            return -1

    @DBOS.step(preemptible=True)
    async def hang(url: str) -> int:
        return (await ns["http_client"].get(url)).status_code

    @DBOS.workflow()
    async def cancel(url: str) -> int:
        return await hang(url)

    @DBOS.step()
    async def park(i: int) -> int:
        ns["parked_n"] += 1
        if ns["parked_event"] is not None and ns["parked_n"] >= ns["parked_target"]:
            ns["parked_event"].set()
        if i >= 0:
            await asyncio.Event().wait()
        return i

    @DBOS.workflow()
    async def parked(i: int) -> int:
        return await park(i)

    @DBOS.step()
    async def crash_step() -> int:
        if ns["crash_mode"] == "run":
            emit({"ready": now()})
            await asyncio.Event().wait()
        emit({"resumed": now()})
        return 2

    @DBOS.workflow()
    async def crash() -> int:
        return await noop(1) + await crash_step()

    ns.update(steps=steps, http=http, deadline=deadline, cancel=cancel, parked=parked,
              crash=crash)
    DBOS(config=config)  # type: ignore[arg-type]
    DBOS.launch()
    return ns


async def dbos_noop(opts: dict[str, Any]) -> dict[str, Any]:
    ns = dbos_side(opts)
    steps, out = opts["steps"], {}
    await ns["steps"](steps)  # warm-up (not counted): first connections, caches
    for name, runs in (("sequential", opts["sequential"]), ("concurrent", opts["concurrent"])):
        if not runs:
            continue
        start = mark()
        if name == "sequential":
            for _ in range(runs):
                await ns["steps"](steps)
        else:
            await asyncio.gather(*(ns["steps"](steps) for _ in range(runs)))
        out[name] = figures(runs * steps, start)
    return out


async def dbos_latency(opts: dict[str, Any]) -> dict[str, Any]:
    import httpx

    ns = dbos_side(opts)
    DBOS, base, out = ns["DBOS"], opts["server"], {}
    tag = f"x{os.getpid()}"
    async with httpx.AsyncClient(timeout=30) as control:
        samples = []
        for i in range(opts["samples"]):
            key = f"{tag}-dl-{i}"
            url = f"{base}/hang/{key}"
            await DBOS.start_workflow_async(ns["deadline"], url)
            closed = (await control.get(f"{base}/_wait/{key}/close?t=10")).json()["at"]
            samples.append(None if closed is None else closed - ns["entered"][url] - DEADLINE)
        out["deadline"] = samples
        samples = []
        for i in range(opts["samples"]):
            key = f"{tag}-cx-{i}"
            handle = await DBOS.start_workflow_async(ns["cancel"], f"{base}/hang/{key}")
            await control.get(f"{base}/_wait/{key}/arrive?t=10")
            t0 = now()
            await DBOS.cancel_workflow_async(handle.workflow_id)
            at = (await control.get(f"{base}/_wait/{key}/close?t={CANCEL_CAP}")).json()["at"]
            samples.append(None if at is None else at - t0)
        out["cancel"] = samples
        if opts["http"]:
            n, batch = opts["http"], f"{tag}-http"
            t0 = now()
            await asyncio.gather(*(ns["http"](f"{base}/hold/{batch}?n={n}&t={opts['hold']}")
                                   for _ in range(n)))
            elapsed = now() - t0
            stats = (await control.get(f"{base}/_stats/{batch}")).json()
            out["http"] = http_figures(stats, t0, elapsed, n)
    return out


async def dbos_memory(opts: dict[str, Any]) -> dict[str, Any]:
    ns = dbos_side(opts)
    DBOS, n = ns["DBOS"], opts["memory"]
    await ns["parked"](-1)  # warm-up
    before = rss_kib()
    ns["parked_event"] = asyncio.Event()
    ns["parked_target"] = ns["parked_n"] + n
    for i in range(n):
        await DBOS.start_workflow_async(ns["parked"], i)
    await asyncio.wait_for(ns["parked_event"].wait(), 120)
    after = rss_kib()
    emit({"memory": {"n": n, "rss_before_kib": before, "rss_after_kib": after}})
    os._exit(0)


async def dbos_list(opts: dict[str, Any]) -> dict[str, Any]:
    ns = dbos_side(opts)
    DBOS = ns["DBOS"]
    handle = await DBOS.start_workflow_async(ns["steps"], 5)
    await handle.get_result()
    conn = sqlite3.connect(ns["path"], isolation_level=None)
    try:
        cols = [r[1] for r in conn.execute("PRAGMA table_info(workflow_status)")]
        shaped = {"workflow_uuid": "'seed-' || printf('%07d', n)",
                  "status": "CASE WHEN n % 10 = 0 THEN 'ERROR' ELSE 'SUCCESS' END",
                  "created_at": "created_at - n * 10", "updated_at": "updated_at - n * 10"}
        select = ", ".join(shaped.get(c, c) for c in cols)
        conn.execute("BEGIN")
        conn.execute(
            f"WITH RECURSIVE s(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM s "
            f"WHERE n < {opts['list_runs'] - 1}) "
            f"INSERT INTO workflow_status ({', '.join(cols)}) SELECT {select} "
            f"FROM s, workflow_status w WHERE w.workflow_uuid = ?", (handle.workflow_id,))
        conn.execute("COMMIT")
        total = conn.execute("SELECT count(*) FROM workflow_status").fetchone()[0]
    finally:
        conn.close()
    wid = handle.workflow_id
    return {
        "rows": total,
        "list newest 50": await median_ms(
            lambda: DBOS.list_workflows_async(limit=50, sort_desc=True)),
        "list failed, 50": await median_ms(
            lambda: DBOS.list_workflows_async(status="ERROR", limit=50, sort_desc=True)),
        "show one run's steps": await median_ms(lambda: DBOS.list_workflow_steps_async(wid)),
    }


async def dbos_crash(opts: dict[str, Any]) -> dict[str, Any]:
    ns = dbos_side(opts, executor_id="bench-peer-crash")
    DBOS = ns["DBOS"]
    if opts["crash_mode"] == "run":
        from dbos import SetWorkflowID

        with SetWorkflowID("crash-1"):
            await DBOS.start_workflow_async(ns["crash"])
        await asyncio.Event().wait()  # SIGKILLed here
    handle = await DBOS.retrieve_workflow_async("crash-1")
    result = await handle.get_result()
    emit({"state": "completed" if result == 3 else f"result {result}"})
    return {}


# -- counting commits (the counting pass) -----------------------------------------------------
COMMITS = {"n": 0}
_real_connect = sqlite3.connect


def _trace(statement: str) -> None:
    head = statement.lstrip()[:6].upper()
    if head.startswith(("COMMIT", "END")):
        COMMITS["n"] += 1


def _counting_connect(*args: Any, **kwargs: Any) -> sqlite3.Connection:
    conn = _real_connect(*args, **kwargs)
    conn.set_trace_callback(_trace)
    return conn


def count_commits() -> None:
    """Every connection opened from here on counts its COMMITs (SQLAlchemy's pysqlite dialect
    connects through ``sqlite3.dbapi2``, durable through ``sqlite3``: both are patched)."""
    sqlite3.connect = _counting_connect  # type: ignore[assignment]
    sqlite3.dbapi2.connect = _counting_connect  # type: ignore[assignment]


# -- child entry -------------------------------------------------------------------------------
def emit(obj: dict[str, Any]) -> None:
    sys.stdout.write("@@" + json.dumps(obj) + "\n")
    sys.stdout.flush()


CHILDREN: dict[tuple[str, str], Any] = {
    ("durable", "noop"): None, ("dbos", "noop"): dbos_noop,
    ("durable", "latency"): durable_latency, ("dbos", "latency"): dbos_latency,
    ("durable", "memory"): durable_memory, ("dbos", "memory"): dbos_memory,
    ("durable", "list"): durable_list, ("dbos", "list"): dbos_list,
    ("durable", "crash"): durable_crash, ("dbos", "crash"): dbos_crash,
}


async def durable_noop_both(opts: dict[str, Any]) -> dict[str, Any]:
    folder, out = Path(opts["folder"]), {}
    for name, runs, at_once in (("sequential", opts["sequential"], False),
                                ("concurrent", opts["concurrent"], True)):
        if not runs:
            continue
        url = durable_url(folder / f"durable-{name}-{opts['tag']}.db", opts["durability"])
        out[name] = await durable_noop_one(url, runs, at_once, opts)
    return out


def child(opts: dict[str, Any]) -> None:
    import logging

    logging.basicConfig(level=logging.ERROR)
    if opts.get("count"):
        count_commits()
    fn = CHILDREN[(opts["engine"], opts["mode"])]
    if (opts["engine"], opts["mode"]) == ("durable", "noop"):
        fn = durable_noop_both
    assert fn is not None

    async def main() -> dict[str, Any]:
        return {"result": await fn(opts)}

    if opts["engine"] == "durable":
        import anyio

        out = anyio.run(main, backend=opts.get("backend", "asyncio"))
    else:
        out = asyncio.run(main())
    emit(out)
    if opts["engine"] == "dbos":
        os._exit(0)  # DBOS.destroy() would wait on its background threads; nothing to keep


# -- parent ------------------------------------------------------------------------------------
def have_dbos() -> bool:
    return importlib.util.find_spec("dbos") is not None


class Parent:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.folder = Path(tempfile.mkdtemp(prefix="bench-peer-"))
        self.server: subprocess.Popen[str] | None = None
        self.base = ""
        self.strace = shutil.which("strace")
        self.n = 0

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "scripts"),
                                             env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        # DBOS: no conductor (no key given), no OTLP export, nothing but loopback
        env.pop("DBOS_CONDUCTOR_KEY", None)
        env["DBOS__DISABLE_TELEMETRY"] = "true"
        return env

    def start_server(self) -> None:
        self.server = subprocess.Popen(
            [sys.executable, __file__, "--serve"], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, text=True, env=self.env())
        assert self.server.stdout is not None
        port = int(self.server.stdout.readline())
        self.base = f"http://127.0.0.1:{port}"

    def stop_server(self) -> None:
        if self.server is not None:
            assert self.server.stdin is not None
            self.server.stdin.close()
            try:
                self.server.wait(10)
            except subprocess.TimeoutExpired:
                self.server.kill()
                self.server.wait()

    def opts(self, engine: str, mode: str, **extra: Any) -> dict[str, Any]:
        a = self.args
        self.n += 1
        base = {"engine": engine, "mode": mode, "folder": str(self.folder),
                "server": self.base, "sequential": a.sequential, "concurrent": a.concurrent,
                "steps": a.steps, "http": a.http, "hold": a.hold, "samples": a.samples,
                "memory": a.memory, "list_runs": a.list_runs, "lease": a.lease,
                "durability": "default", "backend": "asyncio", "tag": str(self.n)}
        base.update(extra)
        return base

    def run_child(self, opts: dict[str, Any], *, strace_out: Path | None = None,
                  timeout: float = 900) -> dict[str, Any]:
        cmd = [sys.executable, __file__, "--child", json.dumps(opts)]
        if strace_out is not None and self.strace:
            cmd = [self.strace, "-f", "--seccomp-bpf", "-ttt", "-e", "trace=fsync,fdatasync",
                   "-o", str(strace_out), *cmd]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=self.env(),
                              timeout=timeout)
        lines = [line[2:] for line in proc.stdout.splitlines() if line.startswith("@@")]
        if proc.returncode != 0 or not lines:
            raise SystemExit(f"child {opts['engine']} {opts['mode']} failed "
                             f"(exit {proc.returncode}):\n{proc.stderr[-3000:]}")
        out: dict[str, Any] = {}
        for line in lines:
            out.update(json.loads(line))
        return out

    def crash(self, engine: str) -> dict[str, Any]:
        opts = self.opts(engine, "crash", crash_mode="run", tag="crash")
        cmd = [sys.executable, __file__, "--child"]
        first = subprocess.Popen([*cmd, json.dumps(opts)], stdout=subprocess.PIPE,
                                 text=True, env=self.env(), start_new_session=True)
        assert first.stdout is not None
        try:
            line = first.stdout.readline()
            if not line.startswith("@@"):
                raise SystemExit(f"{engine} crash: the first process said {line!r}")
            killed = now()
            os.killpg(first.pid, signal.SIGKILL)
        finally:
            first.kill()
            first.wait()
        opts["crash_mode"] = "resume"
        spawned = now()
        second = self.run_child(opts, timeout=self.args.lease + 120)
        return {"kill_to_resumed_s": second["resumed"] - killed,
                "start_to_resumed_s": second["resumed"] - spawned,
                "state": second.get("state")}

    def run(self) -> dict[str, Any]:
        a = self.args
        engines = ["durable"] + (["dbos"] if have_dbos() and not a.skip_dbos else [])
        res: dict[str, Any] = {"engines": engines, "noop": {}, "counts": {}, "skips": []}
        if "dbos" not in engines:
            res["skips"].append(f"DBOS side: {SKIP_NO_DBOS if not have_dbos() else '--skip-dbos'}")
        self.start_server()
        try:
            for engine in engines:
                levels = ("normal", "full") if engine == "durable" else DURABILITIES
                for level in levels:
                    say(f"no-op steps: {engine}, {DURABILITY_LABEL[level]}")
                    res["noop"][f"{engine}/{level}"] = self.run_child(
                        self.opts(engine, "noop", durability=level))["result"]
                    res["counts"][f"{engine}/{level}"] = self.count(engine, level)
            res["latency"] = {}
            for engine, backend in (("durable", "asyncio"), ("durable", "trio"),
                                    ("dbos", "asyncio")):
                if engine in engines:
                    say(f"HTTP, deadline and cancel: {engine} on {backend}")
                    res["latency"][f"{engine}/{backend}"] = self.run_child(
                        self.opts(engine, "latency", backend=backend,
                                  http=a.http if backend == "asyncio" else 0))["result"]
            res["memory"], res["list"], res["crash"] = {}, {}, {}
            for engine in engines:
                say(f"memory, list/show, crash: {engine}")
                res["memory"][engine] = self.run_child(self.opts(engine, "memory"))["memory"]
                res["list"][engine] = self.run_child(self.opts(engine, "list"))["result"]
                res["crash"][engine] = self.crash(engine)
        finally:
            self.stop_server()
            shutil.rmtree(self.folder, ignore_errors=True)
        return res

    def count(self, engine: str, level: str) -> dict[str, Any]:
        """Commits and fsyncs per step, from a smaller pass of its own: the commits counted
        inside each workload's timed window, the fsyncs whose strace timestamp falls in it."""
        a = self.args
        seq = max(2, round(a.sequential * a.count_scale))
        conc = max(2, round(a.concurrent * a.count_scale))
        trace = self.folder / f"strace-{engine}-{level}.txt"
        out = self.run_child(self.opts(engine, "noop", durability=level, count=True,
                                       sequential=seq, concurrent=conc),
                             strace_out=trace)["result"]
        stamps = self.fsync_stamps(trace) if self.strace else None
        per: dict[str, Any] = {}
        for name, got in out.items():
            t0, t1 = got["wall"]
            per[name] = {"commits_per_step": got["commits"] / got["steps"],
                         "fsyncs_per_step": (None if stamps is None else
                                             sum(t0 <= t <= t1 for t in stamps) / got["steps"])}
        return per

    def fsync_stamps(self, trace: Path) -> list[float]:
        """The wall-clock times of the fsync/fdatasync calls in an ``strace -f -ttt`` log."""
        stamps = []
        for line in trace.read_text().splitlines() if trace.exists() else []:
            if "fsync(" in line or "fdatasync(" in line:
                fields = line.split()
                stamp = fields[1] if fields[0].isdigit() else fields[0]  # "PID TIME call"
                with contextlib.suppress(ValueError):
                    stamps.append(float(stamp))
        return stamps


def say(text: str) -> None:
    print(f"  .. {text}", file=sys.stderr, flush=True)


# -- report ------------------------------------------------------------------------------------
def fmt(value: float | None, digits: int = 0) -> str:
    if value is None:
        return "n/a"
    return f"{value:,.{digits}f}"


def pct(values: list[float | None], q: float) -> float | None:
    xs = sorted(v for v in values if v is not None)
    if not xs:
        return None
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]


def ratio(a: float | None, b: float | None, higher_better: bool) -> str:
    if a is None or b is None or a < 0 or b < 0:
        return "n/a"
    if a == 0 or b == 0:  # a count of none on one side (fsyncs, commits)
        if a == b:
            return "equal (none)"
        return "n/a (none on " + (("durable" if a == 0 else "DBOS") + ")")
    r = a / b if higher_better else b / a
    return f"{r:.2f}x"


def table(res: dict[str, Any], args: argparse.Namespace) -> tuple[str, list[list[str]]]:
    """The markdown table; and its rows (for the test and the plots)."""
    dbos = "dbos" in res["engines"]
    rows: list[list[str]] = []
    skip = "skipped: " + (SKIP_NO_DBOS if not have_dbos() else "--skip-dbos")

    def row(workload: str, figure: str, durability: str, d: float | None, x: float | None,
            digits: int, higher_better: bool, x_text: str | None = None) -> None:
        rows.append([workload, figure, durability, fmt(d, digits),
                     x_text if x_text is not None else (fmt(x, digits) if dbos else skip),
                     ratio(d, x, higher_better) if dbos else "n/a"])

    noop, counts = res["noop"], res["counts"]
    for workload, label in (("sequential", f"sequential {args.sequential} x {args.steps}"),
                            ("concurrent", f"concurrent {args.concurrent} x {args.steps}")):
        for level in DURABILITIES:
            dlevel = "normal" if level == "default" else level
            name = (f"own default (durable {ENGINE_DEFAULT['durable']}, DBOS "
                    f"{ENGINE_DEFAULT['dbos']})" if level == "default"
                    else DURABILITY_LABEL[level])
            d = noop[f"durable/{dlevel}"][workload]
            x = noop.get(f"dbos/{level}", {}).get(workload)
            dc = counts[f"durable/{dlevel}"][workload]
            xc = counts.get(f"dbos/{level}", {}).get(workload, {})
            row(label, "steps/s", name, d["steps_per_s"], x and x["steps_per_s"], 0, True)
            row(label, "CPU ms per step", name, d["cpu_ms_per_step"],
                x and x["cpu_ms_per_step"], 3, False)
            row(label, "commits per step", name, dc["commits_per_step"],
                xc.get("commits_per_step"), 3, False)
            fs_skip = None if shutil.which("strace") else "n/a (no strace)"
            row(label, "fsyncs per step", name, dc["fsyncs_per_step"],
                xc.get("fsyncs_per_step"), 3, False, x_text=fs_skip if dbos else None)
    lat = res["latency"]
    dh, xh = lat["durable/asyncio"].get("http"), lat.get("dbos/asyncio", {}).get("http")
    hl = f"HTTP: {args.http} at once, each one GET"
    if dh is not None:
        for key, figure, hb in (("peak_in_flight", "requests in flight at the peak", True),
                                ("first_ms", "first arrival after the first start (ms)", False),
                                ("last_ms", "last arrival after the first start (ms)", False),
                                ("total_s", "all finished (s)", False)):
            row(hl, figure, "own default", dh[key], xh and xh[key],
                0 if key != "total_s" else 2, hb)
    for kind, label in (("deadline", f"deadline → abort (step timeout {DEADLINE} s)"),
                        ("cancel", "operator cancel → abort")):
        for backend in ("asyncio", "trio"):
            d_samples = lat[f"durable/{backend}"][kind]
            x_samples = lat.get("dbos/asyncio", {}).get(kind) if backend == "asyncio" else None
            for q, qn in ((0.5, "p50"), (0.99, "p99")):
                d = pct(d_samples, q)
                x = pct(x_samples, q) if x_samples else None
                x_text = None if backend == "asyncio" else "n/a (DBOS runs on asyncio only)"
                lost = (sum(v is None for v in (x_samples or []))
                        if backend == "asyncio" else 0)
                if lost and x is None:
                    x_text = f"never within {CANCEL_CAP} s"
                row(f"{label} ({backend}, {len(d_samples)} samples)", f"{qn} ms", "own default",
                    d and 1000 * d, x and 1000 * x, 1, False, x_text=x_text if dbos else None)
            d_lost = sum(v is None for v in d_samples)
            x_lost = sum(v is None for v in (x_samples or []))
            if d_lost or x_lost:
                row(f"{label} ({backend})", f"no close within {CANCEL_CAP} s (count)",
                    "own default", d_lost, x_lost, 0, False)
    mem = res["memory"]

    def per_run(m: dict[str, Any] | None) -> float | None:
        return None if not m else (m["rss_after_kib"] - m["rss_before_kib"]) / 1024

    row(f"memory: {args.memory} waiting workflows", "RSS growth (MiB)", "own default",
        per_run(mem.get("durable")), per_run(mem.get("dbos")), 1, False)
    lists = res["list"]
    for figure in ("list newest 50", "list failed, 50", "show one run's steps"):
        row(f"list/show at {args.list_runs:,} runs", f"{figure} (ms, median of 21)",
            "own default", lists["durable"][figure], lists.get("dbos", {}).get(figure), 2, False)
    crash = res["crash"]
    dcr, xcr = crash["durable"], crash.get("dbos")
    row("crash → resumed (SIGKILL, restart)", "SIGKILL → step 2 runs again (s)",
        f"own default (durable lease {args.lease:g} s)", dcr["kill_to_resumed_s"],
        xcr and xcr["kill_to_resumed_s"], 2, False)
    row("crash → resumed (SIGKILL, restart)", "new process start → step 2 runs again (s)",
        "own default", dcr["start_to_resumed_s"], xcr and xcr["start_to_resumed_s"], 2, False)
    head = ["workload", "figure", "durability", "durable", "DBOS Transact",
            "durable vs DBOS (>1: durable better)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines), rows


def noop_key(engine: str, level: str) -> str:
    """durable's own default is WAL + NORMAL: one run stands for both rows."""
    return f"{engine}/{'normal' if engine == 'durable' and level == 'default' else level}"


def plots(res: dict[str, Any], folder: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    engines = res["engines"]
    made = []
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, workload in zip(axes, ("sequential", "concurrent"), strict=True):
        width = 0.38
        for k, engine in enumerate(engines):
            values = [res["noop"][noop_key(engine, lvl)][workload]["steps_per_s"]
                      for lvl in DURABILITIES]
            xs = [i + (k - 0.5) * width for i in range(len(DURABILITIES))]
            bars = ax.bar(xs, values, width, label="durable" if engine == "durable"
                          else "DBOS Transact")
            ax.bar_label(bars, fmt="%.0f", fontsize=7)
        ax.set_xticks(range(len(DURABILITIES)),
                      ["own default", "WAL+NORMAL", "WAL+FULL"])
        ax.set_yscale("log")
        top = max(res["noop"][noop_key(e, lvl)][workload]["steps_per_s"]
                  for e in engines for lvl in DURABILITIES)
        ax.set_ylim(10, top * 5)  # from 10: a cropped log axis would exaggerate the ratios
        ax.set_title(f"{workload} no-op steps (steps/s, log scale from 10)")
        ax.legend()
    fig.tight_layout()
    path = folder / "peer-steps.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    made.append(path)

    fig, ax = plt.subplots(figsize=(11, 4))
    labels, series = [], {e: [] for e in engines}
    lat = res["latency"]
    for kind in ("deadline", "cancel"):
        for q, qn in ((0.5, "p50"), (0.99, "p99")):
            labels.append(f"{kind} {qn}")
            for engine in engines:
                v = pct(lat[f"{engine}/asyncio"][kind], q)
                series[engine].append(1000 * v if v is not None else 0.0)
    labels.append("crash→resumed")
    for engine in engines:
        series[engine].append(1000 * res["crash"][engine]["kill_to_resumed_s"])
    width = 0.38
    for k, engine in enumerate(engines):
        xs = [i + (k - 0.5) * width for i in range(len(labels))]
        bars = ax.bar(xs, series[engine], width,
                      label="durable" if engine == "durable" else "DBOS Transact")
        ax.bar_label(bars, fmt="%.1f", fontsize=7)
    ax.set_xticks(range(len(labels)), labels)
    ax.set_yscale("log")
    ax.set_ylim(0.1, max(max(v) for v in series.values()) * 5)
    ax.set_ylabel("ms (log scale from 0.1)")
    ax.set_title("latency on asyncio (lower is better)")
    ax.legend()
    fig.tight_layout()
    path = folder / "peer-latency.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    made.append(path)
    return made


def machine() -> str:
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip() or "unknown"
    dbos_version = "not installed"
    if have_dbos():
        import importlib.metadata

        dbos_version = importlib.metadata.version("dbos")
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    return (f"{dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC: {os.cpu_count()} CPUs, "
            f"Python {platform.python_version()}, SQLite {sqlite3.sqlite_version}, "
            f"durable {commit}, DBOS Transact {dbos_version}, load {load}")


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    p.add_argument("--sequential", type=int, default=200)
    p.add_argument("--concurrent", type=int, default=1000)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--http", type=int, default=1000)
    p.add_argument("--hold", type=float, default=10.0,
                   help="seconds the server holds a batch at most (default 10)")
    p.add_argument("--samples", type=int, default=20, help="deadline/cancel samples (20)")
    p.add_argument("--memory", type=int, default=1000)
    p.add_argument("--list-runs", type=int, default=100_000)
    p.add_argument("--lease", type=float, default=30.0,
                   help="durable's lease in the crash workload (its default, 30 s)")
    p.add_argument("--count-scale", type=float, default=0.25,
                   help="size of the counting pass against the timed one (0.25)")
    p.add_argument("--plots", type=Path, default=None, help="write PNG plots to this folder")
    p.add_argument("--json", type=Path, default=None, help="write every figure as JSON")
    p.add_argument("--skip-dbos", action="store_true")
    p.add_argument("--from-json", type=Path, default=None,
                   help="print the table and draw the plots of a run saved with --json "
                        "(give the sizes that run used)")
    p.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.quick:
        args.sequential, args.concurrent, args.steps, args.http = 10, 20, 2, 20
        args.samples, args.memory, args.list_runs, args.lease = 3, 50, 2000, 1.0
        args.hold, args.count_scale = 5.0, 0.5
    for name in ("sequential", "concurrent", "steps", "samples", "memory", "list_runs"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.http < 1 or args.lease <= 0 or args.hold <= 0 or not 0 < args.count_scale <= 1:
        p.error("--http must be at least 1; --lease and --hold positive; --count-scale in (0, 1]")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.serve:
        asyncio.run(serve())
        return 0
    if args.child:
        child(json.loads(args.child))
        return 0
    if args.from_json is not None:
        try:
            res = json.loads(args.from_json.read_text())
        except (OSError, ValueError) as exc:
            print(f"bench_peer: cannot read {args.from_json}: {exc}", file=sys.stderr)
            return 2
        print(f"durable vs DBOS Transact, {res.get('machine', 'machine not recorded')}")
    else:
        print(f"durable vs DBOS Transact, {machine()}")
        res = Parent(args).run()
        res["machine"] = machine()
    text, _rows = table(res, args)
    print()
    print(text)
    for note in res["skips"]:
        print(f"\nskipped: {note}")
    if not shutil.which("strace"):
        print("\nfsyncs per step: n/a (strace not found; apt-get install strace)")
    if args.plots is not None:
        if importlib.util.find_spec("matplotlib") is None:
            print("\nplots: skipped (matplotlib is not installed)")
        else:
            for path in plots(res, args.plots):
                print(f"plot: {path}")
    if args.json is not None:
        args.json.write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
