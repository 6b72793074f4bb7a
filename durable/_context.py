"""The contexts handed to workflow and activity code."""

from __future__ import annotations

import contextlib
import datetime as dt
import math
import os
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import IO, TYPE_CHECKING, Any, ParamSpec, TypeVar, overload
from urllib.parse import quote

import anyio
import anyio.abc
import anyio.to_thread
import httpx

from . import _processes
from ._errors import ConfigError, LeaseLostError
from ._logging import redact, redact_json
from ._registry import Activity, BoundActivity, positional
from ._types import JSON, MAX_SECONDS, NEVER, Run, check_printable, dumps

if TYPE_CHECKING:
    from ._attempt import Attempt
    from ._report import RecoveryReport

R = TypeVar("R")
P = ParamSpec("P")

IDEMPOTENCY_HEADER = "Idempotency-Key"
FENCING_HEADER = "Durable-Fencing-Token"
FENCING_SCOPE_HEADER = "Durable-Fencing-Scope"
"""Where a service compares the fencing token: ``key:<concurrency key>``, or ``run:<id>`` for
a run without a key (percent-encoded UTF-8; see docs/design.md, "The fencing token's scope")."""


def fencing_scope(run_id: str, key: str | None) -> str:
    """A run's fencing scope (:meth:`Run.scope_of`) as sent in :data:`FENCING_SCOPE_HEADER`:
    percent-encoded, so always ASCII."""
    return quote(Run.scope_of(run_id, key), safe=":/@-._~")


def _seconds(value: object, what: str, *, negative: bool = False) -> float:
    """A number of seconds (or a time) given to a durable wait, checked: finite, not bool."""
    if (isinstance(value, bool) or not isinstance(value, int | float)
            or not math.isfinite(value) or (value < 0 and not negative)):
        raise ConfigError(f"{what}: expected {'a time' if negative else 'seconds >= 0'} "
                          f"as a finite number, not {value!r}")
    if value >= NEVER if negative else value > MAX_SECONDS:  # a time the calendar shows
        bound = "a time before 9999-12-31" if negative else "at most 100 years of seconds"
        raise ConfigError(f"{what}: expected {bound}, not {value!r}")
    return float(value)


def _where(request: httpx.Request) -> tuple[str, str]:
    """``host:port`` and ``METHOD URL`` of a request, without credentials or query values."""
    url = request.url
    port = url.port or {"http": 80, "https": 443}.get(url.scheme)
    host = f"[{url.host}]" if ":" in url.host else url.host
    address = f"{host}:{port}" if port else host
    shown = f"{url.scheme}://{address if url.port else host}{url.path}"
    if url.query:
        shown += "?..."
    return address, redact(f"{request.method} {shown}")


def name_the_target(exc: httpx.TransportError, request: httpx.Request) -> httpx.TransportError:
    """The same kind of error, its message saying where the request went.

    ``ConnectError: All connection attempts failed`` becomes ``ConnectError: cannot connect
    to 127.0.0.1:9 (GET http://127.0.0.1:9/api/x): All connection attempts failed``. The type
    is kept, so retry policies and ``except httpx.ConnectError`` see what they saw before.
    """
    address, call = _where(request)
    detail = str(exc)
    if isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout)):
        message = f"cannot connect to {address} ({call})"
    else:
        message = call
    if detail:
        message = f"{message}: {redact(detail)}"
    try:
        named = type(exc)(message, request=request)
    except TypeError:  # a subclass with another signature: keep it as it is
        return exc
    return named


class HttpClient(httpx.AsyncClient):
    """``ctx.http``: an ``httpx.AsyncClient`` whose transport errors name their target."""

    async def send(self, request: httpx.Request, **kwargs: Any) -> httpx.Response:
        try:
            return await super().send(request, **kwargs)
        except httpx.TransportError as exc:
            try:
                failed = exc.request  # the request that failed (maybe a redirect's)
            except RuntimeError:
                failed = request
            raise name_the_target(exc, failed) from exc


