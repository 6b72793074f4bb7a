"""Retention: deleting finished runs and their journals (docs/design.md, "Retention").

``python -m durable prune --older-than 30d`` (and a worker with ``--prune-older-than``)
deletes the runs that finished (completed, failed or cancelled, as asked) before that age,
with their journals, in batches of :data:`BATCH` runs, one short transaction each. Each
pruned run leaves a tombstone (:class:`PrunedRun`), so ``show`` and the console say when it
was pruned and how it had ended, instead of "no such run". The journal of an unfinished run
stays append-only: the database's own trigger refuses to delete it.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import anyio
import anyio.lowlevel
import attrs

from ._errors import ConfigError, RunConflictError
from ._logging import get_logger
from ._resend import answered
from ._types import MAX_SECONDS, Run, RunState

if TYPE_CHECKING:
    from .store import Store

BATCH = 500
"""Runs deleted per transaction: a few milliseconds of write lock (SQLite) each."""

FINISHED = (RunState.COMPLETED, RunState.FAILED, RunState.CANCELLED)

_UNITS = (("w", 7 * 86400), ("d", 86400), ("h", 3600), ("m", 60), ("s", 1))
_DURATION = re.compile("".join(rf"(?:(\d+){unit})?" for unit, _ in _UNITS))


def parse_duration(text: str, option: str = "--older-than") -> float:
    """Seconds of ``30d``, ``12h``, ``90m``, ``0s``, ``1w2d`` (units w, d, h, m, s, each at
    most once, largest first; whole numbers). Anything else is a :class:`ConfigError`."""
    match = _DURATION.fullmatch(text.strip()) if isinstance(text, str) else None
    if not text or match is None or not any(match.groups()):
        raise ConfigError(f"{option} takes an age such as 30d, 12h, 90m or 0s (units w, d, h, "
                          f"m, s, largest first), not {text!r}")
    seconds = float(sum(int(n) * size for n, (_, size) in zip(match.groups(), _UNITS,
                                                                strict=True)
                        if n is not None))
    if seconds > MAX_SECONDS:
        raise ConfigError(f"{option} takes an age of at most 100 years, not {text!r}")
    return seconds


def parse_states(text: str, option: str = "--state") -> tuple[RunState, ...]:
    """``completed,cancelled`` as finished states (an unfinished one is refused)."""
    states: list[RunState] = []
    for name in (part.strip() for part in text.split(",")):
        try:
            state = RunState(name)
        except ValueError:
            state = None
        if state is None or not state.finished:
            raise ConfigError(
                f"{option} takes finished states, comma-separated: completed, failed, "
                f"cancelled; not {name!r} (an unfinished run is never pruned)")
        if state not in states:
            states.append(state)
    return tuple(states)


def _iso(when: float) -> str:
    return dt.datetime.fromtimestamp(when, dt.UTC).isoformat(timespec="seconds").replace(
        "+00:00", "Z")


@attrs.frozen
class PrunedRun:
    """The tombstone of a pruned run: what it was and how it ended, and when it was pruned."""

    id: str
    workflow: str
    key: str | None
    state: RunState
    ended_at: float
    pruned_at: float

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> PrunedRun:
        return cls(row["id"], row["workflow"], row["concurrency_key"], RunState(row["state"]),
                   float(row["ended_at"]), float(row["pruned_at"]))

    def describe(self) -> str:
        """One line: ``run X (slot.reset) ended completed at ...; pruned on ...``."""
        return (f"run {self.id!r} ({self.workflow}) was pruned on {_iso(self.pruned_at)}: it "
                f"ended {self.state.value} at {_iso(self.ended_at)}; its journal is gone "
                "(durable prune deletes finished runs)")

    def reused(self) -> RunConflictError:
        """The error of a start that reuses this pruned run's id (nothing is written)."""
        return RunConflictError(
            f"run id {self.id!r} named a {self.workflow} run that ended {self.state.value} "
            f"and was pruned on {_iso(self.pruned_at)}: an id names one run, even after "
            "pruning (a start with it would run the operation again); choose another id")

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "workflow": self.workflow, "key": self.key,
                "state": self.state.value, "ended_at": _iso(self.ended_at),
                "pruned_at": _iso(self.pruned_at), "pruned": True}


async def prune(
    store: Store,
    older_than: float,
    states: Sequence[RunState] = FINISHED,
    *,
    dry_run: bool = False,
    batch: int = BATCH,
    seen: Callable[[Run | PrunedRun], None] | None = None,
    unanswered: Callable[[RunState, int], None] | None = None,
) -> int:
    """Delete (or, ``dry_run``, only list) the runs in ``states`` that ended more than
    ``older_than`` seconds ago by the store's clock, ``batch`` runs per transaction; return
    how many. ``seen`` is called with each run listed (a :class:`Run`) or pruned (its
    :class:`PrunedRun`).

    A batch whose answer was lost may have committed: it is sent once more (a batch deletes
    whatever still matches, never a run twice), and ``unanswered(state, batch)`` says that
    up to ``batch`` runs of that state may have been pruned without being counted (their
    tombstones say so). A second silence raises :class:`StoreUnavailableError`."""
    if older_than < 0:
        raise ConfigError("the age of the runs to prune must not be negative")
    if batch < 1:
        raise ConfigError("a prune batch must hold at least one run")
    wanted = tuple(states)
    if not wanted or any(not RunState(s).finished for s in wanted):
        raise ConfigError("only finished runs (completed, failed, cancelled) can be pruned")
    cutoff = await store.now() - older_than
    total = 0
    for state in wanted:
        after: tuple[float, str] | None = None
        while True:
            found: Sequence[Run | PrunedRun]
            if dry_run:
                runs = await store.prunable_runs(state, cutoff, batch, after)
                if runs:
                    after = (runs[-1].updated_at, runs[-1].id)
                found = runs
            else:
                found = await _prune_batch(store, state, cutoff, batch, unanswered)
            total += len(found)
            if seen is not None:
                for item in found:
                    seen(item)
            if len(found) < batch:
                break
            await anyio.lowlevel.checkpoint()  # between two batches, other writers get the database
    return total


async def _prune_batch(store: Store, state: RunState, cutoff: float, batch: int,
                       unanswered: Callable[[RunState, int], None] | None
                       ) -> Sequence[PrunedRun]:
    async def again() -> Sequence[PrunedRun]:
        if unanswered is not None:
            unanswered(state, batch)
        return await store.prune_runs(state, cutoff, batch)

    return await answered(
        lambda: store.prune_runs(state, cutoff, batch), again, _log, "prune_outcome_unknown",
        f"a prune batch of up to {batch} {state.value} runs",
        "they may have been pruned (their tombstones say so: durable show ID); run it "
        "again to prune the rest", state=state.value, batch=batch)


_log = get_logger("durable.retention")
