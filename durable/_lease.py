"""An attempt's lease as its own process sees it.

Two different things end an attempt early, and they must not be confused:

- **stopping** (an operator's cancel, a shutdown, a deadline): the attempt is asked to
  stop, but it still *holds* its lease. Cleanup code may still send requests and the
  attempt journals its outcome (``run_cancelled``; ``run_interrupted`` and a release).
  That state lives on the attempt (:attr:`durable._attempt.Attempt.stopping`).
- **lost** (a renewal answered without the run, a refused write, the local deadline
  passed): someone else may hold the run now. Every request and write is refused and the
  attempt writes nothing more. That state lives here, and only here.

The local deadline comes from anyio's clock, counted from when the renewal was *sent*, and
falls :data:`LEASE_SAFETY` of the lease before the stored expiry. anyio's clock (monotonic)
stops while the machine is suspended, and the stored lease does not (it is judged on
``CLOCK_BOOTTIME`` or the database server's clock), so the same deadline is also kept on
:func:`durable._clock.boottime`, which counts suspend: after a suspend longer than the lease
the attempt holds nothing, whatever anyio's clock says (docs/design.md, "Clocks").
"""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar, Token
from typing import Any, TypeVar

import anyio

from . import _clock

F = TypeVar("F", bound=Callable[..., Any])

LEASE_SAFETY = 0.1
"""Fraction of the lease kept as margin: the local deadline falls this much before expiry."""


class Lease:
    """The local view of one attempt's lease: its deadline, and whether it was lost."""

    def __init__(self, length: float, sent_at: float, sent_boot: float | None = None) -> None:
        self.length = length
        self.deadline = sent_at + length * (1 - LEASE_SAFETY)
        self.boot_deadline = _boot_time(sent_at, sent_boot) + length * (1 - LEASE_SAFETY)
        """The deadline on :func:`durable._clock.boottime`, which counts time suspended."""
        self.lost: str | None = None
        """Why the lease was lost, once it was; None while it is held."""
        self._bounded: set[anyio.CancelScope] = set()
        self._watchers: list[Callable[[float], None]] | None = None
        """Told each renewal's :attr:`boot_deadline` (:meth:`watch`)."""
        self.failed_renewals = 0
        """Renewals that failed (a store error) since the last that held: what
        :meth:`expired` says of why the deadline passed."""

    def renewed(self, sent_at: float, sent_boot: float | None = None) -> None:
        """A renewal sent at ``sent_at`` (anyio time; ``sent_boot`` on boottime) succeeded:
        move the deadline on."""
        self.failed_renewals = 0
        if self.lost is None:
            self.deadline = max(self.deadline, sent_at + self.length * (1 - LEASE_SAFETY))
            self.boot_deadline = max(self.boot_deadline, _boot_time(sent_at, sent_boot)
                                     + self.length * (1 - LEASE_SAFETY))
            if self._watchers:
                for tell in self._watchers:
                    tell(self.boot_deadline)

    def watch(self, tell: Callable[[float], None]) -> None:
        """Call ``tell`` with the new :attr:`boot_deadline` at each renewal (a process
        group's watcher, which kills the group when the deadline passes: ``_processes``)."""
        if self._watchers is None:
            self._watchers = []
        self._watchers.append(tell)

    def unwatch(self, tell: Callable[[float], None]) -> None:
        if self._watchers is not None and tell in self._watchers:
            self._watchers.remove(tell)

    def holds(self) -> bool:
        """Whether requests and writes may still go out (stopping does not change this)."""
        return (self.lost is None and anyio.current_time() < self.deadline
                and _clock.boottime() < self.boot_deadline)

    def renewal_failed(self) -> None:
        """A renewal was sent and failed (the store refused or did not answer)."""
        self.failed_renewals += 1

    def expired(self) -> str:
        """Why the local deadline passed, as far as the worker knows: renewals that failed,
        or none that failed (the process was frozen, SIGSTOP or a suspended VM, or too
        busy to renew, or a renewal hung: the deadline passed with none answered)."""
        if self.failed_renewals:
            return (f"lease expired locally (renewals failed: {self.failed_renewals} since "
                    "the last that held)")
        return ("lease expired locally: no renewal succeeded in time and none failed (the "
                "process was paused or starved, or a renewal went unanswered)")

    def lose(self, reason: str) -> None:
        """The lease is gone: cancel every shielded piece of work running under it."""
        if self.lost is None:
            self.lost = reason
        for scope in list(self._bounded):
            scope.cancel()

    def shielded(self, timeout: float, *, lazy: bool = False) -> _Shielded:
        """A scope that a stop does not cancel, bounded by ``timeout`` and by the lease:
        it ends at the local lease deadline, and at once when the lease is lost.

        ``lazy``: for work that waits only where it calls :func:`arm_bound` first (a
        :func:`lazily_bounded` store method). The deadline is checked on entry and set on
        the scope only when the work is about to wait: a write that commits in the event
        loop's thread without waiting costs no timer (docs/design.md, "Attempts under
        faults")."""
        now = anyio.current_time()
        deadline = min(now + timeout, self.deadline)
        if lazy:
            scope = anyio.CancelScope(shield=True)
            if self.lost is not None or deadline <= now:
                scope.cancel()
            return _Shielded(self._bounded, scope, deadline)
        scope = anyio.CancelScope(shield=True, deadline=deadline)
        if self.lost is not None:
            scope.cancel()
        return _Shielded(self._bounded, scope)


