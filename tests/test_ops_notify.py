"""Notifications of one outcome are sent once (issue 8, #7 and #10), over the fake hook.

A webhook does not deduplicate: each POST that reaches it is a message the user sees. The
fake hook's ledger counts what arrived and under which idempotency key.
"""

from __future__ import annotations

import os
import signal

import pytest

import durable
from activities import steps
from durable import RunState

from .helpers import poll, running_worker
from .ops import Ops, ops_fixture, worker_process  # noqa: F401

pytestmark = pytest.mark.anyio
HOOK = "/hooks/slots"


async def test_a_failure_notification_is_sent_once_across_a_sigkill_during_the_send(
        ops: Ops) -> None:
    """The reset fails (the PaaS refuses the database delete); the failure path writes the
    slot record and posts the notification; the hook takes the message but the worker is
    SIGKILLed before the answer. The attempt that resumes the run must not send a second
    message (under a second idempotency key no receiver could deduplicate)."""
    await ops.slot("slot-1")
    ops.services.add_fault("/api/v1/databases/db-slot-1", method="DELETE", status=403)
    ops.services.add_fault(HOOK, method="POST", phase="after", hang=True, times=1)
    await ops.client.start("slot.reset", "slot-1", id="reset-1", key="slot-1")
    with worker_process(ops, "--lease", "1") as proc:
        await poll(lambda: ops.services.notifications(), timeout=20)  # it arrived
        os.killpg(proc.pid, signal.SIGKILL)  # before the hook's answer reached the worker
        proc.wait(timeout=10)
    stuck = await ops.client.store.get_run("reset-1")
    assert stuck is not None and stuck.state is RunState.RUNNING

    async with running_worker(ops.client, durable.default_registry, lease=1.0,
                              sweep_interval=0.05):
        done = await ops.client.wait("reset-1", timeout=30)

    # the run fails naming the interrupted send, for an operator to check the hook
    assert done.state is RunState.FAILED
    assert done.error is not None and "(notify.send) was started by an earlier" in done.error
    [note] = ops.services.notifications()  # once
    assert note["body"]["outcome"] == "reset_failed"
    assert len(ops.requests("POST", HOOK)) == 1  # and never posted again
    slot = await ops.record("slot-1")
    assert slot.occupancy == "occupied" and slot.state_reason == note["body"]["text"]
    journal = await ops.client.journal("reset-1")
    records = [e for e in journal if e.name == "durable.set_records"
               and e.kind is durable.EntryKind.STEP_COMPLETED]
    assert len(records) == 1  # the failure's record is written once as well
    [doubt] = [e for e in journal if e.kind is durable.EntryKind.STEP_IN_DOUBT]
    assert doubt.name == "notify.send"  # the interrupted send is left for an operator

    # the operator sees the message arrived, fixes the PaaS token and replays accepting the
    # send: the delete runs again, the reset finishes, and the failure is not sent again
    ops.services.clear_faults()
    await ops.client.replay("reset-1", in_doubt="accept")
    async with running_worker(ops.client, durable.default_registry):
        done = await ops.client.wait("reset-1", timeout=30)
    assert done.state is RunState.COMPLETED, done.error
    outcomes = [n["body"]["outcome"] for n in ops.services.notifications()]
    assert outcomes == ["reset_failed", "reset_finished"]
    assert len(ops.requests("POST", HOOK)) == 2
    assert (await ops.record("slot-1")).occupancy == "vacant"


async def test_a_notification_that_times_out_is_not_sent_again(
        ops: Ops, monkeypatch: pytest.MonkeyPatch) -> None:
    """The hook never answers: notify.send's own activity timeout fires. The message may
    have arrived, so the step fails instead of posting it again."""
    monkeypatch.setattr(steps.notify, "timeout", 0.5)
    await ops.slot("slot-2")
    ops.services.add_fault(HOOK, method="POST", hang=True)
    done = await ops.run("slot.reset", "slot-2", key="slot-2", id="reset-2")
    assert len(ops.requests("POST", HOOK)) == 1
    journal = await ops.client.journal("reset-2")
    notify = [e for e in journal if e.name == "notify.send"]
    assert [e.kind for e in notify] == [durable.EntryKind.STEP_STARTED,
                                        durable.EntryKind.STEP_FAILED]
    assert "timed out after 0.5 s" in str(notify[-1].data["error"])
    # the reset itself was done: the slot is vacant, and the run says so
    assert done.state is RunState.COMPLETED, done.error
    assert (await ops.record("slot-2")).occupancy == "vacant"
    assert done.result["notified"] is False
    assert "timed out" in done.result["notify_error"]
