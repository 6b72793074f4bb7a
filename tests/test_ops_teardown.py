"""slot.teardown: a failed delete keeps the slot's ids and lists what remains.

The incident's teardown logged delete failures, marked the slot retired and cleared its
ids, so the leftovers could never be found again.
"""

from __future__ import annotations

import pytest

import durable
from durable import RunState

from .helpers import running_worker
from .ops import Ops, ops_fixture  # noqa: F401

pytestmark = pytest.mark.anyio


async def test_a_failed_delete_keeps_the_ids_and_a_replay_retries_only_what_is_left(
        ops: Ops) -> None:
    await ops.slot("slot-3")
    [repo] = [r for r in ops.services.state()["repositories"]
              if r["full_name"] == "slots/slot-3"]
    ops.services.add_fault("/2.0/repositories/slots/*", method="DELETE", status=403,
                           body={"type": "error", "error": {"message": "missing scope"}})

    failed = await ops.run("slot.teardown", "slot-3", key="slot-3", id="teardown-3")

    assert failed.state is RunState.FAILED
    assert failed.error is not None and "1 of 3 deletes failed" in failed.error
    state = ops.services.state()
    assert state["databases"] == [] and state["applications"] == []  # these deletes ran
    assert len(state["repositories"]) == 2  # the template and slot-3's, still there
    slot = await ops.record("slot-3")
    assert slot.lifecycle == "active"
    assert (slot.app, slot.database, slot.repository, slot.project) == (
        "app-slot-3", "db-slot-3", "slots/slot-3", "proj-slot-3")  # ids kept
    reason = slot.state_reason or ""
    assert "Still there:\n  - repository slots/slot-3" in reason
    assert "HTTP 403" in reason and "check DURABLE_GITHOST_TOKEN" in reason
    assert "python -m durable replay teardown-3" in reason
    assert "database db-slot-3: deleted" in reason  # what is already done, from the journal

    ops.services.clear_faults()
    before = len(ops.services.ledger())
    await ops.client.replay("teardown-3")
    async with running_worker(ops.client, ops.client.registry):
        done = await ops.client.wait("teardown-3", timeout=30)

    assert done.state is RunState.COMPLETED, done.error
    after = [(e["method"], e["path"]) for e in ops.services.ledger()[before:]]
    # only what was left, the repository the first attempt identified (by its uuid)
    assert after == [("DELETE", f"/2.0/repositories/slots/{repo['uuid']}")]
    assert not ops.services.repo_path("slots", "slot-3").exists()
    slot = await ops.record("slot-3")
    assert slot.lifecycle == "retired" and slot.occupancy == "vacant"
    assert (slot.app, slot.database, slot.repository) == (None, None, None)
    assert slot.project == "proj-slot-3"  # not deleted by a teardown: still findable
    assert done.result["deleted"] == ["database db-slot-3: deleted",
                                      "application app-slot-3: deleted",
                                      "repository slots/slot-3: deleted"]


async def test_already_gone_counts_as_done(ops: Ops) -> None:
    await ops.slot("slot-8")
    ops.services.reset()  # everything vanished already (an earlier, lost teardown)
    done = await ops.run("slot.teardown", "slot-8", key="slot-8", id="teardown-8")
    assert done.state is RunState.COMPLETED, done.error
    assert all(d.endswith("already gone") for d in done.result["deleted"])
    assert (await ops.record("slot-8")).lifecycle == "retired"


async def test_a_repository_created_again_under_the_same_name_is_not_deleted(ops: Ops) -> None:
    """The delete went through but its answer was lost; before the step's retry, someone
    created a new repository under the same name. The retry must not delete that one: the
    teardown deletes the repository it identified (by uuid), never "whatever has this name".
    """
    await ops.slot("slot-r")
    path = "/2.0/repositories/slots/slot-r"
    old_uuid = {r["full_name"]: r["uuid"]
                for r in ops.services.state()["repositories"]}["slots/slot-r"]
    ops.services.add_fault(method="DELETE", path_regex=r"^/2\.0/repositories/slots/",
                           phase="after", hang=True, times=1)
    await ops.client.start("slot.teardown", "slot-r", id="teardown-r", key="slot-r")
    async with running_worker(ops.client, durable.default_registry):
        await ops.services.wait_for_entry(  # deleted, its answer held by the fault
            lambda e: e["method"] == "DELETE" and e["path"].startswith("/2.0/") and e["faults"]
            and e["handled"])
        ops.services.seed(repositories=[{"workspace": "slots", "slug": "slot-r",
                                         "files": {"README.md": "someone else's\n"}}])
        ops.services.release()  # the answer is lost: the step tries again
        done = await ops.client.wait("teardown-r", timeout=30)

    assert done.state is RunState.COMPLETED, done.error
    repos = {r["full_name"]: r["uuid"] for r in ops.services.state()["repositories"]}
    assert "slots/slot-r" in repos and repos["slots/slot-r"] != old_uuid  # the new one lives
    assert ops.services.repo_path("slots", "slot-r").exists()
    assert not ops.requests("DELETE", path)  # never addressed by its name
    assert done.result["deleted"][-1] == (
        "repository slots/slot-r: gone: deleted by an earlier try of this step whose answer "
        "was lost, or by someone else")  # not "already gone": this run deleted it


async def test_a_delete_whose_answer_was_lost_is_not_reported_as_gone_before(ops: Ops) -> None:
    """The first try deleted the database, its answer was lost; the retry's 404 does not
    mean "it was gone before": the step's summary (in show, the console and every recovery
    report) says an earlier try may have deleted it."""
    await ops.slot("slot-g")
    ops.services.add_fault("/api/v1/databases/db-slot-g", method="DELETE", phase="after",
                           drop=True, times=1)
    done = await ops.run("slot.teardown", "slot-g", key="slot-g", id="teardown-g")
    assert done.state is RunState.COMPLETED, done.error
    [summary] = [e.data["summary"] for e in await ops.client.journal("teardown-g")
                 if e.name == "paas.delete_database" and e.kind.value == "step_completed"]
    assert summary == ("database db-slot-g: gone: deleted by an earlier try of this step "
                       "whose answer was lost, or by someone else")
    assert done.result["deleted"] == [summary,  # the run's result says the same
                                      "application app-slot-g: deleted",
                                      "repository slots/slot-g: deleted"]
