"""Interceptors: the one seam for observing (and wrapping) what a worker and a client do.

An interceptor is an object with any of the hooks of :class:`Interceptor` (subclass it and
override what you need; the defaults pass through). ``Worker(..., interceptors=[a, b])``
and ``Client(..., interceptors=[...])`` call them in order: ``a`` wraps ``b``, which wraps
the engine's own call (``a`` sees everything ``b`` does, as an outer middleware).

Two kinds of hooks:

- *around* hooks (``intercept_*``) get an info object and ``call_next``, and must await it
  and hand back (or re-raise) what it gives: a claim, an attempt, one try of a step, a
  fenced journal write, a lease renewal, one outgoing ``ctx.http`` request. Since they run
  in the task doing the work, context variables set around ``call_next`` (a tracing span)
  are seen by what runs inside it.
- *event* hooks (``on_*``) are plain calls, told after the fact: a lease lost, runs
  recovered, a step found in doubt, a run started by the client (which may add
  :attr:`StartInfo.headers`, kept with the run's ``run_created`` journal entry).

A hook must not raise: an exception from an event hook is logged and dropped; one from an
around hook is the wrapped operation's exception. Hooks see identities (run id, workflow,
key, attempt, epoch, step, try) and outcomes, never arguments, results, request headers or
error texts that have not been redacted.

Cost: the engine asks for a hook only where an interceptor overrides it; a worker without
interceptors calls nothing and builds nothing (one ``is None`` test per operation).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs
import httpx

from ._logging import get_logger

if TYPE_CHECKING:
    from ._types import Fence, Renewal, Run


_log = get_logger("durable.interceptors")


@attrs.frozen
class ClaimInfo:
    """One claim statement: up to ``limit`` runs of ``workflows`` for ``worker_id``."""

    worker_id: str
    limit: int
    workflows: Sequence[str]


@attrs.frozen
class AttemptInfo:
    """One attempt at a run (a claim): ``run`` as claimed (id, workflow, key, attempt,
    epoch). :meth:`headers` reads the headers the client kept with the run (one journal
    read; called by an interceptor that needs them, such as a tracer's link)."""

    run: Run
    worker_id: str
    _read_headers: Callable[[], Awaitable[Mapping[str, str]]] = attrs.field(
        alias="read_headers", repr=False)

    async def headers(self) -> Mapping[str, str]:
        return await self._read_headers()


ATTEMPT_OUTCOMES = ("completed", "failed", "cancelled", "released", "abandoned",
                    "superseded", "unknown", "crashed")
"""What ``intercept_attempt``'s ``call_next`` returns: the run finished (``completed``,
``failed``, ``cancelled``), was given back (``released``: a shutdown, or a durable wait),
the lease was lost (``abandoned``), the final write was refused (``superseded``: another
attempt holds the run now), the final write's outcome cannot be told (``unknown``: no
answer came, and the journal does not hold it, or could not be read; the run's journal
says later, and a run left running is recovered when its lease lapses), or the engine
itself failed (``crashed``, raised rather than returned). A final write refused or
unanswered whose entry the journal holds under the attempt's epoch (an earlier try of it
committed, its answer lost) ends as that write says."""


@attrs.frozen
class StepInfo:
    """One try of an activity step: ``try_number`` counts from 1 across the run's
    attempts (as :attr:`durable.ActivityContext.try_number`)."""

    run: Run
    step: int
    step_key: str
    activity: str
    try_number: int
    on_doubt: str = "retry"


@attrs.frozen
class RequestInfo:
    """One outgoing request through ``ctx.http`` of a step's try (or of its lookup)."""

    run: Run
    step: int
    step_key: str
    try_number: int


@attrs.frozen
class WriteInfo:
    """One fenced write of an attempt: ``kind`` is ``append`` (journal entries),
    ``records``, ``finish`` or ``release``; ``entries`` the journal entries it carries."""

    run: Run
    kind: str
    entries: int


@attrs.frozen
class RenewInfo:
    """One renewal statement for ``runs`` leases held by ``worker_id``."""

    worker_id: str
    runs: int


@attrs.define
class StartInfo:
    """A run about to be created by :meth:`durable.Client.start`. ``headers`` (strings) may
    be filled by the interceptor: they are kept with the run (in its ``run_created``
    journal entry, visible in ``show --json``: never put a secret there) and handed to the
    worker's interceptors (:meth:`AttemptInfo.headers`)."""

    run_id: str
    workflow: str
    key: str | None
    headers: dict[str, str] = attrs.field(factory=dict)


class Interceptor:
    """Base class of interceptors: every hook passes through; override the ones you need.

    Around hooks: ``await call_next()`` (``call_next(request)`` for a request) exactly once
    and return its value; an exception it raises must propagate (an ``AttemptCancelled`` is
    how a stop arrives).
    """

    async def intercept_claim(self, info: ClaimInfo,
                              call_next: Callable[[], Awaitable[list[Run]]]) -> list[Run]:
        return await call_next()

    async def intercept_attempt(self, info: AttemptInfo,
                                call_next: Callable[[], Awaitable[str]]) -> str:
        """Around a whole attempt; ``call_next`` returns its outcome
        (:data:`ATTEMPT_OUTCOMES`)."""
        return await call_next()

    async def intercept_step(self, info: StepInfo,
                             call_next: Callable[[], Awaitable[Any]]) -> Any:
        """Around one try of an activity (its function, under its timeout); the step's
        journal writes are ``intercept_write``. ``call_next`` returns the activity's result
        or raises what it raised (a ``TimeoutError`` for its timeout)."""
        return await call_next()

    async def intercept_request(
        self, info: RequestInfo, request: httpx.Request,
        call_next: Callable[[httpx.Request], Awaitable[httpx.Response]],
    ) -> httpx.Response:
        """Around one request sent through ``ctx.http`` (each redirect is one); the
        interceptor may add headers to ``request`` (trace context). The response's headers
        have arrived; its body may still be streaming."""
        return await call_next(request)

    async def intercept_write(self, info: WriteInfo,
                              call_next: Callable[[], Awaitable[bool]]) -> bool:
        """Around one fenced store write; True when it committed under the fence."""
        return await call_next()

    async def intercept_renew(self, info: RenewInfo,
                              call_next: Callable[[], Awaitable[list[Renewal]]]
                              ) -> list[Renewal]:
        """Around one renewal statement; it returns the leases still held."""
        return await call_next()

    def on_lease_lost(self, info: AttemptInfo, reason: str) -> None:
        """An attempt lost its lease, however that was found (a renewal that did not hold
        it, a refused write, a service's ``LeaseLostError``, a local expiry); once."""

    def on_recovered(self, fences: Sequence[Fence], by: str) -> None:
        """Runs whose worker died or whose lease expired were queued again (``by``:
        ``sweep`` or ``liveness``)."""

    def on_step_in_doubt(self, info: StepInfo) -> None:
        """A step an earlier attempt started has no recorded outcome (its try is
        ``info.try_number``); its ``on_doubt`` decides what happens next."""

    def on_start(self, info: StartInfo) -> None:
        """:meth:`durable.Client.start` is about to create a run (may fill
        ``info.headers``)."""

    def on_loop_failed(self, loop: str, error: str) -> None:
        """A try of one of the worker's loops failed (the store unreachable, say): ``loop``
        is one of :data:`LOOPS`; told of every try, logged or not (a failure that goes on
        is logged once a minute: docs/observability.md, *Logs during an outage*)."""

    def on_loop_recovered(self, loop: str, failures: int, seconds: float) -> None:
        """``loop`` succeeded again after ``failures`` failed tries over ``seconds``."""


LOOPS = ("claim", "next_due", "renew", "listen", "cancel_check", "sweep", "schedule",
         "prune", "liveness_sweep")
"""The worker's loops whose failures are told (``on_loop_failed``) and logged
(``<loop>_failed``, ``<loop>_recovered``)."""

_AROUND = ("intercept_claim", "intercept_attempt", "intercept_step", "intercept_request",
           "intercept_write", "intercept_renew")
_EVENTS = ("on_lease_lost", "on_recovered", "on_step_in_doubt", "on_start", "on_loop_failed",
           "on_loop_recovered")


def _overrides(interceptor: object, name: str) -> bool:
    mine = getattr(type(interceptor), name, None)
    return mine is not None and mine is not getattr(Interceptor, name)


class Chain:
    """The interceptors of a worker or client, each hook reduced to those overriding it."""

    def __init__(self, interceptors: Sequence[object]) -> None:
        self.interceptors = tuple(interceptors)
        self.claim = self._hooks("intercept_claim")
        self.attempt = self._hooks("intercept_attempt")
        self.step = self._hooks("intercept_step")
        self.request = self._hooks("intercept_request")
        self.write = self._hooks("intercept_write")
        self.renew = self._hooks("intercept_renew")
        self.lease_lost: tuple[Callable[..., None], ...] = self._hooks("on_lease_lost")
        self.recovered: tuple[Callable[..., None], ...] = self._hooks("on_recovered")
        self.step_in_doubt: tuple[Callable[..., None], ...] = self._hooks("on_step_in_doubt")
        self.start: tuple[Callable[..., None], ...] = self._hooks("on_start")
        self.loop_failed: tuple[Callable[..., None], ...] = self._hooks("on_loop_failed")
        self.loop_recovered: tuple[Callable[..., None], ...] = self._hooks(
            "on_loop_recovered")

    def _hooks(self, name: str) -> tuple[Callable[..., Any], ...]:
        return tuple(getattr(i, name) for i in self.interceptors if _overrides(i, name))

    @classmethod
    def of(cls, interceptors: Sequence[object] | None) -> Chain | None:
        """The chain, or None when there is nothing to call (the engine's fast path)."""
        if not interceptors:
            return None
        for i in interceptors:
            if not any(callable(getattr(i, n, None)) for n in (*_AROUND, *_EVENTS)):
                from ._errors import ConfigError

                raise ConfigError(f"{i!r} is not an interceptor: it has none of the hooks "
                                  f"of durable.Interceptor")
        return cls(interceptors)


async def around(hooks: Sequence[Callable[..., Awaitable[Any]]], info: object,
                 call: Callable[[], Awaitable[Any]]) -> Any:
    """``call`` wrapped by ``hooks`` (the first outermost)."""
    for hook in reversed(hooks):
        call = _bind(hook, info, call)
    return await call()


def _bind(hook: Callable[..., Awaitable[Any]], info: object,
          call: Callable[[], Awaitable[Any]]) -> Callable[[], Awaitable[Any]]:
    def bound() -> Awaitable[Any]:
        return hook(info, call)
    return bound


def tell(hooks: Sequence[Callable[..., None]], *args: Any) -> None:
    """Call event hooks; one that raises is logged and does not stop the engine."""
    for hook in hooks:
        try:
            hook(*args)
        except Exception as exc:
            _log.error("interceptor_failed", hook=getattr(hook, "__qualname__", str(hook)),
                       error=f"{type(exc).__name__}: {exc}")


class InterceptedTransport(httpx.AsyncBaseTransport):
    """A step's ``ctx.http`` transport, its requests going through ``intercept_request``."""

    def __init__(self, inner: httpx.AsyncBaseTransport,
                 hooks: Sequence[Callable[..., Awaitable[httpx.Response]]],
                 info: RequestInfo) -> None:
        self._inner = inner
        self._hooks = tuple(hooks)
        self._info = info

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        call: Callable[[httpx.Request], Awaitable[httpx.Response]] = \
            self._inner.handle_async_request
        for hook in reversed(self._hooks):
            call = _bind_request(hook, self._info, call)
        return await call(request)

    async def aclose(self) -> None:
        pass  # the inner transport is the worker's (or the attempt's), closed by its owner


def _bind_request(hook: Callable[..., Awaitable[httpx.Response]], info: RequestInfo,
                  call: Callable[[httpx.Request], Awaitable[httpx.Response]]
                  ) -> Callable[[httpx.Request], Awaitable[httpx.Response]]:
    def bound(request: httpx.Request) -> Awaitable[httpx.Response]:
        return hook(info, request, call)
    return bound


class Counters(Interceptor):
    """Counts what a worker did (the counters a test or a benchmark reads).

    ``claims`` (statements), ``claimed`` (runs), ``attempts`` (by outcome), ``tries`` (step
    tries started), ``requests`` (sent through ``ctx.http``), ``writes`` (fenced writes),
    ``renewals`` (statements), ``leases_lost``, ``recovered``, ``in_doubt``,
    ``loop_failures`` (failed tries, by loop).
    """

    def __init__(self) -> None:
        self.claims = 0
        self.claimed = 0
        self.attempts: dict[str, int] = {}
        self.tries = 0
        self.requests = 0
        self.writes = 0
        self.renewals = 0
        self.leases_lost = 0
        self.recovered = 0
        self.in_doubt = 0
        self.loop_failures: dict[str, int] = {}

    @property
    def attempts_ended(self) -> int:
        return sum(self.attempts.values())

    async def intercept_claim(self, info: ClaimInfo,
                              call_next: Callable[[], Awaitable[list[Run]]]) -> list[Run]:
        runs = await call_next()
        self.claims += 1
        self.claimed += len(runs)
        return runs

    async def intercept_attempt(self, info: AttemptInfo,
                                call_next: Callable[[], Awaitable[str]]) -> str:
        outcome = "crashed"
        try:
            outcome = await call_next()
            return outcome
        finally:
            self.attempts[outcome] = self.attempts.get(outcome, 0) + 1

    async def intercept_step(self, info: StepInfo,
                             call_next: Callable[[], Awaitable[Any]]) -> Any:
        self.tries += 1
        return await call_next()

    async def intercept_request(
        self, info: RequestInfo, request: httpx.Request,
        call_next: Callable[[httpx.Request], Awaitable[httpx.Response]],
    ) -> httpx.Response:
        self.requests += 1
        return await call_next(request)

    async def intercept_write(self, info: WriteInfo,
                              call_next: Callable[[], Awaitable[bool]]) -> bool:
        self.writes += 1
        return await call_next()

    async def intercept_renew(self, info: RenewInfo,
                              call_next: Callable[[], Awaitable[list[Renewal]]]
                              ) -> list[Renewal]:
        self.renewals += 1
        return await call_next()

    def on_lease_lost(self, info: AttemptInfo, reason: str) -> None:
        self.leases_lost += 1

    def on_recovered(self, fences: Sequence[Fence], by: str) -> None:
        self.recovered += len(fences)

    def on_step_in_doubt(self, info: StepInfo) -> None:
        self.in_doubt += 1

    def on_loop_failed(self, loop: str, error: str) -> None:
        self.loop_failures[loop] = self.loop_failures.get(loop, 0) + 1
