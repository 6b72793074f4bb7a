"""Shared by the workflows: failure messages from the recovery report, and one key per outcome."""

from __future__ import annotations

import attrs

import durable

__all__ = ["FAILURE_PATH", "collapse", "failure_report", "outcome_key"]


FAILURE_PATH = "failed-"
"""Every step key of a failure path starts with this (``failed-...-record``, ``-notify``)."""


async def failure_report(ctx: durable.WorkflowContext, headline: str,
                         exc: BaseException) -> tuple[str, str]:
    """The message for a failed run (headline + the engine's recovery report) and its key.

    The report is derived from the journal: the failed step and why, the completed steps
    with what each touched, the steps in doubt, and a link per step. It is built while the
    run is still running, about to fail, so it is rendered as the failed run it describes.
    """
    report = await ctx.recovery_report()
    error = None if report.failed or report.in_doubt else f"{type(exc).__name__}: {exc}"
    report = attrs.evolve(report, state="failed", error=error)
    return f"{headline}\n{report.text()}", outcome_key(report, exc)


def outcome_key(report: durable.RecoveryReport, exc: BaseException) -> str:
    """A step key naming *this* failure: the failed / in-doubt steps and their try counts.

    The failure path's steps (the slot record, the notification) are keyed by it, so a
    re-execution of the same failure finds them journaled and sends nothing again, while a
    replay that fails anew (new tries) records and reports the new failure once.

    The key is made only of what the re-execution of one failure cannot change: the failure
    path's own steps are left out (a send cut off by a crash is in doubt after resuming, and
    counting it would name a second outcome, so a second message under a second idempotency
    key), and a failure that is no step's (a bad slot, say) is named by its type and the
    steps done before it, never by the attempt number (a recovery adds an attempt).
    """
    parts = [f"{s.number}.{s.tries}" for s in (*report.failed, *report.in_doubt)
             if not s.key.startswith(FAILURE_PATH)]
    if parts:
        return FAILURE_PATH + "-".join(parts)
    done = [s for s in report.completed if not s.key.startswith(FAILURE_PATH)]
    return f"{FAILURE_PATH}{type(exc).__name__}-after{len(done)}"


def collapse(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """What a task group's exception group should be re-raised as, for the engine.

    A control-flow signal (``durable.AttemptCancelled``: lease lost, cancelled) is re-raised
    bare, so the engine sees it for what it is; a single error is re-raised bare too, for a
    readable message; otherwise the group itself.
    """
    leaves: list[BaseException] = []

    def walk(exc: BaseException) -> None:
        if isinstance(exc, BaseExceptionGroup):
            for inner in exc.exceptions:
                walk(inner)
        else:
            leaves.append(exc)

    walk(group)
    for leaf in leaves:
        if isinstance(leaf, durable.AttemptCancelled):
            return leaf
    return leaves[0] if len(leaves) == 1 else group
