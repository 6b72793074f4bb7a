"""The fencing token's scope with the real workflows (issue 8, #4).

A service compares a token only within its scope (the run's concurrency key, or the run
when it has none: ``Durable-Fencing-Scope``). Two resets of different slots share the
template repository and the hook; under a rule that compared tokens per resource across
runs, the older one was refused there and ended in doubt after a full lease.
"""

from __future__ import annotations

import httpx
import pytest

import durable
from durable import RunState

from .helpers import poll, running_worker
from .ops import Ops, git_head, ops_fixture  # noqa: F401

pytestmark = pytest.mark.anyio
TEMPLATE = "/2.0/repositories/templates/starter"


async def test_two_resets_of_different_slots_side_by_side_both_complete(ops: Ops) -> None:
    """A claims first (the older token) and is held on its first PaaS call; B claims later
    (a newer token), touches the template and the hook and completes; then A goes on to
    the same template and hook with its older token."""
    await ops.slot("slot-a")
    await ops.slot("slot-b")
    ops.services.add_fault("/api/v1/applications/app-slot-a", method="GET", hang=True,
                           times=1)
    await ops.client.start("slot.reset", "slot-a", id="reset-a", key="slot-a")
    async with running_worker(ops.client, durable.default_registry):
        await ops.services.wait_for_entry(  # held by the fault, not only arrived
            lambda e: e["path"] == "/api/v1/applications/app-slot-a" and e["faults"])
        await ops.client.start("slot.reset", "slot-b", id="reset-b", key="slot-b")
        b = await ops.client.wait("reset-b", timeout=30)
        assert b.state is RunState.COMPLETED, b.error
        ops.services.release()  # A's held call is dropped; A retries it and goes on
        a = await ops.client.wait("reset-a", timeout=30)
    assert a.state is RunState.COMPLETED, a.error
    assert a.attempt == 1 and b.attempt == 1  # neither was fenced out and recovered
    assert (await ops.record("slot-a")).occupancy == "vacant"
    assert (await ops.record("slot-b")).occupancy == "vacant"
    assert [n["body"]["outcome"] for n in ops.services.notifications()] == [
        "reset_finished", "reset_finished"]
    assert not [e for e in ops.services.ledger() if e["refused"]]
    # the interleaving the old rule refused did happen: B touched the shared template with
    # its token, then A with its own; each request named its run's scope
    template = [(e["fencing_scope"], e["fencing_token"])
                for e in ops.services.ledger(path=TEMPLATE)]
    assert template == [("key:slot-b", b.epoch), ("key:slot-a", a.epoch)]
    hook = [e["fencing_scope"] for e in ops.services.ledger(path="/hooks/slots")]
    assert hook == ["key:slot-b", "key:slot-a"]


async def test_a_superseded_attempt_is_refused_in_its_scope_on_another_resource(
        ops: Ops) -> None:
    """A newer attempt of the same slot's key (token 999) touched the *template*; this
    run's older token is refused on the slot's own database, and the attempt stops,
    sending and writing nothing more."""
    await ops.slot("slot-c")
    async with httpx.AsyncClient() as http:
        newer = await http.get(f"{ops.services.url}{TEMPLATE}", headers={
            "Authorization": f"Bearer {ops.services.token}", durable.FENCING_HEADER: "999",
            durable.FENCING_SCOPE_HEADER: "key:slot-c"})
    assert newer.status_code == 200
    await ops.client.start("slot.reset", "slot-c", id="reset-c", key="slot-c")
    counters = durable.Counters()
    async with running_worker(ops.client, durable.default_registry, interceptors=[counters]):
        await poll(lambda: counters.claimed == counters.attempts_ended == 1)  # it ended
    [refused] = [e for e in ops.services.ledger() if e["refused"]]
    assert refused["fencing_scope"] == "key:slot-c"
    assert refused["method"] == "GET" and refused["path"] == "/api/v1/applications/app-slot-c"
    assert ops.services.ledger()[-1]["seq"] == refused["seq"]  # nothing sent after it
    assert ops.services.notifications() == []
    assert len(ops.services.state()["databases"]) == 1
    assert (await ops.record("slot-c")).state_reason is None


async def test_a_run_without_a_key_is_fenced_in_its_own_scope(ops: Ops) -> None:
    await ops.slot("slot-d")
    await ops.client.start("slot.reset", "slot-d", id="reset-d")
    async with running_worker(ops.client, durable.default_registry):
        done = await ops.client.wait("reset-d", timeout=30)
    assert done.state is RunState.COMPLETED, done.error
    assert {e["fencing_scope"] for e in ops.services.ledger()} == {"run:reset-d"}


async def test_a_force_push_carries_the_attempts_token_to_the_git_host(ops: Ops) -> None:
    """git does not go through ``ctx.http``: the step gives git the fencing token, scope
    and idempotency key (for a local remote, in the environment its hooks inherit); the
    fake git host's pre-receive hook fences the push like an API request, in the ledger."""
    await ops.slot("slot-g")
    done = await ops.run("slot.reset", "slot-g", key="slot-g", id="reset-g")
    assert done.state is RunState.COMPLETED, done.error
    journal = await ops.client.journal("reset-g")
    [key] = {f"reset-g/{e.step_key}" for e in journal if e.name == "git.force_push_with_lease"}
    [push] = ops.requests("PUSH")
    assert (push["path"], push["fencing_token"], push["fencing_scope"],
            push["idempotency_key"], push["refused"]) == (
        "/git/slots/slot-g/refs/heads/main", done.epoch, "key:slot-g", key, False)


async def test_a_push_of_an_attempt_superseded_meanwhile_is_refused_by_the_git_host(
        ops: Ops) -> None:
    """A newer attempt of the slot's key shows itself (token 999, on the template) while
    this run deletes the slot's volume (the answer comes 2 s after the delete). The run's
    force push, next, carries the older token: the git host's fence refuses it, the branch
    does not move, and the attempt stops as at a service's 409, sending and writing
    nothing more."""
    await ops.slot("slot-h")
    repo = ops.services.repo_path("slots", "slot-h")
    before = git_head(repo)
    volume = "/api/v1/applications/app-slot-h/storages/vol-slot-h"
    ops.services.add_fault(volume, method="DELETE", latency=2.0, phase="after")
    await ops.client.start("slot.reset", "slot-h", id="reset-h", key="slot-h")
    counters = durable.Counters()
    async with running_worker(ops.client, durable.default_registry, interceptors=[counters]):
        await ops.services.wait_for_entry(lambda e: e["path"] == volume and e["handled"])
        async with httpx.AsyncClient() as http:
            newer = await http.get(f"{ops.services.url}{TEMPLATE}", headers={
                "Authorization": f"Bearer {ops.services.token}", durable.FENCING_HEADER: "999",
                durable.FENCING_SCOPE_HEADER: "key:slot-h"})
        assert newer.status_code == 200
        await poll(lambda: counters.claimed == counters.attempts_ended == 1)  # it ended
    [refused] = [e for e in ops.services.ledger() if e["refused"]]
    assert (refused["method"], refused["path"]) == ("PUSH", "/git/slots/slot-h/refs/heads/main")
    assert ops.services.ledger()[-1]["seq"] == refused["seq"]  # nothing sent after it
    assert git_head(repo) == before
    assert ops.services.notifications() == []
    assert (await ops.record("slot-h")).state_reason is None
