"""Slot workflows: reset (return a slot), teardown (retire it) and promote (copy its code).

Each runs with the slot as its concurrency key, so at most one of them runs per slot at a
time (enforced by the database). The slot's record changes only through fenced steps.
"""

from __future__ import annotations

from typing import Any

import durable
from activities import steps

from ._outcome import failure_report
from ._plan import PlanChangedError, changes, planned_targets
from .records import Slot, SlotError, load_slot, save_slot

__all__ = ["PlanChangedError", "TeardownIncompleteError", "promote", "reset", "teardown"]


class TeardownIncompleteError(Exception):
    """Some deletes of a teardown failed; the slot keeps its ids and lists what remains."""


def _require(slot: Slot, *fields: str) -> None:
    missing = [f for f in fields if getattr(slot, f) is None]
    if missing:
        raise SlotError(f"slot {slot.name} has no {', '.join(missing)} on record; "
                        "nothing was touched")


RESET_ACTIONS = {"database": "delete", "volume": "delete", "env_var": "delete"}
TEARDOWN_ACTIONS = {"database": "delete", "application": "delete",
                    "volume": "delete with the application",
                    "env_var": "delete with the application", "repository": "delete"}


@durable.workflow("slot.reset")
async def reset(ctx: durable.WorkflowContext, slot_name: str,
                options: dict[str, Any] | None = None) -> dict[str, Any]:
    """Return a slot: delete its database, env vars and volumes, force-push the template,
    mark it vacant, notify.

    Start it after the grace period, cancellable until then, keyed by the slot::

        await client.start("slot.reset", "slot-3", key="slot-3", delay=grace)

    Before deleting anything it checks the configuration, the slot record, the application,
    both repositories, and records in the journal the commit the slot's branch is at and the
    template commit to push: the force push later uses ``--force-with-lease`` with exactly
    those, so no second attempt can push over a moved remote.

    On failure the slot stays occupied, its state reason is the recovery report (what was
    already deleted, what failed, links to each step), and the user is notified once with
    the same report; the run then fails. The "finished" notification is sent only after the
    fenced write that marks the slot vacant, and never after a failure was reported for the
    same outcome; if it cannot be delivered the run still completes (the slot *is* vacant),
    its result saying ``"notified": false`` and why. Each outcome's notification is one
    keyed step (``finished-notify``, ``failed-...-notify``), sent once: a send cut off by a
    crash is in doubt and not sent again. A bad slot or configuration fails the run before
    anything is touched.

    With an approval gate (``{"approval": true}`` as the second argument) the run journals
    its plan after those checks (the database, the application's volumes and env vars, the
    force push with both commits), waits for ``approve``, and right before the first delete
    reads the resources and the branch's commit again: a change fails the run (a failed
    reset, reported as above) naming it, with nothing deleted or pushed. See
    :func:`teardown`.
    """
    opts = _options(options)
    await steps.check_config(ctx, ["paas", "githost", "git", "notify"])
    slot = await load_slot(ctx, slot_name)
    if slot.lifecycle == "retired":
        raise SlotError(f"slot {slot_name} is retired; nothing was touched")
    if slot.occupancy != "occupied":
        raise SlotError(f"slot {slot_name} is already vacant; nothing was touched")
    try:
        _require(slot, "app", "database", "repository", "template")
        assert slot.app and slot.database and slot.repository and slot.template
        await steps.get_application(ctx, slot.app)
        repo = await steps.find_repository(ctx, slot.repository)
        template = await steps.find_repository(ctx, slot.template)
        expected = await steps.remote_head(ctx, repo)
        template_sha = await steps.remote_head(ctx, template)
        if template_sha is None:
            raise SlotError(f"template {slot.template} has no commits; nothing was touched")
        if opts.get("approval"):
            push = (f"force-push {slot.template} {template_sha[:12]} over "
                    f"{(expected or '(empty)')[:12]}")
            await _approved(ctx, f"Reset of {slot_name} will:",
                            {"database": slot.database, "application": slot.app,
                             "repository": slot.repository},
                            {**RESET_ACTIONS, "repository": push},
                            opts.get("approval_timeout"))
            head = await ctx.step(steps.remote_head, repo, key="recheck-head")
            if head != expected:
                raise PlanChangedError(
                    f"the approved plan no longer holds: {slot.repository} "
                    f"{repo['branch']} moved from {(expected or '(empty)')[:12]} to "
                    f"{(head or '(empty)')[:12]}. Nothing was deleted; start a new run to "
                    "plan again.")
        await steps.delete_database(ctx, slot.database)
        await steps.delete_env_vars(ctx, slot.app)
        await steps.delete_volumes(ctx, slot.app)
        pushed = await steps.force_push(ctx, template, template_sha, repo, expected)
        await save_slot(ctx, slot.evolve(occupancy="vacant",
                                         state_reason=f"reset by run {ctx.workflow_id}"),
                        summary=f"slot {slot_name}: vacant")
    except Exception as exc:
        text, key = await failure_report(
            ctx, f"Reset of {slot_name} failed; the slot stays occupied.", exc)
        await save_slot(ctx, slot.evolve(occupancy="occupied", state_reason=text),
                        summary=f"slot {slot_name}: stays occupied (reset failed)",
                        key=f"{key}-record")
        await _notify_quietly(ctx, {"outcome": "reset_failed", "slot": slot_name,
                                    "run": ctx.workflow_id, "text": text}, key=f"{key}-notify")
        raise
    # the slot is vacant from here on, whatever the notifier does: a failed "finished"
    # notification is journaled and reported in the result, never turned into "failed,
    # the slot stays occupied"
    unsent = await _notify_quietly(
        ctx, {"outcome": "reset_finished", "slot": slot_name, "run": ctx.workflow_id,
              "text": f"Reset of {slot_name} finished; the slot is vacant."},
        key="finished-notify")
    result: dict[str, Any] = {"slot": slot_name, "state": "vacant", "sha": pushed["sha"],
                              "notified": unsent is None}
    if unsent is not None:
        result["notify_error"] = unsent
    return result


