"""Steps: their identity, their execution, and what a step in doubt or accepted returns.

The guarantees that live here:

- **Identity.** A step is its key: the n-th *unkeyed* call of the run is key ``"n"``.
  Numbering by call order is only deterministic when one unkeyed call is open at a time, so
  an unkeyed step (or journaled value) started while another unkeyed one is in flight is a
  :class:`durable.ConfigError` that fails the run ("pass key="), rather than a run whose
  concurrent steps get each other's results after a resume.
- **Tries.** ``RetryPolicy.max_tries`` bounds a step's tries across the run's attempts. A
  step whose worker died (or lost its lease) each time it ran ends the run with a message
  saying so; an ``on_doubt="fail"`` step is left in doubt instead (its last try's outcome is
  unknown), so that only a replay with ``--rerun-in-doubt`` runs it again.
- **Results.** A result that cannot be journaled fails the step at once (never retried:
  the side effect happened). A completion of an ``on_doubt="fail"`` step is committed
  before the workflow goes on; an idempotent step's completion rides on the next write.
- **Doubt.** A step in doubt asks its activity's lookup what happened, then applies
  ``on_doubt``. A step an operator accepted gets its result from the lookup, or a result
  that raises :class:`durable.ResultUnknownError` when used: never a silent ``None``.
"""

from __future__ import annotations

import functools
import inspect
import random
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, NoReturn

import anyio

from ._context import ActivityContext
from ._errors import (
    ActivityError,
    AttemptCancelled,
    ConfigError,
    NonDeterminismError,
    NotJsonError,
    ResultUnknownError,
    SignalTimeout,
    StepInDoubtError,
)
from ._history import History, StepView, idempotency_key, tries
from ._interceptors import StepInfo, around, tell
from ._logging import redact, storable
from ._registry import NOT_DONE
from ._types import (
    JSON,
    UNSTORABLE,
    EntryKind,
    JournalWrite,
    Signal,
    StepState,
    check_step_key,
    dumps,
    loads,
)

if TYPE_CHECKING:
    from ._attempt import Attempt
    from ._registry import Activity
    from ._report import RecoveryReport

    AnyActivity = Activity[..., Any]


DEFAULT_WAIT_THRESHOLD = 2.0
"""Seconds from which a wait (``ctx.sleep``, ``ctx.wait_for``, a retry delay) ends the
attempt and releases the run until it is due, instead of waiting in the attempt."""

WAIT_SLICE = 0.25
"""Seconds between two looks of a wait kept in the attempt (at the store's clock, and for a
signal): short waits only, or waits while steps are in flight."""


def _in_time(signal: Signal | None, until: float | None) -> Signal | None:
    """The signal, if it was recorded by the wait's deadline (both times on the store's
    clock): one recorded later did not come in time, whenever the wait looks (an attempt
    claimed late, with no worker running at the deadline, times the wait out as one on time
    would have); it stays for a later wait of its name."""
    if signal is None or until is None or signal.created_at <= until:
        return signal
    return None

class Suspended(BaseException):
    """Raised out of the workflow to end the attempt and release the run to wait without a
    lease (docs/design.md, "Durable waiting"). A BaseException: ``except Exception`` in
    workflow code does not stop it."""

    def __init__(self, until: float | None, reason: str, signal: str | None = None,
                 seen: int = 0) -> None:
        super().__init__(reason)
        self.until = until
        """When the run is due again; None: only when the signal comes."""
        self.reason = reason
        self.signal = signal
        self.seen = seen
        """The run's signal count when the attempt last looked for the signal."""


GROUP_SHOWN = 10
"""The errors of a group a message names, at most (the rest are counted)."""


def leaves(exc: BaseException) -> list[BaseException]:
    """The errors inside ``exc``, nested groups flattened; ``[exc]`` if it is no group."""
    if not isinstance(exc, BaseExceptionGroup):
        return [exc]
    return [leaf for inner in exc.exceptions for leaf in leaves(inner)]


def unwrapped(exc: BaseException) -> BaseException:
    """A group's only error (a task group's way of raising it), else ``exc`` itself: what a
    failure is reported as, so a step that failed in a task group is named as it would be
    outside one, not as ``unhandled errors in a TaskGroup (1 sub-exception)``."""
    found = leaves(exc)
    return found[0] if len(found) == 1 else exc


