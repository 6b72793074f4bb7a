"""One attempt at a run: the workflow function executed under a lease, step by step.

The attempt's cancel scope is the one place cancellation comes from: its deadline follows
the lease's local expiry (moved on by each renewal), and the worker cancels it for an
operator's cancel, a shutdown, or a lost lease. Nothing the attempt writes takes effect
unless it still holds its epoch (the store checks), and its HTTP requests are refused once
it no longer holds the lease.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import anyio
import httpx

from ._context import (
    FENCING_HEADER,
    FENCING_SCOPE_HEADER,
    IDEMPOTENCY_HEADER,
    ActivityContext,
    HttpClient,
    WorkflowContext,
    fencing_scope,
)
from ._errors import (
    ActivityError,
    AttemptCancelled,
    ConfigError,
    LeaseLostError,
    NonDeterminismError,
    StepInDoubtError,
    StoreError,
)
from ._history import History, StepView, tries
from ._logging import get_logger, redact
from ._types import JSON, EntryKind, Fence, JournalWrite, Run, RunState, StepState, dumps

if TYPE_CHECKING:
    from ._registry import Activity, Registry
    from ._report import RecoveryReport
    from .store import Store

CLEANUP_TIMEOUT = 10.0
"""Seconds a shielded cleanup write (final state, interruption) may take."""

LEASE_SAFETY = 0.1
"""Fraction of the lease kept as margin: the local deadline falls this much before expiry."""


def describe(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    if isinstance(exc, TimeoutError) and not str(exc):
        text = "timed out"
    return redact(f"{type(exc).__name__}: {text}" if str(exc) else text)


def _first(group: BaseExceptionGroup[AttemptCancelled]) -> AttemptCancelled:
    exc: BaseException = group
    while isinstance(exc, BaseExceptionGroup):
        exc = exc.exceptions[0]
    assert isinstance(exc, AttemptCancelled)
    return exc


def _has_cancellation(group: BaseExceptionGroup[BaseException]) -> bool:
    """Whether a group holds anything but ordinary exceptions (a backend's Cancelled)."""
    return group.subgroup(lambda e: not isinstance(e, Exception | BaseExceptionGroup)) \
        is not None


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
        transport: httpx.AsyncBaseTransport | None = None,
        worker_id: str = "",
        console_url: str | None = None,
    ) -> None:
        self.store = store
        self.run = run
        self.registry = registry
        self.fence = Fence(run.id, run.epoch)
        self.lease = lease
        self.lease_deadline = lease_sent_at + lease * (1 - LEASE_SAFETY)
        self.scope = anyio.CancelScope(deadline=self.lease_deadline)
        self.stop_reason: str | None = None
        self.lost = False
        self.concluding = False
        self.heartbeat_detail: JSON = None
        self.history = History()
        self.doom: BaseException | None = None
        self.in_flight: dict[str, StepView] = {}
        self._deferred: list[JournalWrite] = []
        self._seq = 0
        self._used_keys: set[str] = set()
        self._transport = transport
        self._own_transport: httpx.AsyncHTTPTransport | None = None
        self._worker_id = worker_id
        self._console_url = console_url
        self._rng = random.Random()
        self.log = get_logger("durable.attempt", workflow_id=run.id, workflow=run.workflow,
                              attempt=run.attempt, epoch=run.epoch)

    # -- lease -----------------------------------------------------------------------------------
    def renewed(self, sent_at: float) -> None:
        """A renewal sent at ``sent_at`` (anyio time) succeeded: move the deadline on."""
        self.lease_deadline = max(self.lease_deadline, sent_at + self.lease * (1 - LEASE_SAFETY))
        if self.stop_reason is None:
            self.scope.deadline = self.lease_deadline

    def holds_lease(self) -> bool:
        return (
            not self.lost
            and self.stop_reason is None
            and anyio.current_time() < self.lease_deadline
        )

    def stop(self, reason: str) -> None:
        """Cancel the attempt (operator cancel, shutdown, lease lost); idempotent."""
        if self.stop_reason is None:
            self.stop_reason = reason
            self.log.info("attempt_stopping", reason=reason)
        self.scope.cancel()

    def lose(self) -> None:
        self.lost = True
        self.stop("lease lost")

    def _refuse(self) -> LeaseLostError:
        return LeaseLostError(
            f"attempt {self.run.attempt} of run {self.run.id} (epoch {self.run.epoch}) "
            "no longer holds its lease; nothing was written or sent"
        )

    def _take_deferred(self, entries: Sequence[JournalWrite]) -> list[JournalWrite]:
        pending, self._deferred = self._deferred, []
        return [*pending, *entries]

    async def write(self, entries: Sequence[JournalWrite]) -> None:
        """Append journal entries (after any deferred ones) under the fence, or stop."""
        if self.lost or anyio.current_time() >= self.lease_deadline:
            self.lose()
            raise self._refuse()
        entries = self._take_deferred(entries)
        if not entries:
            return
        try:
            written = await self.store.append(self.fence, entries)
        except StoreError as exc:
            # cannot tell whether it committed: stop here and let recovery resume the run
            self.log.error("journal_write_failed", error=str(exc))
            written = False
        if not written:
            self.lose()
            raise self._refuse()

    async def assert_still_mine(self) -> None:
        if not self.holds_lease():
            raise self._refuse()
        run = await self.store.get_run(self.run.id)
        now = await self.store.now()  # the store's time, never this host's wall clock
        if (
            run is None
            or run.epoch != self.run.epoch
            or run.state is not RunState.RUNNING
            or run.lease_expires_at is None
            or run.lease_expires_at <= now
        ):
            self.lose()
            raise self._refuse()

    # -- HTTP ------------------------------------------------------------------------------------
    def http_client(self, ctx: ActivityContext) -> httpx.AsyncClient:
        attempt = self

        async def fence_request(request: httpx.Request) -> None:
            if not attempt.holds_lease():
                attempt.log.warning("request_refused", method=request.method,
                                    url=redact(str(request.url)), step=ctx.step)
                raise attempt._refuse()

        transport = self._transport
        if transport is None:
            if self._own_transport is None:
                self._own_transport = httpx.AsyncHTTPTransport()
            transport = self._own_transport
        return HttpClient(
            transport=transport,
            headers={IDEMPOTENCY_HEADER: ctx.idempotency_key,
                     FENCING_HEADER: str(self.run.epoch),
                     FENCING_SCOPE_HEADER: fencing_scope(self.run.id, self.run.key)},
            event_hooks={"request": [fence_request]},
            timeout=httpx.Timeout(30.0),
        )

    # -- running ---------------------------------------------------------------------------------
    async def execute(self) -> None:
        """Run the workflow to an outcome and record it (unless the lease was lost)."""
        outcome: tuple[str, Any] | None = None
        with self.scope:
            try:
                if self.run.attempt > 1:  # a first attempt's journal holds no steps yet
                    self.history = History.fold(await self.store.journal(self.run.id))
                wf = self.registry.workflow(self.run.workflow)
                doubtful = self.history.in_doubt(self.fence.epoch)
                self.log.info("attempt_started", in_doubt=len(doubtful))
                timeout = wf.timeout if self.run.timeout is None else self.run.timeout
                deadline = math.inf if timeout is None else anyio.current_time() + timeout
                with anyio.CancelScope(deadline=deadline) as wf_scope:
                    result = await wf.fn(WorkflowContext(self), *self.run.args)
                if wf_scope.cancelled_caught:
                    outcome = ("failed", TimeoutError(f"workflow timed out after {timeout:g} s"))
                elif self.doom is not None:
                    outcome = ("failed", self.doom)
                else:
                    dumps(result, "the workflow's result")
                    outcome = ("completed", result)
            except AttemptCancelled as exc:
                outcome = self._stopped(exc)
            except Exception as exc:
                outcome = ("failed", self.doom or exc)
            except BaseExceptionGroup as group:  # from a task group in the workflow
                stops, others = group.split(AttemptCancelled)
                if stops is not None:
                    outcome = self._stopped(_first(stops))
                elif others is not None and not _has_cancellation(others):
                    errors = others.exceptions
                    outcome = ("failed", self.doom or (errors[0] if len(errors) == 1
                                                       else others))
                else:
                    raise
        if outcome is None or self.scope.cancelled_caught:
            if self.stop_reason is None:
                self.lost = True
                self.stop_reason = "lease expired locally (renewals failed)"
            outcome = ("stopped", self.stop_reason)
        with anyio.move_on_after(CLEANUP_TIMEOUT, shield=True) as cleanup:
            self.concluding = True
            await self._conclude(*outcome)
            if self._own_transport is not None:
                await self._own_transport.aclose()
        if cleanup.cancelled_caught:
            self.log.error("conclude_timed_out", timeout=CLEANUP_TIMEOUT)

    def _stopped(self, exc: AttemptCancelled) -> tuple[str, Any]:
        if isinstance(exc, LeaseLostError):
            self.lost = True
        return ("stopped", self.stop_reason or exc.reason)

    def _doubt_entries(self, reason: str) -> list[JournalWrite]:
        return [
            JournalWrite(EntryKind.STEP_IN_DOUBT, step.number, step.key, step.name,
                         step.tries, {"reason": reason})
            for step in self.in_flight.values()
        ]

    async def _conclude(self, kind: str, value: Any) -> None:
        log = self.log
        ok = True
        try:
            if kind == "completed":
                ok = await self.store.finish(
                    self.fence, RunState.COMPLETED, result=value,
                    entries=self._take_deferred([JournalWrite(EntryKind.RUN_COMPLETED)]))
                log.info("run_completed") if ok else None
            elif kind == "failed":
                exc: BaseException = value
                message = describe(exc) if not isinstance(
                    exc, ActivityError | StepInDoubtError | NonDeterminismError
                ) else redact(str(exc))
                data: dict[str, JSON] = {"error": message, "error_type": type(exc).__name__}
                if isinstance(exc, ActivityError | StepInDoubtError):
                    data["step"] = exc.step
                ok = await self.store.finish(
                    self.fence, RunState.FAILED, error=message,
                    entries=self._take_deferred(
                        [*self._doubt_entries("the run failed while it was in flight"),
                         JournalWrite(EntryKind.RUN_FAILED, data=data)]))
                log.warning("run_failed", error=message) if ok else None
            elif self.lost:
                log.warning("attempt_abandoned", reason=value,
                            in_flight=sorted(self.in_flight))
                return
            elif value == "cancelled":
                ok = await self.store.finish(
                    self.fence, RunState.CANCELLED, error="cancelled by an operator",
                    entries=self._take_deferred(
                        [*self._doubt_entries("cancelled while in flight"),
                         JournalWrite(EntryKind.RUN_CANCELLED, data={"by": "operator"})]))
                log.info("run_cancelled") if ok else None
            else:  # shutdown: give the run back at once
                ok = await self.store.release(
                    self.fence,
                    self._take_deferred(
                        [*self._doubt_entries(f"interrupted by {value}"),
                         JournalWrite(EntryKind.RUN_INTERRUPTED, data={"reason": value})]))
                log.info("run_released", reason=value) if ok else None
        except StoreError as exc:
            log.error("conclude_failed", error=str(exc))
            return
        if not ok:
            log.warning("attempt_superseded", outcome=kind)

    # -- steps -----------------------------------------------------------------------------------
    def _identify(self, name: str, key: str | None) -> StepView:
        if key is None:
            self._seq += 1
            skey = str(self._seq)
        else:
            skey = str(key)
            if not skey or skey.isdigit():
                raise ConfigError(f"a step key must be a non-numeric string, not {key!r}")
        if skey in self._used_keys:
            raise ConfigError(f"step key {skey!r} is used twice in run {self.run.id}")
        self._used_keys.add(skey)
        view = self.history.steps.get(skey)
        if view is None:
            view = self.history.add(skey, name)
        elif view.name != name:
            err = NonDeterminismError(
                f"run {self.run.id}: step {view.number} (key {skey!r}) was journaled as "
                f"{view.name!r} but the workflow now calls {name!r}; the workflow code changed "
                "since the run started. Deploy the old code to finish it, or start a new run"
            )
            self.doom = err
            raise err
        return view

    async def value(self, name: str, produce: Callable[[], JSON]) -> JSON:
        view = self._identify(name, None)
        if view.state is StepState.COMPLETED:
            return view.result
        result = produce()
        await self.write([JournalWrite(EntryKind.VALUE, view.number, view.key, name, 1,
                                       {"result": result})])
        view.state, view.result = StepState.COMPLETED, result
        return result

    async def set_records(self, records: Mapping[tuple[str, str], JSON], summary: JSON,
                          key: str | None) -> None:
        view = self._identify("durable.set_records", key)
        if view.state is StepState.COMPLETED:
            return
        if not self.holds_lease():
            self.lose()
            raise self._refuse()
        entry = JournalWrite(EntryKind.STEP_COMPLETED, view.number, view.key,
                             "durable.set_records", 1,
                             {"result": None, "summary": summary,
                              "records": [[ns, k] for ns, k in records]})
        writes = [(ns, k, v) for (ns, k), v in records.items()]
        if not await self.store.put_records(self.fence, writes, self._take_deferred([entry])):
            self.lose()
            raise self._refuse()
        view.state = StepState.COMPLETED

    async def get_record(self, namespace: str, key: str) -> JSON:
        view = self._identify("durable.get_record", None)
        if view.state is StepState.COMPLETED:
            return view.result
        record = await self.store.get_record(namespace, key)
        result = None if record is None else record.value
        await self.write([JournalWrite(EntryKind.VALUE, view.number, view.key,
                                       "durable.get_record", 1,
                                       {"result": result, "summary": f"{namespace}/{key}"})])
        view.state, view.result = StepState.COMPLETED, result
        return result

    async def recovery_report(self) -> RecoveryReport:
        from ._report import RecoveryReport

        await self.write([])  # the report reads the journal: commit deferred entries first
        run = await self.store.get_run(self.run.id) or self.run
        return RecoveryReport.build(run, await self.store.journal(self.run.id),
                                    console_url=self._console_url)

    async def run_step(self, act: Activity, args: tuple[Any, ...], key: str | None) -> Any:
        view = self._identify(act.name, key)
        if view.state is StepState.COMPLETED:
            return view.result
        if view.state is StepState.FAILED:
            # an earlier attempt journaled this step's failure: the workflow sees the same
            # failure again (only a replay runs a failed step again)
            raise ActivityError(
                f"step {view.number} ({act.name}) failed after {tries(view.tries)}: "
                f"{view.error}",
                step=view.number, activity=act.name, error_type=view.error_type or "Exception")
        log = self.log.bind(step=view.number, step_key=view.key, activity=act.name)
        in_doubt = view.state is StepState.IN_DOUBT or (
            view.state is StepState.STARTED and view.epoch < self.fence.epoch)
        if in_doubt:
            if view.state is StepState.STARTED:
                await self.write([JournalWrite(
                    EntryKind.STEP_IN_DOUBT, view.number, view.key, act.name, view.tries,
                    {"reason": f"started by an earlier attempt (epoch {view.epoch}) with no "
                               "recorded outcome"})])
                view.state = StepState.IN_DOUBT
            log.warning("step_in_doubt", on_doubt=act.on_doubt)
            if act.on_doubt == "fail":
                err = StepInDoubtError(
                    f"step {view.number} ({act.name}) was started by an earlier attempt and "
                    "its outcome is unknown; check whether it took effect, then replay with "
                    "--rerun-in-doubt (run it again) or --accept-in-doubt (count it as done)",
                    step=view.number, step_key=view.key, activity=act.name)
                self.doom = err
                raise err
        idem = f"{self.run.id}/{view.key}" + (f"~{view.reruns}" if view.reruns else "")
        first = view.tries + 1
        for i in range(act.retry.max_tries):
            number = first + i
            ctx = ActivityContext(self, step=view.number, step_key=view.key,
                                  try_number=number, idempotency_key=idem)
            await self.write([JournalWrite(EntryKind.STEP_STARTED, view.number, view.key,
                                           act.name, number, {"args": list(args)})])
            view.state, view.epoch, view.tries = StepState.STARTED, self.fence.epoch, number
            self.in_flight[view.key] = view
            log.debug("step_started", **{"try": number})
            try:
                if act.timeout is None:
                    result = await act.fn(ctx, *args)
                else:
                    with anyio.fail_after(act.timeout):
                        result = await act.fn(ctx, *args)
                dumps(result, f"the result of activity {act.name}")
            except AttemptCancelled:
                raise
            except Exception as exc:
                message = describe(exc)
                if isinstance(exc, TimeoutError) and act.timeout is not None:
                    message = f"timed out after {act.timeout:g} s (the call in flight was aborted)"
                retry = act.retry.retryable(exc) and i + 1 < act.retry.max_tries
                data: dict[str, JSON] = {"error": message, "error_type": type(exc).__name__,
                                         "summary": ctx.summary}
                if retry:
                    delay = act.retry.delay(number, exc, self._rng)
                    data["retry_in"] = round(delay, 3)
                    await self.write([JournalWrite(EntryKind.STEP_RETRYING, view.number,
                                                   view.key, act.name, number, data)])
                    del self.in_flight[view.key]
                    log.info("step_retrying", **{"try": number}, error=message, delay=delay)
                    await anyio.sleep(delay)
                    continue
                await self.write([JournalWrite(EntryKind.STEP_FAILED, view.number, view.key,
                                               act.name, number, data)])
                del self.in_flight[view.key]
                view.state, view.error = StepState.FAILED, message
                log.warning("step_failed", **{"try": number}, error=message)
                raise ActivityError(
                    f"step {view.number} ({act.name}) failed after "
                    f"{tries(number - first + 1)}: {message}",
                    step=view.number, activity=act.name, error_type=type(exc).__name__,
                ) from exc
            done = JournalWrite(EntryKind.STEP_COMPLETED, view.number, view.key, act.name,
                                number, {"result": result, "summary": ctx.summary,
                                         "ended_at": self.store.clock.now()})
            if act.on_doubt == "retry":
                # idempotent: its completion commits with the next journal write (one commit
                # instead of two); a crash in between only makes the step run again
                self._deferred.append(done)
            else:
                await self.write([done])
            del self.in_flight[view.key]
            view.state, view.result = StepState.COMPLETED, result
            log.debug("step_completed", **{"try": number})
            return result
        raise AssertionError("unreachable")  # pragma: no cover
