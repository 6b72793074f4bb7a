"""Change signals: nothing that waits for a run, new work or a cancel waits for a poll.

Two layers (docs/design.md, "Nothing waits for a poll"):

- **In one process**, the client and the worker that share a store object tell each other
  directly through the store's :class:`Hub`: a run created (or replayed) wakes the
  workers' claim loops, a cancel requested stops the attempt holding the run, an attempt
  ended wakes every :meth:`durable.Client.wait` on that store. No database round trip.
- **Across processes** the store signals (:meth:`durable.store.Store.wait_for_work`,
  :meth:`~durable.store.Store.wait_for_finished`): SQLite by ``PRAGMA data_version``, which
  changes when another connection commits and is read without a write or a lock
  (:func:`until_changed`); PostgreSQL by LISTEN/NOTIFY. Every wait keeps a bounded
  fallback poll, so a lost signal delays, never hangs.

The hub's signals are plain callbacks and :class:`Beacon` generations on the event loop
that owns the store; they are never sent from another thread.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

import anyio

if TYPE_CHECKING:
    from .store import Store

CHANGE_POLL_MIN = 0.001
"""Seconds between looks at a store's change token right after a change (SQLite)."""

CHANGE_POLL_MAX = 0.004
"""Seconds between looks once nothing changed for a while: the idle cost (docs/design.md)."""


class Beacon:
    """A counter of events that any number of tasks can wait on without missing one.

    A waiter reads :attr:`generation` *before* it looks at the state it waits for, then
    :meth:`wait` returns at once if the generation moved since.
    """

    def __init__(self) -> None:
        self.generation = 0
        self._event: anyio.Event | None = None

    def fire(self) -> None:
        self.generation += 1
        event, self._event = self._event, None
        if event is not None:
            event.set()

    async def wait(self, seen: int) -> None:
        """Return once :attr:`generation` differs from ``seen`` (no timeout: use a scope)."""
        while self.generation == seen:
            if self._event is None:
                self._event = anyio.Event()
            await self._event.wait()


class LocalWorker(Protocol):
    def wake(self) -> None: ...

    def cancel_local(self, run_id: str) -> None: ...


class Hub:
    """The in-process signals of one store object."""

    def __init__(self) -> None:
        self.finished = Beacon()
        """Fired when an attempt ended (or a queued run was cancelled): waiters re-read."""
        self.workers: weakref.WeakSet[LocalWorker] = weakref.WeakSet()

    def work(self) -> None:
        """A run became claimable here: wake the claim loops of this process's workers."""
        for worker in list(self.workers):
            worker.wake()

    def cancel(self, run_id: str) -> None:
        """An operator cancel committed: stop the attempt of this process holding it."""
        for worker in list(self.workers):
            worker.cancel_local(run_id)


_hubs: weakref.WeakKeyDictionary[Store, Hub] = weakref.WeakKeyDictionary()


def hub(store: Store) -> Hub:
    """The hub of ``store`` (one per store object, made on first use)."""
    found = _hubs.get(store)
    if found is None:
        found = _hubs[store] = Hub()
    return found


async def until_changed(read: Callable[[], object], seen: object, timeout: float) -> object:
    """Look at ``read()`` (a cheap token that differs after another connection committed)
    until it differs from ``seen`` or ``timeout`` seconds passed; return the last token.

    Looks every :data:`CHANGE_POLL_MIN` seconds at first, backing off to
    :data:`CHANGE_POLL_MAX` while nothing changes: an idle waiter costs a few hundred
    microsecond reads a second, and a change is seen within a few milliseconds.
    """
    token = read()
    interval = CHANGE_POLL_MIN
    with anyio.move_on_after(timeout):
        while token == seen:
            await anyio.sleep(interval)
            interval = min(interval * 1.5, CHANGE_POLL_MAX)
            token = read()
    return token
