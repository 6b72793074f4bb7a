"""The client: start runs, look them up, cancel and replay them."""

from __future__ import annotations

import builtins
import datetime as dt
import json
import logging
import math
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any, Literal, ParamSpec, TypeVar, overload

import anyio
import attrs

from . import _liveness, _wake
from ._approval import PlanClosedError, closed_plan
from ._clock import Clock
from ._commands import command
from ._errors import (
    ConfigError,
    InvalidStateError,
    RunConflictError,
    RunNotFoundError,
    RunPrunedError,
    StoreError,
    StoreUnavailableError,
)
from ._history import History
from ._interceptors import Chain, Interceptor, StartInfo, tell
from ._logging import Repeats, get_logger
from ._registry import BoundWorkflow, Registry, Workflow, default_registry
from ._report import GoneHolder, RecoveryReport
from ._resend import answered
from ._retention import PrunedRun
from ._schedules import Schedule, ScheduleSpec
from ._steps import shown
from ._types import (
    JSON,
    NEVER,
    JournalEntry,
    NewRun,
    PausedWorkflow,
    Run,
    RunState,
    Signal,
    SignalSent,
    StartedRun,
    StepState,
    check_key,
    check_printable,
    check_seconds,
    dumps,
)
from .store import Store, store_from_url
from .store._base import Cursor

InDoubt = Literal["rerun", "accept"]
P = ParamSpec("P")
T = TypeVar("T")
When = dt.datetime | float | None


MAX_LIMIT = 2**62
"""A list's limit beyond any count of runs: a larger one is taken as this (a database's
integers are 64 bits; the stores read one row past a page)."""


