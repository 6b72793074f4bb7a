"""Schedules: runs of a workflow started on a cron calendar (docs/design.md, "Schedules").

A schedule is stored in the database (``durable_schedules``): declared in code with
:func:`schedule` (the worker writes it at start) or created at run time (``python -m durable
schedule add``). Every worker runs the scheduler (:class:`Scheduler`): each fire of a
schedule starts one run whose id is ``<name>@<fire time, ISO UTC>``. The fire and the
schedule's advance are one conditional write (a compare-and-set on the schedule's version,
with the run's insert, which does nothing when the id exists): however many workers see the
fire, one run starts.

Cron expressions are read by croniter: five fields, or six with the seconds last
(``"*/10 * * * * *"``... is every second of every tenth minute; ``"* * * * * */10"`` every ten
seconds), evaluated in the schedule's IANA timezone (``zoneinfo``).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import math
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import attrs
from croniter import CroniterBadDateError, CroniterError, croniter

from ._errors import ConfigError
from ._logging import get_logger
from ._types import JSON, NewRun, check_key, check_printable, dumps, loads

if TYPE_CHECKING:
    from ._registry import Registry, Workflow
    from .store import Store

SKIP_GRACE = 60.0
"""A fire found at most this many seconds after its time is on time and starts, whatever the
policy; an older one was missed (no scheduler ran) and follows ``catchup`` (skipped, or one
of the N latest missed ones started)."""

ON_TIME_MAX = 1_000
"""At most this many fires on time in one tick (a six-field cron fires at most once a
second: 61 within the grace)."""

CRON_SEARCH_YEARS = 50
"""How far croniter looks for a cron's next (or previous) fire, its default. Whatever exists
in the calendar comes round within 40 years (29 February on a given weekday: 2072, then
2112), so an expression croniter finds no fire of in this span never fires."""

NEVER_FIRES_FROM = dt.datetime(2000, 1, 1, tzinfo=dt.UTC)
"""Where a cron is checked to fire: a fixed time, so whether it is accepted does not depend
on when (from any time, a cron that fires at all does within the search)."""

_CRON_ERRORS = (CroniterError, ValueError, LookupError, TypeError, OverflowError)
"""What croniter and zoneinfo raise for what they cannot compute."""

CatchUp = Literal["skip"] | int
_NAME = re.compile(r"[^\s@]+")


def check_name(name: object) -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ConfigError(f"a schedule name must be a non-empty string without spaces or '@', "
                          f"not {name!r}")
    return check_printable(name, "a schedule name")


def check_cron(cron: object) -> str:
    """The cron expression, if croniter reads it with five or six (seconds) fields."""
    if not isinstance(cron, str) or not cron.strip():
        raise ConfigError(f"a cron expression must be a non-empty string, not {cron!r}")
    text = " ".join(cron.split())
    fields = len(text.split(" "))
    if not text.startswith("@") and fields not in (5, 6):
        raise ConfigError(f"bad cron expression {cron!r}: give 5 fields (minute hour day "
                          f"month weekday) or 6 (the same and seconds), not {fields}")
    try:
        it = croniter(text, NEVER_FIRES_FROM)
    except (CroniterError, ValueError, KeyError) as exc:
        raise ConfigError(f"bad cron expression {cron!r}: {exc}") from None
    # valid fields may name no date (30 February): a schedule that never fires would be
    # written, and then every computation of its fires would fail
    try:
        it.get_next(float)
    except _CRON_ERRORS as exc:
        raise ConfigError(_cannot_fire(text, exc)) from None
    return text


def _cannot_fire(cron: str, exc: Exception, timezone: str = "UTC") -> str:
    if isinstance(exc, CroniterBadDateError):
        return (f"cron {cron!r} never fires (no date matches it: croniter finds none in "
                f"{CRON_SEARCH_YEARS} years)")
    return f"cron {cron!r} in timezone {timezone!r} cannot fire ({type(exc).__name__}: {exc})"


def check_timezone(name: object) -> str:
    if not isinstance(name, str) or not name:
        raise ConfigError(f"a timezone must be an IANA name such as 'Europe/Paris', "
                          f"not {name!r}")
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ConfigError(f"unknown timezone {name!r}: give an IANA name such as "
                          "'UTC' or 'Europe/Paris'") from None
    return name


def check_catchup(value: object) -> int:
    """``"skip"`` is 0 (so is 0); a catch-up of up to N fires is N."""
    if value == "skip":
        return 0
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"catchup must be 'skip' or a whole number of fires, not {value!r}")
    return value


def catchup_text(catchup: int) -> str:
    return "skip" if catchup == 0 else f"up to {catchup}"


def fire_id(name: str, fire_at: float) -> str:
    """The id of the run a fire starts: ``<name>@2026-12-01T03:00:00Z``."""
    when = dt.datetime.fromtimestamp(fire_at, dt.UTC)
    text = when.strftime("%Y-%m-%dT%H:%M:%S")
    if when.microsecond:
        text += f".{when.microsecond:06d}"
    return f"{name}@{text}Z"


def iso(when: float | None) -> str | None:
    if when is None:
        return None
    return dt.datetime.fromtimestamp(when, dt.UTC).isoformat().replace("+00:00", "Z")


@attrs.frozen
class ScheduleSpec:
    """What a schedule starts and when: its definition, validated."""

    name: str = attrs.field(converter=check_name)
    workflow: str
    args: list[JSON]
    cron: str = attrs.field(converter=check_cron)
    timezone: str = attrs.field(default="UTC", converter=check_timezone)
    key: str | None = None
    catchup: int = attrs.field(default=0, converter=check_catchup)

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.workflow, str) or not self.workflow:
            raise ConfigError("a schedule's workflow must be a workflow name")
        if not isinstance(self.args, list):
            raise ConfigError("a schedule's args must be a list of JSON values")
        check_key(self.key)
        dumps(self.args, "schedule arguments", around=1)

    @classmethod
    def stored(cls, **fields: Any) -> ScheduleSpec:
        """A definition as stored, not checked again (it was when written): one that no
        longer passes the checks (a cron that never fires, written by an older version) is
        still read and listed, and the scheduler skips it, where a refusal here would fail
        every read of the schedules."""
        spec = object.__new__(cls)
        for field in attrs.fields(cls):
            object.__setattr__(spec, field.name, fields[field.name])
        return spec

    def same_definition(self, other: ScheduleSpec) -> bool:
        return attrs.astuple(self) == attrs.astuple(other)

    def next_fire(self, after: float) -> float:
        """The first fire time strictly after ``after``; a :class:`ConfigError` if the fires
        cannot be computed (a stored definition is not checked again: :meth:`stored`)."""
        with self._computing():
            zone = ZoneInfo(self.timezone)
            it = croniter(self.cron, dt.datetime.fromtimestamp(after, zone))
            while True:
                when = float(it.get_next(float))
                if not self._repeated(when, zone):
                    return when

    def latest_fires(self, after: float, until: float, limit: int) -> list[float]:
        """Up to ``limit`` fire times ``t`` with ``after < t <= until``, the latest ones,
        oldest first (read backwards from ``until``, so a long gap costs ``limit`` steps).
        A :class:`ConfigError` as :meth:`next_fire`."""
        with self._computing():
            return self._latest_fires(after, until, limit)

    @contextlib.contextmanager
    def _computing(self) -> Iterator[None]:
        """croniter's and zoneinfo's errors as one ConfigError saying why the schedule
        cannot fire."""
        try:
            yield
        except _CRON_ERRORS as exc:
            raise ConfigError(_cannot_fire(self.cron, exc, self.timezone)) from exc

    def _latest_fires(self, after: float, until: float, limit: int) -> list[float]:
        zone = ZoneInfo(self.timezone)
        # get_prev is strict: from just after `until`, a fire at `until` itself is found
        start = dt.datetime.fromtimestamp(until, zone) + dt.timedelta(microseconds=1)
        it = croniter(self.cron, start)
        found: list[float] = []
        while len(found) < limit:
            when = float(it.get_prev(float))
            if when <= after:
                break
            if not self._repeated(when, zone):
                found.append(when)
        found.reverse()
        return found

    def _repeated(self, when: float, zone: ZoneInfo) -> bool:
        """Whether ``when`` is a fire this schedule does not start: the second time a wall
        time comes round when the clocks go back (``fold`` 1), for a schedule at fixed times
        of the day. As Vixie cron does: a daily ``30 2 * * *`` fires once in the night the
        hour from 02:00 to 03:00 comes twice (at its first 02:30), where croniter gives both
        (a nightly reset would run twice); an expression whose minute or hour field starts
        with ``*`` (``0 * * * *``, ``*/15 1-3 * * *``) runs on the clock's elapsed time and
        fires in both. The gap when the clocks go forward is croniter's: a wall time that
        does not exist that day fires once, at the gap's end."""
        return self._fixed_time and dt.datetime.fromtimestamp(when, zone).fold == 1

    @property
    def _fixed_time(self) -> bool:
        fields = _ALIASES.get(self.cron.lower(), self.cron).split(" ")
        return not (fields[0].startswith("*") or fields[1].startswith("*"))