class _Shielded:
    """:meth:`Lease.shielded`'s context manager (a class: it is on every journal write)."""

    __slots__ = ("_bounded", "_deadline", "_scope", "_token")

    def __init__(self, bounded: set[anyio.CancelScope], scope: anyio.CancelScope,
                 deadline: float | None = None) -> None:
        self._bounded = bounded
        self._scope = scope
        self._deadline = deadline
        """A lazy scope's deadline, until :meth:`arm` sets it on the scope."""
        self._token: Token[_Shielded | None] | None = None

    def __enter__(self) -> anyio.CancelScope:
        self._bounded.add(self._scope)
        try:
            scope = self._scope.__enter__()
        except BaseException:
            self._bounded.discard(self._scope)
            raise
        if self._deadline is not None:
            self._token = _LAZY.set(self)
        return scope

    def __exit__(self, *exc: Any) -> bool:
        try:
            if self._token is not None:
                _LAZY.reset(self._token)
                self._token = None
            return bool(self._scope.__exit__(*exc))
        finally:
            self._bounded.discard(self._scope)

    def arm(self) -> None:
        if self._deadline is not None:
            self._scope.deadline, self._deadline = self._deadline, None


_LAZY: ContextVar[_Shielded | None] = ContextVar("durable_lazy_bound", default=None)
"""The lazy :meth:`Lease.shielded` scope the current task is in, its deadline not set yet."""

_LAZILY_BOUNDED = "_durable_lazily_bounded"


def arm_bound() -> None:
    """Called right before a real wait (for a database thread's answer): the lazy
    :meth:`Lease.shielded` scope around it, if any, takes its deadline now."""
    shielded = _LAZY.get()
    if shielded is not None:
        shielded.arm()


def in_lazy_bound() -> bool:
    """Whether the current task is in a lazy :meth:`Lease.shielded` scope (innermost:
    only lazily bounded store code runs in one)."""
    return _LAZY.get() is not None


def lazily_bounded(method: F) -> F:
    """Mark a store method that waits only after :func:`arm_bound`: an attempt may call
    it under a lazy :meth:`Lease.shielded` scope. An override (a subclass's method) is not
    marked, and gets an eager scope."""
    setattr(method, _LAZILY_BOUNDED, True)
    return method


def is_lazily_bounded(method: Callable[..., Any]) -> bool:
    return bool(getattr(getattr(method, "__func__", method), _LAZILY_BOUNDED, False))


def _boot_time(sent_at: float, sent_boot: float | None) -> float:
    """When a request sent at ``sent_at`` (anyio time) was sent, on boottime: as measured
    by the sender, or else derived (exact unless the machine was suspended since)."""
    if sent_boot is not None:
        return sent_boot
    return _clock.boottime() - max(0.0, anyio.current_time() - sent_at)
