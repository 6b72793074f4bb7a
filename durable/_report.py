"""Messages about a run, derived from its journal: the recovery report and the timeline.

Terms, used the same way in the CLI, the JSON, the docs and the logs: a run's **attempt** is
one claim of it (``Run.attempt``; the claim's fencing token is its epoch); a step's **try**
is one execution of the step (``ActivityContext.try_number``, ``RetryPolicy.max_tries``),
numbered across the run's attempts.

The timeline (``python -m durable show ID``) is one line per entry, every line at most
``width`` characters (an ellipsis marks a cut; ``show ID --step N`` and ``show ID --json``
carry the full text). Times are UTC. Colour is used only when asked for (:func:`use_color`:
a terminal, ``NO_COLOR`` unset), so piped output is plain and the same on every machine.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import re
import shutil
import sys
import textwrap
from collections.abc import Mapping, Sequence
from typing import IO, Any
from urllib.parse import quote

import attrs

from ._approval import ApprovalView, approval_view, origin_text
from ._commands import command as durable_command
from ._context import fencing_scope
from ._errors import ConfigError
from ._history import History, StepView, idempotency_key, tries
from ._types import (
    JSON,
    NEVER,
    EntryKind,
    JournalEntry,
    PausedWorkflow,
    Run,
    RunState,
    Signal,
    StartedRun,
    StepState,
)

DEFAULT_WIDTH = 100
"""The width of piped output (and of a terminal whose size cannot be read)."""
MIN_WIDTH = 40


def run_path(run_id: str) -> str:
    """A run's page in the console: its id as one path segment, every character but letters,
    digits and ``-_.~`` encoded. An id is any string: left as it is, a ``?`` or ``#`` in it
    would end the path, and a ``/`` would name another page (``job/live``: the live view of
    ``job``); the console reads the id back from the raw path (``%2F`` is part of it)."""
    return "/runs/" + quote(run_id, safe="")


def step_link(run_id: str, number: int, console_url: str | None) -> str:
    """Where to look a step up: the CLI command, and the console URL when one is configured."""
    command = durable_command("show", run_id, "--step", number, python=True)
    if console_url:
        return f"{command}  |  {console_url.rstrip('/')}{run_path(run_id)}#step-{number}"
    return command


def _current_epoch(run: Run) -> int:
    """Steps started under an epoch below this one belong to an attempt that is over."""
    return run.epoch if run.state is RunState.RUNNING else run.epoch + 1


# -- the recovery report -----------------------------------------------------------------------
@attrs.frozen
class StepLine:
    number: int
    key: str
    activity: str
    state: str
    tries: int
    summary: JSON
    error: str | None
    link: str
    accepted: bool = False
    """Counted as done by an operator (``replay --accept-in-doubt``), not by a journaled
    outcome."""
    advice: str | None = None
    """A step in doubt: what to do about it (:func:`doubt_advice`)."""
    request: SentRequest | None = None
    """A step in doubt: the request its try sent, to look for at the service
    (:func:`sent_request`)."""

    def doubt_text(self) -> str:
        """A step in doubt as ``show``'s next steps and the plain-text report say it."""
        where = (f" (its request at the service: {self.request.phrase()})" if self.request
                 else "")
        return f"step {self.number} {self.activity}: {self.advice}{where}"


@attrs.frozen
class SentRequest:
    """The request a step's try sent, as the target service knows it: its headers'
    values (``Idempotency-Key``, ``Durable-Fencing-Token``, ``Durable-Fencing-Scope``)."""

    key: str
    token: int
    scope: str

    def phrase(self) -> str:
        return f"idempotency key {self.key}, fencing token {self.token}, scope {self.scope}"


def sent_request(run: Run, entries: Sequence[JournalEntry], number: int) -> SentRequest | None:
    """The request step ``number``'s last started try sent (None: no try started), derived
    from the journal as the worker derived it: the key from the step's reruns as folded up
    to that try's start (a replay that re-ran the completed step changed it), the token
    from the epoch that journaled the start (not the one that noticed the doubt)."""
    last = max((i for i, e in enumerate(entries)
                if e.step == number and e.kind is EntryKind.STEP_STARTED), default=None)
    if last is None:
        return None
    started = entries[last]
    assert started.step_key is not None
    step = History.fold(entries[:last + 1]).steps[started.step_key]
    return SentRequest(idempotency_key(run.id, step.key, step.reruns), started.epoch,
                       fencing_scope(run.id, run.key))


def doubt_advice(run: Run, entries: Sequence[JournalEntry], number: int) -> str:
    """What to do about step ``number``, in doubt, derived from the journal: every place
    that says it (``show``, the recovery report, the console) says this.

    A run that has not ended leaves it to its next attempt. One that ended asks the operator
    to check it, then to replay choosing for it. A replay since its try that made no choice
    for it (neither re-run nor accept: a replay with either, or from a step at or before it,
    would have taken it out of doubt) is named, so the advice is never to act as if no
    replay had happened.
    """
    started = max((e.seq for e in entries
                   if e.step == number and e.kind is EntryKind.STEP_STARTED), default=0)
    replay = next((e for e in reversed(entries)
                   if e.kind is EntryKind.RUN_REPLAYED and e.seq > started), None)
    since = (f"the replay at {utc(replay.at)} made no choice for it (re-run or accept)"
             if replay is not None else "")
    if not run.state.finished:
        what = "the next attempt runs it again or fails, as its on_doubt says"
        return f"{what}; {since}" if since else what
    what = "check whether it took effect, then replay: re-run it if it did not, accept it if it did"
    return f"{since}, so it is in doubt still: {what}" if since else what


