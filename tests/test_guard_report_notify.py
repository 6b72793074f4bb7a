"""A notification that may have arrived is never posted again (guards of ``notify.send``).

The hook does not deduplicate: every POST that reaches it is a message the user sees. Only
a send that surely did not arrive (connection refused, 429, 503) is tried again; a 5xx or
an answer lost after the hook took the message fails the step after one POST.
"""

from __future__ import annotations

import pytest

import durable
from durable import RunState

from .ops import Ops, ops_fixture  # noqa: F401

pytestmark = pytest.mark.anyio
HOOK = "/hooks/slots"


async def _notify_entries(ops: Ops, run_id: str) -> list[durable.EntryKind]:
    return [e.kind for e in await ops.client.journal(run_id) if e.name == "notify.send"]


async def test_a_notification_answered_500_is_not_posted_again(ops: Ops) -> None:
    """A 500 may come after the hook took the message: one POST, the step fails."""
    await ops.slot("slot-1")
    ops.services.add_fault(HOOK, method="POST", status=500, phase="after")
    done = await ops.run("slot.reset", "slot-1", key="slot-1", id="reset-1")
    assert len(ops.requests("POST", HOOK)) == 1
    assert len(ops.services.notifications()) == 1
    assert await _notify_entries(ops, "reset-1") == [durable.EntryKind.STEP_STARTED,
                                                     durable.EntryKind.STEP_FAILED]
    assert done.state is RunState.COMPLETED, done.error  # the slot is vacant all the same
    assert done.result["notified"] is False
    assert "may or may not have been delivered" in done.result["notify_error"]


async def test_a_notification_whose_answer_was_cut_off_is_not_posted_again(ops: Ops) -> None:
    """The hook took the message, then the connection dropped before any answer."""
    await ops.slot("slot-2")
    ops.services.add_fault(HOOK, method="POST", drop=True, phase="after")
    done = await ops.run("slot.reset", "slot-2", key="slot-2", id="reset-2")
    assert len(ops.requests("POST", HOOK)) == 1
    assert len(ops.services.notifications()) == 1
    assert done.state is RunState.COMPLETED, done.error
    assert done.result["notified"] is False
    assert "may or may not have been delivered" in done.result["notify_error"]


async def test_a_notification_refused_with_503_is_sent_again_once_it_is_taken(
        ops: Ops) -> None:
    """503 says the hook did not take it: the step tries again, and the message arrives
    once."""
    await ops.slot("slot-3")
    ops.services.add_fault(HOOK, method="POST", status=503, times=1)
    done = await ops.run("slot.reset", "slot-3", key="slot-3", id="reset-3")
    assert done.state is RunState.COMPLETED, done.error
    assert done.result["notified"] is True
    assert len(ops.requests("POST", HOOK)) == 2
    assert [n["body"]["outcome"] for n in ops.services.notifications()] == ["reset_finished"]
