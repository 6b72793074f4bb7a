"""Plan, then approve: slot.teardown with an approval gate, over real HTTP (fake services).

The run journals its plan (what it will delete, with the ids the services report), waits for
an ``approve`` signal without holding a lease, re-reads the plan right before the first
delete, and stops naming what changed; a reject ends it cancelled. Nothing is deleted
unless the approved plan still holds, and then exactly the plan.
"""

from __future__ import annotations

import getpass
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import anyio.to_thread
import httpx
import pytest

import durable
from durable import RunState
from durable._approval import approval_view, send_decision
from durable._report import render_timeline

from .helpers import poll, running_worker
from .ops import Ops, git_head, open_ops
from .pg import pg_url, postgres_server  # noqa: F401
from .services import FakeServices
from .test_cli import assert_one_line_error, cli
from .test_ops_reset import _push_a_commit

pytestmark = pytest.mark.anyio

ALICE = {"via": "test", "user": "alice", "host": "ops-1"}


@pytest.fixture(name="ops", params=["sqlite", "postgres"])
async def ops_on_both_stores(request: pytest.FixtureRequest, fake_services: FakeServices,
                             tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                             anyio_backend: str) -> AsyncIterator[Ops]:
    """The operations on SQLite (asyncio and trio) and PostgreSQL (both loops)."""
    url = None
    if request.param == "postgres":
        url = str(request.getfixturevalue("pg_url"))
    async with open_ops(fake_services, tmp_path, monkeypatch, url) as ops:
        yield ops
GATED = {"approval": True}


async def _waiting(ops: Ops, run_id: str) -> durable.Run:
    """Until the run journaled its plan and waits for ``approve`` (released, no lease)."""
    async def ready() -> durable.Run | None:
        run = await ops.client.get(run_id)
        return run if run.waiting_for == "approve" else None
    run: durable.Run = await poll(ready, timeout=20)
    return run


async def _planned(ops: Ops, run_id: str, plans: int) -> durable.Run:
    """Until the run journaled its ``plans``-th plan and waits for ``approve`` on it."""
    async def ready() -> durable.Run | None:
        run = await ops.client.get(run_id)
        entries = await ops.client.journal(run_id)
        done = [e for e in entries if e.step_key == "plan"
                and e.kind is durable.EntryKind.STEP_COMPLETED]
        waits = [e for e in entries if e.kind is durable.EntryKind.WAIT_STARTED]
        ok = (run.state is RunState.QUEUED and len(done) == plans and waits
              and waits[-1].seq > done[-1].seq)
        return run if ok else None
    run: durable.Run = await poll(ready, timeout=20)
    return run


def _deletes(ops: Ops) -> list[str]:
    return [e["path"] for e in ops.services.ledger(method="DELETE")]


def _repo_by_uuid(ops: Ops, full_name: str) -> str:
    """The path a teardown deletes a repository by: its uuid (never its name)."""
    [repo] = [r for r in ops.services.state()["repositories"] if r["full_name"] == full_name]
    workspace = full_name.partition("/")[0]
    return f"/2.0/repositories/{workspace}/{repo['uuid']}"


def _api(ops: Ops) -> httpx.Client:
    """Someone else acting on the services between the plan and its approval."""
    return httpx.Client(base_url=ops.services.url, timeout=10,
                        headers={"Authorization": f"Bearer {ops.services.token}"})


def _with_new_volume(ops: Ops, app_uuid: str) -> None:
    [app] = [a for a in ops.services.state()["applications"] if a["uuid"] == app_uuid]
    volumes = [{"uuid": v["uuid"], "name": v["name"], "mount_path": v["mount_path"]}
               for v in app["persistent_storages"]]
    ops.services.seed(applications=[{
        "uuid": app_uuid, "name": app["name"],
        "envs": [{"uuid": e["uuid"], "key": e["key"], "value": e["value"]} for e in app["envs"]],
        "volumes": [*volumes, {"uuid": "vol-cache", "name": "cache", "mount_path": "/cache"}],
        "file_storages": [{"uuid": f["uuid"], "mount_path": f["mount_path"]}
                          for f in app["file_storages"]]}])