@attrs.frozen
class GoneHolder:
    """The worker holding a running run is dead for sure: its liveness lock is free
    (SQLite, one machine; :meth:`durable.Client.gone_holders` probes it read-only). Its
    run stays running until a live worker's sweep takes it over (within a second)."""

    worker: str
    others: bool | None
    """Whether a live worker of the database was found (its lock held): True; False, none
    found (the first one started takes the run over); None, it could not be told."""

    def phrase(self) -> str:
        """What ``show`` and a run's page say under the worker."""
        then = ("a live worker takes the run over within a second" if self.others
                else "no live worker found: the first worker started takes the run over"
                if self.others is False else "a live worker takes the run over")
        return (f"worker {self.worker} is gone (its process died: its liveness lock is "
                f"free); {then}")

    def as_dict(self) -> dict[str, Any]:
        """``worker_gone`` of a run in the ``--json`` shapes and the console's API."""
        return {"worker": self.worker, "live_worker_found": self.others,
                "phrase": self.phrase()}

    def note(self) -> str:
        """What a runs list says of the run."""
        then = ("a live worker takes it over" if self.others
                else "no live worker found" if self.others is False
                else "a live worker takes it over")
        return f"worker {self.worker} died; {then}"


@attrs.frozen
class RecoveryReport:
    """What a run did, derived from its journal: for state reasons and notifications."""

    run_id: str
    workflow: str
    state: str
    error: str | None
    failed: tuple[StepLine, ...]
    completed: tuple[StepLine, ...]
    in_doubt: tuple[StepLine, ...]
    not_done: tuple[StepLine, ...]
    run_link: str

    @classmethod
    def build(cls, run: Run, entries: Sequence[JournalEntry],
              console_url: str | None = None) -> RecoveryReport:
        history = History.fold(entries)
        current = _current_epoch(run)

        def line(step: StepView, state: str) -> StepLine:
            doubt = state == "in_doubt"
            return StepLine(step.number, step.key, step.name, state, step.tries,
                            step.summary, step.error, step_link(run.id, step.number, console_url),
                            accepted=step.accepted,
                            advice=doubt_advice(run, entries, step.number) if doubt else None,
                            request=sent_request(run, entries, step.number) if doubt else None)

        failed, completed, doubt, not_done = [], [], [], []
        for step in history.ordered():
            if step.name.startswith("durable.") and step.name != "durable.set_records":
                continue
            if step.state is StepState.COMPLETED:
                completed.append(line(step, "completed"))
            elif step.state is StepState.FAILED:
                failed.append(line(step, "failed"))
            elif step.in_doubt(current):
                doubt.append(line(step, "in_doubt"))
            elif step.state is StepState.STARTED:
                not_done.append(line(step, "started"))
        run_link = durable_command("show", run.id, python=True)
        if console_url:
            run_link += f"  |  {console_url.rstrip('/')}{run_path(run.id)}"
        return cls(run.id, run.workflow, run.state.value, run.error, tuple(failed),
                   tuple(completed), tuple(doubt), tuple(not_done), run_link)

    def as_dict(self) -> dict[str, JSON]:
        return attrs.asdict(self)

    def text(self) -> str:
        """A self-contained plain-text report (state reasons, notifications): what failed,
        what is already done, what to check. Each error is on one line, in full."""
        phrase = {"queued": "is queued", "running": "is running", "completed": "completed",
                  "failed": "failed", "cancelled": "was cancelled"}.get(self.state, self.state)
        out = [f"Run {self.run_id} ({self.workflow}) {phrase}."]
        if self.error and not self.failed:
            out.append(f"Error: {one_line(self.error)}")
        for s in self.failed:
            out.append(f"Failed: step {s.number} {s.activity} after {tries(s.tries)}: "
                       f"{one_line(s.error or '')}  -> {s.link}")
        if self.completed:
            out.append("Already done (will not be repeated):")
            for s in self.completed:
                what = f" - {one_line(_short(s.summary))}" if s.summary is not None else ""
                how = " (accepted by operator)" if s.accepted else ""
                out.append(f"  step {s.number} {s.activity}{what}{how}  -> {s.link}")
        else:
            out.append("Already done: nothing.")
        if self.in_doubt:
            out.append("In doubt (started, outcome unknown):")
            for s in self.in_doubt:
                out.append(f"  {s.doubt_text()}  -> {s.link}")
        out.append(f"Journal: {self.run_link}")
        return "\n".join(out)


def _short(value: JSON) -> str:
    return value if isinstance(value, str) else shown_json(value, separators=(",", ":"))


_BIDI = "\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"
"""Unicode's bidirectional controls: shown raw, they reorder the text around them on screen
(a service's "deleted nothing" whose bytes say otherwise: "Trojan Source")."""
_CONTROL = re.compile(f"[\x00-\x1f\x7f-\x9f{_BIDI}]")  # Unicode's Cc (C0, DEL, C1), bidi
_CONTROL_IN_TEXT = re.compile(f"[\x00-\x08\x0b-\x1f\x7f-\x9f{_BIDI}]")  # less tab, newline


def _escaped(found: re.Match[str]) -> str:
    return f"\\u{ord(found.group()):04x}"


def shown_json(value: Any, **options: Any) -> str:
    """A JSON value as text for people (``show``, not ``--json``): non-ASCII as itself
    (``café``, not ``caf\\u00e9``), every control character and bidirectional control
    escaped as JSON escapes it (JSON's own escaping leaves DEL, the C1 controls, a CSI among
    them, and the bidi controls raw without ``ensure_ascii``), so the text is still JSON and
    nothing reaches a terminal raw."""
    return _CONTROL.sub(_escaped, json.dumps(value, ensure_ascii=False, **options))


def visible(text: str) -> str:
    """The one rule for text shown to people (``show``, ``list``, the console's pages):
    control characters (C0 but tab and newline, DEL, C1) and Unicode's bidirectional
    controls escaped visibly (``\\u001b``, ``\\u202e``), never sent raw to a terminal or a
    page. ``--json`` and the console's API are JSON, escaped by the JSON encoder instead."""
    return _CONTROL_IN_TEXT.sub(_escaped, text)


def escaped_line(text: str) -> str:
    """:func:`visible` for a piece of one line: tab and newline escaped too."""
    return _CONTROL.sub(_escaped, text)


# -- text helpers --------------------------------------------------------------------------------
_SPACE = re.compile(r"\s+")


