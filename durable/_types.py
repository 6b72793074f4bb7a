"""Frozen value types shared by the engine, the store and the client."""

from __future__ import annotations

import enum
import json
import json.encoder
import math
import re
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from ._errors import ConfigError, NotJsonError

JSON = Any
"""A JSON value: None, bool, int, float, str, list or dict of JSON values."""


class RunState(enum.StrEnum):
    """The state of a run."""

    QUEUED = "queued"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def finished(self) -> bool:
        return self in (RunState.COMPLETED, RunState.FAILED, RunState.CANCELLED)


class StepState(enum.StrEnum):
    """The state of a step, derived from its journal entries."""

    STARTED = "started"
    COMPLETED = "completed"
    FAILED = "failed"
    IN_DOUBT = "in_doubt"


class EntryKind(enum.StrEnum):
    """Kinds of journal entries. The journal is append-only."""

    RUN_CREATED = "run_created"
    RUN_CLAIMED = "run_claimed"
    RUN_COMPLETED = "run_completed"
    RUN_FAILED = "run_failed"
    RUN_CANCELLED = "run_cancelled"
    RUN_CANCEL_REQUESTED = "run_cancel_requested"
    RUN_INTERRUPTED = "run_interrupted"
    RUN_RECOVERED = "run_recovered"
    RUN_REPLAYED = "run_replayed"
    STEP_STARTED = "step_started"
    STEP_COMPLETED = "step_completed"
    STEP_FAILED = "step_failed"
    STEP_RETRYING = "step_retrying"
    STEP_IN_DOUBT = "step_in_doubt"
    VALUE = "value"
    TIMER_STARTED = "timer_started"
    """``ctx.sleep``: the wake time (``until``), journaled once; a re-execution reuses it."""
    TIMER_FIRED = "timer_fired"
    WAIT_STARTED = "wait_started"
    """``ctx.wait_for``: the signal's ``name`` and the timeout's time (``until``, or None)."""
    SIGNAL_RECEIVED = "signal_received"
    """A ``wait_for`` consumed a signal: its ``name``, ``seq`` and ``payload``."""
    SIGNAL_TIMEOUT = "signal_timeout"
    SIGNAL_SENT = "signal_sent"
    """A signal was recorded for the run (``name``, ``seq``, ``signal_id``, ``origin``; the
    payload is journaled when a ``wait_for`` receives it)."""
    RUN_WAITING = "run_waiting"
    """The attempt ended to wait without a lease: ``until`` (None: for a signal only),
    ``reason`` (``sleep``, ``signal``, ``retry``) and ``signal`` (a name, or None)."""


NEVER = 253402300799.0
"""``run_at`` of a run that waits for a signal without a timeout (9999-12-31T23:59:59Z):
due only when a signal makes it due."""


def _not_json(value: object) -> Any:
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


_ENCODE = json.JSONEncoder(separators=(",", ":"), allow_nan=False).encode
"""The standard library's encoder (pure Python where the C one is missing)."""


class _Encoders(threading.local):
    """Each thread's C encoder of :data:`_ENCODE`'s options, made once per thread:
    ``JSONEncoder.encode`` makes a new one on every call, which cost more than encoding a
    step's entry (docs/benchmarks.md, *Where a sequential step's time goes*). Same text,
    same refusals (NaN and infinities, circular references). One per thread: its record
    of the containers it is inside (``markers``) lives from call to call, and another
    thread may run while an encoding calls back into Python (:func:`_not_json`)."""

    def __init__(self) -> None:
        self.markers: dict[int, object] = {}
        make = getattr(json.encoder, "c_make_encoder", None)
        self.encode = None if make is None else make(
            self.markers, _not_json, json.encoder.encode_basestring_ascii, None, ":", ",",
            False, False, False)


_ENCODERS = _Encoders()


def check_seconds(value: Any, what: str, *, zero: bool = False) -> float:
    """``value`` as seconds: a finite number (not a bool), positive, or 0 or more with
    ``zero``; else a ConfigError, ``"{what} must be positive seconds, not nan"``. NaN
    compares false with every bound, so a plain range check lets it through (a deadline or
    a delay of NaN), and infinity is a time that never comes."""
    if (isinstance(value, bool) or not isinstance(value, (int, float))
            or not math.isfinite(value) or value < 0 or (value == 0 and not zero)):
        raise ConfigError(
            f"{what} must be {'0 or more' if zero else 'positive'} seconds, not {value!r}")
    if value > MAX_SECONDS:
        raise ConfigError(f"{what} must be at most 100 years ({MAX_SECONDS:.0f} s), not "
                          f"{value!r}")
    return float(value)