class Client:
    """Starts and inspects runs. Every read recovers runs whose lease expired (read path)."""

    def __init__(self, store: Store, *, registry: Registry | None = None,
                 console_url: str | None = None,
                 interceptors: Sequence[Interceptor] = ()) -> None:
        self.store = store
        self.registry = registry or default_registry
        self.console_url = console_url
        self.interceptors = tuple(interceptors)
        """Told of each run :meth:`start` creates (``on_start``: they may add headers, kept
        with the run for the worker's interceptors, e.g. a trace context)."""
        self._chain = Chain.of(self.interceptors)
        self.log = get_logger("durable.client")
        self._wait_reads = Repeats(self.log, "wait_read_failed", level=logging.WARNING,
                                   clock=anyio.current_time)
        """The reads of :meth:`wait` that found the store unreachable (every wait of this
        client): logged as they begin, once a minute while they last, and as they end."""

    @classmethod
    @asynccontextmanager
    async def connect(cls, url: str, *, clock: Clock | None = None,
                      registry: Registry | None = None, console_url: str | None = None,
                      create: bool = True, upgrade: bool = True,
                      interceptors: Sequence[Interceptor] = ()) -> AsyncIterator[Client]:
        """Open the store at ``url`` for the duration of the block. It creates the database
        if there is none and upgrades an older schema, unless ``create=False`` /
        ``upgrade=False`` (then either is an error: :func:`~durable.store_from_url`)."""
        store = store_from_url(url, clock=clock, create=create, upgrade=upgrade)
        await store.open()
        try:
            yield cls(store, registry=registry, console_url=console_url,
                      interceptors=interceptors)
        finally:
            await store.aclose()

    # -- starting ----------------------------------------------------------------------------
    @overload  # a bound workflow: its arguments checked, with any option
    async def start(self, workflow: BoundWorkflow[Any], *, id: str | None = ...,
                    key: str | None = ..., run_at: When = ..., delay: float | None = ...,
                    timeout: float | None = ...,
                    start_within: float | None = ...) -> StartedRun: ...

    @overload
    async def start(self, workflow: Workflow[P, Any], *args: P.args,
                    **kwargs: P.kwargs) -> StartedRun: ...

    @overload  # with at least one option: the arguments unchecked
    async def start(self, workflow: Workflow[..., Any] | str, *args: JSON,
                    id: str | None, key: str | None = ...,
                    run_at: When = ..., delay: float | None = ...,
                    timeout: float | None = ...,
                    start_within: float | None = ...) -> StartedRun: ...

    @overload
    async def start(self, workflow: Workflow[..., Any] | str, *args: JSON,
                    id: str | None = ..., key: str | None,
                    run_at: When = ..., delay: float | None = ...,
                    timeout: float | None = ...,
                    start_within: float | None = ...) -> StartedRun: ...

    @overload
    async def start(self, workflow: Workflow[..., Any] | str, *args: JSON,
                    id: str | None = ..., key: str | None = ...,
                    run_at: When, delay: float | None = ...,
                    timeout: float | None = ...,
                    start_within: float | None = ...) -> StartedRun: ...

    @overload
    async def start(self, workflow: Workflow[..., Any] | str, *args: JSON,
                    id: str | None = ..., key: str | None = ...,
                    run_at: When = ..., delay: float | None,
                    timeout: float | None = ...,
                    start_within: float | None = ...) -> StartedRun: ...

    @overload
    async def start(self, workflow: Workflow[..., Any] | str, *args: JSON,
                    id: str | None = ..., key: str | None = ...,
                    run_at: When = ..., delay: float | None = ...,
                    timeout: float | None,
                    start_within: float | None = ...) -> StartedRun: ...

    @overload
    async def start(self, workflow: Workflow[..., Any] | str, *args: JSON,
                    id: str | None = ..., key: str | None = ...,
                    run_at: When = ..., delay: float | None = ...,
                    timeout: float | None = ..., start_within: float | None) -> StartedRun: ...

    @overload  # by name, no option
    async def start(self, workflow: str, *args: JSON,
                    id: str | None = ..., key: str | None = ...,
                    run_at: When = ..., delay: float | None = ...,
                    timeout: float | None = ...,
                    start_within: float | None = ...) -> StartedRun: ...

    async def start(
        self,
        workflow: Workflow[..., Any] | BoundWorkflow[Any] | str,
        *args: Any,
        id: Any = None,
        key: Any = None,
        run_at: Any = None,
        delay: Any = None,
        timeout: Any = None,
        start_within: Any = None,
        **kwargs: Any,
    ) -> StartedRun:
        """Queue a run. Idempotent by ``id``: an existing run with that id is returned
        (:attr:`StartedRun.created` says which: True when this start queued it).

        ``workflow`` is the :class:`Workflow` (a type checker then checks the arguments
        against its parameters, when no option is given: Python's typing cannot check them
        next to the options; ``start(wf.bind(*args), id=..., ...)`` checks them with any
        option) or its name: by name nothing of the workflow's code is needed,
        so a process that only enqueues need not import it (a worker that knows the name
        runs it; a run of a name no worker knows stays queued). ``key`` is the concurrency
        key: at most one run per key runs at a time. ``run_at`` (a datetime or epoch seconds)
        or ``delay`` (seconds) delays the start; a delayed run can be cancelled until it
        starts. ``timeout`` (seconds) bounds the run, counted from its first attempt's
        claim; ``start_within`` (seconds) is how long after it is due its first attempt may
        still be claimed: later, that attempt fails the run without running any of its code
        (both in place of the workflow's own). Reusing an id for another workflow, other
        arguments or another key raises :class:`RunConflictError` and writes nothing.
        Arguments given by keyword (with the Workflow object only) are journaled by
        position.
        """
        if isinstance(workflow, BoundWorkflow):
            if args or kwargs:
                raise ConfigError(f"{workflow.workflow.name} has its arguments bound already; "
                                  "pass only the options")
            name, args = workflow.workflow.name, workflow.args
        elif isinstance(workflow, Workflow):
            name = workflow.name
            args = workflow.arguments(args, kwargs)
        else:
            name = workflow
            if not isinstance(name, str) or not name.strip():
                raise ConfigError(f"a workflow is a Workflow or its name, not {name!r}")
            if kwargs:
                raise ConfigError(
                    f"unexpected keyword arguments {', '.join(sorted(kwargs))}: a workflow "
                    "started by name takes its arguments by position")
        arg_list = list(args)
        dumps(arg_list, "workflow arguments", around=1)
        if id is not None and (not isinstance(id, str) or not id.strip()):
            raise ConfigError("a run id must be a non-empty string")
        if id is not None:
            check_printable(id, "a run id")
        check_key(key)
        timeout, delay, when = check_times(timeout=timeout, delay=delay, run_at=run_at)
        if start_within is not None:
            start_within = check_seconds(start_within, "start_within")
        if when is None and delay:  # the store's time (PostgreSQL: the server's), which
            when = await self.store.now() + delay  # claims compare with
        # (no run_at and no delay: due at once, the store's time of the insert, taken by
        # the insert itself)
        run_id = id or f"{name}-{uuid.uuid4().hex[:12]}"
        headers: dict[str, str] | None = None
        if self._chain is not None and self._chain.start:
            info = StartInfo(run_id, name, key)
            tell(self._chain.start, info)
            headers = {str(k): str(v) for k, v in info.headers.items()} or None
        new = NewRun(run_id, name, arg_list, key, when, timeout, headers=headers,
                     start_within=start_within)
        run, created = await self._answered(
            lambda: self.store.create_run(new), lambda: self._start_again(new),
            "start_outcome_unknown", f"the start of run {run_id!r}",
            f"it may have been queued; look it up ({command('show', run_id)}), or start it "
            f"again with id {run_id!r}, which does nothing if it was", workflow_id=run_id)
        if not created and (run.workflow != name or not same_json(run.args, arg_list)
                            or run.key != key):
            raise RunConflictError(
                f"run id {run_id!r} already belongs to a {run.workflow} run with arguments "
                f"{dumps(run.args)} and {_key_text(run.key)} (asked for: {name} with "
                f"{dumps(arg_list)} and {_key_text(key)}); choose another id"
            )
        if created:
            hub = _wake.hub(self.store)
            hub.work(run.id, run)  # this process's workers claim it now
            if hub.workers:  # (no await since the insert returned: see told_here)
                self.store.told_here(run.id)  # its change signal is no news to them
            self.log.info("run_started", workflow_id=run.id, workflow=name, key=key)
        return StartedRun.of(run, created)

    async def _answered(self, send: Callable[[], Awaitable[T]],
                        again: Callable[[], Awaitable[T]], event: str, what: str,
                        doubt: str, **fields: Any) -> T:
        """``send()``, a write; if it gets no answer, ``again()`` (:func:`answered`)."""
        return await answered(send, again, self.log, event, what, doubt, **fields)

    async def _start_again(self, new: NewRun) -> tuple[Run, bool]:
        """A start is idempotent by id (the client chose one if the caller did not): it
        is sent once more. ``created`` is True when either send did (the run is as asked,
        with no attempt yet: a run of that id from before is taken as this one, as
        idempotence means)."""
        run, created = await self.store.create_run(new)
        return run, created or (run.workflow == new.workflow
                                and same_json(run.args, new.args)
                                and run.key == new.key and run.attempt == 0)

    # -- reading (with stale recovery on the read path) ----------------------------------------
    async def _recover(self, run: Run) -> Run:
        if (
            run.state is RunState.RUNNING
            and run.lease_expires_at is not None
            and run.lease_expires_at <= await self.store.now()
        ):
            recovered = await self.store.recover_stale(run.id, run.epoch)
            if recovered:
                self.log.warning("run_recovered", workflow_id=run.id, epoch=run.epoch,
                                 by="read")
            fresh = await self.store.get_run(run.id)
            return fresh or run
        return run

    async def get(self, run_id: str) -> Run:
        """The run; :class:`RunNotFoundError` if there is none, :class:`RunPrunedError` (a
        subclass) if it finished and was pruned (``durable prune``)."""
        run = await self.store.get_run(run_id)
        if run is None:
            pruned = await self.store.get_pruned(run_id)
            if pruned is not None:
                raise RunPrunedError(pruned.describe(), pruned)
            raise RunNotFoundError(f"no run with id {run_id!r}")
        return await self._recover(run)

    async def pruned(self, run_id: str) -> PrunedRun | None:
        """The tombstone of a run that was pruned: how it ended, and when it was pruned."""
        return await self.store.get_pruned(run_id)

    async def find(self, run_id: str) -> Run | None:
        """Like :meth:`get`, but None when there is no such run."""
        try:
            return await self.get(run_id)
        except RunNotFoundError:
            return None

    async def latest(self, workflow: Workflow[..., Any] | str, key: str) -> Run | None:
        """The newest run of ``workflow`` for ``key``, by a direct query (no scan)."""
        name = workflow.name if isinstance(workflow, Workflow) else workflow
        run = await self.store.latest_run(name, key)
        return None if run is None else await self._recover(run)

    async def list(self, *, state: RunState | str | None = None,
                   workflow: Workflow[..., Any] | str | None = None, key: str | None = None,
                   limit: int = 100, before: Cursor | None = None,
                   created_from: dt.datetime | float | None = None,
                   created_to: dt.datetime | float | None = None,
                   id_prefix: str | None = None) -> builtins.list[Run]:
        """Up to ``limit`` runs, newest first (by ``created_at``, then ``id``, descending).

        ``before`` is the cursor of the next page: ``(run.created_at, run.id)`` of the last
        run of this one. ``created_from`` (inclusive) and ``created_to`` (exclusive) bound
        the creation time (datetimes, or store seconds); ``id_prefix`` matches ids that start
        with it, literally. Every filter shape is an indexed query (docs/list-queries.md).

        A running run whose lease has expired (its worker died) is recovered as it is read,
        as :meth:`get` does: it is returned as that left it (queued, or ended). Asked for
        one ``state``, a run recovery moved out of it is left out and the read goes on past
        it, so a page is as full and as exact as the store's: one shorter than ``limit``
        is the last, whatever was recovered.
        """
        state = _state(state)
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise ConfigError(f"limit must be a whole number, 0 or more, not {limit!r}")
        limit = min(limit, MAX_LIMIT)
        start, end = _when(created_from, "created_from"), _when(created_to, "created_to")
        if start is not None and end is not None and start > end:
            raise ConfigError("created_from must not be after created_to")
        cursor = _cursor(before)
        if id_prefix is not None and not isinstance(id_prefix, str):
            raise ConfigError(f"id_prefix must be a string, not {id_prefix!r}")
        name = workflow.name if isinstance(workflow, Workflow) else workflow
        found: builtins.list[Run] = []
        while len(found) < limit:
            want = limit - len(found)
            runs = await self.store.list_runs(
                state=state, workflow=name, key=key, limit=want, before=cursor,
                created_from=start, created_to=end, id_prefix=id_prefix or None)
            for run in runs:
                run = await self._recover(run)
                if state is None or run.state is state:
                    found.append(run)
            if len(runs) < want:
                break  # the store had no more
            cursor = (runs[-1].created_at, runs[-1].id)  # past the runs left out, if any
        return found

    async def list_unfinished(self, workflow: Workflow[..., Any] | str | None = None,
                              key: str | None = None, *, limit: int = 100,
                              before: Cursor | None = None) -> builtins.list[Run]:
        """Up to ``limit`` queued and running runs, newest first, paged as :meth:`list`
        (``before``), optionally of one workflow and/or key: both states in one read of the
        store (:meth:`Store.list_unfinished`), so a run that moves between them while the
        pages are read (a claim, a worker's release, a lost lease recovered) is in one page
        exactly, where a list of each state in turn could miss it. A run whose lease had
        expired is recovered, as :meth:`list` does, and returned as that left it (queued,
        or ended: its cancel was pending, or it was recovered too often), so a page is as
        long as the store's and a shorter one is the last."""
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise ConfigError(f"limit must be a whole number, 0 or more, not {limit!r}")
        name = workflow.name if isinstance(workflow, Workflow) else workflow
        runs = await self.store.list_unfinished(
            workflow=name, key=key, limit=min(limit, MAX_LIMIT), before=_cursor(before))
        return [await self._recover(r) for r in runs]

    async def gone_holders(self, runs: Sequence[Run]) -> dict[str, GoneHolder]:
        """The running runs among ``runs`` whose worker is dead for sure, by run id: its
        liveness lock (SQLite, one machine: durable/_liveness.py) is free, so the kernel
        let it go when the process died; a live worker's sweep takes such a run over
        within a second. Read-only (no write, no takeover: a read command never changes a
        run). A worker that lives, or that the probe cannot tell of (no lock file, another
        user's; PostgreSQL, which has no such lock), is left out: nothing is said of it."""
        folder = self.store.liveness_dir()
        holders = {r.worker for r in runs if r.state is RunState.RUNNING and r.worker}
        if folder is None or not holders:
            return {}

        def probe() -> tuple[set[str], bool | None]:
            dead = {w for w in holders if _liveness.holder_alive(folder, w) is False}
            return dead, _liveness.any_alive(folder) if dead else None

        dead, others = await anyio.to_thread.run_sync(probe)
        return {r.id: GoneHolder(r.worker, others) for r in runs
                if r.state is RunState.RUNNING and r.worker in dead}

    async def counts(self, workflow: Workflow[..., Any] | str | None = None,
                     key: str | None = None, *,
                     created_from: dt.datetime | float | None = None,
                     created_to: dt.datetime | float | None = None) -> dict[str, int]:
        """The number of runs in each state, ``{"queued": 3, "running": 1, ...}`` (every
        state, 0 when none), optionally of one workflow and/or key and created in a window
        (as :meth:`list`'s); from an index. No id prefix: a prefix can span every run,
        and its count would read them all (docs/list-queries.md)."""
        name = workflow.name if isinstance(workflow, Workflow) else workflow
        start, end = _when(created_from, "created_from"), _when(created_to, "created_to")
        counts = await self.store.count_runs(workflow=name, key=key, created_from=start,
                                             created_to=end)
        return {state.value: counts.get(state, 0) for state in RunState}

    async def journal(self, run_id: str) -> builtins.list[JournalEntry]:
        await self.get(run_id)
        return await self.store.journal(run_id)

    async def report(self, run_id: str) -> RecoveryReport:
        run = await self.get(run_id)
        return RecoveryReport.build(run, await self.store.journal(run_id), self.console_url)

    async def wait(self, run_id: str, *, timeout: float = 60.0,
                   poll: float = 1.0) -> Run:
        """The run once it is finished; TimeoutError after ``timeout`` seconds.

        Woken, not polled: by this process's worker when one of its attempts ends, and by
        the store's change signal for a worker in another process (SQLite: a look at
        ``data_version`` every few milliseconds, no write; PostgreSQL: NOTIFY). ``poll`` is
        only the fallback: the run is read again at least that often, so a lost signal
        delays the answer and never hangs it (docs/design.md, "Nothing waits for a poll").

        A read that finds the store unreachable (:class:`StoreUnavailableError`: a server
        restarting, a network blip) does not end the wait: the run is read again, after
        ``poll`` at most, until ``timeout``. A wait whose last read failed when its timeout
        came raises that :class:`StoreUnavailableError` (the run may have finished: it
        cannot tell), not :class:`TimeoutError` (the run was seen unfinished).
        """
        check_seconds(poll, "poll")
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) \
                or not timeout > 0:  # infinity waits for as long as it takes
            raise ConfigError(f"timeout must be positive seconds, not {timeout!r}")
        signals = _wake.hub(self.store)
        began = signals.handed
        signals.waiting(run_id, +1)
        read: Run | None = None
        failed: StoreUnavailableError | None = None  # the last read, if it failed
        failures = 0
        try:
            with anyio.move_on_after(timeout) as bound:
                while True:
                    seen = signals.ends.get(run_id, 0)  # before the read: no end is missed
                    since = self.store.change_token() if self.store.pushes_changes else None
                    handed = signals.handed_over(run_id, began)
                    if handed is not None:  # as the finish in this process returned it
                        return handed
                    told = None if read is None else signals.told_finished(run_id, read)
                    if told is not None:  # as the signal of its end carried it
                        return told
                    try:
                        read = run = await self.get(run_id)
                    except StoreUnavailableError as exc:
                        failed, failures = exc, failures + 1
                        self._wait_reads.failed(exc, workflow_id=run_id)
                        await anyio.sleep(min(poll, 0.01 * 2 ** min(failures, 10)))
                        continue
                    failed = None
                    if self._wait_reads.failures:
                        self._wait_reads.succeeded(workflow_id=run_id)
                    if run.state.finished:
                        return run
                    async with anyio.create_task_group() as either:
                        either.start_soon(_first, either, signals.wait_end, run_id, seen)
                        if self.store.pushes_changes:
                            either.start_soon(_first, either, self.store.wait_for_finished,
                                              run_id, poll, since)
                        with anyio.move_on_after(poll):
                            await anyio.sleep_forever()
                        either.cancel_scope.cancel()
        finally:
            signals.waiting(run_id, -1)
        assert bound.cancelled_caught
        if failed is not None:
            raise StoreUnavailableError(
                f"run {run_id}: cannot tell whether it finished: the store could not be read "
                f"at the wait's timeout ({timeout:g} s; {failures} reads failed in a row): "
                f"{failed}") from failed
        raise TimeoutError(f"run {run_id} did not finish within {timeout:g} s")

    # -- operator actions ----------------------------------------------------------------------
    async def cancel(self, run_id: str, *, origin: Mapping[str, JSON] | None = None) -> Run:
        """Cancel a queued (or delayed) run at once; ask the worker holding a running one.

        ``origin`` says who and where the request came from (``{"via": "console", "remote":
        "127.0.0.1"}``, ``{"via": "cli", "user": ..., "host": ...}``); it is journaled with
        the cancel as ``"origin"``. Never put a secret in it.
        """
        run = await self.get(run_id)
        if run.state.finished:
            raise InvalidStateError(f"run {run_id} is already {run.state.value}")
        by = _origin(origin)
        cancelled = await self._answered(
            lambda: self.store.request_cancel(run_id, by=by),
            lambda: self._cancel_again(run_id, by), "cancel_outcome_unknown",
            f"the cancel of run {run_id!r}", f"it may have been recorded; look it up "
            f"({command('show', run_id)}), or cancel it again", workflow_id=run_id)
        if cancelled is None:
            run = await self.get(run_id)
            raise InvalidStateError(f"run {run_id} is {run.state.value}; nothing to cancel")
        signals = _wake.hub(self.store)
        if cancelled.state.finished:  # a queued run ends at once
            signals.end(run_id)
        else:  # the attempt holding it, if it runs in this process, stops now
            signals.cancel(run_id)
        self.log.info("run_cancel_requested", workflow_id=run_id, state=cancelled.state.value)
        return cancelled

    async def _cancel_again(self, run_id: str, by: Mapping[str, JSON] | None) -> Run | None:
        """The run is read back: cancelled, or with its cancel requested, it took the
        cancel (this one, or one sent meanwhile: a cancel asks once); otherwise the cancel
        is sent once more."""
        run = await self.store.get_run(run_id)
        if run is not None and (run.state is RunState.CANCELLED or (
                run.cancel_requested and not run.state.finished)):
            return run
        return await self.store.request_cancel(run_id, by=by)

    async def signal(self, run_id: str, name: str, payload: JSON = None, *,
                     id: str | None = None,
                     origin: Mapping[str, JSON] | None = None) -> bool:
        """Send the signal ``name`` with a JSON ``payload`` to a queued or running run: a
        ``ctx.wait_for(name)`` of the run receives it (each signal once, in order; a signal
        sent before the workflow waits is kept). A run waiting for it is due at once.

        ``id`` makes the send idempotent: True if the signal was recorded now, False if a
        signal with that id, name and payload was already recorded for the run (a double
        click is one signal). An id recorded for another name or payload raises
        :class:`RunConflictError` and writes nothing, as :meth:`start` does for a run id.
        Without one, the client chooses an id (``signal-`` and a random hex), so a send
        whose answer is lost is sent again and recorded once (``signal_outcome_unknown``;
        if that one is unanswered too, the error names the id to send it again with).
        ``origin`` (who and where) is journaled with it, as for :meth:`cancel`. The payload
        is journaled when received, like a step's arguments: never put a secret in it.
        Raises :class:`RunNotFoundError` for an unknown run and
        :class:`InvalidStateError` for a finished one; nothing is written then.
        """
        if not isinstance(name, str) or not name.strip():
            raise ConfigError("a signal name must be a non-empty string")
        check_printable(name, "a signal name")
        if id is not None and (not isinstance(id, str) or not id.strip()):
            raise ConfigError("a signal id must be a non-empty string")
        dumps(payload, "a signal's payload")
        by = _origin(origin)
        await self.get(run_id)  # recovers an expired lease first, as every read does
        signal_id = id or f"signal-{uuid.uuid4().hex[:16]}"
        sent = await self._answered(
            lambda: self.store.send_signal(run_id, name, payload, signal_id, by),
            lambda: self._signal_again(run_id, name, payload, signal_id, by,
                                       chosen_here=id is None),
            "signal_outcome_unknown", f"the signal {name!r} to run {run_id!r}",
            f"it may have been recorded; look it up ({command('show', run_id)}), or send it "
            f"again with id {signal_id!r}, which does nothing if it was",
            workflow_id=run_id, signal=name, signal_id=signal_id)
        if sent.state is None:
            raise RunNotFoundError(f"no run with id {run_id!r}")
        if sent.seq is None and sent.state.finished:
            raise InvalidStateError(
                f"run {run_id} is already {sent.state.value}; a signal can no longer reach it")
        if sent.seq is None:  # the id was recorded before: for this very signal, or refused
            await self._same_signal(run_id, name, payload, signal_id)
        if sent.seq is not None:
            _wake.hub(self.store).work()  # a run made due: this process's workers claim it
        self.log.info("signal_sent", workflow_id=run_id, signal=name, seq=sent.seq,
                      recorded=sent.seq is not None)
        return sent.seq is not None

    async def _signal_again(self, run_id: str, name: str, payload: JSON, signal_id: str,
                            by: Mapping[str, JSON] | None, *, chosen_here: bool) -> SignalSent:
        """A send is idempotent by id: it is sent once more. If that one finds the id
        recorded (the first send's, or one from before with the same name and payload, as
        idempotence means), the signal counts as recorded now, even if the run took it
        and ended meanwhile."""
        sent = await self.store.send_signal(run_id, name, payload, signal_id, by)
        if sent.seq is None and sent.state is not None:
            for found in await self.store.list_signals(run_id):
                if found.signal_id == signal_id and (
                        chosen_here or same_signal(found, name, payload)):
                    return SignalSent(sent.state, found.seq)
        return sent

    async def _same_signal(self, run_id: str, name: str, payload: JSON,
                           signal_id: str) -> None:
        """The signal recorded under ``signal_id`` is this one (its name and payload), or
        :class:`RunConflictError`: a second send under an id is a re-send of the first,
        never a new signal silently dropped."""
        for found in await self.store.list_signals(run_id):
            if found.signal_id == signal_id and not same_signal(found, name, payload):
                raise RunConflictError(
                    f"signal id {signal_id!r} of run {run_id} was already used for signal "
                    f"{found.name!r} with payload {shown(found.payload, 120)} (asked for: "
                    f"{name!r} with {shown(payload, 120)}); nothing was written; to send "
                    "another signal, choose another id")

    async def replay(self, run_id: str, from_step: int | None = None,
                     in_doubt: InDoubt | None = None, *,
                     origin: Mapping[str, JSON] | None = None) -> Run:
        """Queue a failed or cancelled run again as a new attempt.

        Completed steps return their journaled results; execution goes on live from the first
        step without one. ``from_step=N`` runs step N and later again. ``in_doubt`` resolves
        steps whose outcome is unknown: ``"rerun"`` runs them again, ``"accept"`` counts them
        as done. Nothing is deleted: the journal keeps every earlier attempt. ``from_step``
        runs the steps in doubt from N on again whatever ``in_doubt`` says, so
        ``"accept"`` with a ``from_step`` at or before a step in doubt is refused
        (:class:`ConfigError`, nothing written): an operator who accepted a step as done
        must not see it run again.

        A run whose plan was rejected, or whose wait for a decision on it timed out
        (:func:`durable.approval_gate`), is refused (:class:`InvalidStateError`, nothing
        written) unless ``from_step`` is its plan step or earlier: the journal keeps the
        rejection or the timeout, so a replay that keeps the plan could never act.
        """
        if from_step is not None and (isinstance(from_step, bool)
                                      or not isinstance(from_step, int) or from_step < 1):
            raise ConfigError(f"from_step is a step number (1, 2, ...), not {from_step!r}")
        if in_doubt not in (None, "rerun", "accept"):
            raise ConfigError("in_doubt must be 'rerun' or 'accept'")
        by = _origin(origin)
        run = await self.get(run_id)
        if run.state not in (RunState.FAILED, RunState.CANCELLED):
            raise InvalidStateError(
                f"run {run_id} is {run.state.value}; only failed or cancelled runs can be "
                "replayed")
        entries = await self.store.journal(run_id)
        if from_step is not None:  # refused before anything is written
            check_step(run_id, entries, from_step, "from_step")
            again = [n for n in in_doubt_steps(entries) if n >= from_step]
            if again and in_doubt == "accept":
                raise ConfigError(
                    f"run {run_id}: {_steps_text(again)} in doubt, and from_step {from_step} "
                    f"runs {'it' if len(again) == 1 else 'them'} again, where "
                    "in_doubt='accept' asks to count in-doubt steps as done; nothing was "
                    "written: leave out one or the other")
        closed = closed_plan(run, entries, from_step)
        if closed is not None:  # it could never act: say how to ask anew
            raise PlanClosedError(closed)
        queued = await self._answered(
            lambda: self.store.requeue(run_id, from_step, in_doubt, by=by),
            lambda: self._replay_again(run, from_step, in_doubt, by),
            "replay_outcome_unknown", f"the replay of run {run_id!r}",
            f"it may have been queued; look it up ({command('show', run_id)}) before replaying "
            "it again", workflow_id=run_id)
        if queued is None:
            raise InvalidStateError(f"run {run_id} changed state meanwhile; look again")
        _wake.hub(self.store).work()
        self.log.info("run_replayed", workflow_id=run_id, from_step=from_step,
                      in_doubt=in_doubt)
        return queued

    async def _replay_again(self, run: Run, from_step: int | None, in_doubt: InDoubt | None,
                            by: Mapping[str, JSON] | None) -> Run | None:
        """The run is read back: a finished run changes only by a replay (its row's
        ``updated_at`` moves), so one that moved since ``run`` was read was queued again,
        by this replay or one sent meanwhile, and is returned (sending it again would add
        an attempt no one asked for, if the run had failed again since); a run as it was
        read is sent once more."""
        now = await self.store.get_run(run.id)
        if now is not None and (now.state is not run.state
                                or now.updated_at != run.updated_at):
            return now
        return await self.store.requeue(run.id, from_step, in_doubt, by=by)

    # -- paused workflows (docs/design.md, "Pausing a workflow") --------------------------------
    async def pause(self, workflow: Workflow[..., Any] | str, *,
                    origin: Mapping[str, JSON] | None = None) -> PausedWorkflow:
        """Pause a workflow: from now no attempt of it starts (no claim takes its runs) until
        :meth:`resume`. Its queued runs keep their place and their intent (a start queues
        more), its running attempts go on, and a run of it released to wait resumes only
        after it is resumed. The pause in force is returned: pausing a paused workflow
        changes nothing (the first pause, its time and ``origin``, stands). ``origin`` is who
        paused it, as for :meth:`cancel`. Its ``known`` says whether a run in the database
        or this client's registry knows the workflow: a name nobody knows (a typo) is
        paused all the same, as a new workflow may be paused before its first start."""
        name = check_printable(_workflow_name(workflow), "a workflow name")
        by = _origin(origin)

        async def pause() -> PausedWorkflow:
            for _ in range(3):  # paused already: the pause in force (unless resumed between)
                written = await self.store.pause_workflow(name, by)
                if written is not None:
                    self.log.info("workflow_paused", workflow=name)
                    return written
                found = await self.pause_of(name)
                if found is not None:
                    return found
            raise StoreError(f"workflow {name!r} kept being paused and resumed meanwhile; "
                             "look: durable paused")

        paused = await self._answered(
            pause, pause, "pause_outcome_unknown", f"the pause of workflow {name!r}",
            "it may have been paused; look (durable paused)", workflow=name)
        known = name in self.registry.workflows or bool(
            await self.store.list_runs(workflow=name, limit=1))
        return attrs.evolve(paused, known=known)

    async def resume(self, workflow: Workflow[..., Any] | str) -> PausedWorkflow | None:
        """Resume a paused workflow: its runs are claimable again (idle workers are woken).
        The pause it ended, or None if the workflow was not paused."""
        name = _workflow_name(workflow)
        ended = await self._answered(
            lambda: self.store.resume_workflow(name), lambda: self.store.resume_workflow(name),
            "resume_outcome_unknown", f"the resume of workflow {name!r}",
            "it may have been resumed; look (durable paused)", workflow=name)
        if ended is not None:
            self.log.info("workflow_resumed", workflow=name)
        return ended

    async def paused(self) -> builtins.list[PausedWorkflow]:
        """Every paused workflow, by name."""
        return await self.store.paused_workflows()

    async def pause_of(self, workflow: Workflow[..., Any] | str) -> PausedWorkflow | None:
        """The pause of ``workflow`` in force, or None if it is not paused."""
        name = _workflow_name(workflow)
        return next((p for p in await self.store.paused_workflows() if p.workflow == name),
                    None)

    # -- schedules (durable/_schedules.py; docs/design.md, "Schedules") ------------------------
    async def add_schedule(self, spec: ScheduleSpec) -> Schedule:
        """Create a schedule at run time: its fires after now start runs. Adding the same
        definition again returns the schedule; another definition under a name in use is a
        :class:`ConfigError` and writes nothing. As :meth:`start` by name, this needs no
        workflow code (the command line checks the name against ``--import``)."""
        found, created = await self._idempotent(
            "add", spec.name, lambda: self.store.put_schedule(spec, origin="cli", replace=False))
        if not created and not found.spec.same_definition(spec):
            raise ConfigError(
                f"a schedule named {spec.name!r} exists with another definition "
                f"({found.spec.workflow}, cron {found.spec.cron!r}, {found.spec.timezone}); "
                "delete it first, or choose another name")
        if created:
            self.log.info("schedule_added", schedule=spec.name, cron=spec.cron,
                          timezone=spec.timezone, workflow=spec.workflow)
        return found

    async def get_schedule(self, name: str) -> Schedule:
        found = await self.store.get_schedule(name)
        if found is None:
            raise ConfigError(_no_schedule(name))
        return found

    async def schedules(self) -> builtins.list[Schedule]:
        """Every schedule, by name."""
        return await self.store.list_schedules()

    async def pause_schedule(self, name: str, *, paused: bool = True) -> Schedule:
        """Pause a schedule (it starts nothing until resumed), or resume it with
        ``paused=False`` (fires while it was paused are never started)."""
        found = await self._idempotent("pause" if paused else "resume", name,
                                       lambda: self.store.pause_schedule(name, paused))
        if found is None:
            raise ConfigError(_no_schedule(name))
        self.log.info("schedule_paused" if paused else "schedule_resumed", schedule=name)
        return found

    async def delete_schedule(self, name: str) -> None:
        """Delete a schedule; the runs it started stay. A schedule declared in code is
        written again by the next worker that starts with it."""
        async def again() -> bool:  # after a lost answer, none left means it was deleted
            await self.store.delete_schedule(name)
            return True

        if not await self._idempotent("delete", name,
                                      lambda: self.store.delete_schedule(name), again):
            raise ConfigError(_no_schedule(name))
        self.log.info("schedule_deleted", schedule=name)

    async def _idempotent(self, change: str, name: str, send: Callable[[], Awaitable[T]],
                          again: Callable[[], Awaitable[T]] | None = None) -> T:
        """A schedule change is idempotent by the schedule's name (the same change twice
        is the change once): with no answer, it is sent once more (by ``again``, if the
        second answer means something else)."""
        return await self._answered(
            send, again or send, "schedule_outcome_unknown", f"the {change} of schedule {name!r}",
            f"it may have been done; look it up ({command('schedule', 'show', name)})",
            schedule=name, change=change)


