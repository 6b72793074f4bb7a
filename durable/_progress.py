"""Per-item progress of a batch run, derived from its journal.

A workflow declares its items with ``await ctx.items(total, key_prefix="item-")`` (a
journaled value named ``durable.items``); item ``i`` is the step keyed ``f"{key_prefix}{i}"``.
Each item is in exactly one state, judged the way the recovery report judges steps:

- ``done``: the step completed (an operator's ``replay --accept-in-doubt`` counts too);
- ``failed``: the step failed (a replay makes it pending again: it will run again);
- ``in_flight``: the current attempt started it (or waits to try it again);
- ``in_doubt``: started by an attempt that is over, with no outcome: it may or may not
  have taken effect, so it is never counted as done;
- ``pending``: not started yet (or to run again after a replay).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Literal

import attrs

from ._history import History, StepView
from ._report import _current_epoch
from ._types import JSON, JournalEntry, Run, RunState, StepState

ITEMS = "durable.items"
"""The name of the journaled value that declares a run's items."""

ItemState = Literal["pending", "in_flight", "done", "failed", "in_doubt"]


@attrs.frozen
class Items:
    """A run's declaration of its items (the result of its ``durable.items`` value)."""

    total: int
    key_prefix: str

    def keys(self) -> Iterator[str]:
        return (f"{self.key_prefix}{i}" for i in range(self.total))


@attrs.frozen
class Progress:
    """How many of a run's declared items are in each state; the counts add up to total."""

    total: int
    done: int
    failed: int
    in_flight: int
    in_doubt: int
    pending: int

    def as_dict(self) -> dict[str, JSON]:
        return attrs.asdict(self)

    @property
    def finished(self) -> int:
        """Items with an outcome (done or failed)."""
        return self.done + self.failed


def declared(history: History) -> Items | None:
    """The run's latest declaration of items, or None if it declared none."""
    found: Items | None = None
    for view in history.ordered():
        result = view.result
        if view.name != ITEMS or not isinstance(result, dict):
            continue
        total, prefix = result.get("total"), result.get("key_prefix")
        if isinstance(total, int) and isinstance(prefix, str):
            found = Items(total, prefix)
    return found


def item_state(view: StepView | None, current_epoch: int, *, running: bool,
               waiting: bool = False) -> ItemState:
    """The state of one item whose step is ``view`` (None: never started).

    ``current_epoch`` is the epoch of the attempt that is running (see
    :func:`durable._report._current_epoch`); ``running`` whether the run is running;
    ``waiting`` whether it is queued after an attempt (released: a long retry delay waits so).
    """
    if view is None:
        return "pending"
    if view.state is StepState.COMPLETED:
        return "done"
    if view.state is StepState.FAILED:
        return "failed"
    if view.in_doubt(current_epoch):
        return "in_doubt"
    if view.state is StepState.STARTED:
        return "in_flight"
    # no state: never tried, to run again after a replay, or waiting to be tried again
    # (step_retrying) by the attempt that is running
    if running and view.tries > 0 and view.epoch == current_epoch:
        return "in_flight"
    if waiting and view.retry_at is not None:  # the run was released until its next try
        return "in_flight"
    return "pending"


def states_of(run: Run, history: History) -> dict[str, ItemState] | None:
    """Each declared item's state by its step key, or None if the run declared no items."""
    items = declared(history)
    if items is None:
        return None
    current = _current_epoch(run)
    running = run.state is RunState.RUNNING
    waiting = run.state is RunState.QUEUED and run.attempt > 0
    return {key: item_state(history.steps.get(key), current, running=running, waiting=waiting)
            for key in items.keys()}


def item_states(run: Run, entries: Sequence[JournalEntry]) -> dict[str, ItemState] | None:
    """Each declared item's state by its step key (``item-0``...), in item order."""
    return states_of(run, History.fold(entries))


def states_by_key(entries: Sequence[JournalEntry], keys: Iterable[str],
                  run: Run | None = None) -> dict[str, ItemState]:
    """The state of the steps ``keys``, declared as items or not (a run started before its
    workflow declared items). Without ``run``, the latest attempt in the journal is taken
    to be running."""
    history = History.fold(entries)
    if run is not None:
        current, running = _current_epoch(run), run.state is RunState.RUNNING
    else:
        current, running = max((e.epoch for e in entries), default=0), True
    return {key: item_state(history.steps.get(key), current, running=running) for key in keys}


def progress_of(run: Run, history: History) -> Progress | None:
    """:func:`progress` from a journal already folded (a follower folds as entries come)."""
    states = states_of(run, history)
    if states is None:
        return None
    counts = dict.fromkeys(("done", "failed", "in_flight", "in_doubt", "pending"), 0)
    for state in states.values():
        counts[state] += 1
    return Progress(total=len(states), **counts)


def progress(run: Run, entries: Sequence[JournalEntry]) -> Progress | None:
    """The run's per-item progress, or None when the run declared no items."""
    return progress_of(run, History.fold(entries))
