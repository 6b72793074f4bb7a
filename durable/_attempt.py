"""One attempt at a run: the workflow function executed under a lease, to an outcome.

The attempt's cancel scope is the one place cancellation comes from: its deadline follows
the lease's local expiry (moved on by each renewal), and the worker cancels it for an
operator's cancel, a shutdown, or a lost lease. The three seams each have one home:

- the lease (held or lost, the local deadline, bounded shielded work): :mod:`._lease`;
- steps (identity, tries, results, doubt): :mod:`._steps`;
- the outcome (why the attempt ended, and what it journals): here.

A *stopping* attempt (cancel, shutdown) still holds its lease: its cleanup may send
requests, and it journals ``run_cancelled`` or ``run_interrupted`` and gives the run back.
A *lost* one writes and sends nothing more. Nothing the attempt writes takes effect unless
it still holds its epoch (the store checks).
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import anyio
import httpx

from ._context import (
    ActivityContext,
    HttpClient,
    WorkflowContext,
)
from ._errors import (
    ActivityError,
    AttemptCancelled,
    LeaseLostError,
    NonDeterminismError,
    NotSentError,
    StaleRecordError,
    StepInDoubtError,
    StoreError,
    StoreUnavailableError,
)
from ._history import History
from ._interceptors import (
    AttemptInfo,
    Chain,
    InterceptedTransport,
    RequestInfo,
    WriteInfo,
    around,
    tell,
)
from ._lease import LEASE_SAFETY as LEASE_SAFETY
from ._lease import Lease, is_lazily_bounded
from ._logging import Logger, get_logger, redact, storable
from ._pool import (
    FENCE_EXTENSION,
    LOG_EXTENSION,
    WAIT_EXTENSION,
    FencedTransport,
    WorkerTransport,
)
from ._steps import (
    DEFAULT_WAIT_THRESHOLD,
    Steps,
    Suspended,
    check_journalable,
    describe,
    refuse_unknown,
    unwrapped,
)
from ._types import (
    JSON,
    NEVER,
    EntryKind,
    Fence,
    Finish,
    JournalEntry,
    JournalWrite,
    Run,
    RunState,
    journaled_as,
)

if TYPE_CHECKING:
    from ._claims import PendingClaim
    from ._registry import Registry
    from .store import Store

CLEANUP_TIMEOUT = 10.0
"""Seconds a shielded cleanup write (final state, interruption) may take."""

WRITE_TIMEOUT = 10.0
"""Seconds a journal write may take; it is shielded, so a stop waits for its outcome."""

OWN_CONNECTIONS = 16
"""Requests in flight per host for an attempt that has no worker's transport."""

ACTIVITY_CLEANUP_TIMEOUT = 5.0
"""Default seconds of ``ctx.cleanup()`` in an activity (bounded by the lease too)."""

__all__ = ["Attempt", "describe"]


def _first(group: BaseExceptionGroup[AttemptCancelled]) -> AttemptCancelled:
    exc: BaseException = group
    while isinstance(exc, BaseExceptionGroup):
        exc = exc.exceptions[0]
    assert isinstance(exc, AttemptCancelled)
    return exc


def _passes_through(exc: BaseException) -> bool:
    """Whether a BaseException from the workflow's code is not the run's to fail with: a
    backend's cancellation (the worker's own scope, or the attempt's, caught by it), a
    Ctrl-C (trio raises it wherever the code is), the engine's own signals. Any other
    (``SystemExit`` from a library's ``sys.exit()``, an application's ``class
    Abort(BaseException)``) fails the run: raised on, it ended the worker and every run
    it held."""
    return isinstance(exc, anyio.get_cancelled_exc_class() | KeyboardInterrupt
                      | GeneratorExit | AttemptCancelled | Suspended)


def _has_cancellation(group: BaseExceptionGroup[BaseException]) -> bool:
    """Whether a group holds anything but the run's own failures (a backend's Cancelled)."""
    return group.subgroup(lambda e: not isinstance(e, Exception | BaseExceptionGroup)
                          and _passes_through(e)) is not None


