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
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

import anyio

from .. import _wake
from .._clock import Clock
from .._errors import SchemaVersionError
from .._retention import PrunedRun
from .._schedules import Schedule, ScheduleSpec
from .._types import (
    JSON,
    ClaimOutcome,
    EntryKind,
    Fence,
    Finish,
    JournalEntry,
    JournalWrite,
    NewRun,
    PausedWorkflow,
    Record,
    Renewal,
    Run,
    RunState,
    Signal,
    SignalSent,
)

SCHEMA_VERSION = 14
"""The schema version this version of durable writes and understands."""


def check_schema(version: int, where: str, url: str, *, upgrade: bool) -> None:
    """Refuse a schema an open may not move (both stores): one newer than this durable's,
    or one behind it when the store was made with ``upgrade=False`` (the operator's
    commands other than ``start``, ``schedule add``, ``worker`` and ``migrate`` never
    upgrade a database under the workers that use it). ``where`` names the database."""
    if version > SCHEMA_VERSION:
        raise SchemaVersionError(
            f"the database {where} has schema version {version}, newer than this durable "
            f"understands ({SCHEMA_VERSION}); upgrade durable to use it")
    if 0 < version < SCHEMA_VERSION and not upgrade:
        raise SchemaVersionError(
            f"the database {url} has schema version {version}, older than this durable's "
            f"({SCHEMA_VERSION}); upgrade it with: durable migrate --db {url}")

DEFAULT_MAX_RECOVERIES = 10
"""Recoveries (lease expiries) a run may have; the next one ends it failed.

Each recovery means the run's worker died or froze while running it, and the next attempt
runs its in-flight step again (``on_doubt="retry"``): ten in a row is a step that kills its
worker, not bad luck. A graceful release (shutdown) is not a recovery. docs/design.md.
"""

CANCELLED_AT_RELEASE = "cancelled by operator (requested while the attempt was running)"
CANCELLED_AT_RECOVERY = ("cancelled by operator (requested while the attempt was running; "
                         "its worker died or froze)")


def ended_entry(state: RunState, row: Mapping[str, Any], when: str) -> JournalWrite | None:
    """The journal entry of a run that a release or a recovery ended instead of requeueing.

    A pending operator cancel ends the run cancelled (it is never executed again); too many
    recoveries end it failed. ``row`` has the run's ``error`` and (recovery) ``step``.
    """
    if state is RunState.CANCELLED:
        return JournalWrite(EntryKind.RUN_CANCELLED, data={"by": "operator", "at": when})
    if state is RunState.FAILED:
        return JournalWrite(EntryKind.RUN_FAILED, data={
            "error": row["error"], "error_type": "RecoveryLimitError",
            "step": row["step"], "recoveries": int(row["recoveries"])})
    return None


Cursor = tuple[float, str]
"""A keyset cursor into the runs list: ``(created_at, id)`` of the last run of a page."""

RUN_FILTERS = ("state", "workflow", "key", "before", "created_from", "created_to", "id_prefix")
"""The filters of :meth:`Store.list_runs`, in the order their fragments are joined."""


def prefix_end(prefix: str) -> str | None:
    """The least string above every string that starts with ``prefix``, in code point
    (SQLite's binary, PostgreSQL's ``"C"``) order; None when there is none (all U+10FFFF).

    So ``id >= prefix AND id < prefix_end(prefix)`` is the prefix as a range of the primary
    key: no LIKE, so ``%`` and ``_`` in the prefix are plain characters.
    """
    chars = list(prefix)
    while chars:
        code = ord(chars.pop()) + 1
        if code == 0xD800:  # surrogates are not characters (and have no UTF-8 form)
            code = 0xE000
        if code <= 0x10FFFF:
            return "".join(chars) + chr(code)
    return None