async def test_approve_deletes_exactly_the_plan_and_show_says_who_approved(ops: Ops) -> None:
    await ops.slot("slot-4")
    repo = _repo_by_uuid(ops, "slots/slot-4")
    await ops.client.start("slot.teardown", "slot-4", GATED, id="td-4", key="slot-4")
    async with running_worker(ops.client, durable.default_registry):
        run = await _waiting(ops, "td-4")
        assert run.state is RunState.QUEUED and run.lease_expires_at is None  # no lease held
        assert _deletes(ops) == []  # nothing before the approval
        entries = await ops.client.journal("td-4")
        gate = approval_view(run, entries)
        assert gate is not None and gate.decision == "waiting"
        planned = [(i["action"], i["kind"], i["id"]) for i in gate.items or []]
        assert planned == [("delete", "database", "db-slot-4"),
                           ("delete", "application", "app-slot-4"),
                           ("delete with the application", "volume", "vol-slot-4"),
                           ("delete with the application", "env_var",
                            gate.plan["reading"]["application"]["env_vars"][0]["id"]),
                           ("delete with the application", "env_var",
                            gate.plan["reading"]["application"]["env_vars"][1]["id"]),
                           ("delete", "repository", "slots/slot-4")]
        shown = render_timeline(run, entries)
        assert "Teardown of slot-4 will delete:" in shown
        assert "- delete: repository slots/slot-4" in shown
        assert "python -m durable approve td-4" in shown

        assert await send_decision(ops.client, "td-4", "approve", {"note": "checked"},
                                   origin=ALICE)
        done = await ops.client.wait("td-4", timeout=30)

    assert done.state is RunState.COMPLETED, done.error
    assert sorted(_deletes(ops)) == sorted([
        "/api/v1/databases/db-slot-4", "/api/v1/applications/app-slot-4", repo])
    entries = await ops.client.journal("td-4")
    gate = approval_view(done, entries)
    assert gate is not None and gate.decision == "approved"
    assert gate.by == "alice@ops-1 (test)"
    assert gate.payload == {"note": "checked", "plan": gate.digest}  # names the plan
    shown = render_timeline(done, entries)
    assert "approved by alice@ops-1 (test)" in shown and ": checked" in shown
    assert (await ops.record("slot-4")).lifecycle == "retired"


async def test_a_resource_changed_after_the_plan_stops_the_run_naming_it(ops: Ops) -> None:
    await ops.slot("slot-5")
    await ops.client.start("slot.teardown", "slot-5", GATED, id="td-5", key="slot-5")
    async with running_worker(ops.client, durable.default_registry):
        await _waiting(ops, "td-5")
        # meanwhile: a new volume, the database gone, the repository created again
        _with_new_volume(ops, "app-slot-5")
        with _api(ops) as api:
            assert api.delete("/api/v1/databases/db-slot-5").status_code == 200
            assert api.delete("/2.0/repositories/slots/slot-5").status_code == 204
        ops.services.seed(repositories=[{"workspace": "slots", "slug": "slot-5",
                                         "files": {"README.md": "someone else's\n"}}])
        before = len(_deletes(ops))
        await send_decision(ops.client, "td-5", "approve", None, origin=ALICE)
        done = await ops.client.wait("td-5", timeout=30)

    assert done.state is RunState.FAILED
    error = done.error or ""
    assert "the approved plan no longer holds" in error
    assert "application app-slot-5 has a new volume vol-cache (cache)" in error
    assert "database db-slot-5 is gone" in error
    assert "repository slots/slot-5 was replaced: uuid {" in error
    assert "Nothing was deleted" in error
    assert len(_deletes(ops)) == before  # the run deleted nothing
    assert ops.services.repo_path("slots", "slot-5").exists()
    slot = await ops.record("slot-5")
    assert slot.lifecycle == "active" and slot.app == "app-slot-5"  # the record untouched
    # the error is derived from the journal: both readings are journaled step results
    journal = await ops.journal_text("td-5")
    assert "vol-cache" in journal and "s3cret-value" not in journal


