"""A claim that rides on the attempt's first journal write (docs/design.md, "One commit per
step").

A worker whose store says so (:attr:`durable.store.Store.claims_ride_on_writes`: SQLite,
PostgreSQL) claims a run that never started in two parts: a read of what a claim would take
(:meth:`~durable.store.Store.claimable`; or, for a run that a start in this process just
created and handed over, that run as created: ``Worker._hand_claims``), then the attempt
runs its workflow code up to its first journal write, and that write commits the claim and
the entries in one transaction (:meth:`~durable.store.Store.claim_with`), with the finish
of the worker's previous attempt when there is one. Until then nothing is written, nothing
is visible to anyone, and the workflow code has done nothing but what every replay does (a
first attempt's journal is empty, and workflow code reaches the world only through
journaled steps). If the first write does not come within :data:`RIDE_WAIT`, the claim
commits on its own.

A claim that finds the run gone (claimed by another worker, cancelled) drops the attempt
without a trace. A claim that finds the run changed since the read (another attempt ran in
between, a cancel is pending), or whose attempt read ``ctx.epoch`` before it (a value it
could not know yet), still holds the run, but not the attempt's entries: the worker drops
that attempt and runs a fresh one on the claimed run.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import anyio

from . import _clock
from ._errors import StoreError
from ._types import (
    ClaimOutcome,
    EntryKind,
    Finish,
    JournalWrite,
    Run,
    RunState,
    journaled_as,
)

if TYPE_CHECKING:
    from ._attempt import Attempt
    from .store import Store

RIDE_WAIT = 0.005
"""Seconds a read claim waits for its attempt's first journal write before it commits on
its own. It bounds how long the previous attempt's result waits for a claim to ride on."""

WRITE_TIMEOUT = 10.0
"""Seconds the claim's transaction may take (shielded, as every fenced write)."""


class PendingClaim:
    """The claim of one run read by :meth:`~durable.store.Store.claimable` (or handed over by
    a start in this process), not written yet."""

    def __init__(self, store: Store, worker_id: str, lease: float, read: Run,
                 attempt: Attempt, carried: Sequence[Finish],
                 workflows: Sequence[str] | None,
                 committed: Callable[[PendingClaim], None]) -> None:
        self.store = store
        self.worker_id = worker_id
        self.lease = lease
        self.read = read
        """The run as read, queued (the attempt sees it as its claim will make it)."""
        self.attempt = attempt
        self.carried = tuple(carried)
        """Finishes of earlier attempts that commit with this claim (their results wait)."""
        self.workflows = workflows
        self._committed = committed
        self.taken = False
        """The claim is being committed (or was): by its attempt's first write, by the
        wait running out, or dropped."""
        self.done = anyio.Event()
        self.outcome: ClaimOutcome | None = None
        """What the store did; None after a store error (nothing known) or a drop."""
        self.error: StoreError | None = None
        self.sent: tuple[float, float | None] = (0.0, None)
        """When the claim was sent (anyio time, boottime): where its lease starts."""
        self.handed = False
        """The run was handed over alone, as created (a start in this process, or its
        NOTIFY), not read: a claim of it that the store refused leaves nothing known to
        be queued."""
        self.dropped = False
        """Given up before it was sent (:meth:`drop`): the run is still queued."""
        self.void = False
        """The attempt used something its claim decides (``ctx.epoch``): the claim commits
        without the attempt's entries, and a fresh attempt runs on the claimed run."""

    async def commit(self, entries: Sequence[JournalWrite] = ()) -> ClaimOutcome | None:
        """Commit the claim with ``entries`` (and the carried finishes), once."""
        assert not self.taken
        self.taken = True
        self.sent = (anyio.current_time(), _clock.boottime())
        try:
            with anyio.fail_after(WRITE_TIMEOUT, shield=True):
                self.outcome = await self.store.claim_with(
                    self.worker_id, self.lease, self.read.id, self.read.attempt + 1,
                    () if self.void else entries, finishes=self.carried,
                    workflows=self.workflows)
        except (StoreError, TimeoutError) as exc:
            self.error = exc if isinstance(exc, StoreError) else StoreError(
                f"the claim of run {self.read.id} did not answer in {WRITE_TIMEOUT:g} s")
            # no answer: it may have committed all the same; the run and the journal tell
            self.outcome = await self._told(() if self.void else entries)
        self._settled()
        return self.outcome

    async def _told(self, entries: Sequence[JournalWrite]) -> ClaimOutcome | None:
        """What a claim that got no answer did, read back: the run claimed by this worker
        as its next attempt means the claim committed (the statement is one transaction:
        the carried finishes with it, each done if its run's journal holds its last entry
        under its epoch; the entries written if the claim's journal ends with them). None
        when it did not, or not yet (a statement the server still runs), or nothing can be
        read: the attempt is dropped, and a claim that commits later waits for its lease.
        (A worker's id is its own: the default names the host, the process and a random
        suffix; two live workers given one id would already share their leases.)"""
        try:
            with anyio.fail_after(WRITE_TIMEOUT, shield=True):
                run = await self.store.get_run(self.read.id)
                if (run is None or run.state is not RunState.RUNNING
                        or run.worker != self.worker_id
                        or run.attempt != self.read.attempt + 1):
                    return None
                mine = [e for e in await self.store.journal(run.id) if e.epoch == run.epoch]
                finished = []
                for f in self.carried:
                    last = f.entries[-1].kind if f.entries else None
                    finished.append(last is not None and any(
                        e.kind is last and e.epoch == f.fence.epoch
                        for e in await self.store.journal(f.fence.run_id)))
        except (StoreError, TimeoutError):
            return None
        appended = not run.cancel_requested and journaled_as(
            [e for e in mine if e.kind is not EntryKind.RUN_CLAIMED], entries)
        return ClaimOutcome(tuple(finished), run, appended)

    async def drop(self) -> None:
        """Give up the claim (its attempt stopped before it): the carried finishes commit
        on their own."""
        if self.taken:
            await self.done.wait()
            return
        self.taken = True
        self.dropped = True
        finished = []
        with anyio.CancelScope(shield=True):
            for f in self.carried:
                try:
                    with anyio.fail_after(WRITE_TIMEOUT):
                        finished.append(await self.store.finish(
                            f.fence, f.state, result=f.result, error=f.error,
                            entries=f.entries))
                except (StoreError, TimeoutError):
                    finished.append(False)
        self.outcome = ClaimOutcome(tuple(finished), None, False)
        self._settled()

    async def settle(self) -> None:
        """Wait up to :data:`RIDE_WAIT` for the attempt's first write to commit the claim;
        then commit it on its own. Returns once it is committed (or dropped)."""
        if not self.taken:
            with anyio.move_on_after(RIDE_WAIT):
                await self.done.wait()
        if not self.taken:
            await self.commit()
        await self.done.wait()

    def _settled(self) -> None:
        try:
            self._committed(self)
        finally:
            self.done.set()

    def finished(self, index: int) -> bool | None:
        """The outcome of the ``index``-th carried finish; None when unknown (a store
        error: the finish is to be tried on its own)."""
        if self.outcome is None:
            return None
        return self.outcome.finished[index]