def _workflow_name(workflow: Any) -> str:
    name = workflow.name if isinstance(workflow, Workflow) else workflow
    if not isinstance(name, str) or not name.strip():
        raise ConfigError(f"a workflow is a Workflow or its name, not {workflow!r}")
    return name


def _no_schedule(name: str) -> str:
    return f"no schedule named {name!r} (see: durable schedule list)"


async def _first(group: anyio.abc.TaskGroup, wait: Any, *args: Any) -> None:
    """Await ``wait(*args)``, then end the group: the first of several waits wins."""
    await wait(*args)
    group.cancel_scope.cancel()


def check_times(*, timeout: Any = None, delay: Any = None,
                run_at: Any = None) -> tuple[float | None, float | None, float | None]:
    """A start's ``timeout``, ``delay`` and ``run_at`` (as epoch seconds), checked: the
    timeout positive seconds, the delay zero or more, the start time a timezone-aware
    datetime or finite seconds, not both of the last two; else a ConfigError naming the
    option. (The CLI checks them before it opens the database.)"""
    if run_at is not None and delay is not None:
        raise ConfigError("give run_at or delay, not both")
    if timeout is not None:
        timeout = check_seconds(timeout, "timeout")
    if delay is not None:
        delay = check_seconds(delay, "delay", zero=True)
    when: float | None = None
    if isinstance(run_at, dt.datetime):
        if run_at.tzinfo is None:
            raise ConfigError("run_at must be timezone-aware")
        when = run_at.timestamp()
    elif run_at is not None:
        if (isinstance(run_at, bool) or not isinstance(run_at, (int, float))
                or not math.isfinite(run_at)):
            raise ConfigError(f"run_at must be a datetime or epoch seconds, not {run_at!r}")
        when = float(run_at)
    if when is not None and not when < NEVER:
        raise ConfigError(f"run_at must be before 9999-12-31T23:59:59Z, not {run_at!r}")
    return timeout, delay, when


