"""Prometheus metrics of a worker (the ``prometheus`` extra).

``python -m durable.worker ... --metrics 127.0.0.1:9464`` serves them at
``http://127.0.0.1:9464/metrics``; in code::

    from durable.prometheus import MetricsInterceptor, serve_metrics

    metrics = MetricsInterceptor()
    worker = durable.Worker(store, interceptors=[metrics])
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=9464)
    async with anyio.create_task_group() as tg:
        await tg.start(serve_metrics, metrics, store, listener)   # GET /metrics
        await worker.run()

Every metric is named in docs/observability.md. Labels are workflow and activity names,
outcomes, states and write kinds: never a run id, key, argument, URL or error text (the
first two would make one series per run; the others may hold credentials).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

try:
    from prometheus_client import (
        CONTENT_TYPE_LATEST,
        CollectorRegistry,
        Counter,
        Gauge,
        Histogram,
        generate_latest,
    )
except ImportError as exc:  # pragma: no cover - the extra is missing
    raise ImportError(
        f"durable.prometheus needs the prometheus extra ({exc.name} is not installed): pip "
        "install 'durable-fenced[prometheus]' (from a checkout: pip install -e "
        "'.[prometheus]')") from exc

import anyio
import anyio.abc

from ._errors import StoreError
from ._hosts import foreign_name
from ._interceptors import (
    AttemptInfo,
    ClaimInfo,
    Interceptor,
    RenewInfo,
    StartInfo,
    StepInfo,
    WriteInfo,
)
from ._logging import get_logger
from ._types import Fence, Renewal, Run
from .store import Store

__all__ = ["MetricsInterceptor", "serve_metrics"]

FINISHED = {"completed": "completed", "failed": "failed", "cancelled": "cancelled"}
"""Attempt outcomes that finish the run, by the run's state."""

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                   2.5, 5.0, 10.0)
"""Claims, journal writes: mostly milliseconds."""

STEP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                300.0, 900.0, 3600.0)
"""Activity tries: milliseconds (a cached lookup) to an hour (a database restore)."""

QUEUE_READ_TIMEOUT = 5.0
"""Seconds a scrape waits for the queue read before answering without fresh queue gauges."""

_log = get_logger("durable.metrics")