async def test_reject_ends_the_run_cancelled_and_deletes_nothing(ops: Ops) -> None:
    await ops.slot("slot-6")
    await ops.client.start("slot.teardown", "slot-6", GATED, id="td-6", key="slot-6")
    async with running_worker(ops.client, durable.default_registry):
        await _waiting(ops, "td-6")
        await send_decision(ops.client, "td-6", "reject", {"reason": "wrong slot"},
                            origin=ALICE)
        done = await ops.client.wait("td-6", timeout=30)

    assert done.state is RunState.CANCELLED
    assert _deletes(ops) == []
    gate = approval_view(done, await ops.client.journal("td-6"),
                         await ops.client.store.list_signals("td-6"))
    assert gate is not None and gate.decision == "rejected"
    assert gate.by == "alice@ops-1 (test)" and gate.payload["reason"] == "wrong slot"
    with pytest.raises(durable.InvalidStateError, match="already rejected by alice"):
        await send_decision(ops.client, "td-6", "approve", None, origin=ALICE)
    assert (await ops.record("slot-6")).lifecycle == "active"


async def test_a_decision_before_the_plan_is_refused(ops: Ops) -> None:
    await ops.slot("slot-7")
    await ops.client.start("slot.teardown", "slot-7", GATED, id="td-7", key="slot-7")
    with pytest.raises(durable.InvalidStateError, match="no plan to approve"):
        await send_decision(ops.client, "td-7", "approve", None, origin=ALICE)
    assert await ops.client.store.list_signals("td-7") == []


async def test_a_gated_reset_stops_when_the_branch_moved_after_the_plan(ops: Ops) -> None:
    await ops.slot("slot-8")
    repo = ops.services.repo_path("slots", "slot-8")
    await ops.client.start("slot.reset", "slot-8", GATED, id="reset-8", key="slot-8")
    async with running_worker(ops.client, durable.default_registry):
        run = await _waiting(ops, "reset-8")
        gate = approval_view(run, await ops.client.journal("reset-8"))
        assert gate is not None
        [push] = [i for i in gate.items or [] if i["kind"] == "repository"]
        assert push["action"].startswith("force-push templates/starter ")
        assert push["action"].endswith(f" over {git_head(repo)[:12]}")
        assert {i["kind"] for i in gate.items or []} == {"database", "volume", "env_var",
                                                         "repository"}
        moved = _push_a_commit(repo, ops.tmp_path / "clone")
        await send_decision(ops.client, "reset-8", "approve", None, origin=ALICE)
        done = await ops.client.wait("reset-8", timeout=30)

    assert done.state is RunState.FAILED
    assert done.error is not None and "slots/slot-8 main moved from" in done.error
    assert f"to {moved[:12]}" in done.error
    assert _deletes(ops) == [] and git_head(repo) == moved
    slot = await ops.record("slot-8")
    assert slot.occupancy == "occupied"


async def test_a_gated_reset_approved_returns_the_slot(ops: Ops) -> None:
    await ops.slot("slot-9")
    await ops.client.start("slot.reset", "slot-9", GATED, id="reset-9", key="slot-9")
    async with running_worker(ops.client, durable.default_registry):
        await _waiting(ops, "reset-9")
        assert _deletes(ops) == []
        await send_decision(ops.client, "reset-9", "approve", None, origin=ALICE)
        done = await ops.client.wait("reset-9", timeout=30)
    assert done.state is RunState.COMPLETED, done.error
    assert "/api/v1/databases/db-slot-9" in _deletes(ops)
    assert (await ops.record("slot-9")).occupancy == "vacant"


