"""The JSON shapes of runs, journals and run details: one definition, used by the CLI's
``--json`` output and by the console's JSON API, so both always agree."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

from ._approval import approval_view
from ._progress import progress
from ._report import GoneHolder, RecoveryReport, timeline_rows
from ._types import JournalEntry, PausedWorkflow, Run, Signal


def run_json(run: Run, gone: GoneHolder | None = None) -> dict[str, Any]:
    """A run as JSON: every field of :class:`durable.Run`, the state as its name, and
    ``worker_gone``: of a running run whose worker is dead for sure (``gone``, from
    :meth:`durable.Client.gone_holders`), ``{"worker", "live_worker_found", "phrase"}``
    (``live_worker_found`` true, false or null: it could not be told); null when nothing
    is known of its worker (alive, not probed, or a probe that cannot tell)."""
    data = attrs.asdict(run)
    data["state"] = run.state.value
    data["worker_gone"] = None if gone is None else gone.as_dict()
    return data


def pause_json(pause: PausedWorkflow) -> dict[str, Any]:
    """A paused workflow as JSON: its workflow, ``paused_at`` and ``origin`` (not ``known``,
    which only the pause's caller is told)."""
    return attrs.asdict(pause, filter=lambda field, _: field.name != "known")


def entry_json(entry: JournalEntry) -> dict[str, Any]:
    """A journal entry as JSON: every field of :class:`durable.JournalEntry`."""
    data = attrs.asdict(entry)
    data["kind"] = entry.kind.value
    return data


def show_json(run: Run, entries: Sequence[JournalEntry], console_url: str | None = None,
              step: int | None = None, signals: Sequence[Signal] = (),
              gone: GoneHolder | None = None) -> dict[str, Any]:
    """``show ID --json``: the run, its steps (timeline rows), its journal, its recovery
    report, its per-item progress (None unless the run declared items with
    ``ctx.items``) and its plan and approval (None unless it journaled a plan); with
    ``step``, only that step's rows and entries."""
    report = RecoveryReport.build(run, entries, console_url)
    items = progress(run, entries)
    gate = approval_view(run, entries, signals)
    return {
        "run": run_json(run, gone),
        "steps": [row for row in timeline_rows(run, entries)
                  if step is None or row.get("step") == step],
        "journal": [entry_json(e) for e in entries if step is None or e.step == step],
        "report": report.as_dict(),
        "progress": None if items is None else items.as_dict(),
        "approval": None if gate is None else gate.as_dict(),
    }