_ALIASES = {"@yearly": "0 0 1 1 *", "@annually": "0 0 1 1 *", "@monthly": "0 0 1 * *",
            "@weekly": "0 0 * * 0", "@daily": "0 0 * * *", "@midnight": "0 0 * * *",
            "@hourly": "0 * * * *"}
"""croniter's nicknames, as the expressions they stand for (for the fixed-time rule)."""


@attrs.frozen
class Schedule:
    """A schedule as stored: its definition and its state."""

    spec: ScheduleSpec
    paused: bool
    fired_through: float
    """Fires at or before this time are done with (started, or skipped by the policy)."""
    last_fire_at: float | None
    last_run_id: str | None
    version: int
    """Counts the schedule's writes: every change is a compare-and-set on it."""
    origin: str
    """``"code"`` (declared with :func:`schedule`, written by each worker at start) or
    ``"cli"`` (created at run time)."""
    created_at: float
    updated_at: float

    @property
    def name(self) -> str:
        return self.spec.name

    def next_fire(self) -> float:
        """The next fire time not yet done with (in the past when a fire is due); a
        :class:`ConfigError` if it cannot be computed."""
        return self.spec.next_fire(self.fired_through)

    def next_fire_or_why(self) -> tuple[float | None, str | None]:
        """The next fire time, or None and why the schedule cannot fire (a stored definition
        croniter refuses: listed, saying so, not an error)."""
        try:
            return self.next_fire(), None
        except ConfigError as exc:
            return None, str(exc)

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Schedule:
        spec = ScheduleSpec.stored(
            name=row["name"], workflow=row["workflow"], args=loads(row["args"]),
            cron=row["cron"], timezone=row["timezone"], key=row["concurrency_key"],
            catchup=int(row["catchup"]))
        return cls(spec=spec, paused=bool(row["paused"]),
                   fired_through=float(row["fired_through"]),
                   last_fire_at=None if row["last_fire_at"] is None
                   else float(row["last_fire_at"]),
                   last_run_id=row["last_run_id"], version=int(row["version"]),
                   origin=row["origin"], created_at=float(row["created_at"]),
                   updated_at=float(row["updated_at"]))

    def to_json(self) -> dict[str, JSON]:
        """The shape of ``schedule list --json`` and ``schedule show --json``."""
        nxt, why = self.next_fire_or_why()
        return {
            "name": self.name, "workflow": self.spec.workflow, "args": self.spec.args,
            "cron": self.spec.cron, "timezone": self.spec.timezone, "key": self.spec.key,
            "catchup": catchup_text(self.spec.catchup).replace("up to ", ""),
            "paused": self.paused,
            "next_fire_at": None if self.paused else iso(nxt), "cannot_fire": why,
            "last_fire_at": iso(self.last_fire_at), "last_run_id": self.last_run_id,
            "origin": self.origin, "created_at": iso(self.created_at),
        }


