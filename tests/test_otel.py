"""durable.otel: spans per attempt, step try and request, trace context over real HTTP."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("opentelemetry.sdk")

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
    InMemorySpanExporter,
)
from opentelemetry.trace import SpanKind, StatusCode

import durable
from durable.otel import TracingInterceptor

from .conftest import ROOT, subprocess_env
from .helpers import running_worker
from .httpserver import Rule, loopback_server

pytestmark = pytest.mark.anyio
TOKEN = "s3cr3t-t0ken-value"


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def provider(exporter: InMemorySpanExporter) -> TracerProvider:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider


def _named(spans: tuple[ReadableSpan, ...] | list[ReadableSpan], name: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name == name]


async def test_attempt_step_and_request_spans_with_trace_context_sent(
        client: durable.Client, registry: durable.Registry, provider: TracerProvider,
        exporter: InMemorySpanExporter) -> None:
    tracing = TracingInterceptor(provider)
    async with loopback_server() as server:
        server.on("/db", Rule(status=503, times=1))
        server.on("/db", Rule(status=204))

        @durable.activity(registry=registry,
                          retry=durable.RetryPolicy(max_tries=2, initial_delay=0))
        async def delete_db(ctx: durable.ActivityContext) -> int:
            response = await ctx.http.delete(f"{server.url}/db")
            response.raise_for_status()
            return response.status_code

        @durable.workflow("traced", registry=registry)
        async def traced(ctx: durable.WorkflowContext) -> int:
            return int(await delete_db(ctx))

        starter = durable.Client(client.store, registry=registry, interceptors=[tracing])
        with provider.get_tracer("app").start_as_current_span("enqueue") as enqueue:
            await starter.start("traced", id="t1", key="slot-1")
        async with running_worker(client, registry, interceptors=[tracing]) as worker:
            assert (await client.wait("t1")).result == 204
        first, second = server.seen("/db")
    spans = exporter.get_finished_spans()
    [attempt] = _named(spans, "durable.attempt traced")
    steps = _named(spans, f"durable.step {delete_db.name}")
    requests = _named(spans, "HTTP DELETE")
    assert len(steps) == 2 and len(requests) == 2

    # the attempt is a root linked to the span current at Client.start
    assert attempt.parent is None
    [link] = attempt.links
    assert link.context.trace_id == enqueue.get_span_context().trace_id
    assert link.context.span_id == enqueue.get_span_context().span_id
    assert attempt.attributes is not None
    assert dict(attempt.attributes) == {
        "durable.run.id": "t1", "durable.workflow": "traced", "durable.run.key": "slot-1",
        "durable.attempt": 1, "durable.epoch": attempt.attributes["durable.epoch"],
        "durable.worker": worker.worker_id, "durable.outcome": "completed"}
    assert int(attempt.attributes["durable.epoch"]) >= 1

    # one step span per try, children of the attempt; each request a child of its try
    assert attempt.context is not None
    for number, (step, request, seen) in enumerate(zip(steps, requests, (first, second),
                                                       strict=True), start=1):
        assert step.parent is not None and step.parent.span_id == attempt.context.span_id
        assert step.context is not None and step.attributes is not None
        assert step.context.trace_id == attempt.context.trace_id
        assert step.attributes["durable.try"] == number
        assert step.attributes["durable.step"] == 1
        assert step.attributes["durable.activity"] == delete_db.name
        assert request.parent is not None and request.parent.span_id == step.context.span_id
        assert request.kind is SpanKind.CLIENT and request.context is not None
        # the service saw the request span's own context (W3C traceparent)
        assert seen.headers["traceparent"] == (
            f"00-{request.context.trace_id:032x}-{request.context.span_id:016x}-"
            f"{request.context.trace_flags:02x}")
        assert request.attributes is not None
        assert request.attributes["server.port"] == server.port
        assert "url.path" not in request.attributes and "url.full" not in request.attributes
    assert [s.attributes["durable.outcome"] for s in steps if s.attributes] == [
        "error", "completed"]
    assert steps[0].status.status_code is StatusCode.ERROR
    assert [r.attributes["http.response.status_code"] for r in requests if r.attributes] == [
        503, 204]
    assert requests[0].status.status_code is StatusCode.ERROR


async def test_a_run_started_outside_a_trace_has_no_link(
        client: durable.Client, registry: durable.Registry, provider: TracerProvider,
        exporter: InMemorySpanExporter) -> None:
    tracing = TracingInterceptor(provider)

    @durable.workflow("untraced", registry=registry)
    async def untraced(ctx: durable.WorkflowContext) -> None:
        return None

    starter = durable.Client(client.store, registry=registry, interceptors=[tracing])
    await starter.start("untraced", id="u")
    async with running_worker(client, registry, interceptors=[tracing]):
        await client.wait("u")
    assert "headers" not in (await client.journal("u"))[0].data
    [attempt] = _named(exporter.get_finished_spans(), "durable.attempt untraced")
    assert attempt.links == ()


async def test_secrets_never_reach_spans(
        client: durable.Client, registry: durable.Registry, provider: TracerProvider,
        exporter: InMemorySpanExporter) -> None:
    tracing = TracingInterceptor(provider)
    async with loopback_server() as server:
        server.on(f"/api/{TOKEN}", Rule(status=500))

        @durable.activity(registry=registry, retry=durable.RetryPolicy(max_tries=1))
        async def call(ctx: durable.ActivityContext) -> None:
            response = await ctx.http.get(f"{server.url}/api/{TOKEN}?token={TOKEN}",
                                          headers={"Authorization": f"Bearer {TOKEN}"})
            raise RuntimeError(f"server failed ({response.status_code}) for "
                               f"Authorization: Bearer {TOKEN}")

        @durable.workflow("secretive", registry=registry)
        async def secretive(ctx: durable.WorkflowContext) -> None:
            await call(ctx)

        starter = durable.Client(client.store, registry=registry, interceptors=[tracing])
        with provider.get_tracer("app").start_as_current_span("enqueue"):
            await starter.start("secretive", id="s")
        async with running_worker(client, registry, interceptors=[tracing]):
            done = await client.wait("s")
        [seen] = server.seen(f"/api/{TOKEN}")
    assert seen.headers["authorization"] == f"Bearer {TOKEN}"  # it was really sent
    assert done.state is durable.RunState.FAILED
    spans = exporter.get_finished_spans()
    assert {s.name for s in spans} >= {"durable.attempt secretive", "HTTP GET",
                                        f"durable.step {call.name}"}
    exported = json.dumps([json.loads(s.to_json()) for s in spans])
    assert TOKEN not in exported
    assert "RuntimeError" in exported  # the error's type is there, its text is not
    [attempt] = _named(spans, "durable.attempt secretive")
    assert attempt.attributes is not None and attempt.attributes["durable.outcome"] == "failed"


def test_durable_imports_without_opentelemetry_and_the_module_names_the_extra() -> None:
    code = (
        "import sys\n"
        "import durable, durable.worker, durable._cli\n"
        "assert not [m for m in sys.modules if m.split('.')[0] in "
        "('opentelemetry', 'prometheus_client')], 'an extra was imported'\n"
        "sys.modules['opentelemetry'] = None\n"
        "try:\n"
        "    import durable.otel\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=subprocess_env(),
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "durable-fenced[otel]" in out.stdout and out.stdout.count("\n") == 1


async def test_a_cancel_mid_request_ends_every_span_none_of_them_an_error(
        client: durable.Client, registry: durable.Registry, provider: TracerProvider,
        exporter: InMemorySpanExporter) -> None:
    """An operator's cancel while the step's request waits at the service: the attempt, the
    step and the request spans end, cancelled, none with status ERROR (nothing failed)."""
    tracing = TracingInterceptor(provider)
    async with loopback_server() as server:
        server.on("/hang", Rule(hang=True))

        @durable.activity(registry=registry, retry=durable.RetryPolicy(max_tries=1))
        async def wait_on_service(ctx: durable.ActivityContext) -> None:
            await ctx.http.get(f"{server.url}/hang")

        @durable.workflow("cancelled.mid.request", registry=registry)
        async def cancelled_mid_request(ctx: durable.WorkflowContext) -> None:
            await wait_on_service(ctx)

        async with running_worker(client, registry, interceptors=[tracing]):
            await client.start("cancelled.mid.request", id="c")
            await server.wait_for(lambda: server.seen("/hang"))
            await client.cancel("c")
            assert (await client.wait("c", timeout=10)).state is durable.RunState.CANCELLED
    spans = exporter.get_finished_spans()
    [attempt] = _named(spans, "durable.attempt cancelled.mid.request")
    [step] = _named(spans, f"durable.step {wait_on_service.name}")
    [request] = _named(spans, "HTTP GET")
    assert attempt.attributes is not None and step.attributes is not None
    assert attempt.attributes["durable.outcome"] == "cancelled"
    assert step.attributes["durable.outcome"] == "cancelled"
    assert [s.status.status_code for s in (attempt, step, request)] == [StatusCode.UNSET] * 3