def one_line(text: str) -> str:
    """``text`` on one line: runs of whitespace (newlines too) become one space, and the
    characters :func:`visible` escapes (a terminal escape in a server's message, a bidi
    control) are escaped, never dropped (a reader sees that they were there)."""
    return escaped_line(_SPACE.sub(" ", text).strip())


def clip(text: str, width: int) -> str:
    """``text`` cut to ``width`` characters, an ellipsis marking the cut."""
    if len(text) <= width:
        return text
    return text[: max(width - 1, 0)] + "…" if width > 0 else ""


def utc(ts: float | None) -> str:
    """``2026-12-01 09:27:05.809 UTC``."""
    if ts is None:
        return "-"
    try:
        return _datetime(ts).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + " UTC"
    except (OverflowError, OSError, ValueError):  # stored before times were bounded
        return f"{ts:g} (epoch seconds, past the calendar)"


def parse_time(value: str | None, name: str) -> float | None:
    """Epoch seconds, or an ISO 8601 time (UTC unless it says otherwise: ``2026-12-01``,
    ``2026-12-01T09:00Z``, ``2026-12-01 09:00:00 UTC``); None for nothing; ConfigError
    (one line, naming ``name``) for anything else."""
    if value is None or not value.strip():
        return None
    text = value.strip()
    try:
        seconds = float(text)
    except ValueError:
        pass
    else:
        if math.isfinite(seconds):
            return seconds
    try:
        when = dt.datetime.fromisoformat(text.replace(" UTC", "+00:00").replace("Z", "+00:00"))
    except ValueError:
        raise ConfigError(f"{name} {value!r} is not a time: give ISO 8601 "
                          "(2026-12-01T09:00Z) or epoch seconds") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return when.timestamp()


def _datetime(ts: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(ts, dt.UTC)


def _clock(ts: float) -> str:
    return _datetime(ts).strftime("%H:%M:%S.%f")[:-3]


def duration(seconds: float) -> str:
    seconds = max(seconds, 0.0)
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.2f} s"
    if seconds < 3600:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


# -- terminal ------------------------------------------------------------------------------------
def _isatty(stream: IO[Any]) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def terminal_width(stream: IO[Any]) -> int:
    """The width to render for: the terminal's (or ``$COLUMNS``) on a tty; piped, always
    :data:`DEFAULT_WIDTH`, so the output does not depend on where it was produced."""
    if not _isatty(stream):
        return DEFAULT_WIDTH
    return max(shutil.get_terminal_size((DEFAULT_WIDTH, 24)).columns, MIN_WIDTH)


def use_color(stream: IO[Any], mode: str = "auto") -> bool:
    """Whether to colour: ``always`` / ``never``; ``auto`` colours a terminal unless
    ``NO_COLOR`` is set (https://no-color.org) or ``TERM=dumb``; ``FORCE_COLOR`` forces it."""
    if mode in ("always", "never"):
        return mode == "always"
    if os.environ.get("NO_COLOR"):
        return False
    if os.environ.get("FORCE_COLOR"):
        return True
    return _isatty(stream) and os.environ.get("TERM") != "dumb"


_SGR = {"completed": "32", "accepted": "32", "failed": "31", "error": "31",
        "retrying": "33", "cancelled": "33", "in_doubt": "35;1", "started": "36",
        "running": "36", "queued": "36", "dim": "2", "bold": "1", "sleeping": "34",
        "waiting": "34", "received": "32", "timed_out": "33"}

Segment = tuple[str, str | None]
"""A piece of a line and its style (a key of the colour table, or None)."""


def _fit(segments: Sequence[Segment], width: int, color: bool) -> str:
    """Join the segments into one line of at most ``width`` characters, then colour them."""
    kept: list[Segment] = []
    used = 0
    for text, style in segments:
        text = escaped_line(text)  # whatever a segment holds, nothing reaches the terminal raw
        room = width - used
        if room <= 0:
            break
        if len(text) > room:
            text = clip(text.rstrip(), room)
        kept.append((text, style))
        used += len(text)
    while kept and not kept[-1][0].strip():
        kept.pop()
    if kept:
        kept[-1] = (kept[-1][0].rstrip(), kept[-1][1])
    return "".join(
        f"\x1b[{_SGR[style]}m{text}\x1b[0m" if color and style and text.strip() else text
        for text, style in kept)


# -- the timeline rows (also the "steps" of show --json) -------------------------------------
_OUTCOME = {
    EntryKind.STEP_COMPLETED: "completed",
    EntryKind.VALUE: "completed",
    EntryKind.STEP_FAILED: "failed",
    EntryKind.STEP_RETRYING: "retrying",
    EntryKind.STEP_IN_DOUBT: "in_doubt",
}


_WAIT_KINDS = frozenset({EntryKind.TIMER_STARTED, EntryKind.TIMER_FIRED,
                         EntryKind.WAIT_STARTED, EntryKind.SIGNAL_RECEIVED,
                         EntryKind.SIGNAL_TIMEOUT})

_WAIT_END = {
    EntryKind.TIMER_FIRED: "completed",
    EntryKind.SIGNAL_RECEIVED: "received",
    EntryKind.SIGNAL_TIMEOUT: "timed_out",
}


def _wait_row(e: JournalEntry, open_tries: dict[tuple[str, int], dict[str, JSON]],
              rows: list[dict[str, JSON]]) -> None:
    """The row of a durable sleep or wait: opened by its start, ended by its firing, its
    signal or its timeout (docs/design.md, "Durable waiting")."""
    key = (e.step_key or "", 1)
    data = e.data
    if e.kind in (EntryKind.TIMER_STARTED, EntryKind.WAIT_STARTED):
        sleeping = e.kind is EntryKind.TIMER_STARTED
        row = _step_row(e, "sleeping" if sleeping else "waiting")
        row["start"] = e.at
        row["until"] = data.get("until")
        if not sleeping:
            row["signal"] = data.get("name")
        row["summary"] = _wait_text(data, sleeping)
        open_tries[key] = row
        rows.append(row)
        return
    opened = open_tries.pop(key, None)
    row = opened if opened is not None else _step_row(e, _WAIT_END[e.kind])
    if opened is None:
        rows.append(row)
    row["state"] = _WAIT_END[e.kind]
    row["end"] = e.at
    if isinstance(row["start"], float):
        row["took"] = round(e.at - row["start"], 6)
    if e.kind is EntryKind.SIGNAL_RECEIVED:
        row["signal"] = data.get("name")
        row["signal_seq"] = data.get("seq")
        row["summary"] = f"signal {data.get('name')!r} received (seq {data.get('seq')})"
    elif e.kind is EntryKind.SIGNAL_TIMEOUT:
        row["summary"] = f"no signal {data.get('name')!r} by {utc(_num(data.get('until')))}"


