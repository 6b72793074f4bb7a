"""The worker: claims runs, holds their leases, runs their attempts, shuts down gracefully."""

from __future__ import annotations

import logging
import os
import socket
import uuid
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import anyio
import attrs
import httpx
from anyio.abc import TaskGroup, TaskStatus
from anyio.lowlevel import cancel_shielded_checkpoint

from . import _clock, _gc, _liveness, _wake
from ._attempt import Attempt
from ._claims import WRITE_TIMEOUT, PendingClaim
from ._errors import ConfigError, DurableError, NotSentError, StoreError
from ._interceptors import LOOPS, Chain, ClaimInfo, Interceptor, RenewInfo, around, tell
from ._logging import Repeats, get_logger
from ._pool import MIN_HTTP_CONNECTIONS, WorkerTransport
from ._registry import Registry, Workflow, default_registry
from ._retention import prune
from ._schedules import Scheduler
from ._steps import DEFAULT_WAIT_THRESHOLD
from ._types import (
    EntryKind,
    Fence,
    Finish,
    JournalWrite,
    Run,
    RunState,
    check_count,
    check_seconds,
)
from .store import Cursor, Store

SPAWN_WAVE = 4
"""Attempts started from one claim before the claim loop yields: the first ones reach
their journal write, its commit and their request while the rest are still being started
(a claim of 1,000 started at once sent its first request after the 1,000th attempt had
journaled its step)."""

SETTLED = frozenset({"completed", "failed", "cancelled"})
"""How an attempt may end (:meth:`durable._attempt.Attempt.execute`) without leaving a run
to claim behind it, unless its run had a concurrency key (the key's next run is free now)."""

BUSY_LOOK_GAP = 0.01
"""Seconds between two looks of a worker holding runs after change signals (a claim and a
read of the held runs' cancel flags): its own commits are changes too (SQLite)."""


READ_BACK_PAGE = 1000
"""Running runs read per page when a claim got no answer (:meth:`Worker._give_back_unheld`):
every page is read, since other workers' running runs are on them too."""

DUE_FLOOR = 0.001
"""The shortest wait for a run to become due (seconds): a run read as due in a moment is
claimed after at least this, so a store clock that lags the loop's cannot make it spin."""

HANDED_KEPT = 2
"""Runs handed over by starts in this process (:meth:`Worker.wake`) kept until the claim
loop looks: only one alone is claimed without a read, so a second is kept only to know
that, and more are not kept."""