def _state(state: RunState | str | None) -> RunState | None:
    if isinstance(state, str) and not isinstance(state, RunState):
        try:
            return RunState(state)
        except ValueError:
            raise ConfigError(
                f"unknown state {state!r}; one of: "
                + ", ".join(s.value for s in RunState)) from None
    return state


def _when(value: dt.datetime | float | None, option: str) -> float | None:
    """A time bound in store seconds: a timezone-aware datetime, or seconds."""
    if value is None:
        return None
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            raise ConfigError(f"{option} must be timezone-aware")
        return value.timestamp()
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        raise ConfigError(f"{option} must be a datetime or seconds, not {value!r}")
    return float(value)


def _cursor(before: Cursor | None) -> Cursor | None:
    if before is None:
        return None
    try:
        at, run_id = before
    except (TypeError, ValueError):
        raise ConfigError(
            "before must be the (created_at, id) of the last run of the previous page, "
            f"not {before!r}") from None
    if isinstance(at, bool) or not isinstance(at, (int, float)) or not isinstance(run_id, str):
        raise ConfigError(
            "before must be the (created_at, id) of the last run of the previous page, "
            f"not {before!r}")
    return float(at), run_id


def _origin(origin: Mapping[str, JSON] | None) -> dict[str, JSON] | None:
    """Who and where an operator action came from, checked before anything is written."""
    if origin is None:
        return None
    if not isinstance(origin, Mapping) or not all(isinstance(k, str) for k in origin):
        raise ConfigError("origin must be a mapping of names to JSON values")
    value = dict(origin)
    dumps(value, "origin")
    return value