def _num(value: JSON) -> float | None:
    return float(value) if isinstance(value, int | float) else None


def _wait_text(data: Mapping[str, JSON], sleeping: bool) -> str:
    until = _num(data.get("until"))
    if sleeping:
        return f"until {utc(until)}"
    limit = f"until {utc(until)}" if until is not None else "no timeout"
    return f"for signal {data.get('name')!r}, {limit}"


def timeline_rows(run: Run, entries: Sequence[JournalEntry]) -> list[dict[str, JSON]]:
    """One row per run event and per step try, in journal order (the JSON of ``show``).

    A step row: ``step``, ``key``, ``activity``, ``try``, ``epoch`` (of the attempt that
    ran it), ``state`` (``started``, ``completed``, ``retrying``, ``failed``, ``in_doubt``,
    ``accepted``), ``start`` / ``end`` (epoch seconds), ``took`` (seconds, or None where no
    duration is known: a value, a try in doubt), ``summary``, ``error`` and ``note``. An
    event row: ``event``, ``at``, ``epoch``, ``attempt`` (``run_claimed``) and ``detail``.
    """
    current = _current_epoch(run)
    rows: list[dict[str, JSON]] = []
    open_tries: dict[tuple[str, int], dict[str, JSON]] = {}
    history = History()
    for e in entries:
        if e.step is None:
            before = {key: step.state for key, step in history.steps.items()}
            history.apply(e)
            event: dict[str, JSON] = {"seq": e.seq, "event": e.kind.value, "at": e.at,
                                      "epoch": e.epoch}
            if e.attempt is not None:
                event["attempt"] = e.attempt
            event["detail"] = dict(e.data)
            rows.append(event)
            if e.kind in _RUN_ENDS:
                _end_waits(open_tries, _RUN_ENDS[e.kind])
            if e.kind is EntryKind.RUN_REPLAYED:
                rows.extend(_accepted_rows(e, history, before, open_tries))
            continue
        history.apply(e)
        if e.kind in _WAIT_KINDS:
            _wait_row(e, open_tries, rows)
            continue
        key = (e.step_key or "", e.try_number or 1)
        if e.kind is EntryKind.STEP_STARTED:
            row = _step_row(e, "started")
            row["start"] = e.at
            open_tries[key] = row
            rows.append(row)
            continue
        opened = open_tries.pop(key, None)
        row = opened if opened is not None else _step_row(e, _OUTCOME[e.kind])
        if opened is None:
            rows.append(row)
        row["state"] = _OUTCOME[e.kind]
        if e.kind is EntryKind.STEP_IN_DOUBT:
            row["note"] = e.data.get("reason") or "outcome unknown"
            row["noticed_at"] = e.at
            continue
        row["end"] = e.data.get("ended_at", e.at)
        if isinstance(row["start"], float) and isinstance(row["end"], float):
            row["took"] = round(row["end"] - row["start"], 6)
        row["error"] = e.data.get("error")
        row["error_type"] = e.data.get("error_type")
        row["summary"] = e.data.get("summary")
        if "retry_in" in e.data:
            row["retry_in"] = e.data["retry_in"]
    for row in open_tries.values():
        epoch = row["epoch"]
        if row["state"] in ("sleeping", "waiting"):
            if run.state.finished:
                row["note"] = f"the run {run.state.value} meanwhile"
            continue
        if isinstance(epoch, int) and epoch < current:
            row["state"] = "in_doubt"
            row["note"] = "its attempt ended with no outcome recorded"
    return rows


_RUN_ENDS = {EntryKind.RUN_COMPLETED: RunState.COMPLETED, EntryKind.RUN_FAILED: RunState.FAILED,
             EntryKind.RUN_CANCELLED: RunState.CANCELLED}


def _end_waits(open_tries: dict[tuple[str, int], dict[str, JSON]], state: RunState) -> None:
    """The sleeps and waits still open when the run ended never ended themselves: noted so,
    and closed, so that a replay's wait of the same step opens a row of its own."""
    for key, row in list(open_tries.items()):
        if row["state"] in ("sleeping", "waiting"):
            row["note"] = f"the run {state.value} meanwhile"
            del open_tries[key]


def _step_row(e: JournalEntry, state: str) -> dict[str, JSON]:
    return {"seq": e.seq, "step": e.step, "key": e.step_key, "activity": e.name,
            "try": e.try_number, "epoch": e.epoch, "state": state, "start": None,
            "end": None, "took": None, "summary": None, "error": None, "note": None}


def _accepted_rows(e: JournalEntry, history: History, before: dict[str, StepState | None],
                   open_tries: dict[tuple[str, int], dict[str, JSON]]) -> list[dict[str, JSON]]:
    """The steps a replay with ``in_doubt="accept"`` counted as done, each its own row."""
    rows: list[dict[str, JSON]] = []
    for step in history.ordered():
        if not step.accepted or before.get(step.key) not in (StepState.STARTED,
                                                               StepState.IN_DOUBT):
            continue
        opened = open_tries.pop((step.key, step.tries), None)
        if opened is not None and opened["state"] == "started":
            opened["state"] = "in_doubt"
            opened["note"] = "its attempt ended with no outcome recorded"
        rows.append({"seq": e.seq, "step": step.number, "key": step.key,
                     "activity": step.name, "try": step.tries, "epoch": e.epoch,
                     "state": "accepted", "start": e.at, "end": None, "took": None,
                     "summary": None, "error": None,
                     "note": "accepted by operator (replay --accept-in-doubt)",
                     "accepted_by": "operator"})
    return rows


