"""The metrics stay true when things go wrong: an attempt that crashed is no longer counted
running, a refused write is counted, a loop that recovered stops showing as failing, a queue
that emptied shows 0, and a scrape is answered when the store fails or hangs."""

from __future__ import annotations

from typing import Any

import anyio
import httpx
import pytest

pytest.importorskip("prometheus_client")

import durable
import durable.prometheus
from durable import FakeClock, RunState
from durable._errors import StoreError
from durable.interceptors import WriteInfo
from durable.prometheus import MetricsInterceptor, serve_metrics

from .helpers import poll, running_worker

pytestmark = pytest.mark.anyio


def sample(metrics: MetricsInterceptor, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


class Crashes(durable.Interceptor):
    """An interceptor inside the metrics one whose attempt hook raises (the engine's own
    failure looks the same from outside)."""

    async def intercept_attempt(self, info: Any, call_next: Any) -> str:
        raise RuntimeError("broken hook")


async def test_a_crashed_attempt_is_counted_ended_and_no_longer_running(
        client: durable.Client, registry: durable.Registry) -> None:
    @durable.workflow("crashy", registry=registry)
    async def flow(ctx: durable.WorkflowContext) -> None:
        return None

    metrics = MetricsInterceptor()
    async with running_worker(client, registry, interceptors=[metrics, Crashes()]):
        await client.start("crashy", id="c1")
        await poll(lambda: sample(metrics, "durable_attempts_ended_total",
                                  workflow="crashy", outcome="crashed") >= 1)
    assert sample(metrics, "durable_attempts_started_total", workflow="crashy") >= 1
    assert sample(metrics, "durable_attempts_running", workflow="crashy") == 0


async def test_a_refused_write_is_counted_by_kind() -> None:
    metrics = MetricsInterceptor()
    info = WriteInfo(run=None, kind="finish", entries=1)  # type: ignore[arg-type]

    async def refused() -> bool:
        return False

    async def committed() -> bool:
        return True

    assert await metrics.intercept_write(info, refused) is False
    assert await metrics.intercept_write(info, committed) is True
    assert sample(metrics, "durable_journal_writes_refused_total", kind="finish") == 1
    assert sample(metrics, "durable_journal_write_duration_seconds_count", kind="finish") == 2


def test_a_loop_that_recovered_no_longer_shows_as_failing() -> None:
    metrics = MetricsInterceptor()
    metrics.on_loop_failed("claim", "cannot reach the store")
    metrics.on_loop_failed("claim", "cannot reach the store")
    assert sample(metrics, "durable_loop_failing", loop="claim") == 1
    metrics.on_loop_recovered("claim", 2, 3.0)
    assert sample(metrics, "durable_loop_failing", loop="claim") == 0
    assert sample(metrics, "durable_loop_failures_total", loop="claim") == 2


async def test_a_queue_that_emptied_shows_zero(
        fclient: durable.Client, registry: durable.Registry, clock: FakeClock) -> None:
    @durable.workflow("queued", registry=registry)
    async def flow(ctx: durable.WorkflowContext) -> None:
        return None

    metrics = MetricsInterceptor()
    await fclient.start("queued", id="q1")
    clock.advance(5.0)
    await metrics.refresh_queue(fclient.store)
    assert sample(metrics, "durable_queue_depth", workflow="queued") == 1
    assert sample(metrics, "durable_queue_age_seconds", workflow="queued") > 0
    assert (await fclient.cancel("q1")).state is RunState.CANCELLED
    await metrics.refresh_queue(fclient.store)
    assert sample(metrics, "durable_queue_depth", workflow="queued") == 0
    assert sample(metrics, "durable_queue_age_seconds", workflow="queued") == 0


async def test_a_paused_workflow_shows_one_until_it_is_resumed(
        fclient: durable.Client) -> None:
    """``durable_workflow_paused``: 1 while paused (its queue is expected to grow), 0 once
    resumed; a workflow never paused has no sample."""
    metrics = MetricsInterceptor()
    await fclient.pause("wiper")
    await metrics.refresh_queue(fclient.store)
    assert sample(metrics, "durable_workflow_paused", workflow="wiper") == 1
    assert metrics.registry.get_sample_value("durable_workflow_paused",
                                             {"workflow": "other"}) is None
    await fclient.resume("wiper")
    await metrics.refresh_queue(fclient.store)
    assert sample(metrics, "durable_workflow_paused", workflow="wiper") == 0


async def _scrape(metrics: MetricsInterceptor, store: Any) -> httpx.Response:
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    async with anyio.create_task_group() as tg:
        await tg.start(serve_metrics, metrics, store, listener)
        async with httpx.AsyncClient() as http:
            response = await http.get(f"http://127.0.0.1:{port}/metrics", timeout=20)
        tg.cancel_scope.cancel()
    return response


async def test_a_scrape_is_answered_when_the_store_fails(
        client: durable.Client, monkeypatch: pytest.MonkeyPatch) -> None:
    async def unreachable() -> dict[str, tuple[int, float]]:
        raise StoreError("cannot reach the store")

    monkeypatch.setattr(client.store, "queue_stats", unreachable)
    metrics = MetricsInterceptor()
    metrics.on_loop_failed("claim", "cannot reach the store")
    with durable.testing.capture_logs() as entries:
        response = await _scrape(metrics, client.store)
    assert response.status_code == 200 and 'durable_loop_failing{loop="claim"} 1.0' in response.text
    assert [e["event"] for e in entries] == ["metrics_queue_read_failed"]


async def test_a_scrape_is_answered_when_the_store_hangs(
        client: durable.Client, monkeypatch: pytest.MonkeyPatch) -> None:
    async def hangs() -> dict[str, tuple[int, float]]:
        await anyio.sleep_forever()
        raise AssertionError

    monkeypatch.setattr(client.store, "queue_stats", hangs)
    monkeypatch.setattr(durable.prometheus, "QUEUE_READ_TIMEOUT", 0.2)
    metrics = MetricsInterceptor()
    metrics.on_loop_failed("renew", "timed out")
    with anyio.fail_after(10):
        response = await _scrape(metrics, client.store)
    assert response.status_code == 200 and 'durable_loop_failing{loop="renew"} 1.0' in response.text


async def test_a_request_head_without_an_end_is_answered_at_the_limit() -> None:
    """A client that sends header lines and never ends them holds no buffer past 16 KiB:
    the page is answered at the limit, without waiting for the read timeout."""
    metrics = MetricsInterceptor()
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    async with anyio.create_task_group() as tg:
        await tg.start(serve_metrics, metrics, None, listener)
        with anyio.fail_after(5):
            async with await anyio.connect_tcp("127.0.0.1", port) as stream:
                await stream.send(b"GET /metrics HTTP/1.1\r\nhost: 127.0.0.1\r\n"
                                  + b"x-filler: " + b"a" * 20000)
                answer = b""
                try:
                    while True:
                        answer += await stream.receive()
                except (anyio.EndOfStream, anyio.BrokenResourceError):
                    pass
        tg.cancel_scope.cancel()
    assert answer.startswith(b"HTTP/1.1 200 OK\r\n")