def same_json(a: Any, b: Any) -> bool:
    """``a`` and ``b`` are one JSON value, compared as JSON text: ``1`` is not ``true`` nor
    ``1.0`` (Python's ``==`` says they are), an object's keys in any order, a tuple the list
    it is journaled as."""
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def same_signal(found: Signal, name: str, payload: JSON) -> bool:
    """``found`` has this name and payload (:func:`same_json`)."""
    return found.name == name and same_json(found.payload, payload)


def _key_text(key: str | None) -> str:
    return "no key" if key is None else f"key {key!r}"


def _steps_text(numbers: builtins.list[int]) -> str:
    """``step 2``, ``steps 1 and 3``, ``steps 1 to 4``."""
    if len(numbers) == 1:
        return f"step {numbers[0]}"
    if numbers == builtins.list(range(numbers[0], numbers[-1] + 1)) and len(numbers) > 2:
        return f"steps {numbers[0]} to {numbers[-1]}"
    return "steps " + ", ".join(str(n) for n in numbers[:-1]) + f" and {numbers[-1]}"


def check_step(run_id: str, entries: builtins.list[JournalEntry], step: int,
               option: str = "step") -> None:
    """Refuse a step number the run's journal does not have (ConfigError, one line)."""
    numbers = sorted(s.number for s in History.fold(entries).steps.values())
    if step in numbers:
        return
    if not numbers:
        raise ConfigError(f"run {run_id} has no steps in its journal yet, so no step {step}; "
                          f"leave out {option}")
    raise ConfigError(f"run {run_id} has no step {step}: its journal has "
                      f"{_steps_text(numbers)}; {option} must be one of them")


