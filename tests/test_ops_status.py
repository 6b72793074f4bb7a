"""What the waiting screen shows: a direct query by slot, and "unknown" is never "done".

The incident's screen scanned the 40 newest jobs and answered "none" past 40, which the
client showed as "reset finished".
"""

from __future__ import annotations

import anyio
import pytest

import durable
from durable import RunState
from workflows import reset_message, reset_status, run_status
from workflows.status import MESSAGES, status_of

from .helpers import running_worker
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


async def test_a_reset_whose_last_notification_failed_reads_done_the_slot_is_vacant(
        ops: Ops) -> None:
    """The finished notification fails after the fenced write that marked the slot vacant:
    the screen must not say "failed, the slot stays occupied" (issue 8, #15)."""
    await ops.slot("slot-3")
    ops.services.add_fault("/hooks/slots", method="POST", status=500)
    done = await ops.run("slot.reset", "slot-3", key="slot-3", id="reset-3")
    assert (await ops.record("slot-3")).occupancy == "vacant"
    assert await reset_status(ops.client, "slot-3") == "done"
    assert done.state is RunState.COMPLETED, done.error
    assert done.result["state"] == "vacant" and done.result["notified"] is False


async def test_a_reset_cancelled_after_the_vacant_write_reads_done(ops: Ops) -> None:
    """The status follows the slot record this run wrote, not only the run's state."""
    await ops.slot("slot-4")
    ops.services.add_fault("/hooks/slots", method="POST", hang=True)
    await ops.client.start("slot.reset", "slot-4", key="slot-4", id="reset-4")
    async with running_worker(ops.client, durable.default_registry):
        await ops.services.wait_for_entry(  # held by the fault, not only arrived
            lambda e: e["path"] == "/hooks/slots" and e["faults"])
        assert await reset_status(ops.client, "slot-4") == "done"  # vacant, notifying
        await ops.client.cancel("reset-4")
        done = await ops.client.wait("reset-4", timeout=30)
    assert done.state is RunState.CANCELLED
    assert (await ops.record("slot-4")).occupancy == "vacant"
    assert await reset_status(ops.client, "slot-4") == "done"


async def test_a_failed_reset_of_an_occupied_slot_reads_failed(ops: Ops) -> None:
    await ops.slot("slot-5")
    ops.services.add_fault("/api/v1/databases/db-slot-5", method="DELETE", status=403)
    done = await ops.run("slot.reset", "slot-5", key="slot-5", id="reset-5")
    assert done.state is RunState.FAILED
    assert (await ops.record("slot-5")).occupancy == "occupied"
    assert await reset_status(ops.client, "slot-5") == "failed"
    # a slot left vacant by an *earlier* run does not make this run's failure a success
    await ops.client.store.put_records(None, [("slot", "slot-5", (await ops.record(
        "slot-5")).evolve(occupancy="vacant", updated_by="someone-else").to_json())])
    assert await reset_status(ops.client, "slot-5") == "failed"


async def test_a_reset_cancelled_during_a_delete_says_what_it_had_done(ops: Ops) -> None:
    """Cancelled while deleting: the database is gone, the env vars' delete in doubt. The
    waiting screen must not read as "nothing happened": its message lists what is done and
    what is in doubt, with a link to each step and to the run."""
    await ops.slot("slot-c")
    ops.services.add_fault("/api/v1/applications/app-slot-c/envs/*", method="DELETE",
                           hang=True)
    await ops.client.start("slot.reset", "slot-c", id="reset-c", key="slot-c")
    async with running_worker(ops.client, durable.default_registry):
        await ops.services.wait_for_entry(lambda e: "/envs/" in e["path"] and e["faults"])
        await ops.client.cancel("reset-c")
        done = await ops.client.wait("reset-c", timeout=30)
    assert done.state is RunState.CANCELLED
    assert ops.services.state()["databases"] == []  # deleted before the cancel

    assert await reset_status(ops.client, "slot-c") == "cancelled"
    text = await reset_message(ops.client, "slot-c")
    assert text.startswith(MESSAGES["cancelled"])
    assert "paas.delete_database - database db-slot-c: deleted" in text
    assert "In doubt" in text and "paas.delete_env_vars" in text
    assert "Journal: python -m durable show reset-c" in text
    assert await reset_message(ops.client, "slot-never-reset") == MESSAGES["unknown"]
