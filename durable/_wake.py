"""Change signals: nothing that waits for a run, new work or a cancel waits for a poll.

Two layers (docs/design.md, "Nothing waits for a poll"):

- **In one process**, the client and the worker that share a store object tell each other
  directly through the store's :class:`Hub`: a run created (or replayed) wakes the
  workers' claim loops, a cancel requested stops the attempt holding the run, an attempt
  ended wakes every :meth:`durable.Client.wait` on that store. No database round trip.
- **Across processes** the store signals (:meth:`durable.store.Store.wait_for_work`,
  :meth:`~durable.store.Store.wait_for_finished`): SQLite by ``PRAGMA data_version``, which
  changes when another connection commits and is read without a write or a lock
  (:class:`ChangeWatcher`); PostgreSQL by LISTEN/NOTIFY. Every wait keeps a bounded
  fallback poll, so a lost signal delays, never hangs.

The hub's signals are plain callbacks and :class:`Beacon` generations on the event loop
that owns the store; they are never sent from another thread.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

import anyio
import anyio.from_thread
import anyio.lowlevel
import anyio.to_thread

if TYPE_CHECKING:
    from ._types import Run
    from .store import Store

CHANGE_POLL = 0.002
"""Seconds between two looks of a :class:`ChangeWatcher` thread (SQLite ``data_version``)
within :data:`BUSY_SPELL` of a change; a change is seen 1 ms later on average."""

CHANGE_POLL_IDLE = 0.005
"""Seconds between two looks once nothing changed for :data:`BUSY_SPELL` seconds."""

CHANGE_POLL_OWN = 0.02
"""Seconds between two looks while this process commits itself and every waiter is
patient (a worker with no free slot, waiting only for cancels): its own commits change the
token too, so a busy worker saw a change at every 2 ms look and woke its event loop each
time (a sequential worker lost about 12 % of its steps to it). An impatient waiter (a
client waiting for a run, a worker with a free slot) cuts such a pause down to the
:data:`CHANGE_POLL` it would have been; with one, or when the process did not commit since
the last look, the looks are 2 ms apart as before."""

BUSY_SPELL = 1.0

WATCH_IDLE_STOP = 2.0
"""Seconds without a waiter after which the watcher thread ends (restarted on demand)."""


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
    def wake(self, run_id: str | None = None, run: Run | None = None) -> None: ...

    def cancel_local(self, run_id: str) -> None: ...


class Hub:
    """The in-process signals of one store object."""

    def __init__(self) -> None:
        self.finished = Beacon()
        """Fired when an attempt ended (or a queued run was cancelled): see :meth:`end`."""
        self.workers: weakref.WeakSet[LocalWorker] = weakref.WeakSet()
        self.waited: dict[str, int] = {}
        """Run id -> how many :meth:`durable.Client.wait` calls on this store wait for it."""
        self.settled: dict[str, tuple[int, Run]] = {}
        """Run id -> (:attr:`handed`, the finished run) handed over by the store that
        finished it, for the waits in :attr:`waited` (kept only while one waits)."""
        self.handed = 0
        self.told_runs: dict[str, Run] = {}
        """Run id -> the finished run a change signal carried (:meth:`told`), for the waits
        in :attr:`waited` (kept only while one waits)."""
        self.ends: dict[str, int] = {}
        """Run id -> how many times :meth:`end` was called for it while waited for."""

    def end(self, run_id: str) -> None:
        """An attempt of ``run_id`` ended in this process (or its queued run was cancelled):
        the waits for that run read it again; waits for other runs stay asleep."""
        if run_id in self.waited:
            self.ends[run_id] = self.ends.get(run_id, 0) + 1
        self.finished.fire()

    async def wait_end(self, run_id: str, seen: int) -> None:
        """Return once :meth:`end` was called for ``run_id`` since ``ends`` was ``seen``
        (read before the caller last read the run, while registered by :meth:`waiting`)."""
        while self.ends.get(run_id, 0) == seen:
            await self.finished.wait(self.finished.generation)

    def settle(self, run: Run) -> None:
        """The store committed the end of ``run`` (a row it got back from the finishing
        statement): the waits for it here take it from here instead of reading it again
        (one round trip less; PostgreSQL). Only for a run somebody here waits for."""
        if run.id in self.waited:
            self.handed += 1
            self.settled[run.id] = (self.handed, run)

    def handed_over(self, run_id: str, since: int) -> Run | None:
        """The run as its finish returned it, if it was handed over after ``since`` (the
        :attr:`handed` a wait read when it began: an older hand-over may predate a replay)."""
        found = self.settled.get(run_id)
        return found[1] if found is not None and found[0] > since else None

    def told(self, run: Run) -> None:
        """A change signal of the store carried ``run`` as the statement that ended it
        returned it (PostgreSQL's ``durable_done`` NOTIFY, from any process): the waits for
        it here may take it instead of reading it again (:meth:`told_finished`). Only for
        a finished run somebody here waits for."""
        if run.id in self.waited and run.state.finished:
            self.told_runs[run.id] = run

    def told_finished(self, run_id: str, read: Run) -> Run | None:
        """The finished run a change signal carried (:meth:`told`), if it ended after
        ``read``, the wait's last read of it: a signal is delivered when its listener
        reads it, so it may be of an earlier end (before a replay queued the run again),
        and a run that was updated since the read cannot have ended before it. The times
        are the store's one clock; an equal one is not taken (the wait reads instead)."""
        run = self.told_runs.pop(run_id, None)
        return run if run is not None and run.updated_at > read.updated_at else None

    def waiting(self, run_id: str, delta: int) -> None:
        """A wait for ``run_id`` begins (+1) or ends (-1)."""
        count = self.waited.get(run_id, 0) + delta
        if count > 0:
            self.waited[run_id] = count
        else:
            self.waited.pop(run_id, None)
            self.settled.pop(run_id, None)
            self.told_runs.pop(run_id, None)
            self.ends.pop(run_id, None)

    def work(self, run_id: str | None = None, run: Run | None = None) -> None:
        """A run became claimable here (``run_id``: a run just created, else any number;
        ``run``: that run as created): wake the claim loops of this process's workers (a
        worker that claimed that run already, after a change signal, stays asleep)."""
        for worker in list(self.workers):
            worker.wake(run_id, run)

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


class ChangeWatcher:
    """A thread that looks at a cheap change token every :data:`CHANGE_POLL` seconds and
    counts the changes on the event loop (:attr:`count`), waking :meth:`wait` at once.

    A thread, not a task: a sleeping thread wakes for about 30 µs of CPU, an event loop
    iteration for 100-200 µs (measured: docs/design.md). ``connect`` makes the reader
    (SQLite: a connection of its own and its ``PRAGMA data_version``). The thread runs
    while somebody waits and ends :data:`WATCH_IDLE_STOP` seconds after the last waiter;
    when it starts again, it counts one change (anything may have happened meanwhile).

    ``own_commits`` counts this process's own commits to the store: while it moves and
    every waiter is patient, the looks are :data:`CHANGE_POLL_OWN` apart.
    """

    def __init__(self, connect: Callable[[], Callable[[], object]],
                 own_commits: Callable[[], int] | None = None) -> None:
        self._connect = connect
        self._own_commits = own_commits or (lambda: 0)
        self.count = 0
        self._beacon = Beacon()
        self._waiters = 0
        self._impatient = 0
        self._nudge = threading.Event()  # an impatient waiter came: end a long pause
        self._idle_since = 0.0
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def start(self) -> None:
        """Start the thread if it is not running (on the event loop thread)."""
        if self._thread is not None and self._thread.is_alive():
            return
        read = self._connect()
        last = read()  # the baseline, before anyone compares against count
        if self._thread is not None:  # a restart: changes may have been missed
            self._bump()
        self._stop.clear()
        self._idle_since = time.monotonic()
        token = anyio.lowlevel.current_token()
        self._thread = threading.Thread(target=self._watch, args=(read, last, token),
                                        name="durable change watcher", daemon=True)
        self._thread.start()

    def _watch(self, read: Callable[[], object], last: object,
               token: anyio.lowlevel.EventLoopToken) -> None:
        changed = time.monotonic()
        own = self._own_commits()
        ours = False  # this process committed since the last look
        while not self._stop.is_set():
            quiet = time.monotonic() - changed > BUSY_SPELL
            self._pause(CHANGE_POLL_OWN if ours and not self._impatient
                        else CHANGE_POLL_IDLE if quiet else CHANGE_POLL)
            if self._waiters == 0 and time.monotonic() - self._idle_since > WATCH_IDLE_STOP:
                return
            now_own = self._own_commits()
            ours, own = now_own != own, now_own
            try:
                value = read()
            except Exception:  # busy or gone: no signal this look (waits keep their poll)
                continue
            if value != last:
                last, changed = value, time.monotonic()
                try:
                    anyio.from_thread.run_sync(self._bump, token=token)
                except RuntimeError:  # the event loop is gone
                    return

    def _pause(self, seconds: float) -> None:
        """The wait before the next look (in the thread; a test steps it)."""
        if seconds < CHANGE_POLL_OWN:
            time.sleep(seconds)  # half the CPU of Event.wait(timeout) per look
            return
        began = time.monotonic()
        if self._nudge.wait(seconds):
            # an impatient waiter came: the pause ends as a CHANGE_POLL one would (a look
            # at once would mostly see the commit the waiter just made, a wake for nothing)
            self._nudge.clear()
            rest = began + CHANGE_POLL - time.monotonic()
            if rest > 0:
                time.sleep(rest)

    def _bump(self) -> None:
        self.count += 1
        self._beacon.fire()

    async def wait(self, seen: int, timeout: float, *, patient: bool = False) -> int:
        """Return :attr:`count` once it differs from ``seen``, or after ``timeout``.

        ``patient``: a change may reach this waiter up to :data:`CHANGE_POLL_OWN` seconds
        late while the process commits itself (a worker with no free slot)."""
        self.start()
        self._waiters += 1
        if not patient:
            self._impatient += 1
            self._nudge.set()
        try:
            with anyio.move_on_after(timeout):
                while self.count == seen:
                    await self._beacon.wait(self._beacon.generation)
        finally:
            self._waiters -= 1
            if not patient:
                self._impatient -= 1
            self._idle_since = time.monotonic()
        return self.count

    async def stop(self) -> None:
        thread, self._thread = self._thread, None
        self._stop.set()
        self._nudge.set()  # out of a long pause
        if thread is not None:  # joined off the loop: the thread may be calling into it
            await anyio.to_thread.run_sync(thread.join)
