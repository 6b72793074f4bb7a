"""durable.otel's spans say what happened: an attempt is a root span even when the worker
runs inside an application's span, a failed attempt is an error, a cancelled step is not,
and headers kept with a run that carry no trace context make no link."""

from __future__ import annotations

import anyio
import pytest

pytest.importorskip("opentelemetry.sdk")

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
    InMemorySpanExporter,
)
from opentelemetry.trace import StatusCode

import durable
from durable import RunState
from durable.interceptors import StartInfo
from durable.otel import TracingInterceptor

from .helpers import running_worker
from .test_otel import exporter, provider

pytestmark = pytest.mark.anyio

__all__ = ["exporter", "provider"]  # the span fixtures: test_otel.py


def _one(exporter: InMemorySpanExporter, name: str) -> ReadableSpan:
    [span] = [s for s in exporter.get_finished_spans() if s.name == name]
    return span


async def test_an_attempt_is_a_root_span_inside_the_worker_s_span_and_failed_is_an_error(
        client: durable.Client, registry: durable.Registry, provider: TracerProvider,
        exporter: InMemorySpanExporter) -> None:
    tracing = TracingInterceptor(provider)

    @durable.activity(registry=registry, retry=durable.RetryPolicy(max_tries=1))
    async def boom(ctx: durable.ActivityContext) -> None:
        raise RuntimeError("refused")

    @durable.workflow("failing", registry=registry)
    async def failing(ctx: durable.WorkflowContext) -> None:
        await boom(ctx)

    await client.start("failing", id="f")
    with provider.get_tracer("app").start_as_current_span("service main"):
        async with running_worker(client, registry, interceptors=[tracing]):
            assert (await client.wait("f")).state is RunState.FAILED
    attempt = _one(exporter, "durable.attempt failing")
    assert attempt.parent is None  # not a child of whatever the worker ran inside
    assert attempt.attributes is not None and attempt.attributes["durable.outcome"] == "failed"
    assert attempt.status.status_code is StatusCode.ERROR
    step = _one(exporter, f"durable.step {boom.name}")
    assert step.status.status_code is StatusCode.ERROR


async def test_a_cancelled_step_is_not_an_error(
        client: durable.Client, registry: durable.Registry, provider: TracerProvider,
        exporter: InMemorySpanExporter) -> None:
    tracing = TracingInterceptor(provider)
    entered = anyio.Event()

    @durable.activity(registry=registry)
    async def wait_forever(ctx: durable.ActivityContext) -> None:
        entered.set()
        await anyio.sleep_forever()

    @durable.workflow("cancelled", registry=registry)
    async def flow(ctx: durable.WorkflowContext) -> None:
        await wait_forever(ctx)

    async with running_worker(client, registry, interceptors=[tracing]):
        await client.start("cancelled", id="c")
        await entered.wait()
        await client.cancel("c")
        assert (await client.wait("c")).state is RunState.CANCELLED
    step = _one(exporter, f"durable.step {wait_forever.name}")
    assert step.attributes is not None and step.attributes["durable.outcome"] == "cancelled"
    assert step.status.status_code is StatusCode.UNSET
    attempt = _one(exporter, "durable.attempt cancelled")
    assert attempt.attributes is not None
    assert attempt.attributes["durable.outcome"] == "cancelled"
    assert attempt.status.status_code is StatusCode.UNSET


class Tenant(durable.Interceptor):
    """Keeps a header with the run that is not trace context."""

    def on_start(self, info: StartInfo) -> None:
        info.headers["tenant"] = "blue"


async def test_headers_without_trace_context_make_no_link(
        client: durable.Client, registry: durable.Registry, provider: TracerProvider,
        exporter: InMemorySpanExporter) -> None:
    tracing = TracingInterceptor(provider)

    @durable.workflow("tenant", registry=registry)
    async def flow(ctx: durable.WorkflowContext) -> None:
        return None

    starter = durable.Client(client.store, registry=registry,
                             interceptors=[Tenant(), tracing])
    await starter.start("tenant", id="t")
    async with running_worker(client, registry, interceptors=[tracing]):
        await client.wait("t")
    assert (await client.journal("t"))[0].data["headers"] == {"tenant": "blue"}
    assert _one(exporter, "durable.attempt tenant").links == ()


async def test_baggage_is_never_kept_with_a_run(
        client: durable.Client, registry: durable.Registry, provider: TracerProvider) -> None:
    """Baggage carries application values (a user id, a tenant's token): only W3C trace
    context is kept with the run, where ``show --json`` shows it."""
    from opentelemetry import baggage
    from opentelemetry import context as otel_context

    @durable.workflow("bagged", registry=registry)
    async def flow(ctx: durable.WorkflowContext) -> None:
        return None

    starter = durable.Client(client.store, registry=registry,
                             interceptors=[TracingInterceptor(provider)])
    token = otel_context.attach(baggage.set_baggage("user_token", "s3cr3t"))
    try:
        with provider.get_tracer("app").start_as_current_span("enqueue"):
            await starter.start("bagged", id="b")
    finally:
        otel_context.detach(token)
    headers = (await client.journal("b"))[0].data["headers"]
    assert set(headers) == {"traceparent"} and "s3cr3t" not in str(headers)