class Attempt:
    """Executes one claimed run. Created and driven by the worker."""

    def __init__(
        self,
        store: Store,
        run: Run,
        registry: Registry,
        *,
        lease: float,
        lease_sent_at: float,
        lease_sent_boot: float | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        worker_id: str = "",
        console_url: str | None = None,
        chain: Chain | None = None,
        wait_threshold: float = DEFAULT_WAIT_THRESHOLD,
    ) -> None:
        self.store = store
        self.wait_threshold = wait_threshold
        """Waits of this many seconds or more release the run (durable waiting)."""
        self.run = run
        self.registry = registry
        self.fence = Fence(run.id, run.epoch)
        self.lease = Lease(lease, lease_sent_at, lease_sent_boot)
        self.scope = anyio.CancelScope(deadline=self.lease.deadline)
        self._claim_sent = lease_sent_at
        """When the claim was sent (anyio time): a first attempt's workflow ``timeout``
        counts from it, so the time between the claim and the body (an interceptor, a
        busy loop) is counted, as a later attempt counts from the claim's stamp."""
        self.stopping: str | None = None
        """Why the attempt was asked to stop (``cancelled``, ``shutdown``); it still holds
        its lease unless :attr:`lease` says it was lost."""
        self.concluding = False
        self.heartbeat_detail: JSON = None
        self.steps = Steps(self)
        self.console_url = console_url
        self._deferred: list[JournalWrite] = []
        self._lazy_append = is_lazily_bounded(store.append)
        """The store's append bounds its own waits: its shielded scope needs no timer
        unless it waits (a SQLite write committed in the event loop's thread)."""
        self._transport = transport
        self._own_transport: WorkerTransport | None = None
        self._worker_id = worker_id
        self.chain = chain
        """The worker's interceptors (None: none, and nothing is called)."""
        self._info: AttemptInfo | None = None
        self._told_lost = False
        self.deadline: float | None = None
        """When the workflow's ``timeout`` runs out, on the store's clock, once known: it
        counts from the first attempt's claim (:attr:`History.started_at`), so a later
        attempt (after a crash, a release, a durable wait) gets what is left of it."""
        self._deadline_at: float | None = None  # the same moment on anyio's clock
        self._doubt_earlier = False  # a failure journals earlier attempts' open steps in doubt
        self._overdue: dict[str, JSON] | None = None  # completed after its time ran out
        self.claim: PendingClaim | None = None
        """Set while the run is only read, not claimed yet (durable/_claims.py): the first
        journal write commits the claim with it."""
        self.unclaimed = False
        """Its claim did not hold: it never ran as far as anyone can tell, and ends
        without a word."""
        self.carry: Callable[[Finish], Awaitable[bool | None]] | None = None
        """The worker's offer to commit this attempt's finish with its next claim (None:
        it had nothing to ride on; the finish then commits on its own)."""
        self._log: Logger | None = None

    @property
    def log(self) -> Logger:
        """The attempt's logger, its run's fields bound: made on first use (a claimed
        attempt's first line comes after the claim, which changes them)."""
        log = self._log
        if log is None:
            run = self.run
            log = self._log = get_logger("durable.attempt", workflow_id=run.id,
                                         workflow=run.workflow, attempt=run.attempt,
                                         epoch=run.epoch)
        return log

    # -- lease and stop ------------------------------------------------------------------------
    @property
    def info(self) -> AttemptInfo:
        """What interceptors are told about this attempt."""
        if self._info is None:
            self._info = AttemptInfo(self.run, self._worker_id, read_headers=self._headers)
        return self._info

    async def _headers(self) -> Mapping[str, str]:
        """The headers the client kept with the run (its ``run_created`` entry)."""
        for entry in await self.store.journal(self.run.id):
            if entry.kind is EntryKind.RUN_CREATED:
                headers = entry.data.get("headers")
                if isinstance(headers, dict):
                    return {str(k): str(v) for k, v in headers.items()}
                break
        return {}

    @property
    def lost(self) -> bool:
        return self.lease.lost is not None

    def renewed(self, sent_at: float, sent_boot: float | None = None) -> None:
        """A renewal sent at ``sent_at`` (anyio time; ``sent_boot`` on
        :func:`durable._clock.boottime`) succeeded: move the deadline on."""
        self.lease.renewed(sent_at, sent_boot)
        self.scope.deadline = self.lease.deadline

    def holds_lease(self) -> bool:
        return self.lease.holds()

    def stop(self, reason: str) -> None:
        """Ask the attempt to stop (operator cancel, shutdown); idempotent. It keeps its
        lease: cleanup may still send, and the outcome is journaled."""
        if self.stopping is None and not self.lost:
            self.stopping = reason
            self.log.info("attempt_stopping", reason=reason)
        self.scope.cancel()

    def lose(self, reason: str = "lease lost", *, quiet: bool = False) -> None:
        """The lease is gone: refuse every request and write from now on, and stop.
        ``quiet``: not said at info level (an attempt that never held its run)."""
        if not self.lost and not quiet:
            self.log.info("attempt_stopping", reason=reason)
        self.lease.lose(reason)
        self._tell_lost()
        self.scope.cancel()

    def _tell_lost(self) -> None:
        """Tell the interceptors once that the lease is lost, however it was found."""
        if self.chain is not None and self.chain.lease_lost and not self._told_lost:
            self._told_lost = True
            tell(self.chain.lease_lost, self.info, self.lease.lost or "lease lost")

    def adopt(self, run: Run, sent_at: float, sent_boot: float | None) -> None:
        """The claim of this attempt committed: ``run`` as claimed, its lease from when
        the claim was sent."""
        self.claim = None
        self.run = run
        self.fence = Fence(run.id, run.epoch)
        self.renewed(sent_at, sent_boot)
        self._log = None  # bound again to the run as claimed, when it logs
        self.log.info("attempt_started", in_doubt=0)

    def drop(self, reason: str, *, quiet: bool = False) -> None:
        """The claim did not hold (or its attempt is replaced): stop, writing nothing.
        ``quiet``: the store refused the claim (the run was taken or cancelled), which
        is logged at debug level only (``attempt_dropped``): of a fleet that a start's
        NOTIFY woke, every worker but one drops its attempt of that run."""
        self.claim = None
        self.unclaimed = True
        self.lose(reason, quiet=quiet)

    async def _claimed(self, entries: Sequence[JournalWrite] = ()) -> bool:
        """Commit the pending claim (with ``entries``, its first journal write), or wait for
        the commit under way; whether the attempt now holds the run (and ``entries``)."""
        claim = self.claim
        if claim is None:
            return not self.unclaimed
        if claim.taken:
            await claim.done.wait()
            return False  # entries not written (the claim may hold, they go next)
        await claim.commit(entries)  # shielded and bounded itself (durable/_claims.py)
        if self.claim is not None or self.unclaimed:
            raise self.refusal()
        return True

    async def ensure_claimed(self) -> None:
        """Before anything but a journal write: the claim commits on its own first."""
        if self.claim is not None:
            await self._claimed()
        if self.unclaimed:
            raise self.refusal()

    def refusal(self) -> LeaseLostError:
        """What is raised at a write or request refused to this attempt: nothing more is
        written or sent (what the last write did, when its outcome is unknown, is for
        the journal to say: the reason names it)."""
        why = "" if self.lease.lost is None else f" ({self.lease.lost})"
        return LeaseLostError(
            f"attempt {self.run.attempt} of run {self.run.id} (epoch {self.run.epoch}) "
            f"no longer holds its lease{why}; nothing more is written or sent"
        )

    def cleanup_scope(self, timeout: float | None) -> Any:
        """``ctx.cleanup()``: shielded from a stop, bounded by ``timeout`` and the lease."""
        return self.lease.shielded(ACTIVITY_CLEANUP_TIMEOUT if timeout is None else timeout)

    # -- journal writes ------------------------------------------------------------------------
    def defer(self, entry: JournalWrite) -> None:
        """Commit ``entry`` with the next journal write (an idempotent step's completion)."""
        self._deferred.append(entry)

    def _take_deferred(self, entries: Sequence[JournalWrite]) -> list[JournalWrite]:
        pending, self._deferred = self._deferred, []
        return [*pending, *entries]

    async def write(self, entries: Sequence[JournalWrite]) -> None:
        """Append journal entries (after any deferred ones) under the fence, or stop.

        The append is shielded (bounded by :data:`WRITE_TIMEOUT` and the lease): a stop
        that arrives meanwhile waits for it, so the attempt always knows what it wrote and
        deferred entries are never dropped half-way.
        """
        if not self.lease.holds():
            self.lose(self.lease.expired())
            raise self.refusal()
        batch = self._take_deferred(entries)
        if self.claim is not None:  # the first write carries the claim
            if batch and await self._claimed(batch):
                return
            await self.ensure_claimed()
        if not batch:
            return
        written = False
        try:
            written = await self.fenced(lambda: self.store.append(self.fence, batch),
                                        "append", len(batch), lazy=self._lazy_append)
        except StoreError as exc:
            # no answer: it may have committed all the same, and the journal tells when it
            # did (only this attempt writes under its epoch); else stop here, and let
            # recovery resume the run (what the entries say may or may not have begun)
            if await self._wrote_last(batch):
                self.log.warning("journal_write_confirmed", error=str(exc),
                                 entries=len(batch))
                return
            self.log.error("journal_write_failed", error=str(exc))
        if not written:
            self.lose("a journal write was refused, or its outcome is unknown")
            raise self.refusal()

    async def fenced(self, write: Callable[[], Awaitable[bool]], kind: str = "append",
                     entries: int = 0, *, intercepted: bool = False,
                     lazy: bool = False) -> bool:
        """One fenced store write, shielded (bounded by :data:`WRITE_TIMEOUT` and the lease).

        A write the store says was never sent (:class:`NotSentError`: no connection could be
        had, the database stayed busy) changed nothing, so it is tried again, with backoff,
        while the lease holds; any other store error leaves its outcome unknown and is
        raised. False when the fence refused it, or when the time ran out before an answer.
        ``kind`` and ``entries`` say what it is, for interceptors (:class:`WriteInfo`).
        ``lazy``: ``write`` waits only after :func:`durable._lease.arm_bound` (a
        :func:`~durable._lease.lazily_bounded` store method), so the bound's timer is set
        only then (:meth:`Lease.shielded`).
        """
        if not intercepted and self.chain is not None and self.chain.write:
            return bool(await around(self.chain.write, WriteInfo(self.run, kind, entries),
                                     lambda: self.fenced(write, intercepted=True,
                                                         lazy=lazy)))
        if self.claim is not None:  # any write but the first journal write: claim first
            await self.ensure_claimed()
        delay = 0.05
        while True:
            try:
                with self.lease.shielded(WRITE_TIMEOUT, lazy=lazy):
                    return await write()
                return False  # the shielded scope ran out (or the lease was lost) first
            except NotSentError as exc:
                if not self.lease.holds():
                    raise
                self.log.warning("store_write_not_sent", error=str(exc), retry_in=delay)
                with self.lease.shielded(delay):
                    await anyio.sleep(delay)
                delay = min(delay * 2, 1.0)

    async def put_records(self, records: list[tuple[str, str, JSON]],
                          entry: JournalWrite,
                          expected: Mapping[tuple[str, str], int] | None = None) -> None:
        if not self.lease.holds():
            self.lose(self.lease.expired())
            raise self.refusal()
        await self.ensure_claimed()
        batch = self._take_deferred([entry])
        written = False
        try:
            written = await self.fenced(lambda: self.store.put_records(
                self.fence, records, batch, expected=expected), "records", len(batch))
        except StaleRecordError:  # nothing was written: the deferred entries go with the next
            self._deferred = [*batch[:-1], *self._deferred]
            raise
        if not written:
            self.lose("a record write was refused, or its outcome is unknown")
            raise self.refusal()

    async def assert_still_mine(self) -> None:
        if not self.holds_lease():
            raise self.refusal()
        await self.ensure_claimed()
        run = await self.store.get_run(self.run.id)
        now = await self.store.now()  # the store's time, never this host's wall clock
        if (
            run is None
            or run.epoch != self.run.epoch
            or run.state is not RunState.RUNNING
            or run.lease_expires_at is None
            or run.lease_expires_at <= now
        ):
            self.lose("superseded (checked in the database)")
            raise self.refusal()

    # -- HTTP ------------------------------------------------------------------------------------
    def http_client(self, ctx: ActivityContext) -> httpx.AsyncClient:
        attempt = self

        async def fence_request(request: httpx.Request) -> None:
            check_fence(request, "")
            # checked again right before the request is written: the pool, the connect and
            # the interceptors come between (FENCE_EXTENSION)
            request.extensions[FENCE_EXTENSION] = lambda: check_fence(
                request, "the lease ran out after the request was made, before it was "
                         "written; nothing was sent")
            request.extensions[LOG_EXTENSION] = log  # the pool's wait warning names the step
            request.extensions[WAIT_EXTENSION] = ctx._pool_wait  # and its timeout says so

        def check_fence(request: httpx.Request, note: str) -> None:
            if not attempt.holds_lease():  # lost: never sent. Stopping: still allowed
                attempt.log.warning("request_refused", method=request.method,
                                    url=redact(str(request.url)), step=ctx.step,
                                    **({"note": note} if note else {}))
                raise attempt.refusal()

        log = self.log.bind(step=ctx.step)
        transport: httpx.AsyncBaseTransport | None = self._transport
        if transport is None:  # an attempt run without a worker: a pool of its own
            if self._own_transport is None:
                self._own_transport = WorkerTransport(OWN_CONNECTIONS)
            transport = self._own_transport
        transport = FencedTransport(transport)  # innermost: the last check before the write
        if self.chain is not None and self.chain.request:
            transport = InterceptedTransport(
                transport, self.chain.request,
                RequestInfo(self.run, ctx.step, ctx.step_key, ctx.try_number))
        return HttpClient(
            transport=transport,
            headers=ctx.fencing_headers,
            event_hooks={"request": [fence_request]},
            timeout=httpx.Timeout(30.0),
        )

    # -- running ---------------------------------------------------------------------------------
    async def execute(self) -> str:
        """Run the workflow to an outcome and record it (unless the lease was lost); the
        outcome (:data:`durable._interceptors.ATTEMPT_OUTCOMES`) is returned."""
        outcome: tuple[str, Any] | None = None
        try:
            with self.scope:
                outcome = await self._body()
        except AttemptCancelled as exc:
            self._signalled(exc)
        except Suspended as exc:  # a long wait: the run is released until it is due
            outcome = ("suspended", exc)
        except StoreUnavailableError as exc:
            self._store_failed(exc)
        except Exception as exc:
            outcome = ("failed", unwrapped(exc))  # a task group's only error: that error
        except BaseExceptionGroup as group:  # from a task group in the workflow
            stops, others = group.split(AttemptCancelled)
            if others is not None:
                failed, others = others.split(StoreUnavailableError)
                if failed is not None:
                    first: BaseException = failed
                    while isinstance(first, BaseExceptionGroup):
                        first = first.exceptions[0]
                    self._store_failed(first)
            waits, rest = (None, others) if others is None else others.split(Suspended)
            if stops is not None:
                self._signalled(_first(stops))
            elif waits is not None and (rest is None or not rest.subgroup(
                    lambda e: isinstance(e, Exception))):
                exc0: BaseException = waits
                while isinstance(exc0, BaseExceptionGroup):
                    exc0 = exc0.exceptions[0]
                outcome = ("suspended", exc0)
            elif others is not None and not _has_cancellation(others):
                outcome = ("failed", unwrapped(others))
            elif self.stopping is None and not self.lost:
                raise  # a cancellation from outside the attempt (the worker's own scope)
        except BaseException as exc:
            if _passes_through(exc):
                raise
            outcome = ("failed", exc)  # SystemExit, an application's own: the run's end
        doom = self.steps.doom
        if not self.lost and not self.lease.holds():
            self.lease.lose(self.lease.expired())
        if self.lost:
            outcome = ("abandoned", self.lease.lost)
            self._tell_lost()  # a refusal, a service's "superseded", a local expiry
        elif outcome is not None and outcome[0] == "completed":
            pass  # it finished: a stop that came too late changes nothing
        elif doom is not None:
            outcome = ("failed", doom)
        elif self.stopping is not None:
            # asked to stop: whatever the workflow raised on its way out (backends differ
            # in how a task group wraps the cancellation), the stop is the outcome
            outcome = ("stopped", self.stopping)
        elif outcome is None:  # pragma: no cover - the lease check above catches it
            self.lease.lose(self.lease.expired())
            outcome = ("abandoned", self.lease.lost)
        ended = "superseded"
        with anyio.move_on_after(CLEANUP_TIMEOUT, shield=True) as cleanup:
            self.concluding = True
            if self.claim is not None:  # nothing was written yet
                if outcome[0] in ("stopped", "abandoned"):
                    await self.claim.drop()  # stopped before its claim: nothing to undo
                else:
                    with contextlib.suppress(LeaseLostError):
                        await self.ensure_claimed()  # then it ends as usual
            if self.unclaimed:
                self.log.debug("attempt_dropped", reason=self.lease.lost)
                return "superseded"
            ended = await self._conclude(*outcome)
            if self._own_transport is not None:
                await self._own_transport.aclose()
        if cleanup.cancelled_caught:
            self.log.error("conclude_timed_out", timeout=CLEANUP_TIMEOUT)
        return ended

    def _store_failed(self, exc: BaseException) -> None:
        """A store call the engine made for the workflow (a read of its records, of its
        journal, of the time; a record write whose outcome is unknown) could not reach
        the database: not the workflow's failure, and nothing to fail the run for. The
        attempt stops and gives the run back, to be resumed from its journal (a lost
        connection, a restart), or, if the store stays unreachable, leaves it to a
        recovery once its lease lapses. (Other store errors, a statement the database
        refused, would come back on every attempt: they fail the run.)"""
        self.log.error("store_failed", error=str(exc))
        if self.stopping is None:  # journaled (run_interrupted): never a credential
            self.stopping = f"the store failed: {redact(str(exc))}"

    def _signalled(self, exc: AttemptCancelled) -> None:
        if isinstance(exc, LeaseLostError):  # a refusal, or a service said "superseded"
            self.lease.lose(exc.reason)
        elif self.stopping is None:
            self.stopping = exc.reason

    async def _body(self) -> tuple[str, Any] | None:
        steps = self.steps
        if self.run.attempt > 1:  # a first attempt's journal holds no steps yet
            steps.history = History.fold(await self.store.journal(self.run.id))
        doubtful = steps.history.in_doubt(self.fence.epoch)
        if self.claim is None:  # else when the claim commits (adopt)
            self.log.info("attempt_started", in_doubt=len(doubtful))
        if self.run.cancel_requested:
            # cancelled before this claim (then recovered or released): no workflow code
            # runs again; the conclusion lists the steps left in doubt
            self.stop("cancelled")
            return None
        stale = await self._stale_read()
        if stale is not None:
            return ("failed", stale)
        wf = self.registry.workflow(self.run.workflow)
        late = await self._started_late(wf.start_within)
        if late is not None:
            return ("failed", late)
        timeout = wf.timeout if self.run.timeout is None else self.run.timeout
        if timeout is None:  # no scope of its own: the attempt's scope is enough
            result = await wf.fn(WorkflowContext(self), *self.run.args)
        else:
            left, since = timeout, ""
            started = steps.history.started_at  # None: the journal was not read (attempt 1)
            if self.run.attempt > 1 and started is not None:  # what earlier ones left
                from ._report import utc as _utc

                self.deadline = started + timeout
                left = self.deadline - await self.store.now()
                since = (f" (counted from its first attempt, claimed at "
                         f"{_utc(started)})")
                if left <= 0:  # its time ran out while it waited, or before this claim
                    return await self._replay_overdue(wf.fn, timeout, started, since)
            # a first attempt (or a replay's): from its claim's send, at or before its
            # stamp, so the time it took to begin is counted, never given twice
            self._deadline_at = (anyio.current_time() + left if since
                                 else self._claim_sent + timeout)
            with anyio.CancelScope(deadline=self._deadline_at) as wf_scope:
                result = await wf.fn(WorkflowContext(self), *self.run.args)
            if wf_scope.cancelled_caught:
                return ("failed", TimeoutError(f"workflow timed out after {timeout:g} s{since}"))
        if steps.doom is not None:
            return ("failed", steps.doom)
        if steps.suspended is not None:  # a wait the workflow swallowed: it waits all the same
            raise steps.suspended
        refuse_unknown(result)
        check_journalable(result, "the workflow's result")
        return ("completed", result)

    async def _replay_overdue(self, fn: Callable[..., Awaitable[Any]], timeout: float,
                              started: float, since: str) -> tuple[str, Any]:
        """A later attempt whose workflow's time ran out before it (while the run waited,
        or before this claim): its code replays what the journal holds and does nothing
        new. At the first step, wait or value the journal does not hold as done, it stops
        and the run fails as timed out (steps an earlier attempt left started are
        journaled in doubt); a run whose earlier attempts did all of its work (its end
        went unrecorded: a crash right after its last step) completes with its result,
        not failed for a time it did not need."""
        steps = self.steps
        attempt = self.run.attempt

        def overdue(where: str) -> TimeoutError:
            return TimeoutError(
                f"workflow timed out after {timeout:g} s{since}, before attempt {attempt} "
                f"began; it did nothing new: its replay of the journal stopped at {where}, "
                "which the journal does not hold as done")

        self._doubt_earlier = True
        steps.overdue = overdue
        self.log.info("attempt_overdue", timeout=timeout, started_at=started)
        try:
            with anyio.CancelScope() as steps.overdue_scope:  # cancelled where it stops
                result = await fn(WorkflowContext(self), *self.run.args)
        finally:
            steps.overdue = steps.overdue_scope = None  # the conclusion writes as usual
        if steps.doom is not None:  # it stopped (and its code may have caught the error)
            return ("failed", steps.doom)
        refuse_unknown(result)
        check_journalable(result, "the workflow's result")
        # said by its run_completed entry: why a run completed past its timeout
        self._overdue = {"overdue": True, "timeout": timeout, "ran_out_at": started + timeout}
        return ("completed", result)

    async def _started_late(self, default: float | None) -> TimeoutError | None:
        """A first attempt claimed more than ``start_within`` seconds (the run's, else the
        workflow's ``default``) after its run was due (as :attr:`Run.start_by` counts) runs
        none of its code: the error that fails the run, else None. The claim's time is the
        store's (its row's ``updated_at``), so a claim still pending (durable/_claims.py)
        commits first: a cost for such runs only. Later attempts (a recovery, a release, a
        replay) are not checked: their run began in time, or an operator asked for it
        again."""
        run = self.run
        within = default if run.start_within is None else run.start_within
        if within is None or run.attempt != 1:
            return None
        await self.ensure_claimed()
        run = self.run  # as claimed
        due = max(run.run_at, run.created_at)  # (Run.start_by) a run due before it existed
        late = run.updated_at - due
        if late <= within:
            return None
        from ._report import duration, utc

        return TimeoutError(
            f"the run did not start within {within:g} s of being due ({utc(due)}): "
            f"its first attempt was claimed {duration(late)} after, at "
            f"{utc(run.updated_at)}, and ran none of its code; replay it to run it now")

    async def _store_deadline(self) -> float | None:
        """:attr:`deadline` (None: the workflow has no timeout), read off the store's clock
        for a first attempt, whose deadline was set on anyio's without a read."""
        if self.deadline is None and self._deadline_at is not None:
            left = self._deadline_at - anyio.current_time()
            self.deadline = await self.store.now() + left
        return self.deadline

    async def _stale_read(self) -> StaleRecordError | None:
        """A resumed run replays the records it read from its journal; if one changed since
        (another run, after this one failed, was cancelled or died), its journaled steps
        would act on the old value: it runs nothing and fails, naming the record."""
        for (namespace, key), version in self.steps.history.record_versions.items():
            record = await self.store.get_record(namespace, key)
            current = 0 if record is None else record.version
            if current != version:
                return StaleRecordError(
                    namespace, key, version, current,
                    "this attempt ran nothing (its journal holds the old value); "
                    "start a new run")
        return None

    async def _conclude(self, kind: str, value: Any) -> str:
        """Journal the outcome; what happened: ``completed``, ``failed``, ``cancelled``,
        ``released``, ``abandoned``, ``superseded`` (the write was refused: the run is
        another attempt's now) or ``unknown`` (its outcome cannot be told)."""
        log = self.log
        ended = kind
        steps = self.steps
        ok = True
        final: EntryKind  # the entry the write journals, which tells whether it committed
        said: Callable[[], None]  # its log line, once it is known to have committed
        error: StoreError | None = None
        try:
            if kind == "completed":
                final = EntryKind.RUN_COMPLETED
                said = lambda: log.info("run_completed")  # noqa: E731
                entries = self._take_deferred([JournalWrite(final, data=self._overdue)])
                ok = await self._finish(Finish(self.fence, RunState.COMPLETED, result=value,
                                               entries=tuple(entries)))
            elif kind == "failed":
                exc: BaseException = value
                message = describe(exc) if not isinstance(
                    exc, ActivityError | StepInDoubtError | NonDeterminismError
                ) else storable(redact(str(exc)))
                data: dict[str, JSON] = {"error": message, "error_type": type(exc).__name__}
                if isinstance(exc, ActivityError | StepInDoubtError):
                    data["step"] = exc.step
                final = EntryKind.RUN_FAILED
                said = lambda: log.warning("run_failed", error=message)  # noqa: E731
                entries = self._take_deferred(
                    [*steps.doubt_entries("the run failed while it was in flight",
                                          earlier=self._doubt_earlier),
                     JournalWrite(final, data=data)])
                ok = await self._finish(Finish(self.fence, RunState.FAILED, error=message,
                                               entries=tuple(entries)))
            elif kind == "abandoned":
                log.warning("attempt_abandoned", reason=value,
                            in_flight=sorted(steps.in_flight))
                return "abandoned"
            elif value == "cancelled":
                ended = "cancelled"
                final = EntryKind.RUN_CANCELLED
                said = lambda: log.info("run_cancelled")  # noqa: E731
                entries = self._take_deferred(
                    [*steps.doubt_entries("cancelled while in flight", earlier=True),
                     JournalWrite(final, data={"by": "operator"})])
                ok = await self.fenced(lambda: self.store.finish(
                    self.fence, RunState.CANCELLED, error="cancelled by an operator",
                    entries=entries), "finish", len(entries))
            elif kind == "suspended":  # a long wait: released, due at its time (or signal)
                ended = "released"
                wait: Suspended = value
                final = EntryKind.RUN_WAITING
                until, short = wait.until, False
                try:
                    deadline = await self._store_deadline()
                except StoreError:  # released as the wait asks: the next attempt still
                    deadline = None  # fails on claim if its time has run out
                if deadline is not None and (until is None or deadline < until):
                    # due again when the workflow's time runs out, to fail then (not when
                    # a wait longer than its timeout would have ended)
                    until, short = deadline, True
                said = lambda: log.info(  # noqa: E731
                    "run_waiting", until=until, reason=wait.reason, signal=wait.signal,
                    cut_short=short)
                waited: dict[str, JSON] = {
                    "until": until, "reason": wait.reason, "signal": wait.signal}
                if short:  # the wait's own end came after the workflow's timeout
                    waited["cut_short"] = True
                entries = self._take_deferred([JournalWrite(final, data=waited)])
                ok = await self.fenced(lambda: self.store.release(
                    self.fence, entries, run_at=NEVER if until is None else until,
                    waiting_for=wait.signal, seen_signals=wait.seen), "release", len(entries))
            else:  # shutdown: give the run back at once
                ended = "released"
                final = EntryKind.RUN_INTERRUPTED
                said = lambda: log.info("run_released", reason=value)  # noqa: E731
                entries = self._take_deferred(
                    [*steps.doubt_entries(f"interrupted by {value}"),
                     JournalWrite(final, data={"reason": value})])
                ok = await self.fenced(lambda: self.store.release(self.fence, entries),
                                       "release", len(entries))
        except StoreError as exc:
            ok, error = False, exc
        if not ok:
            # Refused, or no answer: an earlier try of this write whose answer was lost
            # (a carried finish sent again on its own) may have committed all the same.
            # The journal tells: this epoch's final entry is there only if it did.
            journaled = await self._journaled(final)
            if journaled:
                log.info("conclude_confirmed", entry=final.value,
                         after="an unknown outcome" if error is not None else "a refusal")
            elif error is not None or journaled is None:
                # no answer and not (yet) in the journal: the write may still commit (a
                # statement the server runs on); the lease lapses or the journal says
                log.error("conclude_outcome_unknown", outcome=kind,
                          error=str(error) if error is not None else "refused",
                          journal="unread" if journaled is None else "not there yet")
                return "unknown"
            else:
                log.warning("attempt_superseded", outcome=kind)
                return "superseded"
        said()
        return ended

    async def _journaled(self, kind: EntryKind) -> bool | None:
        """Whether the run's journal holds ``kind`` under this attempt's epoch (only this
        attempt can have written it: the fence); None when the journal cannot be read."""
        mine = await self._own_entries()
        return None if mine is None else any(e.kind is kind for e in mine)

    async def _wrote_last(self, batch: Sequence[JournalWrite]) -> bool:
        """Whether ``batch`` is what this attempt journaled last (an append whose answer
        was lost committed all the same): the entries under its epoch end with them, in
        order (no two appends of an attempt journal the same entries: a step's try starts
        and ends once). False when not, or when the journal cannot be read."""
        assert batch  # (an empty append is never sent)
        mine = await self._own_entries()
        return mine is not None and journaled_as(mine[-len(batch):], batch)

    async def _own_entries(self) -> list[JournalEntry] | None:
        """The run's journal entries under this attempt's epoch; None when the journal
        cannot be read (within :data:`WRITE_TIMEOUT`)."""
        try:
            with anyio.fail_after(WRITE_TIMEOUT):
                entries = await self.store.journal(self.run.id)
        except (StoreError, TimeoutError):
            return None
        epoch = self.fence.epoch
        return [e for e in entries if e.epoch == epoch]

    async def _finish(self, finish: Finish) -> bool:
        """The run's final state: with the worker's next claim when it has one (one commit
        for both; the result waits at most durable._claims.RIDE_WAIT for it), else alone."""
        async def write() -> bool:
            if self.carry is not None and self.lease.holds():
                carried = await self.carry(finish)
                if carried is not None:
                    return carried
            return await self.store.finish(finish.fence, finish.state, result=finish.result,
                                           error=finish.error, entries=finish.entries)

        return await self.fenced(write, "finish", len(finish.entries))

    # -- what the contexts call ----------------------------------------------------------------
    async def run_step(self, act: Any, args: tuple[Any, ...], key: str | None) -> Any:
        return await self.steps.run_step(act, args, key)
