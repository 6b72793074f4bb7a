"""``python -m durable show ID --follow``: a run's timeline, then its journal as it is written.

The follower prints the run and its timeline as ``show`` does, then polls, every
:data:`POLL` seconds, the run (through :meth:`durable.Client.get`, so a run whose worker died
is recovered on this read path too) and the journal entries after the last one seen. A step
is printed when it starts and again when its try ends (completed, retrying, failed, in
doubt); run events (claimed, recovered, cancel requested, ...) as they happen. When the run
has ended it prints the final state line (and what to do next if it failed, was cancelled or
left steps in doubt) and returns.

A read that finds the store unreachable (a server restarting, a network blip) does not end
the follow: one line says so, the reads go on every :data:`POLL` seconds, and one line says
when the store answers again (Ctrl-C stops following, as always; the run goes on).

A run that declared its items (``ctx.items``) also shows its progress: on a terminal one
line at the bottom, redrawn in place with a carriage return; piped, a plain line each time
the counts change (no carriage return, no colour unless asked for).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import IO, Any

import anyio

from ._client import Client
from ._errors import StoreUnavailableError
from ._history import History
from ._logging import redact
from ._progress import Progress, progress_of
from ._report import (
    RecoveryReport,
    Segment,
    _clock,
    _datetime,
    _fit,
    _View,
    event_phrase,
    timeline_rows,
    utc,
)
from ._types import JSON, JournalEntry, Run, RunState

POLL = 0.5
"""Seconds between two looks at the run and its journal."""

BAR = 24
"""The progress bar's width in characters (narrowed on a narrow terminal)."""


def _row_id(row: dict[str, JSON]) -> tuple[Any, ...]:
    """What identifies a row across polls (a step's try keeps its row as its state moves)."""
    if "event" in row:
        return ("event", row["seq"])
    return ("step", row["seq"], row["key"], row["try"], row["state"] == "accepted")


def _row_shown(row: dict[str, JSON]) -> tuple[Any, ...]:
    """What, when it changes, prints the row again."""
    return tuple(row.get(k) for k in ("state", "took", "error", "note", "summary"))


class _FollowView(_View):
    """The timeline's lines, one row at a time, as they arrive."""

    def __init__(self, width: int, color: bool, rows: Sequence[dict[str, JSON]]) -> None:
        super().__init__(width, color)
        names = [len(str(r["activity"])) for r in rows if "event" not in r]
        fixed = self.TIME + 2 + self.STEP + 2 + 1 + self.STATE + 1 + self.TRY + 1 + self.TOOK + 2
        # room for the names of steps not started yet (the timeline fits those it has)
        self.act = min(max([*names, 16]), 24, max(self.width - fixed - 14, 8))
        self.date: object = None
        self.shown_errors: dict[object, tuple[str, object]] = {}

    def head(self) -> None:
        self.add(("", None))
        self.add((f"{'time UTC':<{self.TIME}}  {'step':>{self.STEP}}  {'activity':<{self.act}} "
                  f"{'state':<{self.STATE}} {'try':>{self.TRY}} {'took':>{self.TOOK}}  summary",
                  "dim"))

    def row(self, run: Run, row: dict[str, JSON], *, live: bool) -> None:
        """One row; ``live``: it is news, dated when it happened (a try's end, not its
        start as in the timeline)."""
        at = row["at"] if "event" in row else (
            row["start"] or row.get("noticed_at") or row["end"])
        if live and "event" not in row and row["state"] not in ("started", "accepted"):
            at = row["end"] or row.get("noticed_at") or at
        if isinstance(at, float) and _datetime(at).date() != self.date:
            self.date = _datetime(at).date()
            self.add((_datetime(at).date().isoformat(), "bold"))
        clock = _clock(at) if isinstance(at, float) else "-"
        if "event" in row:
            self.add((f"{clock:<{self.TIME}}  {'':>{self.STEP}}  ", "dim"),
                     (f"· {event_phrase(row)}", "dim"))
        else:
            self._step_row(run, row, clock, self.shown_errors)

    def progress_line(self, p: Progress, at: float | None) -> None:
        clock = _clock(at) if at is not None else "-"
        self.add((f"{clock:<{self.TIME}}  {'':>{self.STEP}}  ", "dim"),
                 ("· items ", "dim"), *_counts(p))

    def final(self, run: Run, entries: Sequence[JournalEntry],
              console_url: str | None) -> None:
        self.add(("", None))
        claims = (f"attempt {run.attempt} (epoch {run.epoch})" if run.attempt
                  else "never claimed")
        self.add(("run ", None), (run.id, "bold"), (" ", None),
                 (run.state.value, run.state.value),
                 (f"    {claims}, finished {utc(run.updated_at)}", None))
        report = RecoveryReport.build(run, entries, console_url)
        if run.state in (RunState.FAILED, RunState.CANCELLED) or report.in_doubt:
            self.next_steps(run, report, console_url)


def _counts(p: Progress) -> list[Segment]:
    parts: list[Segment] = [(f"{p.done}/{p.total} done", "bold"),
                            (" · ", None), (f"{p.failed} failed", "failed" if p.failed else None),
                            (" · ", None),
                            (f"{p.in_flight} in flight", "running" if p.in_flight else None)]
    if p.in_doubt:
        parts += [(" · ", None), (f"{p.in_doubt} in doubt", "in_doubt")]
    parts += [(" · ", None), (f"{p.pending} pending", None)]
    return parts