# -- rendering -----------------------------------------------------------------------------------
def render_timeline(run: Run, entries: Sequence[JournalEntry], *,
                    step: int | None = None, console_url: str | None = None,
                    width: int = DEFAULT_WIDTH, color: bool = False,
                    signals: Sequence[Signal] = (), paused: PausedWorkflow | None = None,
                    gone: GoneHolder | None = None, now: float | None = None) -> str:
    """The human-readable ``show`` output: the run, its journal as a timeline, what to do.

    ``step=N`` shows that step's tries in full instead (arguments, result, the whole error),
    under the run's header in full too (its arguments, result and error never cut: what
    ``show --step`` is asked for). Every line of the timeline is at most ``width``
    characters; ``color`` adds ANSI colours for states (see :func:`terminal_width` and
    :func:`use_color` for a terminal's).
    ``signals`` (the run's stored signals) give a rejection its reason. ``paused``: the
    pause of the run's workflow, said of a run that has not ended. ``gone``: the running
    run's worker is dead for sure (said under it, and of its step in flight).
    """
    width = max(width, MIN_WIDTH)
    rows = timeline_rows(run, entries)
    view = _View(width, color, full=step is not None)
    view.gone = gone if run.state is RunState.RUNNING else None
    view.header(run, rows, entries)
    if paused is not None and not run.state.finished:
        view.field("paused", (f"its workflow is {paused_phrase(paused)}; no attempt starts "
                              f"until: {durable_command('resume', run.workflow)}", "error"))
    gate = approval_view(run, entries, signals, now)
    if gate is not None and step is None:
        view.approval(run, gate)
    if step is not None:
        view.step_detail(run, entries, rows, step)
    else:
        view.timeline(run, rows)
        report = RecoveryReport.build(run, entries, console_url)
        if run.state in (RunState.FAILED, RunState.CANCELLED) or report.in_doubt:
            view.next_steps(run, report, console_url)
    return "\n".join(view.lines)