def schedule_params(spec: ScheduleSpec) -> dict[str, Any]:
    """A definition's columns, as both stores' queries name them."""
    return {"name": spec.name, "workflow": spec.workflow,
            "args": dumps(spec.args, "schedule arguments", around=1), "cron": spec.cron,
            "timezone": spec.timezone, "key": spec.key, "catchup": spec.catchup}


def schedule(
    name: str,
    workflow: Workflow[..., Any] | str,
    args: Sequence[JSON] = (),
    *,
    cron: str,
    timezone: str = "UTC",
    key: str | None = None,
    catchup: CatchUp = "skip",
    registry: Registry | None = None,
) -> ScheduleSpec:
    """Declare a schedule: start ``workflow(*args)`` at every fire of ``cron`` (croniter's
    five fields, or six with the seconds last), read in ``timezone`` (an IANA name).

    Each fire starts one run with the id ``<name>@<fire time, ISO UTC>`` and concurrency
    key ``key``, however many workers run the scheduler; every fire found within
    :data:`SKIP_GRACE` of its time starts. ``catchup`` says what happens to fires missed
    while no worker ran (found later than that): ``"skip"`` (skipped; the next one starts on
    time) or ``N``, start up to the N latest of the missed fires, oldest first. Every
    worker with this registry writes the declaration to the store at start (keeping the
    schedule's paused flag and what it fired); ``python -m durable schedule pause NAME``
    pauses it.
    """
    from ._registry import Workflow, default_registry

    if isinstance(workflow, Workflow):  # arguments it could not take: a TypeError, now
        workflow.arguments(tuple(args), {})
    spec = ScheduleSpec(name=name, workflow=workflow.name if isinstance(workflow, Workflow)
                        else workflow, args=list(args), cron=cron, timezone=timezone,
                        key=key, catchup=catchup)
    (registry or default_registry).add_schedule(spec)
    return spec