def check_count(value: Any, what: str) -> int:
    """``value`` as a count of 1 or more: an int, not a bool (True is not a count); else a
    ConfigError, ``"{what} must be at least 1 (a whole number), not 1.5"``. NaN and 1.5
    pass a plain ``value < 1`` check."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{what} must be at least 1 (a whole number), not {value!r}")
    return value


MAX_SECONDS = 100 * 365.25 * 86400
"""The longest span any option takes (a timeout, a delay, a sleep, an age): 100 years. A
finite number of seconds past that (``--delay 1e300``) was stored, and then every line that
showed the run's time failed (a year beyond 9999)."""


def check_key(key: Any) -> str | None:
    """A concurrency key: None (no key) or a non-empty string. An empty one (``--key
    "$SLOT"`` with SLOT unset) would make every such run share one key and wait for the
    others."""
    if key is not None and (not isinstance(key, str) or not key.strip()):
        raise ConfigError(f"a concurrency key must be a non-empty string, not {key!r}")
    if key is not None:
        check_printable(key, "a concurrency key")
    return key


NAME_MAX = 1000
"""The longest run id or concurrency key, in characters (as Temporal's workflow ids)."""

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]")

UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
"""The characters no store can hold: a NUL (PostgreSQL's text and jsonb refuse it) and a
lone surrogate (not UTF-8: Python's way of carrying bytes that are not, from a file name or
a process's output decoded with ``surrogateescape``). SQLite took both: written, such text
is refused alike on every store (:func:`check_printable`, :func:`dumps`); only looked up,
it matches nothing (the PostgreSQL store does not send the lookup)."""


def check_printable(text: str, what: str) -> str:
    """A run id or a key as every line that names it can show it: at most
    :data:`NAME_MAX` characters, no control character. A newline in an id split the rows of
    ``durable list``; an escape sequence reached the operator's terminal as a command
    (``\\x1b[31m``); a 100,000-character id was taken and printed whole."""
    if len(text) > NAME_MAX:
        raise ConfigError(f"{what} must be at most {NAME_MAX} characters, not {len(text)}")
    found = _CONTROL.search(text)
    if found is not None:
        raise ConfigError(f"{what} must not hold control characters ({found.group()!r} at "
                          f"{found.start()}): {text[:60]!r}")
    return text


def check_step_key(key: Any) -> str:
    """A new step's key (``ctx.step(..., key=)``, ``ctx.set_records(..., key=)``): a string
    that :func:`check_printable` takes. Another type was journaled as its ``str()``
    (``('a',)``), and a key with an escape sequence reached the terminal of ``show``."""
    if not isinstance(key, str):
        raise ConfigError(f"a step key must be a string, not {key!r}"[:200])
    return check_printable(key, "a step key")


MAX_JSON_DEPTH = 100
"""How deep a journaled value's arrays and objects may nest. Reading a value back (a
resumed attempt folding its journal, the console redacting it for a page) recurses once
per level, on a stack already some hundred frames deep, and Python's limit is a thousand:
a value nested 500 deep was journaled and then broke every later read of its run (a
console's run API answered 500 for good), and one nested 2,000 deep escaped the encoder
as a RecursionError. So no such value is written: :func:`dumps` refuses it."""

_CONTAINERS = (list, tuple, dict)


def _too_deep(value: JSON, text: str, limit: int) -> bool:
    """Whether ``value`` (encoded as ``text``) nests deeper than ``limit``. A text with no
    more brackets than that cannot (counted at C speed: most values); else the containers
    are walked a level at a time, stopping at the limit."""
    if (not isinstance(value, _CONTAINERS)
            or text.count("[") + text.count("{") <= limit):
        return False
    level: list[Any] = [value]
    for _ in range(limit):
        inner: list[Any] = []
        for container in level:
            inner.extend([item for item in (
                container.values() if isinstance(container, dict) else container)
                if isinstance(item, _CONTAINERS)])
        if not inner:
            return False
        level = inner
    return True


