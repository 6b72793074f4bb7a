"""slot.promote: a lookup has three outcomes, and only "absent" (404) goes on.

In the incident a lookup answered null for 401/403/500 as well as 404, so "does the target
exist?" passed on an auth error; and a 409 from create came back as data nobody read.
"""

from __future__ import annotations

import pytest

from durable import RunState

from .ops import Ops, git_head, ops_fixture  # noqa: F401

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
