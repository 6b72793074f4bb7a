"""Messages about a run, derived from its journal: the recovery report and the timeline."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Sequence

import attrs

from ._history import History, StepView
from ._types import JSON, EntryKind, JournalEntry, Run, RunState, StepState


def step_link(run_id: str, number: int, console_url: str | None) -> str:
    """Where to look a step up: the CLI command, and the console URL when one is configured."""
    command = f"python -m durable show {run_id} --step {number}"
    if console_url:
        return f"{command}  |  {console_url.rstrip('/')}/runs/{run_id}#step-{number}"
    return command


@attrs.frozen
class StepLine:
    number: int
    key: str
    activity: str
    state: str
    attempts: int
    summary: JSON
    error: str | None
    link: str


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
        current = run.epoch if run.state is RunState.RUNNING else run.epoch + 1

        def line(step: StepView, state: str) -> StepLine:
            return StepLine(step.number, step.key, step.name, state, step.attempts,
                            step.summary, step.error, step_link(run.id, step.number, console_url))

        failed, completed, doubt, not_done = [], [], [], []
        for step in history.ordered():
            if step.name.startswith("durable.") and step.name != "durable.set_records":
                continue
            if step.state is StepState.COMPLETED:
                completed.append(line(step, "completed"))
            elif step.state is StepState.FAILED:
                failed.append(line(step, "failed"))
            elif step.state is StepState.IN_DOUBT or (
                step.state is StepState.STARTED and step.epoch < current
            ):
                doubt.append(line(step, "in_doubt"))
            elif step.state is StepState.STARTED:
                not_done.append(line(step, "started"))
        run_link = f"python -m durable show {run.id}"
        if console_url:
            run_link += f"  |  {console_url.rstrip('/')}/runs/{run.id}"
        return cls(run.id, run.workflow, run.state.value, run.error, tuple(failed),
                   tuple(completed), tuple(doubt), tuple(not_done), run_link)

    def as_dict(self) -> dict[str, JSON]:
        return attrs.asdict(self)

    def text(self) -> str:
        """A plain-text report: what failed, what is already done, what to check."""
        phrase = {"queued": "is queued", "running": "is running", "completed": "completed",
                  "failed": "failed", "cancelled": "was cancelled"}.get(self.state, self.state)
        out = [f"Run {self.run_id} ({self.workflow}) {phrase}."]
        if self.error:
            out.append(f"Error: {self.error}")
        for s in self.failed:
            out.append(f"Failed: step {s.number} {s.activity}: {s.error}  -> {s.link}")
        if self.completed:
            out.append("Already done (will not be repeated):")
            for s in self.completed:
                what = f" - {_short(s.summary)}" if s.summary is not None else ""
                out.append(f"  step {s.number} {s.activity}{what}  -> {s.link}")
        else:
            out.append("Already done: nothing.")
        if self.in_doubt:
            out.append("In doubt (started, outcome unknown: check these before replaying):")
            for s in self.in_doubt:
                out.append(f"  step {s.number} {s.activity}  -> {s.link}")
        out.append(f"Journal: {self.run_link}")
        return "\n".join(out)


def _short(value: JSON) -> str:
    return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))


def _time(ts: float | None) -> str:
    if ts is None:
        return "-"
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def _duration(start: float | None, end: float | None) -> str:
    if start is None or end is None:
        return "-"
    seconds = end - start
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:.2f} s"


def timeline_rows(run: Run, entries: Sequence[JournalEntry]) -> list[dict[str, JSON]]:
    """One row per step try and per run event, in journal order."""
    rows: list[dict[str, JSON]] = []
    open_tries: dict[tuple[str, int], dict[str, JSON]] = {}
    for e in entries:
        if e.step is None:
            rows.append({"seq": e.seq, "event": e.kind.value, "at": e.at, "epoch": e.epoch,
                         "detail": dict(e.data)})
            continue
        key = (e.step_key or "", e.attempt or 1)
        if e.kind is EntryKind.STEP_STARTED:
            row: dict[str, JSON] = {"seq": e.seq, "step": e.step, "key": e.step_key,
                                    "activity": e.name, "state": "started",
                                    "attempt": e.attempt, "epoch": e.epoch, "start": e.at,
                                    "end": None, "error": None, "summary": None}
            open_tries[key] = row
            rows.append(row)
            continue
        row = open_tries.pop(key) if key in open_tries else {}
        if not row:
            row = {"seq": e.seq, "step": e.step, "key": e.step_key, "activity": e.name,
                   "attempt": e.attempt, "epoch": e.epoch, "start": e.at, "end": None,
                   "error": None, "summary": None}
            rows.append(row)
        state = {
            EntryKind.STEP_COMPLETED: "completed",
            EntryKind.VALUE: "completed",
            EntryKind.STEP_FAILED: "failed",
            EntryKind.STEP_RETRYING: "failed (retrying)",
            EntryKind.STEP_IN_DOUBT: "in_doubt",
        }[e.kind]
        row["state"] = state
        row["end"] = e.data.get("ended_at", e.at)
        row["error"] = e.data.get("error") or e.data.get("reason")
        row["summary"] = e.data.get("summary")
        if e.data.get("accepted"):
            row["state"] = "completed (accepted by operator)"
    return rows


def render_timeline(run: Run, entries: Sequence[JournalEntry], *,
                    step: int | None = None, console_url: str | None = None) -> str:
    """The human-readable ``show`` output: the run, then its journal as a timeline."""
    lines = [
        f"run       {run.id}",
        f"workflow  {run.workflow}    key: {run.key or '-'}",
        f"state     {run.state.value}    attempt: {run.attempt}    epoch: {run.epoch}",
        f"args      {json.dumps(run.args)}",
        f"created   {_time(run.created_at)}    run_at: {_time(run.run_at)}",
    ]
    if run.state is RunState.RUNNING:
        lines.append(f"worker    {run.worker}    lease until {_time(run.lease_expires_at)}")
    if run.state is RunState.COMPLETED:
        lines.append(f"result    {json.dumps(run.result)}")
    if run.error:
        lines.append(f"error     {run.error}")
    lines.append("")
    lines.append(f"{'step':>4}  {'activity':<28} {'state':<18} {'try':>3} {'start':<23} "
                 f"{'took':>8}  error")
    for row in timeline_rows(run, entries):
        if "event" in row:
            if step is None:
                detail = row["detail"]
                extra = ""
                if isinstance(detail, dict) and detail:
                    extra = "  " + ", ".join(f"{k}={v}" for k, v in detail.items()
                                             if k not in ("args",) and v is not None)
                lines.append(f"{'':>4}  {'· ' + str(row['event']):<28} {'':<18} {'':>3} "
                             f"{_time(row['at']):<23}{extra}")
            continue
        if step is not None and row["step"] != step:
            continue
        start = row["start"] if isinstance(row["start"], float) else None
        end = row["end"] if isinstance(row["end"], float) else None
        err = row.get("error") or ""
        summary = row.get("summary")
        if summary is not None and not err:
            err = f"({_short(summary)})"
        lines.append(
            f"{row['step']!s:>4}  {str(row['activity'])[:28]:<28} {row['state']!s:<18} "
            f"{row['attempt']!s:>3} {_time(start):<23} {_duration(start, end):>8}  {err}"
        )
    if step is None:
        report = RecoveryReport.build(run, entries, console_url)
        if run.state in (RunState.FAILED, RunState.CANCELLED) or report.in_doubt:
            lines.append("")
            lines.append(report.text())
    return "\n".join(lines)