class _View:
    """Lines being rendered, each fitted to the width."""

    TIME, STEP, TRY, TOOK, STATE = 12, 4, 3, 7, 9

    def __init__(self, width: int, color: bool, *, full: bool = False) -> None:
        self.width = width
        self.color = color
        self.full = full
        """Nothing is cut to the width (``show --step``): each text in full, on one line."""
        self.lines: list[str] = []
        self.act = 8
        """The activity column's width, fitted to the names and the width."""
        self.gone: GoneHolder | None = None
        """The running run's worker, dead for sure (:class:`GoneHolder`)."""

    def add(self, *segments: Segment) -> None:
        self.lines.append(_fit(segments, sys.maxsize if self.full else self.width,
                               self.color))

    def field(self, label: str, *segments: Segment) -> None:
        self.add((f"{label:<10}", "dim"), *segments)

    # -- the run -----------------------------------------------------------------------------
    def header(self, run: Run, rows: list[dict[str, JSON]],
               entries: Sequence[JournalEntry] = ()) -> None:
        self.field("run", (run.id, "bold"))
        self.field("workflow", (run.workflow, None), (f"    key {run.key or '-'}", None))
        claims = (f"attempt {run.attempt} (epoch {run.epoch})" if run.attempt
                  else "not claimed yet")
        self.field("state", (run.state.value, run.state.value), (f"    {claims}", None))
        self.field("args", (one_line(shown_json(run.args)), None))
        self.field("created", (utc(run.created_at), None))
        if run.state is RunState.QUEUED:
            waiting = waiting_phrase(run, entries)
            if waiting:
                self.field("waiting", (waiting, None))
            else:
                self.field("due", (utc(run.run_at), None))
            if run.attempt == 0 and run.start_within is not None:
                self.field("start by", (start_by_phrase(run), None))
        elif run.state.finished:
            self.field("finished", (utc(run.updated_at), None))
        if run.state is RunState.RUNNING:
            self.field("worker", (f"{run.worker}    lease until {utc(run.lease_expires_at)}",
                                  None))
            if self.gone is not None:  # wrapped to the width, never cut
                self.lines.extend(textwrap.wrap(
                    self.gone.phrase(), self.width, initial_indent=" " * 10,
                    subsequent_indent=" " * 10))
        if run.state is RunState.COMPLETED:
            self.field("result", (one_line(shown_json(run.result)), None))
        if run.error:  # in full, as it is: the steps it would refer to may not be shown
            self.field("error", (one_line(run.error) if self.full
                                 else _refer_to_steps(run.error, rows), "error"))

    # -- plan, then approve ------------------------------------------------------------------
    def approval(self, run: Run, gate: ApprovalView) -> None:
        """The plan (in full: wrapped, never cut) and its decision, with who decided."""
        self.add(("", None))
        self.field("plan", (gate.title, "bold"),
                   (f"  (step {gate.plan_step}, digest {gate.digest})", None))
        for line in gate.lines()[1:]:  # wrapped to the width, never cut
            self.lines.extend(textwrap.wrap(one_line(line), self.width,
                                            initial_indent=" " * 10,
                                            subsequent_indent=" " * 14))
        if gate.decision == "waiting":
            if run.state.finished:
                self.field("approval", ("none: the run ended before a decision", None))
            elif gate.ran_out is not None:
                self.field("approval", ("ran out", "failed"),
                           (f" at {utc(gate.ran_out)}: an approval would not reach it; the run "
                            "gives up on its plan without acting when a worker takes it  |  "
                            f"{durable_command('reject', run.id, '--reason', 'TEXT', python=True)}",
                            None))
            else:
                self.field("approval", ("waiting", "queued"),
                           (f"    {durable_command('approve', run.id, python=True)}  |  "
                            f"{durable_command('reject', run.id, '--reason', 'TEXT', python=True)}",
                            None))
            return
        style = "completed" if gate.decision == "approved" else "failed"
        note = gate.payload.get("note") or gate.payload.get("reason") \
            if isinstance(gate.payload, dict) else None
        self.field("approval", (gate.decision, style),
                   (f" by {gate.by} at {utc(gate.at)}", None),
                   (f": {one_line(str(note))}" if note else "", None))
        if gate.early:
            self.field("", ("(sent before the plan was journaled: a raw signal, approving "
                            "blind)", "error"))

    # -- the journal -------------------------------------------------------------------------
    def timeline(self, run: Run, rows: list[dict[str, JSON]]) -> None:
        steps = [r for r in rows if "event" not in r]
        names = [len(str(r["activity"])) for r in steps] or [8]
        fixed = self.TIME + 2 + self.STEP + 2 + 1 + self.STATE + 1 + self.TRY + 1 + self.TOOK + 2
        self.act = min(max(max(names), 8), 24, max(self.width - fixed - 14, 8))
        self.add(("", None))
        self.add((f"{'time UTC':<{self.TIME}}  {'step':>{self.STEP}}  {'activity':<{self.act}} "
                  f"{'state':<{self.STATE}} {'try':>{self.TRY}} {'took':>{self.TOOK}}  summary",
                  "dim"))
        date = None
        shown_errors: dict[object, tuple[str, object]] = {}
        for row in rows:
            at = row["at"] if "event" in row else (
                row["start"] or row.get("noticed_at") or row["end"])
            if isinstance(at, float) and _datetime(at).date() != date:
                date = _datetime(at).date()
                self.add((date.isoformat(), "bold"))
            clock = _clock(at) if isinstance(at, float) else "-"
            if "event" in row:
                self.add((f"{clock:<{self.TIME}}  {'':>{self.STEP}}  ", "dim"),
                         (f"· {event_phrase(row)}", "dim"))
                continue
            self._step_row(run, row, clock, shown_errors)

    def _step_row(self, run: Run, row: dict[str, JSON], clock: str,
                  shown_errors: dict[object, tuple[str, object]]) -> None:
        state = str(row["state"])
        took = row["took"]
        took_text = duration(took) if isinstance(took, float) else ""
        if state == "in_doubt":
            took_text = "unknown"
        text = row_text(run, row, self.gone is not None)
        activity = clip(str(row["activity"]), self.act)
        self.add((f"{clock:<{self.TIME}}  {row['step']!s:>{self.STEP}}  "
                  f"{activity:<{self.act}} ", None),
                 (f"{state:<{self.STATE}}", state),
                 (f" {row['try'] or '':>{self.TRY}} {took_text:>{self.TOOK}}  ", None),
                 (text, None))
        error = row.get("error")
        if isinstance(error, str) and error:
            message = one_line(error)
            earlier = shown_errors.get(row["key"])
            if earlier is not None and earlier[0] == message:
                message = f"same as try {earlier[1]}"
            else:
                shown_errors[row["key"]] = (message, row["try"])
            indent = " " * (self.TIME + 2 + self.STEP + 2)
            self.add((indent, None), ("error: ", "error"), (message, "error"))

    # -- what to do next ---------------------------------------------------------------------
    def next_steps(self, run: Run, report: RecoveryReport, console_url: str | None) -> None:
        self.add(("", None))
        self.add(("next", "bold"))
        done = [s.number for s in report.completed]
        self.add(("  done (not repeated by a replay): ", None),
                 (_numbers(done) if done else "nothing", None))
        links: list[int] = []
        for s in report.failed:
            self.add(("  failed: ", "failed"),
                     (f"step {s.number} {s.activity} after {tries(s.tries)}, error above",
                      None))
            links.append(s.number)
        finished = run.state in (RunState.FAILED, RunState.CANCELLED)
        for s in report.in_doubt:  # the advice wrapped to the width, never cut
            first, *more = textwrap.wrap(s.doubt_text(), max(self.width - 12, 20))
            self.add(("  in doubt: ", "in_doubt"), (first, None))
            for line in more:
                self.add((" " * 12, None), (line, None))
            links.append(s.number)
        if finished:
            options = "  [--rerun-in-doubt | --accept-in-doubt]" if report.in_doubt else ""
            replay = durable_command("replay", run.id, python=True)
            self.add(("  replay: ", None), (replay + options, None))
        for number in links:
            command, _, url = step_link(run.id, number, console_url).partition("  |  ")
            self.add(("  detail: ", None), (command, None))
            if url:
                self.add(("          ", None), (url, None))

    # -- show --step N -----------------------------------------------------------------------
    def step_detail(self, run: Run, entries: Sequence[JournalEntry],
                    rows: list[dict[str, JSON]], number: int) -> None:
        """Every try of one step in full: nothing here is cut to the width."""
        self.add(("", None))
        mine = [r for r in rows if "event" not in r and r["step"] == number]
        if not mine:
            self.add((f"run {run.id} has no step {number}", None))
            return
        first = mine[0]
        self.lines.append(escaped_line(f"step {number}  {first['activity']}  "
                                       f"(key {first['key']})"))
        args = {e.try_number: e.data.get("args") for e in entries
                if e.step == number and e.kind is EntryKind.STEP_STARTED}
        results = {e.try_number: e.data.get("result") for e in entries
                   if e.step == number and e.kind in (EntryKind.STEP_COMPLETED, EntryKind.VALUE)}
        for row in mine:
            state = str(row["state"])
            painted = f"\x1b[{_SGR[state]}m{state}\x1b[0m" if self.color else state
            when = row["start"] if isinstance(row["start"], float) else row.get("noticed_at")
            took = row["took"]
            line = f"try {row['try'] or '-'}  {painted}"
            if isinstance(when, float):
                line += f"  {utc(when)}"
            if isinstance(took, float):
                line += f"  took {duration(took)}"
            elif state == "in_doubt":
                line += "  took unknown"
            self.lines.append(line)
            details: list[tuple[str, str]] = []
            if row["try"] in args:
                details.append(("args", shown_json(args[row["try"]])))
            if state in ("completed",) and row["try"] in results:
                details.append(("result", shown_json(results[row["try"]])))
            if state == "received":  # the signal a wait_for received: its payload in full
                details.extend(("payload", shown_json(e.data.get("payload"))) for e in entries
                               if e.step == number and e.kind is EntryKind.SIGNAL_RECEIVED)
            if row["summary"] is not None:
                details.append(("summary", _short(row["summary"])))
            if row.get("retry_in") is not None:
                details.append(("retry in", duration(float(str(row["retry_in"])))))
            if row["error"]:
                details.append(("error", str(row["error"])))
            if row["note"]:
                details.append(("note", str(row["note"])))
            for label, value in details:
                value = visible(value)
                head = f"    {label:<9}"
                for i, part in enumerate(value.splitlines() or [""]):
                    self.lines.append((head if i == 0 else " " * len(head)) + part)