class Worker:
    """Runs workflows from a store: those of ``registry`` (default: the decorators'
    :data:`durable.default_registry`) and the ``workflows`` given explicitly, by object.

    - Claims with one conditional statement per batch, up to ``concurrency`` runs at once.
    - Renews the leases of all its runs in one statement every ``heartbeat_interval``; the
      same statement tells it which runs an operator cancelled. Each attempt's cancel scope
      deadline follows its lease's local expiry, so an attempt whose renewals fail is
      cancelled before its lease runs out in the store, and so before anyone can take over.
    - Sweeps for runs whose lease expired (crashed or frozen workers) every
      ``sweep_interval`` (default: half the lease, at most 1 s).
    - With a store on this machine (SQLite), holds a lock the kernel releases when the
      process dies, and every ``liveness_interval`` takes over at once the runs of workers
      whose lock it can take: dead for sure, whatever their lease (durable/_liveness.py).
    - :meth:`shutdown` stops claiming, waits ``grace`` seconds, then cancels the attempts
      still running, journals that they were interrupted and gives their runs back at once.
    - ``ctx.http`` goes through one pool per worker allowing ``http_connections`` requests
      in flight per host (default ``concurrency``, at least httpx's 100); a request beyond
      that waits for a slot
      and the wait is logged (``http_pool_wait``), since it counts against the step's timeout.
    - ``interceptors`` (:class:`durable.Interceptor`) are called around each claim, attempt,
      step try, fenced write, renewal and ``ctx.http`` request, and told of lost leases,
      recoveries and steps in doubt (docs/observability.md); none by default, at no cost.
    - While it runs, the process's garbage collector makes no full collection more often
      than every 100 collections of its middle generation (:mod:`._gc`; CPython's default
      is 10): a burst of claims is not stopped by full collections. ``gc_policy=False``
      leaves the collector alone.
    """

    def __init__(
        self,
        store: Store,
        *,
        registry: Registry | None = None,
        workflows: Iterable[Workflow[..., Any]] = (),
        concurrency: int = 16,
        lease: float = 30.0,
        heartbeat_interval: float | None = None,
        poll_interval: float = 0.5,
        sweep_interval: float | None = None,
        liveness_interval: float = 0.25,
        grace: float = 10.0,
        worker_id: str | None = None,
        console_url: str | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        http_connections: int | None = None,
        interceptors: Sequence[Interceptor] = (),
        schedules: bool = True,
        schedule_interval: float = 1.0,
        prune_older_than: float | None = None,
        prune_interval: float = 3600.0,
        durable_wait_threshold: float = DEFAULT_WAIT_THRESHOLD,
        gc_policy: bool = True,
    ) -> None:
        check_count(concurrency, "concurrency")
        if http_connections is not None:
            check_count(http_connections, "http_connections")
        for option, value, zero in (
                ("lease", lease, False), ("poll_interval", poll_interval, False),
                ("grace", grace, True), ("heartbeat_interval", heartbeat_interval, False),
                ("sweep_interval", sweep_interval, False),
                ("liveness_interval", liveness_interval, False),
                ("schedule_interval", schedule_interval, False),
                ("prune_interval", prune_interval, False),
                ("prune_older_than", prune_older_than, True),
                ("durable_wait_threshold", durable_wait_threshold, True)):
            if value is not None:
                check_seconds(value, option, zero=zero)
        self.durable_wait_threshold = durable_wait_threshold
        """Waits (``ctx.sleep``, ``ctx.wait_for``, retry delays) of this many seconds or more
        end the attempt and release the run until it is due (docs/design.md, "Durable
        waiting"); shorter ones wait in the attempt."""
        self.store = store
        self._notifies = type(store).notify_finished is not Store.notify_finished
        """Whether the store overrides ``notify_finished`` (a store whose commits do not
        tell other processes by themselves): the base class's is a no-op, not worth a bound
        and an await per run. Neither SQLite's (the commit changes ``data_version``) nor
        PostgreSQL's (the finishing statements NOTIFY) overrides it."""
        self.registry = registry or default_registry
        explicit = list(workflows)
        if explicit:  # besides the registry's (which may still grow: seen, not copied)
            self.registry = Registry(parent=self.registry)
            for wf in explicit:
                if not isinstance(wf, Workflow):
                    raise ConfigError(f"workflows must be durable.Workflow objects, not {wf!r}")
                self.registry.add_workflow(wf)
        self.concurrency = concurrency
        self.lease = lease
        self.heartbeat_interval = heartbeat_interval or min(lease / 3, 1.0)
        if self.heartbeat_interval >= lease * 0.9:
            raise ConfigError("heartbeat_interval must be well below the lease")
        self.poll_interval = poll_interval
        # ≤ 1 s: a run whose lease lapsed is recovered within a second of its expiry
        self.sweep_interval = sweep_interval or max(min(lease / 2, 1.0), 0.05)
        self.liveness_interval = liveness_interval
        self._lock: _liveness.WorkerLock | None = None
        self.grace = grace
        self.worker_id = worker_id or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.console_url = console_url
        self._transport = transport
        self.http_connections = http_connections or max(concurrency, MIN_HTTP_CONNECTIONS)
        """Requests in flight at once per host through ``ctx.http`` (:mod:`._pool`): one per
        attempt by default, never fewer than httpx's default pool; more wait for a slot, and
        the wait is logged."""
        self.active: dict[Fence, Attempt] = {}
        self.pending: dict[str, Attempt] = {}
        """Attempts whose run was read, not claimed yet (durable/_claims.py), by run id:
        they count against ``concurrency``; renewals and cancels skip them."""
        self._runs: TaskGroup | None = None
        self._more_queued = True
        """Whether the last claim (or read) took all it could (every slot is taken until an
        attempt ends, and a wake meanwhile finds none free) or failed: more may be queued,
        so an attempt's finish looks for a claim to ride on (else it commits at once), and
        an attempt's end claims again."""
        self._http: httpx.AsyncBaseTransport | None = None
        """The attempts running here, by their fence: two attempts of one run (an older one
        still unwinding after it lost its lease, and the newer claim) are both counted, and
        neither's end drops the other."""
        self._stopping = False
        self._grace_scope: anyio.CancelScope | None = None
        self._wake = anyio.Event()
        self._claiming = False
        """Whether the claim loop is claiming (from its statement to the attempts started)."""
        self._awaited: set[str] = set()
        """Runs :meth:`wake` was told of while a claim was under way: claimed again for
        after it unless it took them."""
        self._handed: dict[str, Run] = {}
        """Runs started in this process and handed over as created (:meth:`wake`), not
        claimed yet: one alone is claimed riding on its first write without a read first
        (:meth:`_hand_claims`)."""
        self._read_owed = True
        """Whether something besides a hand-over woke the claim loop since its last read
        (a change signal, a poll, an attempt's end, a run made due): the next claim reads
        what is queued."""
        self._wake_owed = False
        """An attempt's end would have woken the claim loop while no slot was free (the
        claim that rode on its finish took the slot): the next end that frees one wakes it
        (:meth:`_slot_freed`)."""
        self._due_at: float | None = None
        """When (``anyio.current_time()``) the earliest queued run that was not due at the
        last look becomes due (a delayed start, a released wait, a retry delay): the claim
        loop's wait ends then, whatever the poll. None: none, or not known."""
        self._due_owed = True
        """Whether the claim loop read the queue since it last looked when the next run is
        due: it looks again before it waits (docs/design.md, *A timer does not wait for a
        poll*)."""
        self._changed = anyio.Event()
        self.log = get_logger("durable.worker", worker=self.worker_id)
        self._failing: dict[str, Repeats] = {}
        """A loop's failures that go on (a store outage), by event: logged as they begin,
        once a minute while they last, and when they end (:class:`Repeats`)."""
        self.interceptors = tuple(interceptors)
        self._chain = Chain.of(self.interceptors)
        self.schedule_interval = schedule_interval
        """The longest wait between two looks at the schedules (a schedule added or resumed
        elsewhere is seen within it); the scheduler wakes at the next fire time before."""
        self.scheduler: Scheduler | None = (
            Scheduler(store, on_start=self._fired, worker=self.worker_id) if schedules else None)
        """Fires the store's schedules (docs/design.md, "Schedules"); None with
        ``schedules=False``."""
        self._schedule_wake = anyio.Event()
        self.prune_older_than = prune_older_than
        """With an age (seconds), prune finished runs older than it at start and every
        ``prune_interval`` seconds (docs/design.md, "Retention"); None (default): never."""
        self.prune_interval = prune_interval
        self.pruned = 0
        """Runs this worker pruned."""
        self.gc_policy = gc_policy
        """While it runs, the garbage collector's young generation is collected every
        :data:`durable._gc.YOUNG_EVERY` net allocations at the most often, and a full
        collection comes at most every :data:`durable._gc.FULL_SPACING` (process-wide,
        restored when the last worker stops; :func:`durable._gc.policy_thresholds`): none
        in the middle of a burst of claims."""

    # -- control -----------------------------------------------------------------------------
    def shutdown(self, grace: float | None = None) -> None:
        """Stop claiming; cancel what still runs after the grace period. Idempotent."""
        if grace is not None:
            self.grace = min(self.grace, grace)
            if self._grace_scope is not None:  # already waiting: shorten the wait now
                self._grace_scope.deadline = min(self._grace_scope.deadline,
                                                 anyio.current_time() + self.grace)
        if not self._stopping:
            self.log.info("worker_stopping", active=len(self.active), grace=self.grace)
        self._stopping = True
        self._wake.set()
        self._changed.set()
        self._schedule_wake.set()

    def wake(self, run_id: str | None = None, run: Run | None = None) -> None:
        """Look for work now rather than at the next poll. ``run_id``: the one run that
        became claimable (a run just created): when a claim is under way (a change signal
        came first), a claim after it only if that one did not take it. ``run``: that run
        as its start created it in this process; when nothing else is known to be queued,
        its claim rides on its first write without reading what is queued first."""
        if run is not None and run_id == run.id and len(self._handed) < HANDED_KEPT:
            self._handed[run.id] = run
        else:  # more than one at once are claimed by a read (the claim's order) anyway
            self._read_owed = True
        if run_id is not None and self._claiming:
            self._awaited.add(run_id)
            return
        self._wake.set()

    def _rouse(self) -> None:
        """Wake the claim loop to read what is queued."""
        self._read_owed = True
        self._wake.set()

    def wake_scheduler(self) -> None:
        """Look at the schedules now (after a schedule changed, or an injected clock moved)."""
        self._schedule_wake.set()

    def _fired(self) -> None:
        _wake.hub(self.store).work()  # this process's workers claim the fire's run now
        self._rouse()

    def cancel_local(self, run_id: str) -> None:
        """An operator cancel of ``run_id`` committed in this process (:mod:`._wake`): stop
        the attempt holding it now, as the next renewal would."""
        for attempt in list(self.active.values()):
            if attempt.run.id == run_id and not attempt.concluding:
                attempt.stop("cancelled")

    # -- main --------------------------------------------------------------------------------
    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        with _gc.worker_policy(self.gc_policy):
            await self._run(task_status)

    async def _run(self, task_status: TaskStatus[None]) -> None:
        await self._hold_lock()  # before the first claim, until the last attempt ended
        transport = self._transport or WorkerTransport(self.http_connections)
        try:
            async with anyio.create_task_group() as service:
                service.start_soon(self._heartbeat_loop)
                service.start_soon(self._sweep_loop)
                service.start_soon(self._liveness_loop)
                service.start_soon(self._notify_loop)
                service.start_soon(self._schedule_loop)
                service.start_soon(self._prune_loop)
                async with anyio.create_task_group() as runs:
                    self._runs, self._http = runs, transport
                    _wake.hub(self.store).workers.add(self)
                    self.log.info("worker_started", concurrency=self.concurrency,
                                  lease=self.lease, store=type(self.store).__name__,
                                  http_connections=self.http_connections
                                  if self._transport is None else "own transport")
                    task_status.started()
                    await self._claim_loop(runs, transport)
                    with anyio.move_on_after(self.grace) as self._grace_scope:
                        while self.active or self.pending:
                            await self._wait_changed()
                    self._grace_scope = None
                    for attempt in [*self.active.values(), *self.pending.values()]:
                        attempt.stop("shutdown")
                service.cancel_scope.cancel()
        finally:
            if self._lock is not None:  # no attempt runs any more: others may take over
                self._lock.release()
                self._lock = None
            _wake.hub(self.store).workers.discard(self)
            if self._transport is None:
                with anyio.CancelScope(shield=True):
                    await transport.aclose()
            self.log.info("worker_stopped")

    async def _wait_changed(self) -> None:
        await self._changed.wait()
        self._changed = anyio.Event()

    async def _claim_loop(self, runs: TaskGroup, transport: httpx.AsyncBaseTransport) -> None:
        failures = 0
        while not self._stopping:
            free = self._free_slots()
            claimed: list[Run] = []
            if free > 0:
                sent, sent_boot = anyio.current_time(), _clock.boottime()
                workflows = sorted(self.registry.workflows)
                self._claiming, took = True, frozenset[str]()
                try:
                    try:
                        # claims that ride on the first write: a run a start here handed
                        # over alone (no read), else one read for one free slot
                        read = None
                        if free == 1 or not self._more_queued:
                            read = self._hand_claims(free, workflows)
                            if read is None and free == 1:
                                self._due_owed = True
                                read = await self._read_claims(free, workflows)
                        if read is not None:  # claims that ride on the attempts' first writes
                            took = frozenset(claim.read.id for claim in read)
                            for claim in read:
                                await claim.settle()
                            failures = 0
                            self._succeeded("claim_failed")
                            if len(read) == free:
                                continue
                        else:
                            # this claim reads all that is queued, handed over or not
                            self._handed, self._read_owed = {}, False
                            self._due_owed = True
                            ramp = self.store.claim_ramp
                            if ramp is not None and free > ramp:
                                # the rest by the next claim, at once (Store.claim_ramp)
                                free = min(free, max(
                                    ramp, 2 * (len(self.active) + len(self.pending))))
                            if self._chain is None or not self._chain.claim:
                                claimed = await self.store.claim(
                                    self.worker_id, self.lease, free, workflows=workflows)
                            else:
                                claimed = await self._intercepted_claim(free)
                            took = frozenset(run.id for run in claimed)
                            self._more_queued = len(claimed) >= free
                            failures = 0
                            self._succeeded("claim_failed")
                    except StoreError as exc:
                        failures += 1
                        self._more_queued = True  # not known: the next attempt's end claims
                        self._failed("claim_failed", exc)
                        if not isinstance(exc, NotSentError):
                            await self._give_back_unheld()
                    for i, run in enumerate(claimed):
                        if i and i % SPAWN_WAVE == 0:
                            # in waves: the attempts started so far run on to their first
                            # wait before the next ones start (shielded: every claimed run
                            # is started, as without the wave)
                            await cancel_shielded_checkpoint()
                        self._spawn(runs, run, sent, transport, sent_boot)
                finally:
                    self._claimed(took)
                if claimed and len(claimed) == free:
                    continue
            if self._stopping:
                break
            wait = self.poll_interval * min(2 ** failures, 20)
            if self._free_slots() > 0:  # with none free, an attempt's end claims (_claims_after)
                due = await self._next_due(workflows) if self._due_owed else self._due_at
                if due is not None:
                    wait = min(wait, max(due - anyio.current_time(), DUE_FLOOR))
            with anyio.move_on_after(wait) as polled:
                await self._wake.wait()
            self._wake = anyio.Event()
            if polled.cancelled_caught:  # the poll, or a run became due: read the queue
                self._read_owed = self._due_owed = True
            if self._free_slots() <= 0:
                # woken with no slot free: what woke it (a start, a change, the poll) is not
                # read, nor when the next run is due, so the next end that frees a slot
                # wakes the loop. Not left to _claims_after: a claim riding on that end's
                # finish reads only runs due now, and finding none it would not wake it,
                # leaving a run due later to the poll
                self._wake_owed = True

    def _failed(self, event: str, exc: BaseException, level: int = logging.ERROR,
                **fields: Any) -> None:
        """A loop's failure ``event``: logged unless it repeats the one before within a
        minute (:class:`~durable._logging.Repeats`)."""
        repeats = self._failing.get(event)
        if repeats is None:
            assert event.removesuffix("_failed") in LOOPS, event  # told by that name
            repeats = self._failing[event] = Repeats(self.log, event, level=level,
                                                     clock=anyio.current_time, frames=1)
        repeats.failed(exc, **fields)
        if self._chain is not None and self._chain.loop_failed:
            tell(self._chain.loop_failed, event.removesuffix("_failed"), str(exc))

    def _succeeded(self, event: str) -> None:
        """A loop's success: the end of its failures ``event`` is logged, if it failed."""
        repeats = self._failing.get(event)
        if repeats is not None and repeats.failures:
            ended = repeats.succeeded()
            if ended is not None and self._chain is not None and self._chain.loop_recovered:
                tell(self._chain.loop_recovered, event.removesuffix("_failed"), *ended)

    async def _next_due(self, workflows: list[str]) -> float | None:
        """When the earliest queued run of this worker's workflows that is not due yet
        becomes due (:attr:`_due_at`), read from the store; None if none (or the read
        failed: then the poll, and another look after it)."""
        try:
            due_in = await self.store.next_due_in(workflows)
        except StoreError as exc:
            self._failed("next_due_failed", exc, logging.WARNING)
            self._due_at = None
            return None
        self._succeeded("next_due_failed")
        self._due_owed = False
        self._due_at = None if due_in is None else anyio.current_time() + due_in
        return self._due_at

    async def _give_back_unheld(self) -> None:
        """A claim got no answer: it may have claimed runs all the same, which no attempt
        here holds. Left alone they would wait for their lease (nothing runs them); read
        back, they are given back at once (a fenced release, ``run_interrupted``), to be
        claimed again. Released, not run here under the epoch read: a run of this worker
        whose attempt ended with its final write unanswered reads the same, and a release
        is as safe as the recovery that the lease would bring (it is refused if that final
        write committed first). A best effort: what it cannot read or release waits for
        its lease, as before."""
        held = {a.run.id for a in self.active.values()} | set(self.pending)
        released = []
        with anyio.move_on_after(WRITE_TIMEOUT, shield=True):
            try:
                before: Cursor | None = None
                while True:  # every running run, page by page: other workers' too
                    page = await self.store.list_runs(
                        state=RunState.RUNNING, limit=READ_BACK_PAGE, before=before)
                    for run in page:
                        if run.worker != self.worker_id or run.id in held:
                            continue
                        if await self.store.release(Fence(run.id, run.epoch), [JournalWrite(
                                EntryKind.RUN_INTERRUPTED,
                                data={"reason": "its claim got no answer"})]):
                            released.append(run.id)
                    if len(page) < READ_BACK_PAGE:
                        break
                    before = (page[-1].created_at, page[-1].id)
            except StoreError as exc:
                self.log.warning("claim_read_back_failed", error=str(exc))
        if released:
            self.log.warning("claim_given_back", runs=released)
            self._rouse()

    def _free_slots(self) -> int:
        """Runs this worker may take on now (its attempts running or claiming count)."""
        return self.concurrency - len(self.active) - len(self.pending)

    def _claimed(self, took: frozenset[str]) -> None:
        """A claim ended, having taken the runs ``took``: the runs :meth:`wake` was told of
        meanwhile that it did not take are claimed for next."""
        self._claiming = False
        for run_id in took:
            self._handed.pop(run_id, None)
        if self._awaited:
            if not self._awaited <= took:
                self._wake.set()
                if not self._awaited <= self._handed.keys():
                    self._read_owed = True
            self._awaited.clear()

    async def _intercepted_claim(self, free: int) -> list[Run]:
        assert self._chain is not None
        workflows = sorted(self.registry.workflows)
        return list(await around(
            self._chain.claim, ClaimInfo(self.worker_id, free, workflows),
            lambda: self.store.claim(self.worker_id, self.lease, free, workflows=workflows)))

    # -- claims that ride on the first write (durable/_claims.py) ------------------------------
    async def _read_claims(self, limit: int, workflows: list[str],
                           carried: tuple[Finish, ...] = ()) -> list[PendingClaim] | None:
        """Read what a claim would take and start attempts on it that claim with their
        first write; None when the usual claim must do (the store cannot, or a run read has
        started before: its attempt reads its journal first). For one free slot: more
        are claimed at once by one statement (and their writes share commits anyway); with
        more, a read and a claim riding on the first write cost more than the usual claim
        and a write on PostgreSQL, and no less on SQLite. Not with interceptors: they see
        every claim, and each attempt with its claimed run."""
        if not self.store.claims_ride_on_writes or self._runs is None or self._chain:
            return None
        read = await self.store.claimable(self.worker_id, limit, workflows=workflows)
        self._more_queued = len(read) >= limit
        if any(run.attempt or run.cancel_requested for run in read):
            return None
        held = {a.run.id for a in self.active.values()}
        claims = []
        for run in read:
            if self._stopping or run.id in self.pending or run.id in held:
                continue
            claims.append(self._spawn_pending(run, workflows, carried))
            carried = ()
        return claims

    def _hand_claims(self, free: int, workflows: list[str]) -> list[PendingClaim] | None:
        """The run a start in this process handed over (:meth:`wake`), as a claim riding
        on its first write, without the read of what is queued that :meth:`_read_claims`
        makes (one round trip less; on PostgreSQL one statement where the usual claim and
        the first write are two): only when it is the one thing that woke the loop since
        the last read (which found no more than it took), never started, due and without a
        concurrency key (a key's runs are claimed by the read's order), whatever the free
        slots. None: a read or the usual claim (``_read_owed``)."""
        handed, owed = self._handed, self._read_owed
        self._handed, self._read_owed = {}, False
        if (owed or len(handed) != 1 or not self.store.claims_ride_on_writes
                or self._runs is None or self._chain):
            return None
        (run,) = handed.values()
        if (run.state is not RunState.QUEUED or run.attempt or run.cancel_requested
                or run.key is not None or run.run_at > run.created_at
                or run.workflow not in workflows):
            return None
        held = {a.run.id for a in self.active.values()}
        if self._stopping or run.id in self.pending or run.id in held:
            return []
        self._more_queued = free <= 1  # as a read that took all it could would say
        return [self._spawn_pending(run, workflows, (), handed=True)]

    def _spawn_pending(self, run: Run, workflows: list[str],
                       carried: tuple[Finish, ...], *, handed: bool = False) -> PendingClaim:
        assert self._runs is not None
        sent, sent_boot = anyio.current_time(), _clock.boottime()
        # as the claim will make it (else the claim gives the run to a fresh attempt)
        expected = attrs.evolve(run, state=RunState.RUNNING, attempt=run.attempt + 1,
                                worker=self.worker_id)
        attempt = Attempt(self.store, expected, self.registry, lease=self.lease,
                          lease_sent_at=sent, lease_sent_boot=sent_boot,
                          transport=self._http, worker_id=self.worker_id,
                          console_url=self.console_url,
                          wait_threshold=self.durable_wait_threshold)
        claim = PendingClaim(self.store, self.worker_id, self.lease, run, attempt, carried,
                             workflows, self._claim_committed)
        claim.handed = handed
        attempt.claim = claim
        attempt.carry = self._carry
        self.pending[run.id] = attempt
        self._runs.start_soon(self._execute, attempt, name=f"durable run {run.id}")
        return claim

    def _claim_committed(self, claim: PendingClaim) -> None:
        attempt = claim.attempt
        if self.pending.get(claim.read.id) is attempt:
            del self.pending[claim.read.id]
        self._changed.set()
        outcome = claim.outcome
        if outcome is None or outcome.run is None:
            attempt.drop("the run was not claimable any more" if claim.error is None
                         else f"the claim failed: {claim.error}",
                         quiet=claim.error is None and not claim.dropped)
            if claim.error is not None or claim.dropped or not claim.handed:
                # the run may still be queued (no answer, or never sent), or others
                # behind the one read
                self._rouse()
            # else the store refused a run handed over alone (as created): another
            # worker took it, or it was cancelled, and nothing else is known to be queued
            # (each worker of a fleet that a start's NOTIFY woke tries it once, one wins)
            return
        sent, sent_boot = claim.sent
        if claim.error is not None:  # no answer, but the run and its journal told
            attempt.log.warning("claim_confirmed", error=str(claim.error),
                                as_expected=outcome.appended)
        if outcome.appended and not claim.void:
            attempt.adopt(outcome.run, sent, sent_boot)
            self.active[attempt.fence] = attempt
            attempt.log.info("run_claimed", worker=self.worker_id)
            return
        # claimed, but not the run the attempt was started on: a fresh attempt runs it
        attempt.drop("the run changed before its claim")
        assert self._runs is not None and self._http is not None
        self._spawn(self._runs, outcome.run, sent, self._http, sent_boot)

    async def _carry(self, finish: Finish) -> bool | None:
        """An attempt's finish, committed with the claim of the next run when one can be
        read right now (its outcome), else None: the finish then commits on its own."""
        # attempts that are concluding hold no slot: their finish is what rides here
        busy = sum(1 for a in self.active.values() if not a.concluding) + len(self.pending)
        if self._stopping or not self._more_queued or busy >= self.concurrency:
            return None
        try:
            claims = await self._read_claims(1, sorted(self.registry.workflows), (finish,))
        except StoreError:
            return None
        if not claims:
            return None
        await claims[0].settle()
        return claims[0].finished(0)

    def _spawn(self, runs: TaskGroup, run: Run, sent: float,
               transport: httpx.AsyncBaseTransport, sent_boot: float | None = None) -> None:
        attempt = Attempt(self.store, run, self.registry, lease=self.lease, lease_sent_at=sent,
                          lease_sent_boot=sent_boot,
                          transport=transport, worker_id=self.worker_id,
                          console_url=self.console_url, chain=self._chain,
                          wait_threshold=self.durable_wait_threshold)
        self.active[attempt.fence] = attempt
        attempt.log.info("run_claimed", worker=self.worker_id)
        runs.start_soon(self._execute, attempt, name=f"durable run {run.id}")

    async def _execute(self, attempt: Attempt) -> None:
        ended: str | None = None  # unknown (an interceptor's result, a crash): claim again
        try:
            if self._chain is None or not self._chain.attempt:
                ended = await attempt.execute()
            else:
                await around(self._chain.attempt, attempt.info, attempt.execute)
        except Exception as exc:  # the engine's own failure: log it, the lease will lapse
            attempt.log.exception("attempt_crashed", error=str(exc))
        finally:
            if self.active.get(attempt.fence) is attempt:
                del self.active[attempt.fence]
            if self.pending.get(attempt.run.id) is attempt:
                del self.pending[attempt.run.id]
            self._changed.set()
            if self._wake_owed or self._claims_after(attempt, ended):
                self._slot_freed()
            if not attempt.unclaimed:
                _wake.hub(self.store).end(attempt.run.id)  # this process's waiters, at once
        if attempt.unclaimed or not self._notifies:
            return
        try:  # other processes' waiters (PostgreSQL NOTIFY; a no-op where a commit signals)
            with anyio.fail_after(1.0):
                await self.store.notify_finished(attempt.run.id)
        except (StoreError, TimeoutError):
            pass  # they see it at their fallback poll

    def _slot_freed(self) -> None:
        """Wake the claim loop after an attempt's end, if it has a slot to claim for (or
        is stopping); else the wake is owed to the next end that frees one. A slot frees
        only at an attempt's end or a claim that did not hold (which wakes the loop
        itself), so a loop woken with none free would only go back to waiting."""
        if self._stopping or self.concurrency > len(self.active) + len(self.pending):
            self._wake_owed = False
            self._rouse()
        else:
            self._wake_owed = True

    def _claims_after(self, attempt: Attempt, ended: str | None) -> bool:
        """Whether the end of ``attempt`` (how it ``ended``) may leave a run to claim now:
        the slot it frees when the last claim was limited (by the free slots, or the loop
        was woken with none free), its run given back or released to wait (due at once
        if its signal came meanwhile), the next run of its concurrency key. A run that
        finished otherwise leaves nothing: claiming after it would find nothing, and
        whatever else queued meanwhile woke the loop itself. (No slot free means the last
        claim took all it could, so the end of an attempt then claims: a run that became due
        meanwhile is claimed without waiting for the poll.) An attempt whose claim did not
        hold leaves nothing either: :meth:`_claim_committed` woke the loop if it might."""
        if attempt.unclaimed:  # its claim did not hold: _claim_committed chose already
            return False
        return (self._more_queued or self._stopping or ended not in SETTLED
                or attempt.run.key is not None)

    # -- leases --------------------------------------------------------------------------------
    async def _heartbeat_loop(self) -> None:
        while True:
            await anyio.sleep(self.heartbeat_interval)
            await self.renew_now()

    async def renew_now(self) -> None:
        """Renew every held lease (one statement) and apply cancels and losses."""
        attempts = list(self.active.values())
        if not attempts:
            return
        sent, sent_boot = anyio.current_time(), _clock.boottime()  # boottime counts suspend
        details: dict[str, Any] = {
            a.run.id: a.heartbeat_detail for a in attempts
            if a.heartbeat_detail is not None and not a.lost
        }
        fences = [a.fence for a in attempts]
        try:
            if self._chain is None or not self._chain.renew:
                renewals = await self.store.renew(self.worker_id, fences, self.lease, details)
            else:
                renewals = list(await around(
                    self._chain.renew, RenewInfo(self.worker_id, len(fences)),
                    lambda: self.store.renew(self.worker_id, fences, self.lease, details)))
        except StoreError as exc:
            self._failed("renew_failed", exc, runs=len(attempts))
            for attempt in attempts:
                attempt.lease.renewal_failed()
            return
        self._succeeded("renew_failed")
        held = {r.run_id: r for r in renewals}
        for attempt in attempts:
            if attempt.concluding:  # its finish may have committed already: not a loss
                continue
            renewal = held.get(attempt.run.id)
            if renewal is None or renewal.epoch != attempt.fence.epoch:
                if not attempt.lost:
                    attempt.log.warning("lease_lost")
                    attempt.lose("lease lost (the renewal did not hold)")
                continue
            attempt.renewed(sent, sent_boot)
            if renewal.cancel_requested:
                attempt.stop("cancelled")

    async def _notify_loop(self) -> None:
        """With a store that signals changes (SQLite ``data_version``, PostgreSQL
        LISTEN/NOTIFY), wake at once for new work, and deliver an operator's cancel to the
        attempt without waiting for the next renewal: one read of the held runs' cancel
        flags after a change, never a write (docs/design.md, "Nothing waits for a poll")."""
        if not self.store.pushes_changes:
            return  # polling only
        looked = -BUSY_LOOK_GAP
        while True:
            try:
                # no free slot: only a cancel can matter, and it may come a little later
                created = await self.store.wait_for_work(30.0, self.worker_id,
                                                         patient=self._free_slots() <= 0)
            except StoreError as exc:
                self._failed("listen_failed", exc)
                await anyio.sleep(self.poll_interval)
                continue
            self._succeeded("listen_failed")
            if created:
                # the news was only these runs, created queued (PostgreSQL's NOTIFY carries
                # them): no cancel to look for; one alone is claimed riding on its first
                # write, as a start in this process hands it over (_hand_claims); a run of
                # a workflow this worker does not run is nothing to it
                for run in created:
                    if run.workflow in self.registry.workflows:
                        self.wake(run.id, run)
                continue
            if self.active:
                # a busy worker's own commits are changes too: one look per gap at most
                await anyio.sleep(max(0.0, looked + BUSY_LOOK_GAP - anyio.current_time()))
                looked = anyio.current_time()
                self._rouse()
                await self.check_cancels()
            else:
                self._rouse()

    async def check_cancels(self) -> None:
        """Stop the attempts whose run an operator cancelled (one read, no write: of the
        running runs with a cancel pending, whatever this worker holds; a busy worker looks
        after each of its own commits' change signals, BUSY_LOOK_GAP apart at most)."""
        if not self.active:
            return
        try:
            flagged = await self.store.cancels_requested(
                {a.run.id for a in self.active.values()})
        except StoreError as exc:
            self._failed("cancel_check_failed", exc)
            return
        self._succeeded("cancel_check_failed")
        if not flagged:
            return
        for attempt in list(self.active.values()):
            if (attempt.run.id in flagged and attempt.stopping is None and not attempt.lost
                    and not attempt.concluding):
                attempt.stop("cancelled")

    async def _sweep_loop(self) -> None:
        while True:
            try:
                recovered = await self.store.recover_stale()
                self._succeeded("sweep_failed")
            except StoreError as exc:
                self._failed("sweep_failed", exc)
                recovered = []
            for fence in recovered:
                self.log.warning("run_recovered", workflow_id=fence.run_id, epoch=fence.epoch,
                                 by="sweep")
            if recovered:
                if self._chain is not None:
                    tell(self._chain.recovered, recovered, "sweep")
                self._rouse()
            await anyio.sleep(self.sweep_interval)

    async def _schedule_loop(self) -> None:
        """Fire due schedules; sleep until the next fire time, at most ``schedule_interval``
        (times are the store's clock: an injected clock is read again at each look)."""
        scheduler = self.scheduler
        if scheduler is None:
            return
        declared = False
        while not self._stopping:
            upcoming: float | None = None
            try:
                if not declared:
                    await scheduler.declare(list(self.registry.schedules.values()))
                    declared = True
                upcoming = await scheduler.tick()
                wait = self.schedule_interval
                if upcoming is not None:
                    wait = min(wait, max(0.0, upcoming - await self.store.now()))
                self._succeeded("schedule_failed")
            except DurableError as exc:
                self._failed("schedule_failed", exc)
                wait = self.schedule_interval
            with anyio.move_on_after(wait):
                await self._schedule_wake.wait()
            self._schedule_wake = anyio.Event()

    async def _prune_loop(self) -> None:
        """Prune finished runs older than ``prune_older_than``, now and then every
        ``prune_interval`` (batches of a few milliseconds of write lock each)."""
        if self.prune_older_than is None:
            return
        while not self._stopping:
            try:
                count = await prune(self.store, self.prune_older_than)
                self._succeeded("prune_failed")
                self.pruned += count
                if count:
                    self.log.info("runs_pruned", runs=count, older_than=self.prune_older_than)
            except DurableError as exc:
                self._failed("prune_failed", exc)
            await anyio.sleep(self.prune_interval)

    # -- liveness (one machine) ------------------------------------------------------------------
    async def _hold_lock(self) -> None:
        folder = self.store.liveness_dir()
        if folder is None:
            return
        try:
            self._lock = await anyio.to_thread.run_sync(_liveness.hold, folder, self.worker_id)
        except _liveness.InUseError as exc:
            raise ConfigError(str(exc)) from None
        except OSError as exc:  # the runs of this worker will wait for their lease
            self.log.warning("liveness_lock_unavailable", folder=str(folder), error=str(exc))

    async def _liveness_loop(self) -> None:
        folder = self.store.liveness_dir()
        if folder is None:
            return
        mine = _liveness.lock_name(self.worker_id)
        while True:
            # listing and probing the lock files is no store access: a read of the store
            # only when a lock could be taken, a write only to recover a dead worker's run
            dead = _liveness.dead_lock_files(folder, skip=mine)
            if dead:
                try:
                    await self.take_over_dead(folder, set(dead))
                    self._succeeded("liveness_sweep_failed")
                except StoreError as exc:
                    self._failed("liveness_sweep_failed", exc)
            await anyio.sleep(self.liveness_interval)

    async def take_over_dead(self, folder: Path, dead: set[str]) -> list[Fence]:
        """Recover the runs of the workers whose lock files (``dead``) could be locked: each
        worker's lock is taken again and held while its runs (read before) are recovered by
        a compare-and-set on (id, epoch, running, same worker); its file is then removed."""
        by_worker: dict[str, list[Fence]] = {}
        for fence, worker in await self.store.running_workers():
            if worker != self.worker_id and _liveness.lock_name(worker) in dead:
                by_worker.setdefault(worker, []).append(fence)
        named = {_liveness.lock_name(w) for w in by_worker}
        for name in dead - named:  # dead, and nothing of theirs runs: clean up
            _liveness.remove_if_dead(folder, name)
        recovered: list[Fence] = []
        for worker, fences in by_worker.items():
            with _liveness.probe_dead(folder, worker) as is_dead:
                if not is_dead:
                    continue
                for fence in fences:
                    for done in await self.store.recover_dead(fence.run_id, fence.epoch,
                                                              worker):
                        recovered.append(done)
                        self.log.warning("run_recovered", workflow_id=done.run_id,
                                         epoch=done.epoch, by="liveness", dead_worker=worker)
        if recovered:
            if self._chain is not None:
                tell(self._chain.recovered, recovered, "liveness")
            self._rouse()
        return recovered
