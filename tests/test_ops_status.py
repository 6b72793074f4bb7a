"""What the waiting screen shows: a direct query by slot, and "unknown" is never "done".

The incident's screen scanned the 40 newest jobs and answered "none" past 40, which the
client showed as "reset finished".
"""

from __future__ import annotations

import anyio
import pytest

from durable import RunState
from workflows import reset_status, run_status
from workflows.status import MESSAGES, status_of

from .ops import Ops, ops_fixture  # noqa: F401

pytestmark = pytest.mark.anyio


async def test_the_latest_reset_is_found_after_1000_other_runs(ops: Ops) -> None:
    await ops.slot("slot-7")
    done = await ops.run("slot.reset", "slot-7", key="slot-7", id="reset-7")
    assert done.state is RunState.COMPLETED, done.error

    async def start(i: int) -> None:
        slot = f"other-{i}"
        await ops.client.start("slot.reset", slot, key=slot, delay=3600)

    async with anyio.create_task_group() as tg:  # concurrent starts share commits
        for i in range(1000):
            tg.start_soon(start, i)

    newest = await ops.client.list(limit=40)
    assert "reset-7" not in {r.id for r in newest}  # a scan of the newest would miss it
    assert await reset_status(ops.client, "slot-7") == "done"
    assert await reset_status(ops.client, "other-5") == "running"  # queued: in its grace


async def test_a_run_that_cannot_be_found_reads_as_unknown_never_as_done(ops: Ops) -> None:
    assert await reset_status(ops.client, "slot-never-reset") == "unknown"
    assert await run_status(ops.client, "no-such-run") == "unknown"
    assert status_of(None) == "unknown"
    assert "not a success" in MESSAGES["unknown"]
    assert MESSAGES["unknown"] != MESSAGES["done"]


async def test_a_delayed_reset_can_be_cancelled_in_its_grace_period(ops: Ops) -> None:
    await ops.slot("slot-9")
    run = await ops.client.start("slot.reset", "slot-9", key="slot-9", delay=60)
    assert await reset_status(ops.client, "slot-9") == "running"
    await ops.client.cancel(run.id)
    assert await reset_status(ops.client, "slot-9") == "cancelled"
    assert ops.services.ledger() == []  # nothing was touched
