"""Plan, then approve: a run journals its plan and waits for an operator's decision.

The workflow side is :func:`approval_gate`: it runs a plan activity as the step keyed
:data:`PLAN_KEY` (its result, journaled, is the plan), then waits for the ``approve`` signal
(:meth:`durable.Client.signal`, ``python -m durable approve ID``, the console's button). A
``reject`` (``python -m durable reject ID``, the console) is journaled as a signal and
cancels the run, which ends without doing anything. The workflow then re-checks its plan
right before acting (see ``workflows/_plan.py`` for the slots' re-check).

The reading side is :func:`approval_view`: the plan and the decision derived from a run's
journal, for ``show`` and the console. A plan is the result of the completed step keyed
``plan``; when it has ``items`` (``{"action", "kind", "id", "detail"}``) they are shown as a
list, else the result is shown as JSON. The decision and its origin come from the journaled
signal, never from what a workflow says about it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs

from ._commands import command
from ._errors import (
    ConfigError,
    DurableError,
    InvalidStateError,
    RunConflictError,
    SignalTimeout,
)
from ._types import JSON, EntryKind, JournalEntry, Run, RunState, Signal

if TYPE_CHECKING:
    from ._client import Client
    from ._context import WorkflowContext
    from ._registry import Activity

__all__ = ["APPROVE", "PLAN_KEY", "REJECT", "Approval", "ApprovalRejected", "ApprovalView",
           "approval_gate", "approval_view", "origin_text", "plan_digest", "send_decision"]

PLAN_KEY = "plan"
APPROVE = "approve"
REJECT = "reject"


class ApprovalRejected(DurableError):
    """An operator rejected the run's plan (or no decision came in time): nothing was done."""


@attrs.frozen
class Approval:
    """An approved plan: the plan (the ``plan`` step's result) and who approved it."""

    plan: Any
    payload: JSON
    """The approve signal's payload (``{"note": ...}`` from the CLI and the console). Who
    sent it is journaled with the signal (its origin), shown by ``show`` and the console."""


def origin_text(origin: Any) -> str:
    """``user@host (cli)``, ``127.0.0.1 (console)``: who an action came from, for messages."""
    if not isinstance(origin, Mapping) or not origin:
        return "an unnamed sender"
    via = origin.get("via")
    who = origin.get("user") or origin.get("remote") or origin.get("who")
    host = origin.get("host")
    text = str(who) if who else "someone"
    if host and origin.get("user"):
        text += f"@{host}"
    return f"{text} ({via})" if via else text