def run_filters(
    fragments: Mapping[str, str],
    *,
    state: RunState | None = None,
    workflow: str | None = None,
    key: str | None = None,
    before: Cursor | None = None,
    created_from: float | None = None,
    created_to: float | None = None,
    id_prefix: str | None = None,
    prefix_leads: bool | None = None,
    pair_leads: bool | None = None,
) -> tuple[str, dict[str, Any]]:
    """The WHERE clause (``""`` when nothing is filtered) and its parameters, joined from
    the fixed fragments ``runs_where_<filter>`` of a dialect's queries.sql, one per filter
    given. Never ``(:x IS NULL OR col = :x)``: SQLite cannot use an index for that.

    With an id prefix, ``prefix_leads`` says which index finds the rows, where the dialect
    has ``_checked`` fragments (a condition no index serves): True, the prefix's range of
    ids (every other filter checked on its rows, which are then sorted); False, the other
    filters' index (or the newest-first one), read in the list's order, each id checked
    (docs/list-queries.md, *An id prefix*); None, the planner's choice. With a key, a
    workflow and a state, ``pair_leads`` True reads the key's runs of the workflow and
    checks the state (``state_checked``), else the key's runs in the state are read and
    the workflow checked (*A key with a long history*)."""
    params: dict[str, Any] = {}
    used: list[str] = []
    if state is not None:
        used.append("state")
        params["state"] = RunState(state).value
    if workflow is not None:
        # with a key, the key's own indexes: its runs of the workflow, or (with a state too)
        # its runs in the state, the workflow checked on each (docs/list-queries.md, "A key
        # with a long history"); never the workflow's whole index
        used.append("workflow" if key is None else
                    "workflow_of_key" if state is None else "workflow_of_key_state")
        params["workflow"] = workflow
    if key is not None:
        used.append("key")
        params["key"] = key
    if before is not None:
        used.append("before")
        params["before_at"], params["before_id"] = float(before[0]), str(before[1])
    if created_from is not None:
        used.append("created_from")
        params["created_from"] = float(created_from)
    if created_to is not None:
        used.append("created_to")
        params["created_to"] = float(created_to)
    if id_prefix:
        end = prefix_end(id_prefix)
        used.append("id_prefix" if end is not None else "id_prefix_open")
        params["id_prefix"], params["id_prefix_end"] = id_prefix, end
    if not used:
        return "", params
    if pair_leads and "workflow_of_key_state" in used and "runs_where_state_checked" in fragments:
        used = [{"workflow_of_key_state": "workflow_of_key", "state": "state_checked"}.get(f, f)
                for f in used]
    if id_prefix and prefix_leads is not None:
        # checked: the filters that the leading index's rows are tested against
        used = [f + "_checked" if f.startswith("id_prefix") is not prefix_leads
                and f"runs_where_{f}_checked" in fragments else f for f in used]
    return "WHERE " + "\n  AND ".join(fragments[f"runs_where_{f}"] for f in used), params


def list_unfinished_query(queries: Mapping[str, str], *, workflow: str | None = None,
                          key: str | None = None, before: Cursor | None = None,
                          ) -> tuple[str, dict[str, Any]]:
    """A dialect's ``list_unfinished`` statement for the filters given, and its parameters:
    each branch's WHERE clause is :func:`run_filters`' for its state (so the same index
    leads it as a list of that state), the state written as a literal
    (``runs_where_queued``, ``runs_where_running``) so one statement holds both."""
    query, params = queries["list_unfinished"], dict[str, Any]()
    for state in (RunState.QUEUED, RunState.RUNNING):
        own = {**queries, "runs_where_state": queries[f"runs_where_{state.value}"]}
        where, params = run_filters(own, state=state, workflow=workflow, key=key,
                                    before=before)
        query = query.replace(f"/*{state.value}*/", where)
    del params["state"]  # (each branch names its own)
    return query, params


def operator_data(data: Mapping[str, JSON], by: Mapping[str, JSON] | None) -> dict[str, JSON]:
    """The data of an operator action's journal entry: the action's own items, and
    ``"origin"`` (who and where the action came from) when known."""
    entry: dict[str, JSON] = dict(data)
    if by is not None:
        entry["origin"] = dict(by)
    return entry


