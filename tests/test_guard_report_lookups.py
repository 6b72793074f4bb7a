"""A plan's reading has three answers per resource: found, absent (404 only) and unknown.

An approval gate's plan lists what a teardown will delete; a resource the plan reads as
absent is dropped from the targets ("nothing: already gone") and the slot's id for it is
cleared when the slot is retired. So a service that cannot answer (5xx) must never be
read as absent: the plan step fails (after its retries), no plan is journaled, nothing is
deleted and the slot keeps every id.
"""

from __future__ import annotations

import pytest

import durable
from durable import RunState

from .helpers import poll, running_worker
from .ops import Ops, ops_fixture  # noqa: F401

pytestmark = pytest.mark.anyio
GATED = {"approval": True}


async def _failed_or_asking(ops: Ops, run_id: str) -> durable.Run | None:
    """The run once it ended, or once it waits for an approval of its plan."""
    run = await ops.client.get(run_id)
    return run if run.state.finished or run.waiting_for == "approve" else None


@pytest.mark.parametrize("path", [
    "/2.0/repositories/slots/slot-1",
    "/api/v1/databases/db-slot-1",
    "/api/v1/applications/app-slot-1",
    "/api/v1/applications/app-slot-1/storages",
])
async def test_a_plan_whose_reading_got_a_5xx_is_never_made_of_absent_resources(
        ops: Ops, path: str) -> None:
    await ops.slot("slot-1")
    ops.services.add_fault(path, method="GET", status=500)
    await ops.client.start("slot.teardown", "slot-1", GATED, id="td-1", key="slot-1")
    async with running_worker(ops.client, durable.default_registry):
        done = await poll(lambda: _failed_or_asking(ops, "td-1"), timeout=30)

    assert done.state is RunState.FAILED, "the run asks to approve a plan read from a 5xx"
    assert "500" in (done.error or "")
    journal = await ops.client.journal("td-1")
    assert [e for e in journal if e.step_key == "plan"
            and e.kind is durable.EntryKind.STEP_COMPLETED] == []  # no plan to approve
    assert len(ops.requests("GET", path)) == 3  # unknown: retried, then the step fails
    assert ops.requests("DELETE") == []
    slot = await ops.record("slot-1")
    assert slot.lifecycle == "active"
    assert (slot.app, slot.database, slot.repository) == (
        "app-slot-1", "db-slot-1", "slots/slot-1")