async def _notify_quietly(ctx: durable.WorkflowContext, message: dict[str, Any],
                          key: str) -> str | None:
    """Send a notification; answers None, or why it was not (surely) delivered.

    A failed notification is in the journal (its step failed, or is in doubt); the run goes
    on to the outcome it already has: a failed reset fails with its original error, not the
    notifier's, and a finished one finishes.
    """
    try:
        await ctx.step(steps.notify, message, key=key)
    except durable.DurableError as exc:
        return str(exc)
    return None


@durable.workflow("slot.teardown")
async def teardown(ctx: durable.WorkflowContext, slot_name: str,
                   options: dict[str, Any] | None = None) -> dict[str, Any]:
    """Retire a slot: delete its database, application and repository.

    Start it keyed by the slot::

        await client.start("slot.teardown", "slot-3", key="slot-3")

    Each delete is attempted and journaled on its own (404 counts as done), and failures are
    collected. If any failed, the slot keeps every id, its state reason lists what remains
    (with the recovery report), and the run fails; a replay (``python -m durable replay
    ID``) retries only the deletes that failed. Only when every delete is confirmed is the
    slot retired and its app, database and repository ids cleared, in one fenced write. The
    PaaS project is not deleted here, so its id is kept.

    With an approval gate (``{"approval": true}`` as the second argument; ``"approval_timeout"``
    seconds optional) nothing is deleted before an operator approves: the run journals its
    plan (the database, application with its volumes and env vars, and repository it will
    delete, with their ids as the services report them now), waits for an ``approve`` or
    ``reject`` signal (``python -m durable approve ID`` / ``reject ID``, or the console), and
    right before the first delete reads the same resources again. If anything changed (gone,
    a new volume, a repository created again under the same name) the run fails naming each
    change and deletes nothing; a reject ends it cancelled, deleting nothing. Only what the
    plan found is deleted.
    """
    opts = _options(options)
    await steps.check_config(ctx, ["paas", "githost"])
    slot = await load_slot(ctx, slot_name)
    ids: dict[str, str | None] = {"database": slot.database, "application": slot.app,
                                  "repository": slot.repository}
    planned: dict[str, Any] | None = None
    if opts.get("approval"):
        ids, planned = await _approved(ctx, f"Teardown of {slot_name} will delete:", ids,
                                       TEARDOWN_ACTIONS, opts.get("approval_timeout"))
    targets: list[tuple[str, str | None, durable.Activity[[str], str] | None]] = [
        ("database", ids["database"], steps.delete_database),
        ("application", ids["application"], steps.delete_application),
        ("repository", ids["repository"], None)]
    remaining: list[str] = []
    done: list[str] = []
    for kind, ident, activity in targets:
        if ident is None:
            continue
        try:
            if activity is None:
                outcome = await _delete_repository(ctx, ident, planned)
            else:
                outcome = await ctx.step(activity, ident, key=f"delete-{kind}")
            done.append(f"{kind} {ident}: {str(outcome).replace('_', ' ')}")
        except durable.ActivityError as exc:
            remaining.append(f"{kind} {ident} ({exc})")
    if remaining:
        headline = (f"Teardown of {slot_name} is incomplete; its ids are kept. Still there:\n"
                    + "\n".join(f"  - {r}" for r in remaining)
                    + f"\nReplay to retry only these: python -m durable replay "
                      f"{ctx.workflow_id}")
        error = TeardownIncompleteError(
            f"{len(remaining)} of {len(remaining) + len(done)} deletes failed; still there: "
            + "; ".join(remaining))
        text, key = await failure_report(ctx, headline, error)
        await save_slot(ctx, slot.evolve(state_reason=text),
                        summary=f"slot {slot_name}: ids kept, {len(remaining)} remaining",
                        key=f"{key}-record")
        raise error
    await save_slot(ctx, slot.evolve(lifecycle="retired", occupancy="vacant", app=None,
                                     database=None, repository=None,
                                     state_reason=f"retired by run {ctx.workflow_id}"),
                    summary=f"slot {slot_name}: retired, ids cleared")
    return {"slot": slot_name, "state": "retired", "deleted": done}