def dumps(value: JSON, what: str = "value", *, around: int = 0) -> str:
    """Encode a JSON value, or raise NotJsonError naming what was not JSON (or nested
    deeper than :data:`MAX_JSON_DEPTH`). ``around``: the levels that hold such values
    (``1``: a list of arguments, a step entry's ``{"result": ...}``; ``2``: a journal
    entry's data, ``{"args": [...]}``), allowed on top."""
    encoders = _ENCODERS
    try:
        if encoders.encode is None or type(value) is str:
            text = _ENCODE(value)
        else:
            text = "".join(encoders.encode(value, 0))
    except (TypeError, ValueError) as exc:
        encoders.markers.clear()  # a failed encoding leaves its containers recorded
        raise NotJsonError(f"{what} must be JSON values: {exc}") from exc
    except RecursionError:  # deeper than the stack allows: far deeper than the limit
        encoders.markers.clear()
        raise _too_deep_error(what) from None
    if _too_deep(value, text, MAX_JSON_DEPTH + around):
        raise _too_deep_error(what)
    if ("\\u0000" in text or "\\ud" in text) and (found := _unstorable(value)) is not None:
        # (escaped by the encoder; "\\ud" is also a character beyond the BMP, a pair)
        raise NotJsonError(f"{what} must not hold {found!r} (a NUL or a lone surrogate: "
                           "no store can hold it)")
    return text


def _unstorable(value: Any) -> str | None:
    """The first character of :data:`UNSTORABLE` in a string of ``value`` (keys too)."""
    level: list[Any] = [value]
    while level:
        inner: list[Any] = []
        for item in level:
            if isinstance(item, str):
                if (found := UNSTORABLE.search(item)) is not None:
                    return found.group()
            elif isinstance(item, dict):
                inner.extend(item)
                inner.extend(item.values())
            elif isinstance(item, list | tuple):
                inner.extend(item)
        level = inner
    return None


def _too_deep_error(what: str) -> NotJsonError:
    return NotJsonError(f"{what} must be JSON values nested at most {MAX_JSON_DEPTH} deep")


def loads(text: str | None) -> JSON:
    return None if text is None else json.loads(text)


@attrs.frozen
class Run:
    """One run of a workflow, as stored."""

    id: str
    workflow: str
    args: list[JSON]
    key: str | None
    state: RunState
    epoch: int
    attempt: int
    run_at: float
    created_at: float
    updated_at: float
    worker: str | None = None
    lease_expires_at: float | None = None
    heartbeat_at: float | None = None
    cancel_requested: bool = False
    result: JSON = None
    error: str | None = None
    timeout: float | None = None
    recoveries: int = 0
    """How many times the run's lease expired and the run was recovered (see max_recoveries)."""
    waiting_for: str | None = None
    """A queued run released to wait for a signal: the signal's name (its ``run_at`` is the
    wait's timeout, or :data:`NEVER`). None otherwise; a sleeping run is queued with its
    wake time as ``run_at``."""
    start_within: float | None = None
    """Seconds after it is due within which its first attempt must be claimed (by
    :attr:`start_by`), or that attempt fails it without running any workflow code (None: no
    limit of its own; the workflow's, if any). See docs/design.md, "A run that starts too
    late"."""

    @staticmethod
    def scope_of(run_id: str, key: str | None) -> str:
        """The fencing scope of a run: ``key:<key>``, or ``run:<id>`` for a run without one."""
        return f"run:{run_id}" if key is None else f"key:{key}"

    @property
    def fencing_scope(self) -> str:
        """Where this run's fencing token (epoch) is compared: see docs/design.md.

        Tokens strictly increase within a scope (the concurrency key, whose holder the lease
        protects, or the run itself when it has no key); tokens of different scopes are
        unrelated and a service must not compare them.
        """
        return Run.scope_of(self.id, self.key)

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Run:
        return cls(
            id=row["id"],
            workflow=row["workflow"],
            args=loads(row["args"]),
            key=row["concurrency_key"],
            state=RunState(row["state"]),
            epoch=int(row["epoch"]),
            attempt=int(row["attempt"]),
            run_at=float(row["run_at"]),
            created_at=float(row["created_at"]),
            updated_at=float(row["updated_at"]),
            worker=row["worker"],
            lease_expires_at=_opt_float(row["lease_expires_at"]),
            heartbeat_at=_opt_float(row["heartbeat_at"]),
            cancel_requested=bool(row["cancel_requested"]),
            result=loads(row["result"]),
            error=row["error"],
            timeout=_opt_float(row["timeout"]),
            recoveries=int(row["recoveries"]),
            waiting_for=_optional(row, "waiting_for"),
            start_within=_opt_float(_optional(row, "start_within")),
        )

    @property
    def start_by(self) -> float | None:
        """When a run with :attr:`start_within` must have its first attempt claimed by, on the
        store's clock: that long after it is due, or after its creation when it was due
        before it existed (a ``run_at`` in the past, a schedule's caught-up fire). None
        without a limit of its own. Meaningful until its first claim (a release moves
        ``run_at``)."""
        if self.start_within is None:
            return None
        return max(self.run_at, self.created_at) + self.start_within

    def evolve(self, **changes: Any) -> Run:
        return attrs.evolve(self, **changes)