async def test_the_cli_approves_and_show_prints_the_plan_and_who_approved(ops: Ops) -> None:
    await ops.slot("slot-10")
    await ops.client.start("slot.teardown", "slot-10", GATED, id="td-10", key="slot-10")

    def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
        return cli(*args, db=ops.db_url)

    async with running_worker(ops.client, durable.default_registry):
        await _waiting(ops, "td-10")
        shown = await anyio.to_thread.run_sync(run_cli, "show", "td-10")
        assert shown.returncode == 0, shown.stderr
        assert "plan      Teardown of slot-10 will delete:" in shown.stdout
        assert "approval  waiting    python -m durable approve td-10" in shown.stdout
        bad = await anyio.to_thread.run_sync(run_cli, "approve", "td-404")
        assert bad.returncode == 2
        assert_one_line_error(bad, "td-404")
        done = await anyio.to_thread.run_sync(run_cli, "approve", "td-10", "--note", "ok")
        assert done.returncode == 0, done.stderr
        assert "td-10: plan approved" in done.stdout
        twice = await anyio.to_thread.run_sync(run_cli, "approve", "td-10")
        assert_one_line_error(twice, "already approved by")
        run = await ops.client.wait("td-10", timeout=30)
    assert run.state is RunState.COMPLETED, run.error
    shown = await anyio.to_thread.run_sync(run_cli, "show", "td-10")
    assert f"approval  approved by {getpass.getuser()}@" in shown.stdout
    assert "(cli) at " in shown.stdout and ": ok" in shown.stdout


async def test_an_approval_naming_another_plan_is_ignored_and_the_run_waits_on(
        ops: Ops) -> None:
    await ops.slot("slot-11")
    await ops.client.start("slot.teardown", "slot-11", GATED, id="td-11", key="slot-11")
    async with running_worker(ops.client, durable.default_registry):
        await _waiting(ops, "td-11")
        assert await ops.client.signal("td-11", "approve", {"plan": "0123456789abcdef"},
                                       origin=ALICE)

        async def received() -> bool:
            return any(e.kind is durable.EntryKind.SIGNAL_RECEIVED
                       for e in await ops.client.journal("td-11"))
        await poll(received, timeout=20)
        run = await _waiting(ops, "td-11")  # took it, ignored it, waits again
        gate = approval_view(run, await ops.client.journal("td-11"))
        assert gate is not None and gate.decision == "waiting" and _deletes(ops) == []
        await send_decision(ops.client, "td-11", "approve", None, origin=ALICE)
        done = await ops.client.wait("td-11", timeout=30)
    assert done.state is RunState.COMPLETED, done.error
    assert len(_deletes(ops)) == 3


async def test_a_raw_approve_sent_before_the_plan_is_shown_as_early(ops: Ops) -> None:
    await ops.slot("slot-12")
    await ops.client.start("slot.teardown", "slot-12", GATED, id="td-12", key="slot-12")
    assert await ops.client.signal("td-12", "approve", origin=ALICE)  # blind: no plan yet
    async with running_worker(ops.client, durable.default_registry):
        done = await ops.client.wait("td-12", timeout=30)
    assert done.state is RunState.COMPLETED, done.error
    entries = await ops.client.journal("td-12")
    gate = approval_view(done, entries)
    assert gate is not None and gate.decision == "approved" and gate.early
    assert "(sent before the plan was journaled: a raw signal" in render_timeline(done, entries)


async def test_no_decision_within_the_approval_timeout_fails_the_run_deleting_nothing(
        ops: Ops) -> None:
    await ops.slot("slot-13")
    await ops.client.start("slot.teardown", "slot-13", {"approval": True,
                                                        "approval_timeout": 0.5},
                           id="td-13", key="slot-13")
    async with running_worker(ops.client, durable.default_registry):
        done = await ops.client.wait("td-13", timeout=30)
    assert done.state is RunState.FAILED
    assert done.error is not None
    assert "no decision on the plan within 0.5 s; nothing was done" in done.error
    assert _deletes(ops) == []
    with pytest.raises(durable.InvalidStateError, match="is failed"):
        await send_decision(ops.client, "td-13", "approve", None, origin=ALICE)