def bar_line(p: Progress, width: int, color: bool) -> str:
    """The terminal's progress line: ``items [████▒▒░░░░] 4/10 done · 1 failed · ...``."""
    size = max(min(BAR, width - 60), 10)
    done = size * p.done // p.total if p.total else size
    failed = min(size * p.failed // p.total if p.total else 0, size - done)
    if p.failed and not failed and done < size:
        failed = 1  # a failure always shows
    rest = size - done - failed
    return _fit([("items ", "dim"), ("[", None), ("█" * done, "completed"),
                 ("▒" * failed, "failed"), ("░" * rest, "dim"), ("] ", None), *_counts(p)],
                width - 1, color)  # never the last column: a terminal would wrap there


class Follower:
    """Prints a run as it goes; see the module's docstring."""

    def __init__(self, client: Client, run_id: str, out: IO[str], *, width: int,
                 color: bool, tty: bool, console_url: str | None = None,
                 poll: float = POLL) -> None:
        self.client = client
        self.run_id = run_id
        self.out = out
        self.width = width
        self.color = color
        self.tty = tty
        self.console_url = console_url
        self.poll = poll
        self.entries: list[JournalEntry] = []
        self.history = History()
        self.shown: dict[tuple[Any, ...], tuple[Any, ...]] = {}
        self.progress: Progress | None = None
        self._bar = 0
        """The length of the progress line drawn on the terminal (0: none drawn)."""
        self.view: _FollowView | None = None

    async def run(self) -> Run:
        """Follow until the run has ended; the run as it ended."""
        run = await self.client.get(self.run_id)
        self._add(await self.client.store.journal(self.run_id))
        self._start(run)
        unreachable: float | None = None  # since when the reads fail
        try:
            while not run.state.finished:
                await anyio.sleep(self.poll)
                try:
                    now = await self.client.get(self.run_id)  # first the run, then its
                    new = await self.client.store.journal(  # journal: an ended run's
                        self.run_id, after=self.history.last_seq)  # is read to its end
                except StoreUnavailableError as exc:
                    if unreachable is None:
                        unreachable = anyio.current_time()
                        self._note(f"-- the store cannot be read: {redact(str(exc))}; "
                                   f"reading again every {self.poll:g} s (Ctrl-C stops "
                                   f"following; the run goes on)")
                    continue
                if unreachable is not None:
                    self._note(f"-- the store answers again (unreadable for "
                               f"{anyio.current_time() - unreachable:.1f} s)")
                    unreachable = None
                before, run = run, now
                self._add(new)
                if new or _phase(run) != _phase(before):
                    self._update(run)
        except BaseException:  # an error's line, or the shell's prompt, below the bar
            self.stop()
            raise
        self._finish(run)
        return run

    def stop(self) -> None:
        """End the terminal's progress line (the follower was interrupted)."""
        if self._bar:
            self._bar = 0
            with contextlib.suppress(OSError):  # the terminal may be gone
                self._write("\n")

    # -- internals -----------------------------------------------------------------------------
    def _note(self, text: str) -> None:
        """A line of the follower's own, between the timeline's (above a progress bar)."""
        view = self.view
        assert view is not None
        view.lines.append(text)
        self._flush_lines()
        if self.tty and self.progress is not None:  # the bar, drawn again below it
            self._draw(bar_line(self.progress, self.width, self.color))

    def _add(self, entries: list[JournalEntry]) -> None:
        for entry in entries:
            self.history.apply(entry)
        self.entries.extend(entries)

    def _start(self, run: Run) -> None:
        rows = timeline_rows(run, self.entries)
        view = self.view = _FollowView(self.width, self.color, rows)
        view.header(run, rows, self.entries)
        view.head()
        self._emit(run, rows, live=False)

    def _update(self, run: Run) -> None:
        self._emit(run, timeline_rows(run, self.entries), live=True)

    def _emit(self, run: Run, rows: list[dict[str, JSON]], *, live: bool) -> None:
        view = self.view
        assert view is not None
        for row in rows:
            ident, shown = _row_id(row), _row_shown(row)
            if self.shown.get(ident) != shown:
                self.shown[ident] = shown
                view.row(run, row, live=live)
        now = progress_of(run, self.history)
        changed = now is not None and now != self.progress
        self.progress = now
        if changed and not self.tty:
            assert now is not None
            at = self.entries[-1].at if self.entries else None
            view.progress_line(now, at)
        self._flush_lines()
        if self.tty and now is not None and (changed or not self._bar):
            self._draw(bar_line(now, self.width, self.color))

    def _finish(self, run: Run) -> None:
        view = self.view
        assert view is not None
        if self._bar:
            self._write("\n")  # the bar, as it ended, stays on the screen
            self._bar = 0
        view.final(run, self.entries, self.console_url)
        self._flush_lines()

    def _flush_lines(self) -> None:
        view = self.view
        assert view is not None
        if not view.lines:
            return
        text = "".join(line + "\n" for line in view.lines)
        view.lines.clear()
        if self._bar:  # lines go above the progress line: clear it (drawn again after)
            text = "\r" + " " * self._bar + "\r" + text
            self._bar = 0
        self._write(text)

    def _draw(self, line: str) -> None:
        visible = len(_plain(line))
        pad = " " * max(self._bar - visible, 0)  # cover a longer line drawn before
        self._write("\r" + line + pad)
        self._bar = visible

    def _write(self, text: str) -> None:
        self.out.write(text)
        self.out.flush()


def _phase(run: Run) -> tuple[Any, ...]:
    """What of the run the rows depend on (not its lease, renewed every second)."""
    return run.state, run.epoch, run.attempt


def _plain(text: str) -> str:
    """``text`` without its colour codes."""
    out, i = [], 0
    while i < len(text):
        if text[i] == "\x1b":
            end = text.find("m", i)
            i = end + 1 if end >= 0 else len(text)
            continue
        out.append(text[i])
        i += 1
    return "".join(out)