def plan_digest(plan: JSON) -> str:
    """A short digest of a plan (its canonical JSON): what an approval names to approve
    exactly that plan."""
    text = json.dumps(plan, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _names_another_plan(payload: JSON, digest: str) -> bool:
    return isinstance(payload, Mapping) and "plan" in payload and payload["plan"] != digest


async def approval_gate(ctx: WorkflowContext, plan: Activity[..., Any], *args: Any,
                        timeout: float | None = None) -> Approval:
    """Journal the plan (``plan(*args)`` as the step keyed ``plan``), then wait for the
    ``approve`` signal (``ctx.wait_for``: a waiting run holds no lease).

    Answers the :class:`Approval`. An approve whose payload names another plan
    (``{"plan": digest}`` that is not :func:`plan_digest` of this one: an approval of an
    earlier plan, before a replay planned again) is received and ignored, and the run waits
    on; :func:`send_decision` always names the plan, a raw signal may leave it out. A reject
    ends the run cancelled (:func:`send_decision` records the ``reject`` signal, then
    cancels), so it never reaches the workflow. No decision within ``timeout`` seconds (None:
    wait forever; counted again after an ignored approve) raises :class:`ApprovalRejected`.
    """
    result = await ctx.step(plan, *args, key=PLAN_KEY)
    digest = plan_digest(result)
    while True:
        try:
            payload = await ctx.wait_for(APPROVE, timeout=timeout)
        except SignalTimeout as exc:
            raise ApprovalRejected(f"no decision on the plan within {timeout:g} s; nothing "
                                   "was done") from exc
        if not _names_another_plan(payload, digest):
            return Approval(result, payload)


async def send_decision(client: Client, run_id: str, name: str, payload: JSON = None, *,
                        id: str | None = None, origin: Mapping[str, JSON] | None = None,
                        per_plan: bool = False) -> bool:
    """Send ``approve`` or ``reject`` to a run waiting for a decision on its plan; the CLI's
    ``approve`` / ``reject`` and the console's buttons all come through here.

    Refused (:class:`InvalidStateError`, nothing sent) for a run that journaled no plan yet
    (an approval must follow the plan it approves), whose plan was already decided, or that
    is finished. ``approve`` is the signal the run waits for. ``reject`` is recorded as a
    signal (who and why, journaled), then the run is cancelled (``origin`` journaled with the
    cancel too): it ends ``cancelled`` without doing anything. Answers whether a new signal
    was recorded (False: ``id`` was already used for this run, for this very decision); a
    decision sent meanwhile under ``id`` with another note is refused as already made.
    ``per_plan``: ``id`` is made the plan's own (the plan entry's seq appended), so a plan
    journaled again by a replay takes a decision under the same ``id`` (the console's).
    """
    if name not in (APPROVE, REJECT):
        raise ConfigError(f"a decision is {APPROVE!r} or {REJECT!r}, not {name!r}")
    run = await client.get(run_id)
    entries = await client.journal(run_id)
    gate = approval_view(run, entries, await client.store.list_signals(run_id),
                         await client.store.now())
    if gate is None:
        raise InvalidStateError(f"{run_id} has no plan to {name}: it journaled none (yet)")
    if gate.decision != "waiting":
        raise InvalidStateError(f"{run_id}: its plan was already {gate.decision} by {gate.by}")
    if run.state.finished:
        raise InvalidStateError(f"{run_id} is {run.state.value}: it no longer waits for a "
                                "decision")
    if name == APPROVE and gate.ran_out is not None:
        from ._report import utc

        raise InvalidStateError(
            f"{run_id}: its wait for a decision ran out at {utc(gate.ran_out)}; an approval "
            "would not reach it (the run gives up on its plan without acting when a worker "
            "takes it); nothing was sent")
    if payload is not None and not isinstance(payload, Mapping):
        raise ConfigError("a decision's payload is a JSON object ({\"note\": ...})")
    named = {**(payload or {}), "plan": plan_digest(gate.plan)}  # approves exactly this plan
    if per_plan and id is not None:  # one decision per plan: a replay's new plan gets its own
        id = f"{id}-{gate.plan_seq}"
    try:
        sent = await client.signal(run_id, name, named, id=id, origin=origin)
    except RunConflictError:  # the id's decision, sent meanwhile (two tabs), is the one made
        gate = approval_view(run, await client.journal(run_id),
                             await client.store.list_signals(run_id))
        if gate is None or gate.decision == "waiting":
            raise
        raise InvalidStateError(
            f"{run_id}: its plan was already {gate.decision} by {gate.by}") from None
    if name == REJECT:
        await client.cancel(run_id, origin=origin)
    return sent


def _ran_out(entries: Sequence[JournalEntry], now: float) -> float | None:
    """The deadline of the run's open wait for ``approve`` if it has passed (``now`` on the
    store's clock), else None: a signal recorded after it is not received
    (docs/design.md, "Durable waiting")."""
    for e in reversed(entries):
        if e.kind in (EntryKind.SIGNAL_RECEIVED, EntryKind.SIGNAL_TIMEOUT) \
                and e.data.get("name") == APPROVE:
            return None  # the latest wait for a decision ended
        if e.kind is EntryKind.WAIT_STARTED and e.data.get("name") == APPROVE:
            until = e.data.get("until")
            return float(until) if isinstance(until, int | float) and until < now else None
    return None


# -- reading a run's plan and decision from its journal ------------------------------------------
@attrs.frozen
class ApprovalView:
    """A run's plan and what became of it, derived from the journal."""

    plan: Any
    plan_step: int
    decision: str
    """``waiting`` (no decision yet), ``approved`` or ``rejected``."""
    by: str | None = None
    origin: JSON = None
    at: float | None = None
    payload: JSON = None
    digest: str = ""
    """:func:`plan_digest` of the plan: an approve naming another digest is ignored."""
    early: bool = False
    """The decision was sent before the plan was journaled (a raw ``signal``; the CLI's and
    the console's approve refuse to)."""
    plan_seq: int = 0
    """The journal seq of the plan's entry: a replay that plans again journals a new one."""
    ran_out: float | None = None
    """When the run's wait for a decision ran out, if it has with no decision while the run
    is unfinished (read with a ``now``): an approval sent now would not be received."""

    @property
    def items(self) -> list[dict[str, Any]] | None:
        items = self.plan.get("items") if isinstance(self.plan, Mapping) else None
        if isinstance(items, list) and all(isinstance(i, Mapping) for i in items):
            return [dict(i) for i in items]
        return None

    @property
    def title(self) -> str:
        title = self.plan.get("title") if isinstance(self.plan, Mapping) else None
        return str(title) if title else "Plan"

    def as_dict(self) -> dict[str, JSON]:
        return {"plan": self.plan, "plan_step": self.plan_step, "decision": self.decision,
                "by": self.by, "origin": self.origin, "at": self.at, "payload": self.payload,
                "digest": self.digest, "early": self.early}

    def lines(self) -> list[str]:
        """The plan as plain text lines (``show``)."""
        out = [self.title]
        items = self.items
        if items is None:
            out.append(f"  {self.plan!r}")
        else:
            for i in items:
                kind = str(i.get("kind")).replace("_", " ")
                out.append(f"  - {i.get('action')}: {kind} {i.get('id')}"
                           + (f" · {i.get('detail')}" if i.get("detail") else ""))
        return out


def approval_view(run: Run, entries: Sequence[JournalEntry],
                  signals: Sequence[Signal] = (), now: float | None = None
                  ) -> ApprovalView | None:
    """The run's plan and its decision, or None for a run without a plan.

    The plan is the latest result of the step keyed ``plan`` (a replay from that step plans
    again). The decision is the first ``approve`` or ``reject`` signal journaled after it
    (``signal_sent``, with its origin), else one sent before any plan existed (``early``:
    only a raw ``signal`` can send that; the run's ``wait_for`` takes it all the same). Its
    payload is the one a ``wait_for`` received, else the stored signal's (``signals``, from
    :meth:`Store.list_signals`), if given. With ``now`` (the store's clock), a gate still
    waiting says whether its wait ran out (``ran_out``)."""
    plans = [e for e in entries
             if e.step_key == PLAN_KEY and e.kind is EntryKind.STEP_COMPLETED]
    if not plans:
        return None
    first, latest = plans[0], plans[-1]
    plan = latest.data.get("result")
    digest = plan_digest(plan)
    stored = {s.seq: s.payload for s in signals}
    received: dict[int, JSON] = {}
    for e in entries:
        if e.kind is EntryKind.SIGNAL_RECEIVED and isinstance(e.data.get("seq"), int):
            received[int(e.data["seq"])] = e.data.get("payload")
    after: JournalEntry | None = None
    before: JournalEntry | None = None
    for e in entries:
        if e.kind is not EntryKind.SIGNAL_SENT or e.data.get("name") not in (APPROVE, REJECT):
            continue
        seq = e.data.get("seq")
        payload = received.get(seq, stored.get(seq)) if isinstance(seq, int) else None
        if e.data["name"] == APPROVE and _names_another_plan(payload, digest):
            continue  # the run ignores it (an approval of an earlier plan)
        if e.seq > latest.seq and after is None:
            after = e
        elif e.seq < first.seq and before is None:
            before = e
    step = latest.step or 0
    decision = after or before
    if decision is None:
        ran_out = (_ran_out(entries, now) if now is not None and not run.state.finished
                   else None)
        return ApprovalView(plan, step, "waiting", digest=digest, plan_seq=latest.seq,
                            ran_out=ran_out)
    seq = decision.data.get("seq")
    payload = received.get(seq, stored.get(seq)) if isinstance(seq, int) else None
    origin = decision.data.get("origin")
    return ApprovalView(plan, step,
                        "approved" if decision.data["name"] == APPROVE else "rejected",
                        origin_text(origin), origin, decision.at, payload,
                        early=decision is before, digest=digest, plan_seq=latest.seq)


@attrs.frozen
class ClosedPlan:
    """Why a replay that keeps a run's latest plan could never act (:func:`closed_plan`):
    ``reason``, and the step to replay from to plan again and ask anew, which each surface
    names its own way (the CLI's ``--from-step``, the console's replay form)."""

    run_id: str
    plan_step: int
    reason: str

    def __str__(self) -> str:  # as the client and the command line say it
        return (f"{self.reason}; replay it from the plan step to plan again and ask anew: "
                f"{command('replay', self.run_id, '--from-step', self.plan_step)}")


class PlanClosedError(InvalidStateError):
    """A replay refused: it would keep a plan that can never be acted on (the
    :class:`ClosedPlan` it carries says why and from which step to replay)."""

    def __init__(self, closed: ClosedPlan) -> None:
        super().__init__(str(closed))
        self.closed = closed


def closed_plan(run: Run, entries: Sequence[JournalEntry],
                from_step: int | None) -> ClosedPlan | None:
    """Why a replay of ``run`` that keeps its latest plan could never act, or None.

    A replay reuses what the journal holds, the plan and what became of it included. A plan
    that was rejected stays rejected (:func:`send_decision` refuses to approve it, so the
    replayed run would wait for ever), and a wait for its decision that timed out stays
    timed out (the replayed run fails again at once). Only a replay from the plan step (or
    earlier) plans again and asks anew; ``from_step`` later than it keeps the plan too.
    """
    gate = approval_view(run, entries)
    if gate is None or (from_step is not None and from_step <= gate.plan_step):
        return None
    if gate.decision == "rejected":
        return ClosedPlan(run.id, gate.plan_step, (
            f"run {run.id}'s plan (step {gate.plan_step}) was rejected by {gate.by}; a "
            "replay that keeps that plan would wait for an approval that can no longer "
            "be given"))
    if gate.decision == "waiting" and run.state is RunState.FAILED:
        plans = [e.seq for e in entries
                 if e.step_key == PLAN_KEY and e.kind is EntryKind.STEP_COMPLETED]
        if any(e.kind is EntryKind.SIGNAL_TIMEOUT and e.data.get("name") == APPROVE
               and e.seq > plans[-1] for e in entries):
            return ClosedPlan(run.id, gate.plan_step, (
                f"run {run.id}'s plan (step {gate.plan_step}) got no decision within its "
                "timeout, and the journal keeps that timeout: a replay that keeps the "
                "plan would fail again at once"))
    return None