@attrs.frozen(eq=False)
class StartedRun(Run):
    """What :meth:`Client.start <durable.Client.start>` returns: the run, and whether this
    start queued it. It compares (and hashes) as the :class:`Run` it is: equal to the run
    read back from the store."""

    created: bool = attrs.field(default=False, kw_only=True)
    """True when this start queued the run (or a send of it whose answer was lost did);
    False when a run of that id was there before, of the same workflow, arguments and key:
    a start again, idempotent, that returns that run as it is (in whatever state) and
    queues nothing."""

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Run):
            return NotImplemented
        return all(getattr(self, f.name) == getattr(other, f.name) for f in attrs.fields(Run))

    __hash__ = Run.__hash__

    @classmethod
    def of(cls, run: Run, created: bool) -> StartedRun:
        return cls(**{f.name: getattr(run, f.name) for f in attrs.fields(Run)},
                   created=created)


def _optional(row: Mapping[str, Any], column: str) -> Any:
    """A column added by a later migration (absent from rows of an explicit column list)."""
    try:
        return row[column]
    except (IndexError, KeyError):  # sqlite3.Row, a mapping
        return None


def _opt_float(value: Any) -> float | None:
    return None if value is None else float(value)


@attrs.frozen
class NewRun:
    """What the client asks the store to create."""

    id: str
    workflow: str
    args: list[JSON]
    key: str | None
    run_at: float | None
    """When the run is due, in store seconds; None: at once, the store's time of the insert
    (PostgreSQL: the server's, in the INSERT itself: no round trip to ask for it first)."""
    timeout: float | None = None
    headers: Mapping[str, str] | None = attrs.field(default=None, kw_only=True)
    """Kept in the run's ``run_created`` entry (``data["headers"]``) when given: what the
    client's interceptors attach to the run (a trace context), never a secret."""
    start_within: float | None = attrs.field(default=None, kw_only=True)
    """Seconds after it is due within which the run must start (:attr:`Run.start_within`);
    also kept in its ``run_created`` entry (``data["start_within"]``) when given."""


@attrs.frozen
class PausedWorkflow:
    """A workflow an operator paused: no attempt of it starts until it is resumed
    (docs/design.md, "Pausing a workflow")."""

    workflow: str
    paused_at: float
    """When, on the store's clock."""
    origin: Mapping[str, JSON] | None = None
    """Who paused it (``{"via": "cli", "user": ..., "host": ...}``), as given."""
    known: bool | None = attrs.field(default=None, eq=False, kw_only=True)
    """Told by :meth:`Client.pause <durable.Client.pause>` only: False when neither a run in
    the database nor the client's registry knows the workflow (a typo; or a workflow paused
    before its first start, on purpose: it is paused all the same), True when either does.
    None on a pause read back (``paused``, ``pause_of``). Not compared, not in the JSON."""

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> PausedWorkflow:
        return cls(row["workflow"], float(row["paused_at"]), loads(row["origin"]))


@attrs.frozen
class Fence:
    """The identity of an attempt: every write it makes is conditioned on it."""

    run_id: str
    epoch: int