def _numbers(numbers: list[int]) -> str:
    return ("step " if len(numbers) == 1 else "steps ") + ", ".join(map(str, numbers))


def row_text(run: Run, row: Mapping[str, JSON], gone: bool = False) -> str:
    """A step row's last column: the summary, or what the state needs said (``show``'s
    timeline and the console's table of a step's tries; ``gone``: the running run's worker
    is dead for sure, so its step is no longer in flight)."""
    parts: list[str] = []
    state = row["state"]
    if state == "retrying" and row.get("retry_in") is not None:
        parts.append(f"retry in {duration(float(str(row['retry_in'])))}")
    if state in ("in_doubt", "accepted", "sleeping", "waiting") and row["note"]:
        parts.append(str(row["note"]))
    if state == "started" and run.state is RunState.RUNNING:
        parts.append(STEP_OF_THE_DEAD if gone else "in flight")
    if row["summary"] is not None:
        parts.append(_short(row["summary"]))
    return one_line(" · ".join(parts))


def _refer_to_steps(error: str, rows: list[dict[str, JSON]]) -> str:
    """The run's error with the errors its steps show below replaced by a reference."""
    text = one_line(error)
    for row in reversed(rows):
        step_error = row.get("error")
        if "event" in row or not isinstance(step_error, str) or not step_error:
            continue
        message = one_line(step_error)
        reference = f"error at step {row['step']} below"
        text = text.replace(f": {message}", f" ({reference})").replace(message, reference)
    return text


def waiting_phrase(run: Run, entries: Sequence[JournalEntry] | None = None,
                   now: float | None = None) -> str | None:
    """What a queued run released to wait is waiting for (None for any other run): the
    signal and its timeout, or the time it sleeps until (a retry delay's due time). With
    ``entries`` (its journal) the reason is read from its last release; without them (the
    runs list), a run that started and is due later says when it is due."""
    if run.state is not RunState.QUEUED or run.attempt == 0:
        return None
    last = next((e for e in reversed(entries or ()) if e.kind in _RELEASES), None)
    short = (CUT_SHORT if last is not None and last.kind is EntryKind.RUN_WAITING
             and last.data.get("cut_short") else "")
    if run.waiting_for is not None:
        until = "no timeout" if run.run_at >= NEVER else f"until {utc(run.run_at)}"
        return f"for signal {run.waiting_for!r}, {until}{short}"
    if entries is None:
        return (f"until {utc(run.run_at)}" if now is not None and run.run_at > now
                else None)
    if last is None or last.kind is not EntryKind.RUN_WAITING:
        return None
    reason = last.data.get("reason") or "sleep"
    return f"{'sleeping' if reason == 'sleep' else reason} until {utc(run.run_at)}{short}"


STEP_OF_THE_DEAD = "its worker died during it"
"""What is said of the step a running run had in flight when its worker died for sure."""


LIST_NOTE_COLUMN = "detail"
"""The name of the runs list's column of :func:`list_note` (``durable list``, the console):
not *error*, since it also says what a waiting run waits for (and, in ``durable list``,
that a queued run's workflow is paused), or that a running run's worker died."""


def list_note(run: Run, now: float, gone: GoneHolder | None = None) -> str:
    """What a runs list says of a run where an error would be (``durable list``, the
    console's runs list, under :data:`LIST_NOTE_COLUMN`): its error, or what a run released
    to wait waits for, or that the worker of a running run died (``gone``)."""
    if gone is not None and run.state is RunState.RUNNING:
        return gone.note()
    waiting = waiting_phrase(run, now=now)
    return run.error or (f"waiting {waiting}" if waiting else "")


def retry_phrase(reason: str) -> str:
    """A released retry's reason as journaled (``retry of step 2``) as what the run waits
    to do (``retry step 2``)."""
    return reason.replace("retry of step", "retry step", 1)


def cancel_phrase(run: Run, entries: Sequence[JournalEntry]) -> str:
    """What a cancel did, said of the run as it answered (``run``) and its journal: a
    run cancelled at once was cancelled before it started only if no attempt ever ran;
    else it was queued between attempts (waiting, or to be resumed), and what its attempts
    did is said: the steps done, and those left in doubt, which the cancel does not undo.
    (Said as "before it started" of every run that ended at once, it hid steps done.)"""
    if not run.state.finished:
        return "cancel requested; the worker holding it stops it now"
    if run.attempt == 0:
        return "cancelled before it started"
    last = next((e for e in reversed(entries) if e.kind in _RELEASES), None)
    why = "while queued between attempts"
    if last is not None and last.kind is EntryKind.RUN_WAITING:
        reason, signal = last.data.get("reason"), last.data.get("signal")
        why = ("while it waited for signal " + repr(signal) if reason == "signal"
               else f"while it waited to {retry_phrase(reason)}"
               if isinstance(reason, str) and reason.startswith("retry")
               else "while it slept")
    history = History.fold(entries)
    done = [s.number for s in history.ordered() if s.state is StepState.COMPLETED]
    doubt = [s.number for s in history.in_doubt(_current_epoch(run))]
    did = (f"{'attempt' if run.attempt == 1 else 'attempts'} "
           f"{'1' if run.attempt == 1 else f'1-{run.attempt}'} had run: "
           + (_numbers(done) + " done" if done else "no step done"))
    if doubt:
        did += (f"; {_numbers(doubt)} in doubt: check {'it' if len(doubt) == 1 else 'them'} "
                "before any replay")
    return f"cancelled {why} ({did})"