class WorkflowContext:
    """Given to a workflow function: runs steps, and hands out journaled values."""

    def __init__(self, attempt: Attempt) -> None:
        self._attempt = attempt

    @property
    def workflow_id(self) -> str:
        return self._attempt.run.id

    @property
    def workflow_name(self) -> str:
        return self._attempt.run.workflow

    @property
    def attempt(self) -> int:
        """The run's attempt number (1 for the first claim; recoveries and replays add one)."""
        return self._attempt.run.attempt

    @property
    def epoch(self) -> int:
        """The attempt's fencing token."""
        claim = self._attempt.claim
        if claim is not None:  # not known before the claim commits (durable/_claims.py):
            claim.void = True  # this attempt gives way to one that knows it
        return self._attempt.run.epoch

    @property
    def key(self) -> str | None:
        """The run's concurrency key."""
        return self._attempt.run.key

    @overload
    async def step(self, activity: BoundActivity[R], *, key: str | None = None) -> R: ...

    @overload
    async def step(self, activity: Activity[P, R], *args: P.args, **kwargs: P.kwargs) -> R: ...

    @overload
    async def step(self, activity: Activity[..., R], *args: Any, key: str | None) -> R: ...

    async def step(self, activity: Activity[..., Any] | BoundActivity[Any], *args: Any,
                   key: Any = None, **kwargs: Any) -> Any:
        """Run ``activity`` as a journaled step.

        Without ``key`` the step's identity is its position among the run's unkeyed steps
        (the n-th call is step n). Steps started concurrently (a task group) must each pass
        a stable ``key`` (an item id, say), so their identity does not depend on the order
        the tasks happen to start in: an unkeyed step started while another unkeyed step
        is in flight raises :class:`durable.ConfigError` and fails the run.

        Typed by the activity: a type checker checks the arguments of an unkeyed step
        against the activity's parameters, and infers the result's type of every step.
        Python's typing cannot check arguments next to the extra ``key`` keyword: for a
        keyed step checked in full, bind them first, ``ctx.step(act.bind(item),
        key=...)``. Arguments given by keyword are journaled by position.
        """
        if isinstance(activity, BoundActivity):
            if args or kwargs:
                raise ConfigError(f"ctx.step: {activity.activity.name} has its arguments "
                                  "bound already; pass only key=")
            act, args = activity.activity, activity.args
        elif isinstance(activity, Activity):
            act = activity
            args = positional(act.fn, args, kwargs, f"activity {act.name}")
        else:
            raise ConfigError(f"ctx.step takes an activity (declared with @durable.activity, "
                              f"or act.bind(...)), not {activity!r}")
        return await self._attempt.steps.run_step(act, args, key)

    async def sleep(self, seconds: float) -> None:
        """Sleep ``seconds``, durably: the wake time is journaled once (a re-executing
        attempt finds it and does not sleep again from the start). A wait of the worker's
        ``durable_wait_threshold`` (2 s by default) or more ends the attempt and releases
        the run until then: no lease, no concurrency slot held, and a worker restart changes
        nothing; the run resumes past the sleep without re-running completed steps. Shorter
        waits (and any wait while a step is in flight) stay in the attempt, cancellable.
        """
        await self._attempt.steps.sleep(_seconds(seconds, "ctx.sleep"), None)

    async def sleep_until(self, timestamp: float | dt.datetime) -> None:
        """Sleep until ``timestamp`` (epoch seconds, or a timezone-aware datetime), durably,
        as :meth:`sleep` does; a time already passed returns at once."""
        if isinstance(timestamp, dt.datetime):
            if timestamp.tzinfo is None:
                raise ConfigError("ctx.sleep_until: the datetime must be timezone-aware")
            when = timestamp.timestamp()
        else:
            when = _seconds(timestamp, "ctx.sleep_until", negative=True)
        await self._attempt.steps.sleep(None, when)

    async def wait_for(self, name: str, timeout: float | None = None) -> JSON:
        """Wait for the signal ``name`` (:meth:`durable.Client.signal`, ``python -m durable
        signal``) and return its payload.

        Signals are kept until a wait receives them, each once, in the order they were sent:
        one sent before the wait is received at once. The reception is journaled, so a
        re-executing attempt gets the same payload. A run that waits holds no lease (it is
        released, as by a long :meth:`sleep`) and is due again as soon as the signal is
        recorded. With ``timeout`` (seconds), :class:`durable.SignalTimeout` is raised when
        no signal came in time (journaled too: a re-execution raises it again).
        """
        if not isinstance(name, str) or not name:
            raise ConfigError(f"ctx.wait_for: the signal name must be a non-empty string, "
                              f"not {name!r}")
        check_printable(name, "ctx.wait_for: the signal name")  # as Client.signal's
        limit = None if timeout is None else _seconds(timeout, "ctx.wait_for timeout")
        return await self._attempt.steps.wait_for(name, limit)

    async def now(self) -> float:
        """The wall-clock time, journaled: a replay sees the same value."""
        return float(await self._attempt.steps.value("durable.now", time.time))

    async def uuid4(self) -> str:
        """A random UUID, journaled: a replay sees the same value."""
        return str(await self._attempt.steps.value("durable.uuid4", lambda: str(uuid.uuid4())))

    async def items(self, total: int, key_prefix: str = "item-") -> None:
        """Declare that this run processes ``total`` items, item ``i`` being the step keyed
        ``f"{key_prefix}{i}"``: progress (done / failed / in flight / total) is then derived
        from the journal (``show ID --follow``, ``show ID --json``, the console).

        Journaled as a value (``durable.items``): a resumed or replayed attempt keeps the
        declaration it journaled. Call it once, before the items start; if a run declares
        items more than once, its progress is that of the latest declaration.
        """
        if isinstance(total, bool) or not isinstance(total, int) or total < 0:
            raise ConfigError(f"ctx.items: total must be a whole number >= 0, not {total!r}")
        if (not isinstance(key_prefix, str) or not key_prefix
                or f"{key_prefix}0".isdigit()):
            raise ConfigError("ctx.items: key_prefix must be a non-numeric string (item keys "
                              f"are key_prefix + number), not {key_prefix!r}")
        keys = [f"{key_prefix}{i}" for i in sorted({0, total - 1})] if total else []
        summary = f"{total} item{'' if total == 1 else 's'}" + (
            ": " + (" … " if total > 2 else ", ").join(keys) if keys else "")
        await self._attempt.steps.value(
            "durable.items", lambda: {"total": total, "key_prefix": key_prefix}, summary)

    async def set_records(
        self, records: Mapping[tuple[str, str], JSON], *, summary: JSON = None,
        key: str | None = None,
    ) -> None:
        """Write application records as one fenced step.

        The records and the step's journal entry commit in one transaction, only if this
        attempt still holds its lease and epoch: a superseded attempt can never apply it.
        """
        await self._attempt.steps.set_records(records, summary, key)

    async def get_record(self, namespace: str, key: str) -> JSON:
        """Read an application record; the value read is journaled as a step."""
        return await self._attempt.steps.get_record(namespace, key)

    async def recovery_report(self) -> RecoveryReport:
        """What this run has done so far, derived from its journal (for messages)."""
        return await self._attempt.steps.recovery_report()


