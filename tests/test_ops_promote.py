"""slot.promote: a lookup has three outcomes, and only "absent" (404) goes on.

In the incident a lookup answered null for 401/403/500 as well as 404, so "does the target
exist?" passed on an auth error; and a 409 from create came back as data nobody read.
"""

from __future__ import annotations

import os
import signal

import pytest

import durable
from durable import RunState

from .helpers import poll, running_worker
from .ops import Ops, git_head, ops_fixture, worker_process  # noqa: F401

pytestmark = pytest.mark.anyio
TARGET = "/2.0/repositories/acme/shop"


async def test_promote_copies_the_slot_code_without_force(ops: Ops) -> None:
    await ops.slot("slot-1")
    done = await ops.run("slot.promote", "slot-1", "acme/shop", key="slot-1", id="promote-1")
    assert done.state is RunState.COMPLETED, done.error
    source = git_head(ops.services.repo_path("slots", "slot-1"))
    assert git_head(ops.services.repo_path("acme", "shop")) == source == done.result["sha"]


async def test_a_401_on_the_lookup_aborts_the_promote(ops: Ops) -> None:
    status = 401
    await ops.slot("slot-1")
    ops.services.add_fault(TARGET, method="GET", status=status)
    done = await ops.run("slot.promote", "slot-1", "acme/shop", key="slot-1", id="promote-2")
    assert done.state is RunState.FAILED
    assert done.error is not None
    assert "could not tell whether repository acme/shop exists" in done.error
    assert f"HTTP {status}" in done.error and "not proceeding" in done.error
    assert ops.requests("POST") == []  # nothing created
    assert len(ops.requests("GET", TARGET)) == 1  # a refusal is not retried
    assert not ops.services.repo_path("acme", "shop").exists()


async def test_an_unanswered_lookup_is_retried_then_aborts(ops: Ops) -> None:
    await ops.slot("slot-1")
    ops.services.add_fault(TARGET, method="GET", drop=True)
    done = await ops.run("slot.promote", "slot-1", "acme/shop", key="slot-1", id="promote-3")
    assert done.state is RunState.FAILED
    assert done.error is not None and "not proceeding" in done.error
    assert len(ops.requests("GET", TARGET)) == 3  # unknown: retried, never read as absent
    assert ops.requests("POST") == []


async def test_409_on_create_fails_the_promote(ops: Ops) -> None:
    await ops.slot("slot-1")
    ops.services.add_fault(TARGET, method="POST", status=409, body={
        "type": "error", "error": {"message": "Repository with this Slug already exists."}})
    done = await ops.run("slot.promote", "slot-1", "acme/shop", key="slot-1", id="promote-4")
    assert done.state is RunState.FAILED
    assert done.error is not None and "already existed (409)" in done.error
    assert not ops.services.repo_path("acme", "shop").exists()  # nothing pushed



async def test_a_create_whose_answer_was_lost_is_not_taken_for_someone_elses(ops: Ops) -> None:
    """The create went through, its answer was lost; the step's retry meets the 409 of its
    own repository. The repository carries this step's mark: the create is done, the
    promote goes on (a 409 that ends the run there would end every replay there too)."""
    await ops.slot("slot-1")
    ops.services.add_fault(TARGET, method="POST", phase="after", drop=True, times=1)
    done = await ops.run("slot.promote", "slot-1", "acme/shop", key="slot-1", id="promote-9")
    assert done.state is RunState.COMPLETED, done.error
    assert [e["status"] for e in ops.requests("POST", TARGET)] == [None, 409]  # created once
    source = git_head(ops.services.repo_path("slots", "slot-1"))
    assert git_head(ops.services.repo_path("acme", "shop")) == source == done.result["sha"]
    summaries = [str(e.data.get("summary", "")) for e in await ops.client.journal("promote-9")
                 if e.name == "githost.create_repository"]
    assert "repository acme/shop: created by an earlier try of this step (its answer was "\
           "lost)" in summaries

async def test_an_existing_target_is_refused(ops: Ops) -> None:
    await ops.slot("slot-1")
    ops.services.seed(repositories=[{"workspace": "acme", "slug": "shop",
                                     "files": {"README.md": "theirs\n"}}])
    theirs = git_head(ops.services.repo_path("acme", "shop"))
    done = await ops.run("slot.promote", "slot-1", "acme/shop", key="slot-1", id="promote-5")
    assert done.state is RunState.FAILED
    assert done.error is not None and "acme/shop already exists" in done.error
    assert ops.requests("POST") == []
    assert git_head(ops.services.repo_path("acme", "shop")) == theirs


