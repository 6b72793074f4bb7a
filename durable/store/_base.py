"""The storage boundary: the few primitives the engine needs, and nothing else.

Every claim and state change is one conditional statement. Every write of an attempt is
*fenced*: it takes effect only while the run is ``running`` under the attempt's epoch and
its lease has not expired, judged by the store's one clock. A write that fails its fence
changes nothing and returns ``False``.

Implementations never run user code and never let driver types or exceptions out: driver
errors become :class:`durable.StoreError` subclasses at this boundary.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence

from .._clock import Clock
from .._types import (
    JSON,
    Fence,
    JournalEntry,
    JournalWrite,
    NewRun,
    Record,
    Renewal,
    Run,
    RunState,
)

SCHEMA_VERSION = 1
"""The schema version this version of durable writes and understands."""


class Store(abc.ABC):
    """Abstract store. Use :func:`durable.store.open_store` to get one from a URL."""

    clock: Clock
    url: str
    created: str | None = None
    """Set by :meth:`open` when it created the database (or schema): where, for messages."""

    # -- lifecycle ---------------------------------------------------------------------------
    @abc.abstractmethod
    async def open(self) -> None:
        """Connect, bring the schema up to date, refuse a newer schema."""

    @abc.abstractmethod
    async def aclose(self) -> None:
        """Release the connection(s)."""

    @abc.abstractmethod
    async def schema_version(self) -> int:
        """The schema version of the database (0 for an empty one)."""

    async def now(self) -> float:
        """The time leases are judged by, in seconds since the epoch: the store clock's
        (PostgreSQL without an injected clock: the server's). Compare stored times with
        this, never with the local wall clock."""
        return self.clock.now()

    # -- runs --------------------------------------------------------------------------------
    @abc.abstractmethod
    async def create_run(self, new: NewRun) -> tuple[Run, bool]:
        """Create a queued run unless one with that id exists; return it and whether it is new.

        The run's ``run_created`` journal entry is written in the same transaction.
        """

    @abc.abstractmethod
    async def get_run(self, run_id: str) -> Run | None: ...

    @abc.abstractmethod
    async def list_runs(
        self,
        *,
        state: RunState | None = None,
        workflow: str | None = None,
        key: str | None = None,
        limit: int = 100,
    ) -> list[Run]:
        """Runs, newest first."""

    @abc.abstractmethod
    async def latest_run(self, workflow: str, key: str) -> Run | None:
        """The newest run of a workflow for a concurrency key, by a direct query."""

    @abc.abstractmethod
    async def next_run_at(self) -> float | None:
        """The earliest ``run_at`` of any queued run, or None when nothing is queued."""

    # -- attempts ----------------------------------------------------------------------------
    @abc.abstractmethod
    async def claim(
        self,
        worker: str,
        lease: float,
        limit: int,
        run_id: str | None = None,
        workflows: Sequence[str] | None = None,
    ) -> list[Run]:
        """Move up to ``limit`` runnable runs to running with a new epoch, in one statement.

        A run is runnable when queued, due, and no other run with its concurrency key is
        running. Finished runs are never claimed. With ``workflows``, only runs of those
        workflows (a worker never claims a run it cannot execute).
        """

    @abc.abstractmethod
    async def renew(
        self,
        worker: str,
        held: Sequence[Fence],
        lease: float,
        details: Mapping[str, JSON] | None = None,
    ) -> list[Renewal]:
        """Renew the leases of all runs a worker holds in one statement.

        Returns one :class:`Renewal` per run still held (with its cancel flag); a run
        missing from the answer is lost.
        """

    @abc.abstractmethod
    async def append(self, fence: Fence, entries: Sequence[JournalWrite]) -> bool:
        """Append journal entries, all or none, only if the fence holds."""

    @abc.abstractmethod
    async def finish(
        self,
        fence: Fence,
        state: RunState,
        *,
        result: JSON = None,
        error: str | None = None,
        entries: Sequence[JournalWrite] = (),
    ) -> bool:
        """Move a held run to a final state with its last journal entries, atomically."""

    @abc.abstractmethod
    async def release(self, fence: Fence, entries: Sequence[JournalWrite] = ()) -> bool:
        """Give a held run back to the queue at once (graceful shutdown)."""

    @abc.abstractmethod
    async def recover_stale(
        self, run_id: str | None = None, epoch: int | None = None
    ) -> list[Fence]:
        """Requeue runs whose lease expired: a compare-and-set per run.

        With ``run_id`` and ``epoch``, only that run and only if it is still running under
        that epoch and still expired. Returns the runs this call recovered; a caller that
        lost the race gets an empty list and must back off.
        """

    @abc.abstractmethod
    async def journal(self, run_id: str, after: int = 0) -> list[JournalEntry]:
        """A run's journal entries with ``seq > after``, in order."""

    # -- operator actions ---------------------------------------------------------------------
    @abc.abstractmethod
    async def request_cancel(self, run_id: str) -> Run | None:
        """Cancel a queued run at once, or flag a running one; None if neither applies."""

    @abc.abstractmethod
    async def requeue(
        self, run_id: str, replay_from: int | None, doubt_policy: str | None
    ) -> Run | None:
        """Queue a failed or cancelled run again (replay); None if it is in another state."""

    # -- fenced application records ------------------------------------------------------------
    @abc.abstractmethod
    async def put_records(
        self,
        fence: Fence | None,
        records: Sequence[tuple[str, str, JSON]],
        entries: Sequence[JournalWrite] = (),
    ) -> bool:
        """Write records and journal entries in one transaction, only if the fence holds.

        ``fence=None`` writes unfenced (seeding records from outside any run).
        """

    @abc.abstractmethod
    async def get_record(self, namespace: str, key: str) -> Record | None: ...

    @abc.abstractmethod
    async def list_records(self, namespace: str) -> list[Record]: ...
