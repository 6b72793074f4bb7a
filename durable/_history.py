"""Folding a run's journal into the state of each step. The journal is the truth."""

from __future__ import annotations

from collections.abc import Iterable

import attrs

from ._types import JSON, EntryKind, JournalEntry, StepState


def tries(count: int) -> str:
    """``1 try``, ``2 tries``: how often a step was executed (a run's claims are attempts)."""
    return "1 try" if count == 1 else f"{count} tries"


def idempotency_key(run_id: str, step_key: str, reruns: int) -> str:
    """The ``Idempotency-Key`` a step's tries send: ``<run id>/<step key>``, then ``~n``
    once a replay has asked the completed step to run again for the n-th time (the service
    must not take the new call for a retry of the old one). The one derivation: the worker
    sends it, and what an operator is told to look for (:func:`durable._report.sent_request`)
    is it."""
    return f"{run_id}/{step_key}" + (f"~{reruns}" if reruns else "")


@attrs.define
class StepView:
    """What the journal says of one step."""

    number: int
    key: str
    name: str
    state: StepState | None = None
    """None: not (or no longer, after a replay) done; to run."""
    tries: int = 0
    """How many times the step was executed (its last try's number, counted across attempts)."""
    epoch: int = 0
    result: JSON = None
    error: str | None = None
    error_type: str | None = None
    summary: JSON = None
    started_at: float | None = None
    ended_at: float | None = None
    accepted: bool = False
    reruns: int = 0
    """How many times a replay asked for the step to run again (changes its idempotency key)."""
    result_known: bool = False
    """Whether :attr:`result` is what the step returned (False for a step accepted by an
    operator without a result: its activity's lookup, if any, finds it)."""
    tries_base: int = 0
    """:attr:`tries` when a replay last gave the step a fresh budget of tries."""
    interrupted: int = 0
    """Tries since then that their own attempt stopped (cancel, shutdown): not counted
    against ``RetryPolicy.max_tries``."""
    died: int = 0
    """Tries since then with no outcome that their attempt never reported: it died (or lost
    its lease) while the step ran."""
    retry_at: float | None = None
    """When the step's next try is due after a journaled retry delay (a delay long enough
    to release the run: the next attempt waits out what is left of it)."""
    wake_at: float | None = None
    """``ctx.sleep``: the journaled wake time."""
    wait_started: bool = False
    """``ctx.wait_for``: the wait was journaled (its signal name and timeout's time)."""
    wait_name: str | None = None
    wait_until: float | None = None
    wait_timeout: float | None = None
    args: list[JSON] | None = None
    """An activity step's arguments as its last journaled try was called with (None: no
    try journaled, or not an activity's step)."""
    timed_out: bool = False
    """``ctx.wait_for``: its timeout fired (journaled): it raises SignalTimeout again."""

    def in_doubt(self, current_epoch: int) -> bool:
        """Started by an earlier attempt with no outcome: the one definition of in doubt."""
        return self.state is StepState.IN_DOUBT or (
            self.state is StepState.STARTED and self.epoch < current_epoch)

    @property
    def tries_used(self) -> int:
        """Tries counted against ``RetryPolicy.max_tries``, across attempts."""
        return self.tries - self.tries_base - self.interrupted

    def fresh_budget(self) -> None:
        """A replay runs the step again: its tries count from here."""
        self.tries_base, self.interrupted, self.died = self.tries, 0, 0
        self.clear_waits()

    def clear_waits(self) -> None:
        """A replay that runs a sleep or a wait again starts it afresh (a new wake time, a
        new timeout), and a retry delay is not waited out again."""
        self.retry_at = self.wake_at = self.wait_until = self.wait_timeout = None
        self.wait_started = self.timed_out = False
        self.wait_name = None


_WAITS = frozenset({EntryKind.TIMER_STARTED, EntryKind.TIMER_FIRED, EntryKind.WAIT_STARTED,
                    EntryKind.SIGNAL_RECEIVED, EntryKind.SIGNAL_TIMEOUT})