async def test_a_rejected_plan_is_replayed_only_from_its_plan_step_and_asked_anew(
        ops: Ops) -> None:
    """A replay keeps what the journal holds, the rejection too: one that kept the plan
    waited for ever for an approve that ``send_decision`` refuses ("already rejected")."""
    await ops.slot("slot-14")
    repo = _repo_by_uuid(ops, "slots/slot-14")
    await ops.client.start("slot.teardown", "slot-14", GATED, id="td-14", key="slot-14")
    async with running_worker(ops.client, durable.default_registry):
        await _waiting(ops, "td-14")
        await send_decision(ops.client, "td-14", "reject", {"reason": "not yet"}, origin=ALICE)
        done = await ops.client.wait("td-14", timeout=30)
        assert done.state is RunState.CANCELLED
        before = await ops.client.journal("td-14")
        gate = approval_view(done, before)
        assert gate is not None and gate.decision == "rejected"
        step = gate.plan_step
        with pytest.raises(durable.InvalidStateError) as refused:
            await ops.client.replay("td-14", origin=ALICE)
        assert str(refused.value) == (
            f"run td-14's plan (step {step}) was rejected by alice@ops-1 (test); a replay that "
            "keeps that plan would wait for an approval that can no longer be given; replay "
            "it from the plan step to plan again and ask anew: durable replay td-14 "
            f"--from-step {step}")
        by_cli = await anyio.to_thread.run_sync(lambda: cli("replay", "td-14", db=ops.db_url))
        assert_one_line_error(by_cli, "was rejected by alice", f"--from-step {step}")
        assert await ops.client.journal("td-14") == before  # nothing written
        assert (await ops.client.get("td-14")).state is RunState.CANCELLED

        await ops.client.replay("td-14", from_step=step, origin=ALICE)
        run = await _planned(ops, "td-14", 2)
        again = approval_view(run, await ops.client.journal("td-14"))
        assert again is not None and again.decision == "waiting"  # planned again
        assert await send_decision(ops.client, "td-14", "approve", None, origin=ALICE)
        done = await ops.client.wait("td-14", timeout=30)
    assert done.state is RunState.COMPLETED, done.error
    assert sorted(_deletes(ops)) == sorted([
        "/api/v1/databases/db-slot-14", "/api/v1/applications/app-slot-14", repo])


async def test_a_plan_whose_decision_timed_out_is_replayed_only_from_its_plan_step(
        ops: Ops) -> None:
    """The journaled timeout is reused by a replay that keeps the plan: it failed again at
    once, having asked no one."""
    await ops.slot("slot-15")
    await ops.client.start("slot.teardown", "slot-15", {"approval": True,
                                                        "approval_timeout": 2.5},
                           id="td-15", key="slot-15")
    async with running_worker(ops.client, durable.default_registry):
        done = await ops.client.wait("td-15", timeout=30)
        assert done.state is RunState.FAILED and "no decision on the plan" in (done.error or "")
        before = await ops.client.journal("td-15")
        gate = approval_view(done, before)
        assert gate is not None and gate.decision == "waiting"
        step = gate.plan_step
        with pytest.raises(durable.InvalidStateError,
                           match=rf"run td-15's plan \(step {step}\) got no decision within its "
                           rf"timeout.*: durable replay td-15 --from-step {step}$"):
            await ops.client.replay("td-15")
        assert await ops.client.journal("td-15") == before  # nothing written

        await ops.client.replay("td-15", from_step=step)
        await _planned(ops, "td-15", 2)  # asked anew, with the timeout anew
        assert await send_decision(ops.client, "td-15", "reject", None, origin=ALICE)
        done = await ops.client.wait("td-15", timeout=30)
    assert done.state is RunState.CANCELLED
    assert _deletes(ops) == []