async def _create_in_doubt(ops: Ops, run_id: str) -> None:
    """Start a promote; the git host creates the repository but its answer never comes, and
    the worker is SIGKILLed: the create step is in doubt."""
    await ops.slot("slot-1")
    ops.services.add_fault(TARGET, method="POST", phase="after", hang=True, times=1)
    await ops.client.start("slot.promote", "slot-1", "acme/shop", key="slot-1", id=run_id)
    with worker_process(ops, "--lease", "1") as proc:
        await poll(lambda: ops.services.repo_path("acme", "shop").exists(), timeout=20)
        await ops.services.wait_for_entry(lambda e: e["method"] == "POST" and e["handled"])
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


async def test_a_create_in_doubt_is_looked_up_and_the_promote_finishes(ops: Ops) -> None:
    await _create_in_doubt(ops, "promote-6")
    async with running_worker(ops.client, durable.default_registry, lease=1.0,
                              sweep_interval=0.05):
        done = await ops.client.wait("promote-6", timeout=30)
    assert done.state is RunState.COMPLETED, done.error
    assert len(ops.requests("POST", TARGET)) == 1  # never created twice
    source = git_head(ops.services.repo_path("slots", "slot-1"))
    assert git_head(ops.services.repo_path("acme", "shop")) == source == done.result["sha"]
    journal = await ops.client.journal("promote-6")
    [found] = [e for e in journal if e.name == "githost.create_repository"
               and e.kind is durable.EntryKind.STEP_COMPLETED]
    assert found.data["looked_up"] and found.data["result"]["full_name"] == "acme/shop"


async def test_an_accepted_create_gets_its_result_from_the_lookup(ops: Ops) -> None:
    """The lookup cannot tell while the host fails (the step stays in doubt and the run
    fails); the operator checks and accepts: the lookup reads the repository, and the
    promote pushes into it (never a None that fails with TypeError)."""
    await _create_in_doubt(ops, "promote-7")
    ops.services.add_fault(TARGET, method="GET", status=500, times=1)
    async with running_worker(ops.client, durable.default_registry, lease=1.0,
                              sweep_interval=0.05):
        failed = await ops.client.wait("promote-7", timeout=30)
        assert failed.state is RunState.FAILED
        assert failed.error is not None and "outcome is unknown" in failed.error
        await ops.client.replay("promote-7", in_doubt="accept")
        done = await ops.client.wait("promote-7", timeout=30)
    assert done.state is RunState.COMPLETED, done.error
    assert len(ops.requests("POST", TARGET)) == 1
    source = git_head(ops.services.repo_path("slots", "slot-1"))
    assert git_head(ops.services.repo_path("acme", "shop")) == source == done.result["sha"]
    journal = await ops.client.journal("promote-7")
    [found] = [e for e in journal if e.name == "githost.create_repository"
               and e.kind is durable.EntryKind.STEP_COMPLETED]
    assert found.data["accepted"] and found.data["looked_up"]


async def test_someone_elses_repository_is_not_taken_for_the_create_in_doubt(
        ops: Ops) -> None:
    """The create never reached the host (dropped before it), and someone else created the
    target meanwhile: the lookup says not done, the create runs, meets the 409, fails."""
    await ops.slot("slot-1")
    ops.services.add_fault(TARGET, method="POST", hang=True, times=1)
    await ops.client.start("slot.promote", "slot-1", "acme/shop", key="slot-1", id="promote-8")
    with worker_process(ops, "--lease", "1") as proc:
        # held: the fault took it (the entry is made on arrival, before its body is read;
        # a kill in between left the fault for the next attempt's create, which then hung)
        await ops.services.wait_for_entry(lambda e: e["method"] == "POST" and e["faults"])
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    ops.services.seed(repositories=[{"workspace": "acme", "slug": "shop",
                                     "files": {"README.md": "theirs\n"}}])
    theirs = git_head(ops.services.repo_path("acme", "shop"))
    async with running_worker(ops.client, durable.default_registry, lease=1.0,
                              sweep_interval=0.05):
        done = await ops.client.wait("promote-8", timeout=30)
    assert done.state is RunState.FAILED
    assert done.error is not None and "already existed (409)" in done.error
    assert git_head(ops.services.repo_path("acme", "shop")) == theirs  # nothing pushed