class Store(abc.ABC):
    """Abstract store. Use :func:`durable.store.store_from_url` to get one from a URL."""

    clock: Clock
    url: str
    max_recoveries: int = DEFAULT_MAX_RECOVERIES
    """A run recovered more often than this ends failed (``?max_recoveries=N`` in the URL)."""
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

    # -- change signals (durable/_wake.py; docs/design.md, "Nothing waits for a poll") ------
    pushes_changes: bool = False
    """Whether :meth:`wait_for_work` and :meth:`wait_for_finished` return on a change made
    by another process (else they only wait out their timeout: plain polling)."""
    _work_seen: object = None

    def change_watcher(self) -> _wake.ChangeWatcher | None:
        """The watcher of this store's change token (SQLite: ``PRAGMA data_version`` of a
        connection of its own, which changes when any other connection commits, read
        without a write), or None when the store has no such signal."""
        return None

    def change_token(self) -> object | None:
        """The count of changes seen so far (None without a watcher): read it *before*
        reading what you wait for, and pass it to :meth:`wait_for_finished`."""
        watcher = self.change_watcher()
        if watcher is None:
            return None
        watcher.start()
        return watcher.count

    async def wait_for_work(self, timeout: float, worker: str | None = None, *,
                            patient: bool = False) -> tuple[Run, ...] | None:
        """Return when work may be waiting for this process's worker (a run queued, a cancel
        requested: something another process committed), or after ``timeout`` seconds.

        Changes since the previous return are kept: the first call returns at once, so a
        caller that claims after every return misses nothing. Meant for one waiting task
        per store (the worker's). ``worker``: the waiting worker's id, for a store whose
        signal says what changed (PostgreSQL skips the changes that worker's last claim
        saw); the default waits on :meth:`change_watcher`, which says nothing of the kind.
        ``patient``: the caller can take a change up to ``durable._wake.CHANGE_POLL_OWN``
        seconds late while its process commits itself (a worker with no free slot, which
        waits only for cancels): the watcher then looks less often.

        Returns None: the caller looks at what is queued. A store whose signal can say
        that the news was only runs created queued returns those runs as created (a
        non-empty tuple; PostgreSQL, where their NOTIFY carries them): the caller may
        claim them riding on their first write, without a read.
        """
        watcher = self.change_watcher()
        if watcher is None:
            await anyio.sleep(timeout)
            return None
        seen = self._work_seen if isinstance(self._work_seen, int) else -1
        self._work_seen = await watcher.wait(seen, timeout, patient=patient)
        return None

    async def wait_for_finished(self, run_id: str, timeout: float,
                                since: object = None) -> None:
        """Return when the run may have finished (re-read it to know), or after ``timeout``
        seconds; any number of tasks may wait at once. ``since``: the :meth:`change_token`
        read *before* the caller last read the run (so a finish in between is not missed).
        The default waits on :meth:`change_watcher`."""
        watcher = self.change_watcher()
        if watcher is None:
            await anyio.sleep(timeout)
            return
        watcher.start()
        await watcher.wait(since if isinstance(since, int) else watcher.count, timeout)

    def told_here(self, run_id: str) -> None:
        """The start of ``run_id`` through this store object was told to this process's
        workers directly (``durable._wake.Hub.work``, with the run as created): a store
        whose change signal names the transaction that queued it may skip that signal in
        :meth:`wait_for_work` for a worker on this store object, to which it is no news.
        Called right after :meth:`create_run` returns, with no await in between (a store
        may judge a signal that came before the answer once its starts in flight are
        told). Nothing by default."""
        return None

    async def notify_finished(self, run_id: str) -> None:
        """Tell other processes' :meth:`wait_for_finished` that the run finished (sent by
        the worker after the finish committed; a no-op where a commit is the signal)."""
        return None

    async def cancels_requested(self, run_ids: Collection[str]) -> set[str]:
        """Which of these runs have an operator cancel pending: reads, never writes (a
        worker asks after a change signal, instead of waiting for its next renewal). The
        stores read the running runs with a cancel pending (an index of those alone), so the
        answer costs the same however many runs are asked about."""
        flagged: set[str] = set()
        for run_id in list(run_ids):
            run = await self.get_run(run_id)
            if run is not None and run.cancel_requested:
                flagged.add(run_id)
        return flagged

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
        before: Cursor | None = None,
        created_from: float | None = None,
        created_to: float | None = None,
        id_prefix: str | None = None,
    ) -> list[Run]:
        """Up to ``limit`` runs, newest first: by ``(created_at, id)`` descending.

        Filters, all optional and combined with AND: ``state``, ``workflow``, ``key`` (the
        concurrency key); ``before``, the keyset cursor ``(created_at, id)`` of the last run
        of the previous page (only runs strictly after it in this order, so paging visits
        every run once, even runs created in the same instant); ``created_from`` (inclusive)
        and ``created_to`` (exclusive), in store seconds; ``id_prefix``, ids that start with
        it (literally: no wildcards). Every shape is an indexed query (docs/list-queries.md).
        """

    @abc.abstractmethod
    async def list_unfinished(
        self,
        *,
        workflow: str | None = None,
        key: str | None = None,
        limit: int = 100,
        before: Cursor | None = None,
    ) -> list[Run]:
        """Up to ``limit`` queued and running runs together, newest first, paged as
        :meth:`list_runs` pages (``before``), with its ``workflow`` and ``key`` filters.

        One statement reads both states, so each page is one snapshot: a run that moves
        from one state to the other while the pages are read (claimed, released, recovered)
        is in exactly one page, in one of them, where a list of each state in turn could
        read it in neither (``durable cancel`` by filter). Each state's part is read in its
        own index in the list's order (docs/list-queries.md, *Queued and running*).
        """

    @abc.abstractmethod
    async def count_runs(
        self, *, workflow: str | None = None, key: str | None = None,
        created_from: float | None = None, created_to: float | None = None,
    ) -> dict[RunState, int]:
        """The number of runs in each state (every state, 0 when none), optionally of one
        workflow and/or concurrency key, created in ``[created_from, created_to)``; counted
        from an index."""

    @abc.abstractmethod
    async def latest_run(self, workflow: str, key: str) -> Run | None:
        """The newest run of a workflow for a concurrency key, by a direct query."""

    @abc.abstractmethod
    async def next_run_at(self) -> float | None:
        """The earliest ``run_at`` of any queued run, or None when nothing is queued."""

    async def next_due_in(self, workflows: Sequence[str] | None = None) -> float | None:
        """Seconds from now (the store's clock) until the earliest queued run of
        ``workflows`` (every workflow: None) that is not due yet becomes due: a delayed
        start, a wait or a retry delay that released its run. None when there is none.
        The worker wakes then to claim it, whatever its poll (docs/design.md, *A timer
        does not wait for a poll*). A store that cannot tell inherits None: the poll."""
        return None

    async def queue_stats(self) -> dict[str, tuple[int, float]]:
        """For metrics, per workflow with queued runs that are due (``run_at`` passed): how
        many, and how many seconds the longest-waiting one has been due (the store's
        clock). A store without it raises NotImplementedError (no queue metrics)."""
        raise NotImplementedError

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

        A run is runnable when queued, due, and its concurrency key is free: no run of the
        key is running, and the run is the key's first in line. A run that has started
        (``attempt > 0``: released, recovered or replayed) is first in line, ahead of runs
        that never started, which are served FIFO (``run_at``, then creation). Finished runs
        are never claimed. A claimed run keeps ``cancel_requested`` (the attempt cancels at
        once). Its epoch is above every earlier epoch of its fencing scope
        (:attr:`durable.Run.fencing_scope`). With ``workflows``, only runs of those
        workflows (a worker never claims a run it cannot execute).
        """

    claim_ramp: int | None = None
    """A worker with more slots free than this claims at most this many runs by one
    :meth:`claim`, or twice the attempts it holds if more (None: all it has room for at
    once). A claim of many runs is one long statement while an idle worker has nothing to
    run; ramped up, the first runs claimed run while the server claims the next ones
    (docs/benchmarks.md, target 7)."""

    # -- a claim that rides on the attempt's first write (docs/design.md, "One commit
    # per step") ----------------------------------------------------------------------------
    claims_ride_on_writes: bool = False
    """Whether the worker claims a run that never started by a read (:meth:`claimable`)
    followed by :meth:`claim_with` carrying the attempt's first journal write and the
    previous attempt's finish: one commit where three were. A store says so only when
    :meth:`claim_with` is one transaction (SQLite: one transaction; PostgreSQL: one
    statement); elsewhere it would only add a read."""

    async def claimable(
        self, worker: str, limit: int, workflows: Sequence[str] | None = None
    ) -> list[Run]:
        """Up to ``limit`` runs that :meth:`claim` would claim now, read without a write
        or a lock (another worker may claim them first). This default knows none: the
        worker then claims the usual way."""
        return []

    async def claim_with(
        self,
        worker: str,
        lease: float,
        run_id: str,
        attempt: int,
        entries: Sequence[JournalWrite] = (),
        finishes: Sequence[Finish] = (),
        workflows: Sequence[str] | None = None,
    ) -> ClaimOutcome:
        """Commit ``finishes`` (each as :meth:`finish` would, each under its own fence,
        each on its own: one refused changes nothing else), then claim run ``run_id`` as
        :meth:`claim` would (``run_claimed`` journaled), and, when the claimed run has
        attempt number ``attempt`` and no pending cancel (it is the run the caller read),
        append ``entries`` under its new epoch.

        SQLite does all of it in one transaction, PostgreSQL in one statement. This default
        does it in steps, each
        committed on its own before the next (the finishes first: a result never waits on
        a claim that fails), which is what a worker without it does anyway.
        """
        finished = tuple([
            await self.finish(f.fence, f.state, result=f.result, error=f.error,
                              entries=f.entries) for f in finishes])
        runs = await self.claim(worker, lease, 1, run_id=run_id, workflows=workflows)
        run = runs[0] if runs else None
        appended = False
        if run is not None and run.attempt == attempt and not run.cancel_requested:
            appended = not entries or await self.append(Fence(run.id, run.epoch), entries)
        return ClaimOutcome(finished, run, appended)

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
    async def release(self, fence: Fence, entries: Sequence[JournalWrite] = (), *,
                      run_at: float | None = None, waiting_for: str | None = None,
                      seen_signals: int = 0) -> bool:
        """Give a held run back to the queue (graceful shutdown: due at once).

        A run with a pending operator cancel is not queued: it ends ``cancelled`` (with a
        ``run_cancelled`` entry after ``entries``). ``run_at``: due then instead (a durable
        sleep or retry delay, a wait's timeout). ``waiting_for``: it waits for the signal of
        that name (:attr:`Run.waiting_for`); if the run received any signal after its
        attempt counted ``seen_signals``, it is due at once (judged in the statement).
        """

    # -- signals (docs/design.md, "Durable waiting") -------------------------------------------
    @abc.abstractmethod
    async def send_signal(self, run_id: str, name: str, payload: JSON,
                          signal_id: str | None = None,
                          by: Mapping[str, JSON] | None = None) -> SignalSent:
        """Record a signal for a queued or running run, in one transaction with its
        ``signal_sent`` journal entry (``by`` as its origin), unless ``signal_id`` was
        already recorded for the run; a run waiting for ``name`` becomes due at once."""

    @abc.abstractmethod
    async def next_signal(self, run_id: str, name: str,
                          after: int) -> tuple[int, Signal | None]:
        """The run's signal count (read first), then its oldest signal ``name`` with
        ``seq > after`` (None when there is none)."""

    @abc.abstractmethod
    async def list_signals(self, run_id: str) -> list[Signal]:
        """Every signal recorded for the run, in order."""

    @abc.abstractmethod
    async def recover_stale(
        self, run_id: str | None = None, epoch: int | None = None
    ) -> list[Fence]:
        """Requeue runs whose lease expired: a compare-and-set per run.

        With ``run_id`` and ``epoch``, only that run and only if it is still running under
        that epoch and still expired. Returns the runs this call recovered; a caller that
        lost the race gets an empty list and must back off.
        """

    # -- liveness (one machine: a lock the kernel releases when a worker dies) ----------------
    def liveness_dir(self) -> Path | None:
        """The folder of the lock files of this store's workers (durable/_liveness.py), or
        None for a store without liveness: then a dead worker's runs wait for their lease.
        This default is None; the SQLite store (one machine) has one."""
        return None

    async def running_workers(self) -> list[tuple[Fence, str]]:
        """The running runs and their workers (a read). This default, for stores without
        liveness, returns []."""
        return []

    async def recover_dead(self, run_id: str, epoch: int, worker: str) -> list[Fence]:
        """Recover a run whose worker is dead for sure (its liveness lock could be taken),
        whatever its lease: a compare-and-set on ``(id, epoch, still running, same
        worker)``, counted and journaled as :meth:`recover_stale` does (a pending cancel
        ends it cancelled). Returns the run if this call recovered it, else []. This
        default, for stores without liveness, returns [] (their runs wait for the lease)."""
        return []

    @abc.abstractmethod
    async def journal(self, run_id: str, after: int = 0) -> list[JournalEntry]:
        """A run's journal entries with ``seq > after``, in order."""

    # -- operator actions ---------------------------------------------------------------------
    @abc.abstractmethod
    async def request_cancel(
        self, run_id: str, by: Mapping[str, JSON] | None = None
    ) -> Run | None:
        """Cancel a queued run at once, or flag a running one, in one statement; None if the
        run is finished or missing.

        ``by`` says who and where the request came from (``{"via": "console", "remote":
        ...}``); it is journaled as ``"origin"`` in the ``run_cancelled`` or
        ``run_cancel_requested`` entry, written with the change.
        """

    @abc.abstractmethod
    async def requeue(
        self,
        run_id: str,
        replay_from: int | None,
        doubt_policy: str | None,
        by: Mapping[str, JSON] | None = None,
    ) -> Run | None:
        """Queue a failed or cancelled run again (replay); None if it is in another state.

        ``by`` (who and where from) is journaled as ``"origin"`` in the ``run_replayed``
        entry, written with the change.
        """

    # -- fenced application records ------------------------------------------------------------
    @abc.abstractmethod
    async def put_records(
        self,
        fence: Fence | None,
        records: Sequence[tuple[str, str, JSON]],
        entries: Sequence[JournalWrite] = (),
        *,
        expected: Mapping[tuple[str, str], int] | None = None,
    ) -> bool:
        """Write records and journal entries in one transaction, only if the fence holds.

        ``fence=None`` writes unfenced (seeding records from outside any run). Returns False
        (nothing written) when the fence fails. ``expected`` maps ``(namespace, key)`` to the
        :attr:`Record.version` the run read (0: absent); if any record has another version,
        nothing is written and :class:`durable.StaleRecordError` is raised. Every write of a
        record adds one to its version. Records are not guarded by epochs: tokens of
        different runs are not compared (docs/design.md).
        """

    @abc.abstractmethod
    async def get_record(self, namespace: str, key: str) -> Record | None: ...

    @abc.abstractmethod
    async def list_records(self, namespace: str) -> list[Record]: ...

    # -- schedules (durable/_schedules.py; docs/design.md, "Schedules") ----------------------
    @abc.abstractmethod
    async def put_schedule(self, spec: ScheduleSpec, *, origin: str,
                           replace: bool) -> tuple[Schedule, bool]:
        """Create a schedule (its fires start after now), or, when one of that name exists:
        with ``replace``, give it this definition (its paused flag and what it fired are
        kept); without, leave it. Returns the stored schedule and whether this call wrote."""

    @abc.abstractmethod
    async def get_schedule(self, name: str) -> Schedule | None: ...

    @abc.abstractmethod
    async def list_schedules(self) -> list[Schedule]:
        """Every schedule, by name."""

    @abc.abstractmethod
    async def pause_schedule(self, name: str, paused: bool) -> Schedule | None:
        """Pause, or resume, a schedule in one statement; None if there is none of that
        name. A resume moves the schedule past every fire up to now: a paused schedule
        starts nothing, not even later."""

    # -- paused workflows (docs/design.md, "Pausing a workflow") --------------------------------
    @abc.abstractmethod
    async def pause_workflow(self, workflow: str,
                             origin: Mapping[str, JSON] | None) -> PausedWorkflow | None:
        """Pause ``workflow``: from this write's commit no claim takes a run of it. The
        pause as written, or None if it was paused already (the first pause stands)."""

    @abc.abstractmethod
    async def resume_workflow(self, workflow: str) -> PausedWorkflow | None:
        """Resume ``workflow`` (its runs are claimable again; idle workers are woken): the
        pause it ended, or None if it was not paused."""

    @abc.abstractmethod
    async def paused_workflows(self) -> list[PausedWorkflow]:
        """Every paused workflow, by name."""

    @abc.abstractmethod
    async def delete_schedule(self, name: str) -> bool:
        """Delete a schedule (its runs stay); False if there was none."""

    @abc.abstractmethod
    async def fire_schedule(self, name: str, version: int, fire_at: float,
                            new: NewRun | None) -> bool:
        """One fire, in one conditional write: if the schedule is not paused and still at
        ``version``, move it past ``fire_at`` (version + 1) and, with ``new``, create that
        run as :meth:`create_run` does (nothing when its id exists) and note it as the
        schedule's last run. ``new=None`` skips the fire. False (nothing written) if the
        schedule changed since it was read at ``version``."""

    # -- retention (durable/_retention.py; docs/design.md, "Retention") ----------------------
    @abc.abstractmethod
    async def prunable_runs(self, state: RunState, cutoff: float, limit: int,
                            after: tuple[float, str] | None = None) -> list[Run]:
        """Up to ``limit`` runs in the finished ``state`` that ended (``updated_at``) before
        ``cutoff``, oldest end first, after the keyset cursor ``(updated_at, id)``: what
        :meth:`prune_runs` would delete (a read)."""

    @abc.abstractmethod
    async def prune_runs(self, state: RunState, cutoff: float, limit: int) -> list[PrunedRun]:
        """Delete up to ``limit`` runs in the finished ``state`` that ended before ``cutoff``
        (oldest first), with their journals, in one short transaction; leave a tombstone of
        each and return them. The journal's trigger lets only these entries go."""

    @abc.abstractmethod
    async def get_pruned(self, run_id: str) -> PrunedRun | None:
        """The tombstone of a pruned run, or None."""


def watch_finishes(store: Store, seen: Callable[[Fence, bool], None]) -> Callable[[], None]:
    """Call ``seen(fence, ok)`` after each finish ``store`` commits (or its fence refuses),
    whether by :meth:`Store.finish` or carried by :meth:`Store.claim_with`; returns a
    function that stops watching. For benchmarks and tests (it replaces the two methods on
    the instance)."""
    finish, claim_with = store.finish, store.claim_with
    carries = type(store).claim_with is not Store.claim_with  # the default calls finish

    async def watched_finish(fence: Fence, *args: Any, **kwargs: Any) -> bool:
        ok = await finish(fence, *args, **kwargs)
        seen(fence, ok)
        return ok

    async def watched_claim_with(*args: Any, **kwargs: Any) -> ClaimOutcome:
        outcome = await claim_with(*args, **kwargs)
        if carries:
            for carried, ok in zip(kwargs.get("finishes", ()), outcome.finished, strict=True):
                seen(carried.fence, ok)
        return outcome

    def unwatch() -> None:
        store.finish, store.claim_with = finish, claim_with  # type: ignore[method-assign]

    store.finish = watched_finish  # type: ignore[method-assign]
    store.claim_with = watched_claim_with  # type: ignore[method-assign]
    return unwatch