def describe(exc: BaseException) -> str:
    """An error as its run's journal, row and log lines give it: the type and text, redacted
    of credentials and :func:`storable`."""
    if isinstance(exc, BaseExceptionGroup):  # several errors: each named, not the group
        found = leaves(exc)
        named = "; ".join(describe(leaf) for leaf in found[:GROUP_SHOWN])
        more = len(found) - GROUP_SHOWN
        return (f"{type(exc).__name__}: {len(found)} errors: {named}"
                + (f"; and {more} more" if more > 0 else ""))
    text = str(exc) or type(exc).__name__
    if isinstance(exc, TimeoutError) and not str(exc):
        text = "timed out"
    return storable(redact(f"{type(exc).__name__}: {text}" if str(exc) else text))


class UnknownResult:
    """Handed to the workflow for an accepted step whose result nobody knows.

    Ignoring it is fine (a delete's ``None``); using it raises
    :class:`durable.ResultUnknownError` saying which step and what to do.
    """

    def __init__(self, step: int, activity: str) -> None:
        self._message = (
            f"the result of step {step} ({activity}) is unknown: an operator accepted the step "
            "as done (replay --accept-in-doubt) and its activity has no lookup to find the "
            f"result; declare one (@{activity.rsplit('.', 1)[-1]}.lookup) or replay with "
            "--rerun-in-doubt")

    def _refuse(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise ResultUnknownError(self._message)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        self._refuse()

    __getitem__ = __iter__ = __len__ = __bool__ = __contains__ = __int__ = __float__ = _refuse
    __add__ = __radd__ = __lt__ = __le__ = __gt__ = __ge__ = _refuse

    def __repr__(self) -> str:
        return "<durable: unknown result of an accepted step>"


def unknown_in(value: Any) -> UnknownResult | None:
    """The first :class:`UnknownResult` inside a value about to be journaled, if any.
    Walked without recursion: a value nested deeper than Python's stack is refused by the
    encoder (:data:`durable._types.MAX_JSON_DEPTH`), not here with a RecursionError."""
    if isinstance(value, UnknownResult):
        return value
    if not isinstance(value, dict | list | tuple):
        return None
    stack: list[Iterator[Any]] = [iter(value.values() if isinstance(value, dict) else value)]
    while stack:
        for item in stack[-1]:
            if isinstance(item, UnknownResult):
                return item
            if isinstance(item, dict | list | tuple):
                stack.append(iter(item.values() if isinstance(item, dict) else item))
                break
        else:
            stack.pop()
    return None


def refuse_unknown(value: Any) -> None:
    """Raise :class:`ResultUnknownError` if ``value`` holds an accepted step's unknown
    result (rather than an unhelpful "not JSON serializable")."""
    found = unknown_in(value)
    if found is not None:
        found._refuse()


def shown(value: Any, limit: int = 200) -> str:
    """``value`` as JSON (its repr if it is not), redacted, cut to about ``limit``: how a
    message shows a value the journal holds in full (a step's arguments, a signal's
    payload). Redacted before it is cut: a cut could leave a secret's prefix no pattern
    knows."""
    try:
        text = dumps(value, "a step's arguments", around=1)
    except NotJsonError:
        text = repr(value)
    text = redact(text)
    return text if len(text) <= limit else text[:limit] + "..."


_RNG = random.Random()

_SCALARS = (type(None), bool, int, str)


def check_journalable(value: Any, what: str) -> None:
    """Raise :class:`NotJsonError` if ``value`` cannot be journaled. The store encodes it
    when it writes the entry; a scalar is checked by its type alone, so the common result is
    not encoded twice."""
    if type(value) in _SCALARS:
        return
    dumps(value, what)


def encoded_once(value: Any, data: dict[str, JSON], what: str) -> str | None:
    """The journal text of an entry's ``data`` that holds ``value`` (a result), or None
    when it is left to the store to encode: a scalar is checked by its type alone. Any
    other value is checked by encoding the entry itself, once, and the store writes that
    text (JournalWrite.encoded) instead of encoding the value a second time. Raises
    :class:`NotJsonError` naming ``what`` if ``value`` cannot be journaled."""
    if type(value) in _SCALARS:
        return None
    try:
        return dumps(data, what, around=1)
    except NotJsonError:
        dumps(value, what)  # the value's fault: raise naming it
        return None  # another field's: the store refuses it as before


def _check_record_name(name: object, what: str) -> None:
    """A record's name: two strings. A key of another type was stored under its text but
    known to the run by its value, so a write of ``("slot", 5)`` after a read of ``("slot",
    "5")`` skipped the compare-and-set on the version read."""
    if not (isinstance(name, tuple) and len(name) == 2
            and all(isinstance(part, str) for part in name)):
        raise ConfigError(f"{what}: a record is named by two strings (namespace, key), not "
                          f"{name!r}")
    for part in name:
        if (found := UNSTORABLE.search(part)) is not None:  # journaled with the entry
            raise ConfigError(f"{what}: a record's name must not hold {found.group()!r} (a NUL "
                              f"or a lone surrogate: no store can hold it): {part[:60]!r}")


def as_journaled(encoded: str) -> JSON:
    """The result of a step's completion entry, encoded by :func:`encoded_once`, as the
    journal holds it: what every later attempt of the run reads. The attempt that ran the
    step gets the same value, not the activity's own object: JSON keeps string keys and
    lists only (``{1: "a"}`` is ``{"1": "a"}``, a tuple a list), and a workflow handed
    the object first and the journal's value after a resume could decide differently."""
    outcome = loads(encoded)
    assert isinstance(outcome, dict)
    return outcome["result"]


async def _invoke(act: AnyActivity, ctx: ActivityContext, args: tuple[Any, ...]) -> Any:
    """One try of an activity: its function under its timeout."""
    if act.timeout is None:
        return await act.fn(ctx, *args)
    with anyio.fail_after(act.timeout):
        return await act.fn(ctx, *args)


def _returns_none(fn: Callable[..., Any]) -> bool:
    annotation = inspect.signature(fn).return_annotation
    return annotation is None or annotation == "None"


class Steps:
    """The steps of one attempt: identifies each call, runs it, journals its outcome."""

    def __init__(self, attempt: Attempt) -> None:
        self.attempt = attempt
        self.history = History()
        self.doom: BaseException | None = None
        """An error that fails the run even if workflow code catches it."""
        self.suspended: Suspended | None = None
        """The durable wait this attempt raised to release the run: kept, so workflow code
        that swallows it (a bare ``except:``) cannot go on past the wait."""
        self.in_flight: dict[str, StepView] = {}
        self._seq = 0
        self._used_keys: set[str] = set()
        self._open_unkeyed: str | None = None
        self._rng = _RNG  # retry jitter: one generator per process, not one seeded per run
        self.overdue: Callable[[str], TimeoutError] | None = None
        """Set when the workflow's time ran out before this attempt (a later one): its code
        replays what the journal holds and nothing new runs. Given what was reached (a
        step not journaled as done, a wait, a value), it makes the error that fails the
        run (:meth:`nothing_new`)."""
        self.overdue_scope: anyio.CancelScope | None = None

    @property
    def run_id(self) -> str:
        return self.attempt.run.id

    @property
    def epoch(self) -> int:
        return self.attempt.fence.epoch

    def nothing_new(self, view: StepView, what: str) -> None:
        """Where workflow code is about to do something its journal does not hold (run or
        look up a step, start or go on waiting, journal a value): an attempt whose
        workflow's time ran out stops there, and the run fails, whatever the code catches
        (the error is the attempt's doom, its scope is cancelled)."""
        if self.suspended is not None:  # a wait it swallowed: it goes no further
            raise self.suspended
        if self.overdue is None:
            return
        err = self.overdue(f"step {view.number} ({what})")
        self.doom = self.doom or err
        if self.overdue_scope is not None:
            self.overdue_scope.cancel()
        raise err

    def suspend(self, wait: Suspended) -> Suspended:
        """``wait``, kept as the attempt's (:attr:`suspended`), to be raised."""
        self.suspended = wait
        return wait

    # -- identity ------------------------------------------------------------------------------
    @contextmanager
    def identified(self, name: str, key: str | None) -> Iterator[StepView]:
        """The step's view, held open (for the unkeyed-concurrency check) for the block."""
        view = self._open(name, key)
        if key is not None:
            yield view
            return
        try:
            yield view
        finally:
            self._open_unkeyed = None

    def _open(self, name: str, key: str | None) -> StepView:
        """Identify a step and, if unkeyed, hold it open (the caller clears
        ``_open_unkeyed`` when it ends)."""
        if key is None and self._open_unkeyed is not None:
            err = ConfigError(
                f"run {self.run_id}: the unkeyed step {name!r} was started while the unkeyed "
                f"step {self._open_unkeyed!r} was still in flight; unkeyed steps are numbered "
                "in call order, which concurrent tasks do not keep: give each step started "
                "concurrently a stable key (ctx.step(activity, ..., key=...))")
            self.doom = self.doom or err
            raise err
        view = self._identify(name, key)
        if key is None:
            self._open_unkeyed = name
        return view

    def _identify(self, name: str, key: str | None) -> StepView:
        if key is None:
            self._seq += 1
            skey = str(self._seq)
        else:
            skey = str(key)
            if not skey or skey.isdigit():
                raise ConfigError(f"a step key must be a non-numeric string, not {key!r}")
        if skey in self._used_keys:
            raise ConfigError(f"step key {skey!r} is used twice in run {self.run_id}")
        self._used_keys.add(skey)
        view = self.history.steps.get(skey)
        if view is None:
            if key is not None:  # a new key only: one journaled before this check is read
                check_step_key(key)
            view = self.history.add(skey, name)
        elif view.name != name:
            err = NonDeterminismError(
                f"run {self.run_id}: step {view.number} (key {skey!r}) was journaled as "
                f"{view.name!r} but the workflow now calls {name!r}; the workflow code changed "
                "since the run started. Deploy the old code to finish it, or start a new run"
            )
            self.doom = err
            raise err
        return view

    def _same_args(self, act: AnyActivity, args: tuple[Any, ...], view: StepView) -> None:
        """An unkeyed step whose journaled outcome (its result, its failure, its doubt) is
        reused must be called with the arguments it was journaled with: it is known only as
        the n-th call, so other arguments mean another call, and its result would stand for
        one that never happened (a backup of db-A taken as one of db-B, before the delete
        of db-B). Compared as JSON values (a tuple is the list it was journaled as, key
        order does not matter). A keyed step is what its key names: its arguments may
        describe rather than identify (a notification's text built from the journal as it
        is now), so they are not compared. A step a replay runs again is not compared: it
        runs, with the arguments of the code deployed now."""
        given = list(args)
        if given == view.args:
            return
        try:
            if loads(dumps(given, "a step's arguments", around=1)) == view.args:
                return
        except NotJsonError:
            pass  # not JSON: not what was journaled either
        err = NonDeterminismError(
            f"run {self.run_id}: step {view.number} ({act.name}) was journaled with the "
            f"arguments {shown(view.args)} but the workflow now calls it with "
            f"{shown(given)}; its journaled outcome is not reused for another call. The "
            "workflow code is not deterministic (an argument made of something other than "
            "the run's arguments, step results, ctx.now() or ctx.uuid4()), or it changed "
            "since the run started: deploy the code it started with, or start a new run")
        self.doom = err
        raise err

    def doubt_entries(self, reason: str, *, earlier: bool = False) -> list[JournalWrite]:
        """``step_in_doubt`` for the steps in flight (and, with ``earlier``, for steps an
        earlier attempt left started, not yet journaled as in doubt)."""
        entries = [JournalWrite(EntryKind.STEP_IN_DOUBT, s.number, s.key, s.name, s.tries,
                                {"reason": reason}) for s in self.in_flight.values()]
        if earlier:
            entries += [
                JournalWrite(EntryKind.STEP_IN_DOUBT, s.number, s.key, s.name, s.tries,
                             {"reason": f"started by an earlier attempt (epoch {s.epoch}) "
                                        "with no recorded outcome"})
                for s in self.history.ordered()
                if s.key not in self.in_flight and s.state is StepState.STARTED
                and s.epoch < self.epoch]
        return entries

    # -- journaled values and records ----------------------------------------------------------
    async def value(self, name: str, produce: Callable[[], JSON],
                    summary: JSON = None) -> JSON:
        """A journaled value: produced once, the journaled one handed back on replay."""
        with self.identified(name, None) as view:
            if view.state is StepState.COMPLETED:
                return view.result
            self.nothing_new(view, name)
            result = produce()
            data: dict[str, JSON] = {"result": result}
            if summary is not None:
                data["summary"] = summary
            await self.attempt.write([JournalWrite(EntryKind.VALUE, view.number, view.key,
                                                   name, 1, data)])
            view.state, view.result = StepState.COMPLETED, result
            return result

    async def set_records(self, records: Mapping[tuple[str, str], JSON], summary: JSON,
                          key: str | None) -> None:
        if not isinstance(records, Mapping):
            raise ConfigError("ctx.set_records: records are a mapping of (namespace, key) to "
                              f"a value, not {records!r}")
        for name in records:
            _check_record_name(name, "ctx.set_records")
        with self.identified("durable.set_records", key) as view:
            if view.state is StepState.COMPLETED:
                return
            self.nothing_new(view, "durable.set_records")
            # A record this run read is written only if it still has the version read
            # (compare-and-set; StaleRecordError otherwise): a write is never based on a
            # stale read, e.g. one journaled by an earlier attempt.
            known = self.history.record_versions
            expected = {k: known[k] for k in records if k in known}
            entry = JournalWrite(EntryKind.STEP_COMPLETED, view.number, view.key,
                                 "durable.set_records", 1,
                                 {"result": None, "summary": summary,
                                  "records": [[ns, k] for ns, k in records],
                                  "versions": [[ns, k, v + 1]
                                               for (ns, k), v in expected.items()]})
            await self.attempt.put_records([(ns, k, v) for (ns, k), v in records.items()],
                                           entry, expected)
            known.update({k: v + 1 for k, v in expected.items()})
            view.state = StepState.COMPLETED

    async def get_record(self, namespace: str, key: str) -> JSON:
        _check_record_name((namespace, key), "ctx.get_record")
        with self.identified("durable.get_record", None) as view:
            if view.state is StepState.COMPLETED:
                return view.result
            self.nothing_new(view, "durable.get_record")
            record = await self.attempt.store.get_record(namespace, key)
            result = None if record is None else record.value
            version = 0 if record is None else record.version
            await self.attempt.write([JournalWrite(
                EntryKind.VALUE, view.number, view.key, "durable.get_record", 1,
                {"result": result, "summary": f"{namespace}/{key}",
                 "record": [namespace, key], "version": version})])
            self.history.record_versions[(namespace, key)] = version
            view.state, view.result = StepState.COMPLETED, result
            return result

    async def recovery_report(self) -> RecoveryReport:
        from ._report import RecoveryReport

        attempt = self.attempt
        await attempt.write([])  # the report reads the journal: commit deferred entries first
        run = await attempt.store.get_run(self.run_id) or attempt.run
        return RecoveryReport.build(run, await attempt.store.journal(self.run_id),
                                    console_url=attempt.console_url)

    # -- durable waiting (docs/design.md, "Durable waiting") ------------------------------------
    def _may_release(self, left: float | None) -> bool:
        """Whether a wait of ``left`` seconds (None: no end) ends the attempt: long enough,
        and no step in flight (releasing would cut it off)."""
        return not self.in_flight and (left is None or left >= self.attempt.wait_threshold)

    async def _wait_until(self, until: float, reason: str) -> None:
        """Wait until the store's clock reads ``until``: release the run if the wait is
        long, else sleep in the attempt (cancellable), looking at the clock every slice."""
        store = self.attempt.store
        left = until - await store.now()
        if left > 0 and self._may_release(left):
            raise self.suspend(Suspended(until, reason))
        while left > 0:
            await anyio.sleep(min(left, WAIT_SLICE))
            left = until - await store.now()

    async def sleep(self, seconds: float | None, until: float | None) -> None:
        with self.identified("durable.sleep", None) as view:
            if view.state is StepState.COMPLETED:
                return
            if view.wake_at is None:  # first execution: journal the wake time, once
                self.nothing_new(view, "durable.sleep")
                now = await self.attempt.store.now()
                wake = float(until) if until is not None else now + float(seconds or 0.0)
                await self.attempt.write([JournalWrite(
                    EntryKind.TIMER_STARTED, view.number, view.key, "durable.sleep", None,
                    {"until": wake, "seconds": round(wake - now, 6)})])
                view.wake_at, view.epoch = wake, self.epoch
            wake = view.wake_at
            if self.overdue is not None and wake > await self.attempt.store.now():
                self.nothing_new(view, "durable.sleep")  # a wait still to come is new
            await self._wait_until(wake, "sleep")
            # rides on the next write: a crash before it only finds the wake time passed
            self.attempt.defer(JournalWrite(EntryKind.TIMER_FIRED, view.number, view.key,
                                            "durable.sleep", None, {"until": wake}))
            view.state, view.result = StepState.COMPLETED, None

    def _timed_out(self, view: StepView) -> SignalTimeout:
        name = view.wait_name or "?"
        timeout = view.wait_timeout
        within = f" within {timeout:g} s" if timeout is not None else ""
        return SignalTimeout(
            f"no signal {name!r} arrived{within} (run {self.run_id}, step {view.number})",
            name=name, timeout=timeout, step=view.number)

    async def wait_for(self, name: str, timeout: float | None) -> JSON:
        attempt = self.attempt
        store = attempt.store
        with self.identified("durable.wait_for", None) as view:
            if view.state is StepState.COMPLETED:
                if view.timed_out:
                    raise self._timed_out(view)
                return view.result
            self.nothing_new(view, f"durable.wait_for {name!r}")
            if not view.wait_started:  # first execution: journal what it waits for, once
                until = None if timeout is None else await store.now() + timeout
                await attempt.write([JournalWrite(
                    EntryKind.WAIT_STARTED, view.number, view.key, "durable.wait_for", None,
                    {"name": name, "until": until, "timeout": timeout})])
                view.wait_started, view.wait_name = True, name
                view.wait_until, view.wait_timeout, view.epoch = until, timeout, self.epoch
            elif view.wait_name != name:
                err = NonDeterminismError(
                    f"run {self.run_id}: step {view.number} was journaled as a wait for signal "
                    f"{view.wait_name!r} but the workflow now waits for {name!r}; the workflow "
                    "code changed since the run started")
                self.doom = err
                raise err
            until = view.wait_until
            log = attempt.log.bind(step=view.number, signal=name)
            while True:
                after = self.history.signals_consumed.get(name, 0)
                seen, signal = await store.next_signal(self.run_id, name, after)
                signal = _in_time(signal, until)
                left = None
                if signal is None and until is not None:
                    left = until - await store.now()
                    if left <= 0:
                        # past the deadline: look once more, after the clock read, so a
                        # timeout means that no signal had been recorded when the clock read
                        # past it (one committed while the process stood still between the
                        # first look and the clock read would be timed out otherwise)
                        seen, signal = await store.next_signal(self.run_id, name, after)
                        signal = _in_time(signal, until)
                if signal is not None:
                    await attempt.write([JournalWrite(
                        EntryKind.SIGNAL_RECEIVED, view.number, view.key, "durable.wait_for",
                        None, {"name": name, "seq": signal.seq, "payload": signal.payload,
                               "sent_at": signal.created_at})])
                    self.history.signals_consumed[name] = signal.seq
                    view.state, view.result, view.result_known = (
                        StepState.COMPLETED, signal.payload, True)
                    log.info("signal_received", seq=signal.seq)  # never the payload
                    return signal.payload
                if left is not None and left <= 0:
                    await attempt.write([JournalWrite(
                        EntryKind.SIGNAL_TIMEOUT, view.number, view.key, "durable.wait_for",
                        None, {"name": name, "until": until})])
                    view.state, view.timed_out = StepState.COMPLETED, True
                    log.info("signal_timed_out")
                    raise self._timed_out(view)
                if self._may_release(left):
                    raise self.suspend(Suspended(until, "signal", signal=name, seen=seen))
                await anyio.sleep(WAIT_SLICE if left is None else min(left, WAIT_SLICE))

    # -- activities ----------------------------------------------------------------------------
    def _context(self, view: StepView, try_number: int) -> ActivityContext:
        return ActivityContext(self.attempt, step=view.number, step_key=view.key,
                               try_number=try_number,
                               idempotency_key=idempotency_key(self.run_id, view.key,
                                                               view.reruns))

    def _failure(self, view: StepView, act: AnyActivity, count: int, message: str,
                 error_type: str) -> ActivityError:
        return ActivityError(f"step {view.number} ({act.name}) failed after {tries(count)}: "
                             f"{message}", step=view.number, activity=act.name,
                             error_type=error_type)

    async def _fail_step(self, view: StepView, act: AnyActivity, number: int,
                         data: dict[str, JSON]) -> None:
        await self.attempt.write([JournalWrite(EntryKind.STEP_FAILED, view.number, view.key,
                                               act.name, number, data)])
        self.in_flight.pop(view.key, None)
        view.state, view.error = StepState.FAILED, data["error"]
        view.error_type = str(data["error_type"])

    async def _look_up(self, act: AnyActivity, view: StepView, args: tuple[Any, ...]) -> Any:
        """The lookup's answer: a result, NOT_DONE, or an exception (cannot tell)."""
        assert act.lookup_fn is not None
        ctx = self._context(view, max(view.tries, 1))
        if act.timeout is None:
            return await act.lookup_fn(ctx, *args)
        with anyio.fail_after(act.timeout):
            return await act.lookup_fn(ctx, *args)

    async def _complete_from_lookup(self, act: AnyActivity, view: StepView, found: JSON,
                                    *, accepted: bool) -> JSON:
        found = loads(dumps(found, f"the result of the lookup of activity {act.name}"))
        await self.attempt.write([JournalWrite(
            EntryKind.STEP_COMPLETED, view.number, view.key, act.name, max(view.tries, 1),
            {"result": found, "summary": "found by its lookup", "looked_up": True,
             "accepted": accepted, "ended_at": self.attempt.store.clock.now()})])
        view.state, view.result, view.result_known = StepState.COMPLETED, found, True
        return found

    async def _accepted(self, act: AnyActivity, view: StepView, args: tuple[Any, ...]) -> Any:
        """An operator counted the step as done: find its result, never hand back None."""
        log = self.attempt.log.bind(step=view.number, activity=act.name)
        if act.lookup_fn is None:
            if _returns_none(act.fn):
                return None
            log.warning("step_result_unknown")
            return UnknownResult(view.number, act.name)
        try:
            found = await self._look_up(act, view, args)
        except (AttemptCancelled, NotJsonError):
            raise
        except Exception as exc:
            raise ActivityError(
                f"step {view.number} ({act.name}) was accepted as done, but its lookup "
                f"failed: {describe(exc)}; replay again when it can answer",
                step=view.number, activity=act.name, error_type=type(exc).__name__) from exc
        if found is NOT_DONE:
            raise ActivityError(
                f"step {view.number} ({act.name}) was accepted as done, but its lookup found "
                "that it did not take effect; replay with --rerun-in-doubt to run it",
                step=view.number, activity=act.name, error_type="NotDone")
        log.info("step_looked_up", accepted=True)
        return await self._complete_from_lookup(act, view, found, accepted=True)

    async def run_step(self, act: AnyActivity, args: tuple[Any, ...], key: str | None) -> Any:
        # self.identified(act.name, key) written out: a generator context manager costs
        # more than the rest of a completed step's replay
        view = self._open(act.name, key)
        if key is not None:
            return await self._run_step(act, args, view)
        try:
            return await self._run_step(act, args, view)
        finally:
            self._open_unkeyed = None

    async def _run_step(self, act: AnyActivity, args: tuple[Any, ...], view: StepView) -> Any:
        if view.state is not None and view.args is not None and view.key.isdigit():
            self._same_args(act, args, view)  # its journaled outcome is about to be reused
        if view.state is StepState.COMPLETED:
            if view.accepted and not view.result_known:
                self.nothing_new(view, act.name)  # its lookup is a call to the world
                return await self._accepted(act, view, args)
            return view.result
        if view.state is StepState.FAILED:
            # an earlier attempt journaled this step's failure: the workflow sees the same
            # failure again (only a replay runs a failed step again)
            raise self._failure(view, act, view.tries_used, view.error or "",
                                view.error_type or "Exception")
        self.nothing_new(view, act.name)
        log = self.attempt.log.bind(step=view.number, step_key=view.key, activity=act.name)
        if view.in_doubt(self.epoch):
            if view.state is StepState.STARTED:
                await self.attempt.write([JournalWrite(
                    EntryKind.STEP_IN_DOUBT, view.number, view.key, act.name, view.tries,
                    {"reason": f"started by an earlier attempt (epoch {view.epoch}) with no "
                               "recorded outcome"})])
                view.died += 1
                view.state = StepState.IN_DOUBT
            log.warning("step_in_doubt", on_doubt=act.on_doubt)
            chain = self.attempt.chain
            if chain is not None and chain.step_in_doubt:
                tell(chain.step_in_doubt, StepInfo(self.attempt.run, view.number, view.key,
                                                   act.name, view.tries, act.on_doubt))
            settled = False
            if act.lookup_fn is not None:
                try:
                    found = await self._look_up(act, view, args)
                except (AttemptCancelled, NotJsonError):
                    raise
                except Exception as exc:  # it cannot tell: the step stays in doubt
                    log.warning("step_lookup_failed", error=describe(exc))
                else:
                    if found is not NOT_DONE:
                        log.info("step_looked_up", accepted=False)
                        return await self._complete_from_lookup(act, view, found,
                                                                accepted=False)
                    settled = True  # it did not take effect: running it is safe
            # before the tries are counted: a step whose outcome is unknown stays in doubt
            # whatever tries it has left. Failed as out of tries instead, it would be run
            # again by a plain replay (which runs failed steps), although it may have taken
            # effect; in doubt, only --rerun-in-doubt runs it
            if not settled and act.on_doubt == "fail":
                err = StepInDoubtError(
                    f"step {view.number} ({act.name}) was started by an earlier attempt and "
                    "its outcome is unknown; check whether it took effect, then replay with "
                    "--rerun-in-doubt (run it again) or --accept-in-doubt (count it as done)",
                    step=view.number, step_key=view.key, activity=act.name)
                self.doom = err
                raise err
        if view.retry_at is not None:  # a journaled retry delay: wait out what is left
            await self._wait_until(view.retry_at, f"retry of step {view.number}")
            view.retry_at = None
        if view.tries_used >= act.retry.max_tries:
            await self._poison(act, view)
        return await self._tries(act, args, view, log)

    async def _poison(self, act: AnyActivity, view: StepView) -> NoReturn:
        """The step's tries ran out across attempts: fail it instead of looping forever."""
        used = view.tries_used
        if view.died and view.died >= used:
            # what the journal tells: each try's attempt ended with no outcome for it; not
            # whether its worker died or lost its lease (frozen, cut off, its disk full)
            why = (f"the worker died or lost its lease each time it ran (no try recorded an "
                   f"outcome; RetryPolicy.max_tries={act.retry.max_tries} across attempts)")
            error_type = "WorkerDied"
        else:
            why = (f"no tries left (RetryPolicy.max_tries={act.retry.max_tries} across "
                   f"attempts); the last: {view.error or 'no recorded outcome'}")
            error_type = view.error_type or "WorkerDied"
        data: dict[str, JSON] = {"error": why, "error_type": error_type, "summary": None}
        await self._fail_step(view, act, view.tries, data)
        self.attempt.log.warning("step_failed", step=view.number, activity=act.name,
                                 error=why)
        raise self._failure(view, act, used, why, error_type)

    async def _tries(self, act: AnyActivity, args: tuple[Any, ...], view: StepView,
                     log: Any) -> Any:
        attempt = self.attempt
        refuse_unknown(args)
        while True:
            number = view.tries + 1
            ctx = self._context(view, number)
            await attempt.write([JournalWrite(EntryKind.STEP_STARTED, view.number, view.key,
                                              act.name, number, {"args": list(args)})])
            view.state, view.epoch, view.tries = StepState.STARTED, self.epoch, number
            self.in_flight[view.key] = view
            log.debug("step_started", **{"try": number})
            chain = attempt.chain
            try:
                if chain is not None and chain.step:
                    result = await around(
                        chain.step, StepInfo(attempt.run, view.number, view.key, act.name,
                                             number, act.on_doubt),
                        functools.partial(_invoke, act, ctx, args))
                elif act.timeout is None:  # no interceptor: the call itself, no extra frame
                    result = await act.fn(ctx, *args)
                else:
                    with anyio.fail_after(act.timeout):
                        result = await act.fn(ctx, *args)
            except AttemptCancelled:
                raise
            except Exception as raised:
                exc = unwrapped(raised)  # the error inside the activity's own task group
                message = describe(exc)
                if isinstance(exc, TimeoutError) and act.timeout is not None:
                    message = (f"timed out after {act.timeout:g} s (the call in flight was "
                               f"aborted){ctx.pool_wait_note()}")
                # a value durable was handed and cannot journal (ctx.annotate's): the same
                # call would fail the same way, after the same effect
                retry = (not isinstance(exc, NotJsonError) and act.retry.retryable(exc)
                         and view.tries_used < act.retry.max_tries)
                data: dict[str, JSON] = {"error": message, "error_type": type(exc).__name__,
                                         "summary": ctx.summary}
                if retry:
                    delay = act.retry.delay(number, exc, self._rng)
                    data["retry_in"] = round(delay, 3)
                    release = (delay >= attempt.wait_threshold
                               and set(self.in_flight) == {view.key})
                    if release:  # a long delay: the run waits without a lease
                        view.retry_at = await attempt.store.now() + delay
                        data["retry_at"] = view.retry_at
                    await attempt.write([JournalWrite(EntryKind.STEP_RETRYING, view.number,
                                                      view.key, act.name, number, data)])
                    del self.in_flight[view.key]
                    view.state, view.error = None, message
                    view.error_type = type(exc).__name__
                    log.info("step_retrying", **{"try": number}, error=message, delay=delay)
                    if release and view.retry_at is not None:
                        raise self.suspend(Suspended(
                            view.retry_at, f"retry of step {view.number}")) from None
                    await anyio.sleep(delay)
                    continue
                await self._fail_step(view, act, number, data)
                log.warning("step_failed", **{"try": number}, error=message)
                raise self._failure(view, act, view.tries_used, message,
                                    type(exc).__name__) from exc
            outcome: dict[str, JSON] = {"result": result, "summary": ctx.summary,
                                        "ended_at": attempt.store.clock.now()}
            try:
                encoded = encoded_once(result, outcome,
                                       f"the result of activity {act.name}")
            except NotJsonError as exc:
                # a programming error, and the step's effect happened: never run it again
                message = (f"its result cannot be journaled ({type(result).__name__} "
                           f"returned): {exc}")
                await self._fail_step(view, act, number, {
                    "error": message, "error_type": "NotJsonError", "summary": ctx.summary})
                log.warning("step_failed", **{"try": number}, error=message)
                raise self._failure(view, act, view.tries_used, message,
                                    "NotJsonError") from exc
            if encoded is not None:  # a container: handed over as the journal holds it
                result = as_journaled(encoded)
            done = JournalWrite(EntryKind.STEP_COMPLETED, view.number, view.key, act.name,
                                number, outcome, encoded=encoded)
            if act.on_doubt == "retry":
                # idempotent: its completion commits with the next journal write (one commit
                # instead of two); a crash in between only makes the step run again
                attempt.defer(done)
            else:
                await attempt.write([done])
            del self.in_flight[view.key]
            view.state, view.result, view.result_known = StepState.COMPLETED, result, True
            log.debug("step_completed", **{"try": number})
            return result