class History:
    """Step states of one run, folded from its journal entries in order."""

    def __init__(self) -> None:
        self.steps: dict[str, StepView] = {}
        self.top = 0
        """The highest step number given out so far (kept, not searched for)."""
        self.last_seq = 0
        self.replays = 0
        self.signals_consumed: dict[str, int] = {}
        """The highest seq of each signal name a ``wait_for`` of this run received, over all
        its attempts and replays: signals are delivered in order, each once (a replay that
        runs a wait again waits for a new signal)."""
        self.record_versions: dict[tuple[str, str], int] = {}
        """The latest version of each record this run read (``get_record``) or wrote under
        a condition (``set_records``), over all its attempts and replays: what its next
        write of that record is conditioned on (compare-and-set)."""
        self.started_at: float | None = None
        """When the run's first attempt since it was created or last replayed was claimed
        (the store's clock): a workflow's ``timeout`` counts from there, across attempts."""

    @classmethod
    def fold(cls, entries: Iterable[JournalEntry]) -> History:
        history = cls()
        for entry in entries:
            history.apply(entry)
        return history

    def _record_versions(self, entry: JournalEntry) -> None:
        """Kept across replays: a replay re-runs steps, it does not undo their writes."""
        data = entry.data
        if entry.name == "durable.get_record" and "record" in data and "version" in data:
            ns, key = data["record"]
            self.record_versions[(ns, key)] = int(data["version"])
        elif entry.name == "durable.set_records" and "versions" in data:
            for ns, key, version in data["versions"]:
                self.record_versions[(ns, key)] = int(version)

    def add(self, key: str, name: str) -> StepView:
        """A new step, numbered after every step seen so far."""
        self.top += 1
        view = self.steps[key] = StepView(self.top, key, name)
        return view

    def by_number(self, number: int) -> StepView | None:
        for step in self.steps.values():
            if step.number == number:
                return step
        return None

    def ordered(self) -> list[StepView]:
        return sorted(self.steps.values(), key=lambda s: s.number)

    def apply(self, entry: JournalEntry) -> None:
        self.last_seq = max(self.last_seq, entry.seq)
        kind = entry.kind
        if kind is EntryKind.RUN_REPLAYED:
            self._replayed(entry)
            self.started_at = None  # a replay's first attempt starts the timeout anew
            return
        if kind is EntryKind.RUN_CLAIMED and self.started_at is None:
            self.started_at = entry.at
        if entry.step_key is None or entry.step is None:
            return
        self._record_versions(entry)
        step = self.steps.get(entry.step_key)
        if step is None:
            step = StepView(entry.step, entry.step_key, entry.name or "?")
            self.steps[entry.step_key] = step
            self.top = max(self.top, entry.step)
        data = entry.data
        started_by = step.epoch
        step.epoch = entry.epoch
        if kind is EntryKind.STEP_STARTED:
            if step.state is StepState.STARTED:
                step.died += 1  # the previous try ended with nobody left to report it
            step.state = StepState.STARTED
            args = data.get("args")
            if isinstance(args, list):
                step.args = args
            step.tries = max(step.tries, entry.try_number or 1)
            step.started_at = entry.at
            step.ended_at = None
            step.error = None
            step.retry_at = None
        elif kind is EntryKind.STEP_RETRYING:
            step.state = None  # that try failed for sure; the next try has not started
            step.error = data.get("error")
            step.error_type = data.get("error_type")
            retry_at = data.get("retry_at")
            step.retry_at = None if retry_at is None else float(retry_at)
        elif kind in _WAITS:
            self._waited(step, entry)
        elif kind is EntryKind.STEP_COMPLETED or kind is EntryKind.VALUE:
            step.state = StepState.COMPLETED
            step.result = data.get("result")
            step.result_known = True
            step.summary = data.get("summary")
            step.error = None
            step.accepted = bool(data.get("accepted"))
            step.ended_at = data.get("ended_at", entry.at)
            if step.started_at is None:
                step.started_at = entry.at
        elif kind is EntryKind.STEP_FAILED:
            step.state = StepState.FAILED
            step.error = data.get("error")
            step.error_type = data.get("error_type")
            step.summary = data.get("summary", step.summary)
            step.ended_at = entry.at
        elif kind is EntryKind.STEP_IN_DOUBT:
            if step.state is StepState.STARTED:
                if entry.epoch == started_by:
                    step.interrupted += 1  # its own attempt stopped it and said so
                else:
                    step.died += 1
            step.state = StepState.IN_DOUBT
            step.error = data.get("reason")

    def _waited(self, step: StepView, entry: JournalEntry) -> None:
        """The entries of ``ctx.sleep`` and ``ctx.wait_for`` (durable waiting)."""
        data, kind = entry.data, entry.kind
        if kind is EntryKind.TIMER_STARTED:
            step.wake_at = float(data["until"])
            step.started_at = entry.at
        elif kind is EntryKind.WAIT_STARTED:
            step.wait_started = True
            step.wait_name = str(data.get("name"))
            until, timeout = data.get("until"), data.get("timeout")
            step.wait_until = None if until is None else float(until)
            step.wait_timeout = None if timeout is None else float(timeout)
            step.started_at = entry.at
        else:  # fired, received, timed out: the wait is over
            step.state = StepState.COMPLETED
            step.result = data.get("payload") if kind is EntryKind.SIGNAL_RECEIVED else None
            step.result_known = True
            step.ended_at = entry.at
            step.timed_out = kind is EntryKind.SIGNAL_TIMEOUT
            if kind is EntryKind.SIGNAL_RECEIVED:
                name, seq = str(data.get("name")), int(data.get("seq") or 0)
                self.signals_consumed[name] = max(self.signals_consumed.get(name, 0), seq)

    def _replayed(self, entry: JournalEntry) -> None:
        self.replays += 1
        from_step = entry.data.get("from_step")
        policy = entry.data.get("in_doubt")
        for step in self.steps.values():
            if from_step is not None and step.number >= int(from_step):
                if step.state is StepState.COMPLETED:
                    step.reruns += 1
                step.state = None
                step.fresh_budget()
            elif step.state in (StepState.STARTED, StepState.IN_DOUBT):
                if policy == "accept":
                    step.state = StepState.COMPLETED
                    step.accepted = True
                    step.result_known = "result" in entry.data
                    step.result = entry.data.get("result")
                elif policy == "rerun":
                    step.state = None
                    step.fresh_budget()
            elif step.state is StepState.FAILED:
                step.state = None
                step.fresh_budget()
            if step.state is None:  # a sleep, wait or retry delay left pending: afresh
                step.clear_waits()

    def in_doubt(self, current_epoch: int) -> list[StepView]:
        """Steps started by an earlier attempt with no outcome."""
        return [s for s in self.ordered() if s.in_doubt(current_epoch)]