async def _delete_repository(ctx: durable.WorkflowContext, full_name: str,
                             planned: dict[str, Any] | None) -> str:
    """Delete the repository that is ``full_name`` now, by its uuid, never by its name.

    Repositories are named by their owner; the same name can be given to a new repository
    at any time. So its identity is read and journaled first (the approved plan's reading,
    or the step keyed ``identify-repository``), and the delete addresses that uuid: a try,
    a recovered attempt or a replay that finds the name taken by another repository gets a
    404 (already gone) and leaves the new one alone."""
    if planned is None:
        planned = await ctx.step(steps.read_resources, {"repository": full_name},
                                 key="identify-repository")
    found = planned.get("repository")
    if found is None:
        return "already_gone"
    return await ctx.step(steps.delete_repository, full_name, found.get("uuid"),
                          key="delete-repository")


def _options(options: Any) -> dict[str, Any]:
    """A workflow's optional last argument: a JSON object of options."""
    if options is None:
        return {}
    if not isinstance(options, dict) or set(options) - {"approval", "approval_timeout"}:
        raise SlotError(f"options are {{\"approval\": true, \"approval_timeout\": seconds}}, "
                        f"not {options!r}; nothing was touched")
    return options


async def _approved(ctx: durable.WorkflowContext, title: str, ids: dict[str, str | None],
                    actions: dict[str, str], timeout: float | None
                    ) -> tuple[dict[str, str | None], dict[str, Any]]:
    """Journal the plan, wait for its approval, re-read; answers the targets to act on
    and the approved plan's reading of them (their identities).

    Raises (failing the run before anything is touched) on a reject, a timeout, or a
    resource that changed since the plan; each change is named.
    """
    approval = await durable.approval_gate(ctx, steps.plan_resources, title, ids, actions,
                                           timeout=timeout)
    planned = approval.plan["reading"]
    current = await ctx.step(steps.read_resources, ids, key="recheck")
    changed = changes(ids, planned, current)
    if changed:
        raise PlanChangedError(
            "the approved plan no longer holds: " + "; ".join(changed)
            + ". Nothing was deleted; start a new run to plan again.")
    return planned_targets(ids, planned), planned


@durable.workflow("slot.promote")
async def promote(ctx: durable.WorkflowContext, slot_name: str, target: str) -> dict[str, Any]:
    """Copy a slot's code into a new repository ``target`` (``workspace/slug``).

    Start it keyed by the slot::

        await client.start("slot.promote", "slot-3", "acme/shop", key="slot-3")

    Looks the target up first: found fails ("already exists"), and *unknown* (401, 403,
    5xx, no answer) fails too, never proceeding on a guess; only a 404 goes on. Then creates
    it (an "already existed" 409 fails the run, unless the repository carries this run's
    mark: a create whose answer was lost) and pushes the slot's current commit,
    recorded in the journal, without force.
    """
    await steps.check_config(ctx, ["githost", "git"])
    slot = await load_slot(ctx, slot_name)
    _require(slot, "repository")
    assert slot.repository is not None
    await steps.require_absent(ctx, target)
    source = await steps.find_repository(ctx, slot.repository)
    sha = await steps.remote_head(ctx, source)
    if sha is None:
        raise SlotError(f"{slot.repository} has no commits on {source['branch']}: "
                        "nothing to promote")
    created = await steps.create_repository(ctx, target)
    pushed = await steps.push(ctx, source, sha, created)
    return {"slot": slot_name, "repository": target, "sha": pushed["sha"]}