@attrs.frozen
class JournalWrite:
    """A journal entry an attempt asks to append.

    Two counters, never mixed: ``try_number`` is the step's try (one execution of the step,
    1-based, as :attr:`durable.ActivityContext.try_number`) and is set on step entries only;
    ``attempt`` is the run's attempt (a claim) and is set on ``run_claimed`` only.
    """

    kind: EntryKind
    step: int | None = None
    step_key: str | None = None
    name: str | None = None
    try_number: int | None = None
    data: Mapping[str, JSON] | None = None
    attempt: int | None = attrs.field(default=None, kw_only=True)
    encoded: str | None = attrs.field(default=None, kw_only=True, eq=False, repr=False)
    """``data`` as journal text, when whoever made the entry encoded it already (to check
    a result): the store writes it as is (:meth:`data_json`)."""

    def data_json(self) -> str | None:
        """The journal text of ``data`` (None: no data)."""
        if self.encoded is not None:
            return self.encoded
        data = self.data
        if data is None:
            return None
        return dumps(data if type(data) is dict else dict(data), "journal data", around=2)

    @property
    def attempt_column(self) -> int | None:
        """The value stored in the journal's ``attempt`` column (see :class:`JournalEntry`)."""
        return self.try_number if self.step is not None else self.attempt


@attrs.frozen
class JournalEntry:
    """A journal entry as stored.

    ``try_number`` (step entries) is the step's try; ``attempt`` (``run_claimed``) is the
    run's attempt. Both live in the journal's one ``attempt`` column, which keeps its name
    (no migration): on a row with a step it holds the try, on a run row the attempt.
    """

    seq: int
    run_id: str
    epoch: int
    kind: EntryKind
    at: float
    step: int | None = None
    step_key: str | None = None
    name: str | None = None
    try_number: int | None = None
    data: Mapping[str, JSON] = attrs.field(factory=dict)
    attempt: int | None = attrs.field(default=None, kw_only=True)

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> JournalEntry:
        step = row["step"]
        counter = row["attempt"]
        return cls(
            seq=int(row["seq"]),
            run_id=row["run_id"],
            epoch=int(row["epoch"]),
            kind=EntryKind(row["kind"]),
            at=float(row["at"]),
            step=step,
            step_key=row["step_key"],
            name=row["name"],
            try_number=counter if step is not None else None,
            attempt=counter if step is None else None,
            data=loads(row["data"]) or {},
        )


def journaled_as(entries: Sequence[JournalEntry], writes: Sequence[JournalWrite]) -> bool:
    """Whether ``entries`` are ``writes`` as journaled, in order (kind, step, key, name and
    try: an attempt journals a step's try once, so they tell a write read back)."""
    return [(e.kind, e.step, e.step_key, e.name, e.try_number) for e in entries] == [
        (w.kind, w.step, w.step_key, w.name, w.try_number) for w in writes]


@attrs.frozen
class Renewal:
    """The answer to a lease renewal for one run."""

    run_id: str
    epoch: int
    cancel_requested: bool


@attrs.frozen
class Record:
    """A fenced application record (for example a slot), written only by attempts."""

    namespace: str
    key: str
    value: JSON
    epoch: int
    updated_at: float
    version: int = 1
    """Counts the record's writes (1 after the first); 0 stands for "absent" in a
    compare-and-set (:meth:`durable.store.Store.put_records` ``expected``)."""


@attrs.frozen
class Signal:
    """A signal sent to a run (:meth:`durable.Client.signal`), as stored."""

    seq: int
    name: str
    payload: JSON
    created_at: float
    signal_id: str | None = None
    origin: JSON = None


@attrs.frozen
class SignalSent:
    """What a store did with a signal: ``state`` is the run's (None: no such run); ``seq``
    the new signal's number, None when nothing was recorded (its id was already recorded,
    or the run is finished or missing)."""

    state: RunState | None
    seq: int | None


@attrs.frozen
class Finish:
    """A held run's move to a final state, as :meth:`durable.store.Store.finish` takes it:
    handed to :meth:`durable.store.Store.claim_with` to commit with the worker's next claim."""

    fence: Fence
    state: RunState
    result: JSON = None
    error: str | None = None
    entries: tuple[JournalWrite, ...] = ()


@attrs.frozen
class ClaimOutcome:
    """What :meth:`durable.store.Store.claim_with` did.

    ``finished``: one outcome per :class:`Finish` given (as ``finish`` returns it).
    ``run``: the run as claimed (None: it was not claimable any more, nothing of it changed).
    ``appended``: the run was claimed as the caller expected (the attempt number it
    predicted, no pending cancel) and the entries were appended under the new epoch; False
    with a ``run``: the claim holds, the entries were not written.
    """

    finished: tuple[bool, ...]
    run: Run | None
    appended: bool