def in_doubt_steps(entries: builtins.list[JournalEntry]) -> builtins.list[int]:
    """The numbers of the steps a replay finds in doubt: started, no outcome journaled (the
    run is finished, so no attempt holds them)."""
    return [s.number for s in History.fold(entries).ordered()
            if s.state in (StepState.STARTED, StepState.IN_DOUBT)]


def describe_replay(run_id: str, entries: builtins.list[JournalEntry],
                    from_step: int | None = None, in_doubt: InDoubt | None = None) -> str:
    """What a replay of the run with this journal will do, step by step, in one line.

    Follows :meth:`History.fold`'s reading of a ``run_replayed`` entry, which is what the
    next attempt acts on.
    """
    kept: builtins.list[int] = []
    from_here: builtins.list[int] = []
    failed: builtins.list[int] = []
    doubt: builtins.list[int] = []
    doubt_again: builtins.list[int] = []  # in doubt, and run again by from_step
    for step in History.fold(entries).ordered():
        if from_step is not None and step.number >= from_step:
            from_here.append(step.number)
            if step.state in (StepState.STARTED, StepState.IN_DOUBT):
                doubt_again.append(step.number)
        elif step.state is StepState.COMPLETED:
            kept.append(step.number)
        elif step.state in (StepState.STARTED, StepState.IN_DOUBT):
            doubt.append(step.number)
        else:
            failed.append(step.number)
    parts: builtins.list[str] = []
    if from_step is not None:
        parts.append(f"step {from_step} and every later step will run again" + (
            f", {_steps_text(doubt_again)} in doubt (outcome unknown) included"
            if doubt_again else ""))
    if kept:
        parts.append(f"{_steps_text(kept)} will not run again (journaled results are used)")
    if failed:
        parts.append(f"{_steps_text(failed)} (failed or unfinished) will run again")
    if doubt and in_doubt == "accept":
        parts.append(f"{_steps_text(doubt)} (in doubt) will count as done, accepted by an "
                     "operator")
    elif doubt and in_doubt == "rerun":
        parts.append(f"{_steps_text(doubt)} (in doubt) will run again")
    elif doubt:
        parts.append(f"{_steps_text(doubt)} in doubt: each runs again if its activity has "
                     "on_doubt='retry', else the run fails there again (decide with "
                     "--rerun-in-doubt or --accept-in-doubt)")
    elif in_doubt is not None and not doubt_again:
        parts.append("no step is in doubt, so the in-doubt choice changes nothing")
    if not kept and not from_here and not failed and not doubt:
        parts.append("no step had run: the workflow starts from the beginning")
    return f"{run_id} queued again: " + "; ".join(parts)