class _Cleanup:
    """The context manager of :meth:`ActivityContext.cleanup`."""

    def __init__(self, attempt: Attempt | None, timeout: float | None) -> None:
        self._attempt = attempt
        self._timeout = timeout
        self._stack = contextlib.ExitStack()

    async def __aenter__(self) -> anyio.CancelScope:
        if self._attempt is not None:
            scope: anyio.CancelScope = self._stack.enter_context(
                self._attempt.cleanup_scope(self._timeout))
        else:
            scope = self._stack.enter_context(
                anyio.move_on_after(5.0 if self._timeout is None else self._timeout,
                                    shield=True))
        return scope

    async def __aexit__(self, *exc: object) -> bool:
        return bool(self._stack.__exit__(*exc))  # type: ignore[arg-type]


class ActivityContext:
    """Given to an activity: the fenced HTTP client, heartbeats, and step identity."""

    def __init__(
        self,
        attempt: Attempt | None,
        *,
        step: int = 0,
        step_key: str = "",
        try_number: int = 1,
        idempotency_key: str = "",
        http: httpx.AsyncClient | None = None,
    ) -> None:
        self._attempt = attempt
        self.step = step
        self.step_key = step_key
        self.try_number = try_number
        self.idempotency_key = idempotency_key
        self._http = http
        self.summary: JSON = None
        self.pool_waited = 0.0
        """Seconds this try's requests waited for a connection of the worker's pool (its
        ``http_connections`` per host were all in use): part of the step's timeout."""
        self.pool_wait_host: tuple[str, int, str] | None = None

    def _pool_wait(self, waited: float, host: str, limit: int, outcome: str) -> None:
        self.pool_waited += waited
        self.pool_wait_host = (host, limit, outcome)

    def pool_wait_note(self) -> str:
        """What a timeout message adds when part of the time was a wait for a connection."""
        if self.pool_wait_host is None:
            return ""
        host, limit, outcome = self.pool_wait_host
        unsent = "" if outcome == "connection" else ", the last request never sent"
        return (f"; {self.pool_waited:.1f} s of it waiting for a connection to {host}"
                f"{unsent}: all {limit} connections per host were in use (Worker "
                "http_connections)")

    @classmethod
    def standalone(cls, http: httpx.AsyncClient | None = None) -> ActivityContext:
        """A context for calling an activity outside any workflow (tests, scripts)."""
        return cls(None, http=http)

    @property
    def workflow_id(self) -> str | None:
        return None if self._attempt is None else self._attempt.run.id

    @property
    def fencing_token(self) -> int | None:
        return None if self._attempt is None else self._attempt.run.epoch

    @property
    def fencing_scope(self) -> str | None:
        """Where the token is compared (:data:`FENCING_SCOPE_HEADER`'s value)."""
        if self._attempt is None:
            return None
        return fencing_scope(self._attempt.run.id, self._attempt.run.key)

    @property
    def fencing_headers(self) -> dict[str, str]:
        """The headers ``ctx.http`` puts on every request (``Idempotency-Key``,
        ``Durable-Fencing-Token``, ``Durable-Fencing-Scope``), for requests this attempt sends
        some other way (``git push`` over HTTPS as ``http.extraHeader``, a service's own
        SDK); empty outside a workflow. Sending them does not check the lease: call
        :meth:`assert_still_mine` first, as ``ctx.http`` does before each request."""
        if self._attempt is None:
            return {}
        run = self._attempt.run
        return {IDEMPOTENCY_HEADER: self.idempotency_key, FENCING_HEADER: str(run.epoch),
                FENCING_SCOPE_HEADER: fencing_scope(run.id, run.key)}

    @property
    def http(self) -> httpx.AsyncClient:
        """An httpx client bound to this attempt.

        Every request carries ``Idempotency-Key: <workflow id>/<step key>``,
        ``Durable-Fencing-Token: <epoch>`` and ``Durable-Fencing-Scope`` (where the token is
        compared: the run's concurrency key, or the run), and is refused before it is sent
        (:class:`durable.LeaseLostError`) once the attempt no longer holds its lease.
        Cancelling the attempt or the step aborts a request in flight.
        """
        if self._http is None:
            if self._attempt is None:
                self._http = HttpClient()
            else:
                self._http = self._attempt.http_client(self)
        return self._http

    def heartbeat(self, detail: JSON = None) -> None:
        """Report progress; the detail goes out with the worker's next lease renewal. A
        detail that is not JSON is a :class:`durable.NotJsonError` here (it failed the
        renewal, and the worker with it)."""
        dumps(detail, "ctx.heartbeat's detail")
        if self._attempt is not None:
            self._attempt.heartbeat_detail = detail

    def annotate(self, summary: JSON) -> None:
        """A short summary of what this step did or touched, kept in the journal (redacted
        of credentials first, like errors: a careless summary never journals a token). A
        summary that is not JSON is a :class:`durable.NotJsonError` here, not when the
        step's completion is journaled after its work was done; the step fails, untried
        again."""
        dumps(summary, "ctx.annotate's summary")
        self.summary = redact_json(summary)

    async def assert_still_mine(self) -> None:
        """Raise :class:`durable.LeaseLostError` unless this attempt still holds the run.

        Checks the local lease and then the database (the write-up's ``assertStillMine``).
        """
        if self._attempt is None:
            return
        await self._attempt.assert_still_mine()

    @contextlib.asynccontextmanager
    async def process_group(
        self,
        command: Sequence[str],
        *,
        stdout: int | IO[Any] | None = subprocess.PIPE,
        stderr: int | IO[Any] | None = subprocess.PIPE,
        cwd: str | os.PathLike[str] | None = None,
        env: Mapping[str, str] | None = None,
    ) -> AsyncIterator[anyio.abc.Process]:
        """``async with ctx.process_group(["git", "push", ...]) as process:`` runs a program
        for this attempt, as :func:`durable.process_group` does (a group of its own, killed
        on a cancel with its connections' unsent bytes dropped, and when the worker dies),
        and bound to the attempt's lease: the program is refused to start once the lease is
        lost (:class:`durable.LeaseLostError`, as a request of ``ctx.http``), and its group
        is killed when the lease's local deadline passes without a renewal, by a watcher in
        the group, even if the worker is frozen or its event loop blocked and cannot act."""
        lease = None
        if self._attempt is not None:
            if not self._attempt.holds_lease():
                self._attempt.log.warning("process_refused", program=command[0],
                                          step=self.step)
                raise self._attempt.refusal()
            lease = self._attempt.lease
        async with _processes.process_group(command, stdout=stdout, stderr=stderr, cwd=cwd,
                                            env=env, lease=lease) as process:
            yield process

    def cleanup(self, timeout: float | None = None) -> AbstractAsyncContextManager[Any]:
        """``async with ctx.cleanup():`` in a ``finally``: work that still runs when the
        attempt is stopping (operator cancel, shutdown, timeout), shielded from that stop.

        It is bounded: by ``timeout`` seconds (default 5), by the lease's local deadline,
        and it is cancelled at once if the lease is lost. Its requests through ``ctx.http``
        are sent while the attempt still holds its lease.
        """
        return _Cleanup(self._attempt, timeout)

    async def to_thread(self, fn: Callable[..., R], *args: Any) -> R:
        """Run blocking ``fn(*args)`` in a worker thread; a timeout or a cancel of the step
        abandons the wait at once (the thread runs on: Python cannot stop it).

        Code after the call does not run once the step is cancelled. The thread is still
        fenced: it cannot write the journal, and ``ctx.http`` refuses its requests once the
        lease is lost. ``anyio.to_thread.run_sync`` without ``abandon_on_cancel=True`` waits
        for the thread instead, however long it takes.
        """
        result: R = await anyio.to_thread.run_sync(fn, *args, abandon_on_cancel=True)
        return result

    def check_lease(self) -> None:
        """The local (no database) half of :meth:`assert_still_mine`."""
        if self._attempt is not None and not self._attempt.holds_lease():
            raise LeaseLostError(f"attempt of {self._attempt.run.id} no longer holds its lease")