class Scheduler:
    """Fires a store's due schedules (the worker runs one: :meth:`durable.Worker.run`).

    :meth:`tick` reads the schedules and, for each one not paused with fires due, starts
    them by :meth:`Store.fire_schedule`: one conditional write that advances the schedule
    from the version it read and creates the fire's run, or changes nothing (another worker
    fired it first, or the schedule changed since the read: it is read again next tick).
    """

    def __init__(self, store: Store, *, on_start: Callable[[], None] | None = None,
                 worker: str | None = None) -> None:
        self.store = store
        self.on_start = on_start
        self.log = get_logger("durable.scheduler", worker=worker)
        self.started = 0
        """Runs this scheduler started."""
        self.ticks_begun = 0
        self.ticks = 0
        """Ticks begun and ticks done (a tick begun after the clock moved saw it)."""
        self._unfireable: dict[str, str] = {}
        """The schedules that cannot fire, and why, as logged (once, not every tick)."""

    async def declare(self, specs: Sequence[ScheduleSpec]) -> None:
        """Write the schedules declared in code (their definitions; state is kept)."""
        for spec in specs:
            _found, changed = await self.store.put_schedule(spec, origin="code", replace=True)
            if changed:
                self.log.info("schedule_declared", schedule=spec.name, cron=spec.cron,
                              timezone=spec.timezone, workflow=spec.workflow)

    async def tick(self) -> float | None:
        """Start what is due now; return the next fire time of any active schedule."""
        self.ticks_begun += 1
        try:
            return await self._tick()
        finally:
            self.ticks += 1

    async def _tick(self) -> float | None:
        now = await self.store.now()
        upcoming: float | None = None
        unfireable: dict[str, str] = {}
        for sched in await self.store.list_schedules():
            if sched.paused:
                continue
            try:
                late, on_time = self._due(sched, now)
                # every fire up to now is done with once they start (here or by another
                # worker; a schedule that changed under this tick is read again at the next)
                when = sched.spec.next_fire(max(sched.fired_through, now))
            except ConfigError as exc:
                # a stored definition whose fires cannot be computed (a cron that never
                # fires, written before it was refused): skipped, the others fire
                why = str(exc)
                if self._unfireable.get(sched.name) != why:
                    self.log.error("schedule_cannot_fire", schedule=sched.name,
                                   cron=sched.spec.cron, timezone=sched.spec.timezone,
                                   error=why)
                self._unfireable[sched.name] = unfireable[sched.name] = why
                continue
            await self._fire_due(sched, now, late, on_time)
            upcoming = when if upcoming is None else min(upcoming, when)
        self._unfireable = unfireable  # logged again if it comes back after a fix
        return upcoming

    def _due(self, sched: Schedule, now: float) -> tuple[list[float], list[float]]:
        """The fires due now: those missed (at most ``catchup``, or the latest when
        skipped) and those on time."""
        spec = sched.spec
        # every fire found within the grace is on time and starts, whatever the policy (a
        # scheduler held up for a while finds several of a frequent schedule due at once);
        # the policy rules the older ones: skipped, or the `catchup` latest of them started
        # a fire SKIP_GRACE old is still on time (latest_fires' `after` is exclusive)
        grace_from = max(sched.fired_through, math.nextafter(now - SKIP_GRACE, -math.inf))
        on_time = spec.latest_fires(grace_from, now, ON_TIME_MAX)
        late = (spec.latest_fires(sched.fired_through, grace_from, spec.catchup or 1)
                if grace_from > sched.fired_through else [])
        return late, on_time

    async def _fire_due(self, sched: Schedule, now: float, late: list[float],
                        on_time: list[float]) -> None:
        spec = sched.spec
        version = sched.version
        if spec.catchup == 0 and late:
            # missed while no scheduler ran: skipped, the cursor moves past them
            if not await self.store.fire_schedule(spec.name, version, late[-1], None):
                return  # another worker moved it, or the schedule changed: read it again
            version += 1
            self.log.warning("schedule_fire_skipped", schedule=spec.name,
                             fire_at=iso(late[-1]), late=round(now - late[-1], 3))
            late = []
        for fire_at in [*late, *on_time]:
            run_id = fire_id(spec.name, fire_at)
            new = NewRun(run_id, spec.workflow, list(spec.args), spec.key, fire_at)
            if not await self.store.fire_schedule(spec.name, version, fire_at, new):
                return  # another worker fired it, or the schedule changed: read it again
            version += 1
            self.started += 1
            self.log.info("schedule_fired", schedule=spec.name, fire_at=iso(fire_at),
                          workflow_id=run_id, workflow=spec.workflow,
                          late=round(now - fire_at, 3))
            if self.on_start is not None:
                self.on_start()
