"""OpenTelemetry traces of durable's attempts, steps and requests (the ``otel`` extra).

::

    from durable.otel import TracingInterceptor

    tracing = TracingInterceptor()                   # the global tracer provider, or pass one
    worker = durable.Worker(store, interceptors=[tracing])
    client = durable.Client(store, interceptors=[tracing])   # runs link to the caller's trace

What is traced (docs/observability.md):

- ``durable.attempt <workflow>``: one span per attempt (a claim of a run), a root span with a
  link to the span that was current when the client started the run (its W3C trace context
  is kept with the run, in its ``run_created`` journal entry);
- ``durable.step <activity>``: one span per try of an activity, a child of the attempt's;
- ``HTTP <method>``: each request through ``ctx.http`` (a client span, a child of the
  step's), its trace context sent in the request's ``traceparent`` header (W3C).

Attributes are identities and outcomes only (``durable.run.id``, ``durable.workflow``,
``durable.run.key``, ``durable.attempt``, ``durable.epoch``, ``durable.step``,
``durable.step.key``, ``durable.activity``, ``durable.try``, ``durable.outcome``,
``error.type``; for requests the method, scheme, host, port and status, never the path or
query). No argument, result, header, URL path or error message is recorded (any may hold a
credential); exceptions are not attached to spans, only their type.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

try:
    from opentelemetry import context as otel_context
    from opentelemetry import trace
    from opentelemetry.propagators.textmap import TextMapPropagator
    from opentelemetry.trace import Link, SpanKind, Status, StatusCode
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError as exc:  # pragma: no cover - the extra is missing
    raise ImportError(
        f"durable.otel needs the otel extra ({exc.name} is not installed): pip install "
        "'durable-fenced[otel]' (from a checkout: pip install -e '.[otel]')") from exc

import httpx

from ._errors import AttemptCancelled
from ._interceptors import AttemptInfo, Interceptor, RequestInfo, StartInfo, StepInfo
from ._types import Run
from ._version import __version__

__all__ = ["TracingInterceptor"]

_FAILED_ATTEMPTS = frozenset({"failed", "abandoned", "superseded", "unknown"})


def _run_attributes(run: Run) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        "durable.run.id": run.id,
        "durable.workflow": run.workflow,
        "durable.attempt": run.attempt,
        "durable.epoch": run.epoch,
    }
    if run.key is not None:
        attributes["durable.run.key"] = run.key
    return attributes


def _step_outcome(exc: BaseException) -> str:
    if isinstance(exc, AttemptCancelled):
        return "cancelled"
    if isinstance(exc, TimeoutError):
        return "timed_out"
    if isinstance(exc, Exception):
        return "error"
    return "cancelled"  # the backend's cancellation (the attempt's scope)


class TracingInterceptor(Interceptor):
    """Spans for attempts, steps and ``ctx.http`` requests; trace context into requests
    and from :meth:`durable.Client.start` to the run's attempts.

    ``tracer_provider``: default the global one. ``propagator``: how trace context is
    written to requests and kept with runs; default W3C Trace Context alone
    (``traceparent``, ``tracestate``: no baggage, which may carry application values).
    """

    def __init__(self, tracer_provider: trace.TracerProvider | None = None, *,
                 propagator: TextMapPropagator | None = None) -> None:
        self._tracer = trace.get_tracer("durable", __version__,
                                        tracer_provider=tracer_provider)
        self._propagator = propagator or TraceContextTextMapPropagator()

    # -- client -------------------------------------------------------------------------------
    def on_start(self, info: StartInfo) -> None:
        """Keep the caller's trace context with the run (nothing when none is current)."""
        carrier: dict[str, str] = {}
        self._propagator.inject(carrier)
        info.headers.update(carrier)

    # -- worker -------------------------------------------------------------------------------
    def _started_by(self, headers: Mapping[str, str]) -> list[Link]:
        if not headers:
            return []
        origin = trace.get_current_span(self._propagator.extract(dict(headers)))
        context = origin.get_span_context()
        return [Link(context, {"durable.link": "started_by"})] if context.is_valid else []

    async def intercept_attempt(self, info: AttemptInfo,
                                call_next: Callable[[], Awaitable[str]]) -> str:
        run = info.run
        links = self._started_by(await info.headers())
        attributes = _run_attributes(run)
        attributes["durable.worker"] = info.worker_id
        with self._tracer.start_as_current_span(
                f"durable.attempt {run.workflow}", context=otel_context.Context(),
                kind=SpanKind.INTERNAL, links=links, attributes=attributes,
                record_exception=False, set_status_on_exception=False) as span:
            try:
                outcome = await call_next()
            except BaseException as exc:
                span.set_attribute("durable.outcome", "crashed")
                span.set_attribute("error.type", type(exc).__name__)
                span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
                raise
            span.set_attribute("durable.outcome", outcome)
            if outcome in _FAILED_ATTEMPTS:
                span.set_status(Status(StatusCode.ERROR, outcome))
            return outcome

    async def intercept_step(self, info: StepInfo,
                             call_next: Callable[[], Awaitable[Any]]) -> Any:
        attributes = _run_attributes(info.run)
        attributes.update({"durable.step": info.step, "durable.step.key": info.step_key,
                           "durable.activity": info.activity, "durable.try": info.try_number})
        with self._tracer.start_as_current_span(
                f"durable.step {info.activity}", kind=SpanKind.INTERNAL,
                attributes=attributes, record_exception=False,
                set_status_on_exception=False) as span:
            try:
                result = await call_next()
            except BaseException as exc:
                outcome = _step_outcome(exc)
                span.set_attribute("durable.outcome", outcome)
                span.set_attribute("error.type", type(exc).__name__)
                if outcome != "cancelled":
                    span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
                raise
            span.set_attribute("durable.outcome", "completed")
            return result

    async def intercept_request(
        self, info: RequestInfo, request: httpx.Request,
        call_next: Callable[[httpx.Request], Awaitable[httpx.Response]],
    ) -> httpx.Response:
        url = request.url
        attributes: dict[str, Any] = {
            "http.request.method": request.method,
            "server.address": url.host,
            "url.scheme": url.scheme,
            # neither the path nor the query: either may hold a credential (a webhook's
            # secret path, an api_key parameter), and no redaction can tell every one
            "durable.run.id": info.run.id,
            "durable.step": info.step,
            "durable.try": info.try_number,
        }
        if url.port is not None:
            attributes["server.port"] = url.port
        with self._tracer.start_as_current_span(
                f"HTTP {request.method}", kind=SpanKind.CLIENT, attributes=attributes,
                record_exception=False, set_status_on_exception=False) as span:
            self._propagator.inject(request.headers)
            try:
                response = await call_next(request)
            except BaseException as exc:
                span.set_attribute("error.type", type(exc).__name__)
                if _step_outcome(exc) != "cancelled":  # a cancel is no failure of the request
                    span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
                raise
            span.set_attribute("http.response.status_code", response.status_code)
            if response.status_code >= 400:
                span.set_attribute("error.type", str(response.status_code))
                span.set_status(Status(StatusCode.ERROR))
            return response
