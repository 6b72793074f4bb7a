"""A broken observer never breaks a run: an event hook that raises is logged and the hooks
after it are still told; a span exporter that raises leaves the run to complete."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

import durable
import durable.testing
from durable import RunState
from durable.interceptors import StartInfo

from .helpers import running_worker

pytestmark = pytest.mark.anyio


class Broken(durable.Interceptor):
    def on_start(self, info: StartInfo) -> None:
        raise RuntimeError("broken hook")


class Tags(durable.Interceptor):
    def on_start(self, info: StartInfo) -> None:
        info.headers["tenant"] = "blue"


async def test_a_failing_event_hook_does_not_keep_the_next_hooks_from_being_told(
        client: durable.Client, registry: durable.Registry) -> None:
    @durable.workflow("told", registry=registry)
    async def told(ctx: durable.WorkflowContext) -> str:
        return "fine"

    starter = durable.Client(client.store, registry=registry,
                             interceptors=[Broken(), Tags(), Broken()])
    with durable.testing.capture_logs() as logs:
        await starter.start("told", id="t")
    assert [e["event"] for e in logs if e["event"] == "interceptor_failed"] == [
        "interceptor_failed", "interceptor_failed"]
    assert (await client.journal("t"))[0].data["headers"] == {"tenant": "blue"}
    async with running_worker(client, registry):
        assert (await client.wait("t")).result == "fine"


async def test_a_span_exporter_that_raises_never_breaks_a_run(
        client: durable.Client, registry: durable.Registry) -> None:
    pytest.importorskip("opentelemetry.sdk")
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.sdk.trace.export import (
        SimpleSpanProcessor,
        SpanExporter,
        SpanExportResult,
    )

    from durable.otel import TracingInterceptor

    exported: list[str] = []

    class Failing(SpanExporter):
        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            exported.extend(s.name for s in spans)
            raise ConnectionError("collector unreachable")

    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(Failing()))
    tracing = TracingInterceptor(provider)

    @durable.activity(registry=registry)
    async def work(ctx: durable.ActivityContext) -> int:
        return 7

    @durable.workflow("exported", registry=registry)
    async def flow(ctx: durable.WorkflowContext) -> int:
        return int(await work(ctx))

    starter = durable.Client(client.store, registry=registry, interceptors=[tracing])
    await starter.start("exported", id="e")
    async with running_worker(client, registry, interceptors=[tracing]):
        done = await client.wait("e")
    assert done.state is RunState.COMPLETED and done.result == 7
    assert f"durable.step {work.name}" in exported and "durable.attempt exported" in exported
