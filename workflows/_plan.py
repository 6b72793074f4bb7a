"""Plan, then approve: the re-check of a journaled plan against what is there now.

A gated operation journals its plan (``steps.plan_resources``, the step keyed ``plan``),
waits for an operator's ``approve`` (:func:`durable.approval_gate`), then reads the same
resources again (``steps.read_resources``, keyed ``recheck``) right before acting. Both
readings are journaled step results; :func:`changes` compares them in workflow code, so what
the run says changed is derived from the journal (a replay says the same).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["PlanChangedError", "changes", "planned_targets"]


class PlanChangedError(Exception):
    """A resource changed between the approved plan and the re-check; nothing was done."""


def _members(found: Mapping[str, Any] | None, field: str) -> dict[str, str]:
    if found is None:
        return {}
    return {str(m["id"]): str(m["name"]) for m in found.get(field, [])}


def changes(targets: Mapping[str, str | None], planned: Mapping[str, Any],
            current: Mapping[str, Any]) -> list[str]:
    """What differs between the planned reading and the current one, one phrase each
    (empty: nothing changed). Statuses are not compared (a database that restarted is the
    same database); identities are: present or gone, the repository's uuid (deleted and
    created again under the same name is another repository), the application's volumes and
    env vars (one added or removed)."""
    out: list[str] = []
    for kind in ("database", "application", "repository"):
        wanted = targets.get(kind)
        if not wanted:
            continue
        before, now = planned.get(kind), current.get(kind)
        if before is None and now is None:
            continue
        if before is None:
            out.append(f"{kind} {wanted} exists again (it was absent when planned)")
            continue
        if now is None:
            out.append(f"{kind} {before['id']} is gone")
            continue
        if kind == "repository" and before.get("uuid") != now.get("uuid"):
            out.append(f"repository {before['id']} was replaced: uuid {before.get('uuid')} "
                       f"when planned, {now.get('uuid')} now")
        if kind == "application":
            for field, what in (("volumes", "volume"), ("env_vars", "env var")):
                was, is_ = _members(before, field), _members(now, field)
                out += [f"application {before['id']} has a new {what} {i} ({is_[i]})"
                        for i in is_ if i not in was]
                out += [f"{what} {i} ({was[i]}) of application {before['id']} is gone"
                        for i in was if i not in is_]
    return out


def planned_targets(targets: Mapping[str, str | None],
                    planned: Mapping[str, Any]) -> dict[str, str | None]:
    """The targets the plan found (the ones to act on): an absent one is dropped."""
    return {kind: ident if planned.get(kind) is not None else None
            for kind, ident in targets.items()}