def start_by_phrase(run: Run) -> str:
    """When a run that never started must be claimed by (its ``start_within``), and what
    happens past it."""
    return f"{utc(run.start_by)}  (else it fails without running)"


def paused_phrase(pause: PausedWorkflow) -> str:
    """``paused since T by user@host (cli)``: a paused workflow, for messages."""
    return f"paused since {utc(pause.paused_at)} by {origin_text(pause.origin)}"


def resumed_phrase(workflow: str, ended: PausedWorkflow | None) -> str:
    """What a resume did, from what the store returned (the pause it ended, or None): a
    resume sent again after its answer was lost (a script's retry) finds no pause, which is
    said as the state it leaves, not as a failure (the store keeps no ended pause, so it
    cannot tell that from a workflow never paused)."""
    if ended is None:
        return (f"{workflow} is not paused (resumed already, or never paused): its runs are "
                "claimed as usual; nothing to do")
    return f"{ended.workflow} resumed (it was {paused_phrase(ended)}): its runs are claimed again"


def started_phrase(run: StartedRun) -> str:
    """``ID  WORKFLOW  STATE`` of a run a start returned, and, when the run was there before
    (:attr:`StartedRun.created` False: an idempotent start again), that it is that run as it
    is, in whatever state, and nothing new was queued."""
    line = f"{run.id}  {run.workflow}  {run.state.value}"
    if run.created:
        return line
    return (f"{line}  (started before with these arguments: that run, as it is; nothing new "
            "queued)")


def overdue_phrase(detail: Mapping[str, JSON], ran_out: str) -> str:
    """Said of a run completed by an attempt claimed after its workflow's timeout ran out
    (its ``run_completed`` entry's ``overdue``): its replay of the journal needed nothing
    new, every step had been done (docs/design.md, *A workflow's timeout spans its
    attempts*)."""
    timeout = detail.get("timeout")
    limit = f"{timeout:g} s " if isinstance(timeout, int | float) else ""
    return (f"completed by an attempt claimed after its {limit}timeout ran out ({ran_out}): "
            "every step had been done, its replay needed nothing new")


CUT_SHORT = " (when the workflow's timeout runs out: the run then fails)"
"""Said of a durable wait whose own end came after the workflow's timeout (``cut_short``
in its ``run_waiting`` entry): the run is due when the timeout runs out, and fails."""


_RELEASES = frozenset({EntryKind.RUN_WAITING, EntryKind.RUN_CLAIMED, EntryKind.RUN_INTERRUPTED,
                       EntryKind.RUN_RECOVERED, EntryKind.RUN_REPLAYED})


def event_phrase(row: Mapping[str, JSON]) -> str:
    """What a run event of :func:`timeline_rows` says, in the words of ``show``'s timeline
    (and the console's table of attempts): never the entry's kind nor a raw time."""
    kind = row["event"]
    detail = row["detail"] if isinstance(row["detail"], dict) else {}
    at = row["at"] if isinstance(row["at"], float) else 0.0

    def when(key: str) -> str:
        """A time in the detail: the clock alone on the row's date, else in full."""
        value = detail.get(key)
        if not isinstance(value, int | float):
            return "-"
        same_day = _datetime(float(value)).date() == _datetime(at).date()
        return _clock(float(value)) if same_day else utc(float(value))

    if kind == "run_created":
        run_at = detail.get("run_at")
        within = detail.get("start_within")
        limit = (f", to start within {duration(float(within))}"
                 if isinstance(within, int | float) else "")
        if isinstance(run_at, int | float) and run_at - at >= 0.001:
            return f"run created, due {when('run_at')}{limit}"
        return f"run created{limit}"
    if kind == "run_claimed":
        attempt = row.get("attempt")
        return (f"attempt {attempt if attempt is not None else '?'} started (epoch "
                f"{row['epoch']}) by worker {detail.get('worker') or '?'}")
    if kind == "run_completed":
        return ("run " + overdue_phrase(detail, when("ran_out_at")) if detail.get("overdue")
                else "run completed")
    if kind == "run_failed":
        step = detail.get("step")
        return f"run failed at step {step}" if step is not None else "run failed (error above)"
    if kind == "run_cancel_requested":
        return f"cancel requested by {detail.get('by') or 'operator'}"
    if kind == "run_cancelled":
        return f"run cancelled by {detail.get('by') or 'operator'}"
    if kind == "run_interrupted":
        return (f"attempt interrupted ({detail.get('reason') or '?'}); "
                "its lease was released for another worker")
    if kind == "run_recovered" and detail.get("worker_died"):
        return (f"run recovered: worker {detail.get('worker') or '?'} died (its liveness lock "
                "was free), taken over before its lease expired")
    if kind == "run_recovered":
        return (f"run recovered: the lease of worker {detail.get('worker') or '?'} expired "
                f"{when('lease_expired_at')}")
    if kind == "run_waiting":
        until = detail.get("until")
        reason = detail.get("reason") or "sleep"
        if detail.get("signal") is not None:
            limit = f"until {when('until')}" if until is not None else "no timeout"
            what = f"waiting for signal {detail['signal']!r}, {limit}"
        else:
            what = f"{'sleeping' if reason == 'sleep' else reason} until {when('until')}"
        if detail.get("cut_short"):
            what += CUT_SHORT
        return f"attempt ended to wait without a lease: {what}"
    if kind == "signal_sent":
        origin = detail.get("origin") if isinstance(detail.get("origin"), dict) else {}
        via = origin.get("via") if isinstance(origin, dict) else None
        ident = f", id {detail['signal_id']!r}" if detail.get("signal_id") else ""
        return (f"signal {detail.get('name')!r} sent (seq {detail.get('seq')}{ident})"
                + (f" via {via}" if via else ""))
    if kind == "run_replayed":
        phrase = "replay requested"
        if detail.get("from_step") is not None:
            phrase += f" from step {detail['from_step']}"
        policy = detail.get("in_doubt")
        if policy == "accept":
            phrase += "; steps in doubt accepted as done"
        elif policy == "rerun":
            phrase += "; steps in doubt to run again"
        return phrase
    return one_line(str(kind))