class MetricsInterceptor(Interceptor):
    """Counters and histograms of what the worker does, in ``registry`` (default: a new
    :class:`prometheus_client.CollectorRegistry` of its own, :attr:`registry`)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        r = self.registry
        self.runs_enqueued = Counter(
            "durable_runs_enqueued", "Runs created by Client.start in this process",
            ["workflow"], registry=r)
        self.runs_started = Counter(
            "durable_runs_started", "Runs whose first attempt started here",
            ["workflow"], registry=r)
        self.attempts_started = Counter(
            "durable_attempts_started", "Attempts started here (claims of a run)",
            ["workflow"], registry=r)
        self.attempts_ended = Counter(
            "durable_attempts_ended", "Attempts ended here, by outcome (completed, failed, "
            "cancelled, released, abandoned, superseded, unknown, crashed)",
            ["workflow", "outcome"], registry=r)
        self.runs_finished = Counter(
            "durable_runs_finished", "Runs finished by an attempt here, by final state",
            ["workflow", "state"], registry=r)
        self.attempts_running = Gauge(
            "durable_attempts_running", "Attempts running here now", ["workflow"],
            registry=r)
        self.step_duration = Histogram(
            "durable_step_duration_seconds", "Duration of one try of an activity, by outcome "
            "(completed, error, timed_out, cancelled)", ["workflow", "activity", "outcome"],
            buckets=STEP_BUCKETS, registry=r)
        self.step_tries = Counter(
            "durable_step_tries", "Tries of activities, by outcome",
            ["workflow", "activity", "outcome"], registry=r)
        self.steps_in_doubt = Counter(
            "durable_steps_in_doubt", "Steps found started by an earlier attempt with no "
            "recorded outcome", ["workflow", "activity"], registry=r)
        self.claim_duration = Histogram(
            "durable_claim_duration_seconds", "Duration of one claim statement",
            buckets=LATENCY_BUCKETS, registry=r)
        self.claimed = Counter(
            "durable_claimed_runs", "Runs claimed by this worker", registry=r)
        self.write_duration = Histogram(
            "durable_journal_write_duration_seconds", "Duration of one fenced write "
            "(append: journal entries, records, finish, release), retries included",
            ["kind"], buckets=LATENCY_BUCKETS, registry=r)
        self.writes_refused = Counter(
            "durable_journal_writes_refused", "Fenced writes the store refused (the "
            "attempt no longer held its lease and epoch) or whose outcome is unknown",
            ["kind"], registry=r)
        self.renewals = Counter(
            "durable_lease_renewals", "Leases renewed (one per held run per renewal)",
            registry=r)
        self.renewal_duration = Histogram(
            "durable_lease_renewal_duration_seconds", "Duration of one renewal statement",
            buckets=LATENCY_BUCKETS, registry=r)
        self.lease_losses = Counter(
            "durable_lease_losses", "Attempts that lost their lease", ["workflow"],
            registry=r)
        self.recoveries = Counter(
            "durable_recoveries", "Runs queued again by this worker after their worker "
            "died or their lease expired (by: sweep, liveness)", ["by"], registry=r)
        self.queue_depth = Gauge(
            "durable_queue_depth", "Queued runs that are due, per workflow (read from the "
            "store at each scrape)", ["workflow"], registry=r)
        self.queue_age = Gauge(
            "durable_queue_age_seconds", "How long the longest-waiting due queued run has "
            "been due, per workflow (0: none)", ["workflow"], registry=r)
        self.workflow_paused = Gauge(
            "durable_workflow_paused", "1 while a workflow is paused (durable pause: its runs "
            "wait, its queue grows), else 0 (read from the store at each scrape)",
            ["workflow"], registry=r)
        self.loop_failures = Counter(
            "durable_loop_failures", "Failed tries of a worker loop (claim, renew, listen, "
            "sweep, schedule, ...): the store unreachable, say", ["loop"], registry=r)
        self.loop_failing = Gauge(
            "durable_loop_failing", "1 while a worker loop's tries fail (from its first "
            "failure to its next success), else 0", ["loop"], registry=r)
        self._queued: set[str] = set()
        self._paused: set[str] = set()

    def on_loop_failed(self, loop: str, error: str) -> None:
        self.loop_failures.labels(loop).inc()
        self.loop_failing.labels(loop).set(1)

    def on_loop_recovered(self, loop: str, failures: int, seconds: float) -> None:
        self.loop_failing.labels(loop).set(0)

    # -- client ------------------------------------------------------------------------------
    def on_start(self, info: StartInfo) -> None:
        self.runs_enqueued.labels(info.workflow).inc()

    # -- worker ------------------------------------------------------------------------------
    async def intercept_claim(self, info: ClaimInfo,
                              call_next: Callable[[], Awaitable[list[Run]]]) -> list[Run]:
        started = time.perf_counter()
        try:
            runs = await call_next()
        finally:
            self.claim_duration.observe(time.perf_counter() - started)
        if runs:
            self.claimed.inc(len(runs))
        return runs

    async def intercept_attempt(self, info: AttemptInfo,
                                call_next: Callable[[], Awaitable[str]]) -> str:
        workflow = info.run.workflow
        self.attempts_started.labels(workflow).inc()
        if info.run.attempt == 1:
            self.runs_started.labels(workflow).inc()
        running = self.attempts_running.labels(workflow)
        running.inc()
        outcome = "crashed"
        try:
            outcome = await call_next()
            return outcome
        finally:
            running.dec()
            self.attempts_ended.labels(workflow, outcome).inc()
            state = FINISHED.get(outcome)
            if state is not None:
                self.runs_finished.labels(workflow, state).inc()

    async def intercept_step(self, info: StepInfo,
                             call_next: Callable[[], Awaitable[Any]]) -> Any:
        started = time.perf_counter()
        outcome = "cancelled"
        try:
            result = await call_next()
            outcome = "completed"
            return result
        except TimeoutError:
            outcome = "timed_out"
            raise
        except Exception:
            outcome = "error"
            raise
        finally:
            labels = (info.run.workflow, info.activity, outcome)
            self.step_duration.labels(*labels).observe(time.perf_counter() - started)
            self.step_tries.labels(*labels).inc()

    async def intercept_write(self, info: WriteInfo,
                              call_next: Callable[[], Awaitable[bool]]) -> bool:
        started = time.perf_counter()
        ok = False
        try:
            ok = await call_next()
            return ok
        finally:
            self.write_duration.labels(info.kind).observe(time.perf_counter() - started)
            if not ok:
                self.writes_refused.labels(info.kind).inc()

    async def intercept_renew(self, info: RenewInfo,
                              call_next: Callable[[], Awaitable[list[Renewal]]]
                              ) -> list[Renewal]:
        started = time.perf_counter()
        try:
            held = await call_next()
        finally:
            self.renewal_duration.observe(time.perf_counter() - started)
        self.renewals.inc(len(held))
        return held

    def on_lease_lost(self, info: AttemptInfo, reason: str) -> None:
        self.lease_losses.labels(info.run.workflow).inc()

    def on_recovered(self, fences: Sequence[Fence], by: str) -> None:
        self.recoveries.labels(by).inc(len(fences))

    def on_step_in_doubt(self, info: StepInfo) -> None:
        self.steps_in_doubt.labels(info.run.workflow, info.activity).inc()

    # -- the queue ---------------------------------------------------------------------------
    async def refresh_queue(self, store: Store) -> None:
        """Read the due queued runs per workflow into the queue gauges, and the paused
        workflows (two reads); a workflow whose queue emptied, or that was resumed, shows
        0."""
        stats = await store.queue_stats()
        paused = {p.workflow for p in await store.paused_workflows()}
        for workflow in self._paused - paused:  # resumed
            self.workflow_paused.labels(workflow).set(0)
        for workflow in paused:
            self.workflow_paused.labels(workflow).set(1)
        self._paused |= paused
        for workflow in self._queued - set(stats):
            self.queue_depth.labels(workflow).set(0)
            self.queue_age.labels(workflow).set(0)
        for workflow, (depth, age) in stats.items():
            self.queue_depth.labels(workflow).set(depth)
            self.queue_age.labels(workflow).set(age)
        self._queued |= set(stats)

    def exposition(self) -> bytes:
        """The metrics page (Prometheus text format)."""
        return bytes(generate_latest(self.registry))


async def serve_metrics(metrics: MetricsInterceptor, store: Store | None,
                        listener: anyio.abc.Listener[anyio.abc.SocketStream], *,
                        task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
                        ) -> None:
    """Serve ``GET /metrics`` on ``listener`` (``anyio.create_tcp_listener``) until
    cancelled, on asyncio or trio. Each scrape first reads the queue gauges from ``store``
    (bounded by :data:`QUEUE_READ_TIMEOUT`; on a store error the page keeps the last
    ones)."""

    async def answer(stream: anyio.abc.SocketStream) -> None:
        async with stream:
            await _answer(stream, metrics, store)

    async with listener:
        task_status.started()
        await listener.serve(answer)


_HEAD_LIMIT = 16384
_READ_TIMEOUT = 10.0


async def _answer(stream: anyio.abc.SocketStream, metrics: MetricsInterceptor,
                  store: Store | None) -> None:
    head = b""
    with anyio.move_on_after(_READ_TIMEOUT):
        try:
            while b"\r\n\r\n" not in head and len(head) < _HEAD_LIMIT:
                head += await stream.receive()
        except (anyio.EndOfStream, anyio.BrokenResourceError, OSError):
            return
    parts = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/"):
        return await _send(stream, 400, b"bad request\n")
    method, path = parts[0], parts[1].partition("?")[0]
    local = str(stream.extra(anyio.abc.SocketAttribute.local_address, ("",))[0])
    if foreign_name(local, _header(head, b"host")):
        return await _send(stream, 403, b"durable metrics: refused a request for another "
                           b"site's host name on a loopback address (DNS rebinding); "
                           b"scrape it by address or as localhost\n")
    if path not in ("/metrics", "/"):
        return await _send(stream, 404, b"not found: the metrics are at /metrics\n")
    if method not in ("GET", "HEAD"):
        return await _send(stream, 405, b"GET /metrics\n")
    if store is not None:
        with anyio.move_on_after(QUEUE_READ_TIMEOUT):
            try:
                await metrics.refresh_queue(store)
            except NotImplementedError:
                pass  # this store has no queue statistics
            except StoreError as exc:
                _log.warning("metrics_queue_read_failed", error=str(exc))
    body = metrics.exposition()
    await _send(stream, 200, body, CONTENT_TYPE_LATEST, head_only=method == "HEAD")


_REASONS = {200: "OK", 400: "Bad Request", 403: "Forbidden", 404: "Not Found",
            405: "Method Not Allowed"}


def _header(head: bytes, name: bytes) -> str:
    """The value of the request header ``name`` (lower case) in ``head``, or ""."""
    for line in head.split(b"\r\n")[1:]:
        key, sep, value = line.partition(b":")
        if sep and key.strip().lower() == name:
            return value.strip().decode("latin-1")
    return ""


async def _send(stream: anyio.abc.SocketStream, status: int, body: bytes,
                content_type: str = "text/plain; charset=utf-8", *,
                head_only: bool = False) -> None:
    response = (f"HTTP/1.1 {status} {_REASONS[status]}\r\ncontent-type: {content_type}\r\n"
                f"content-length: {len(body)}\r\nconnection: close\r\n\r\n").encode()
    try:
        await stream.send(response if head_only else response + body)
    except (anyio.BrokenResourceError, OSError):
        pass  # the scraper went away
