"""slot.reset over real HTTP (fake services) and real git: the promise-race incident.

The incident's abandoned task went on deleting, force-pushed, marked the slot vacant and sent
"reset finished" after the user had been told "reset failed". Here a step that times out is
cancelled into the call in flight (git and its hook are killed), an attempt that lost its
lease can send and write nothing more, and each outcome is notified once.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import anyio
import httpx
import pytest

import durable
from durable import RunState
from durable._attempt import Attempt

from .helpers import poll, running_worker
from .ops import Ops, alive, git_head, ops_fixture  # noqa: F401

pytestmark = pytest.mark.anyio


async def test_reset_returns_the_slot(ops: Ops) -> None:
    await ops.slot("slot-1")
    template_sha = git_head(ops.services.repo_path("templates", "starter"))
    done = await ops.run("slot.reset", "slot-1", key="slot-1", id="reset-1")
    assert done.state is RunState.COMPLETED, done.error
    state = ops.services.state()
    assert state["databases"] == []
    [app] = state["applications"]
    assert app["envs"] == [] and app["persistent_storages"] == []
    assert len(app["file_storages"]) == 1  # configuration mounts are kept
    assert git_head(ops.services.repo_path("slots", "slot-1")) == template_sha
    slot = await ops.record("slot-1")
    assert slot.occupancy == "vacant" and slot.updated_by == "reset-1"
    [note] = ops.services.notifications()
    assert note["body"]["outcome"] == "reset_finished"
    # every request carried the attempt's fencing token and a step's idempotency key
    for entry in ops.services.ledger():
        assert entry["fencing_token"] == done.epoch
        assert entry["idempotency_key"].startswith("reset-1/")
    journal = await ops.journal_text("reset-1")
    assert ops.services.token not in journal and "s3cret-value" not in journal
    assert "database db-slot-1: deleted" in journal
    assert "env vars of app-slot-1: deleted API_KEY, DEBUG" in journal


async def test_a_force_push_that_hangs_is_killed_and_nothing_after_it_runs(
        ops: Ops, monkeypatch: pytest.MonkeyPatch) -> None:
    await ops.slot("slot-2")
    repo = ops.services.repo_path("slots", "slot-2")
    before = git_head(repo)
    pid_file = ops.tmp_path / "hook.pid"
    hook = repo / "hooks" / "pre-receive"
    hook.write_text(f"#!/bin/sh\necho $$ > {pid_file}\nexec sleep 60\n")
    hook.chmod(0o755)
    monkeypatch.setenv("DURABLE_GIT_TIMEOUT", "1")

    done = await ops.run("slot.reset", "slot-2", key="slot-2", id="reset-2")

    assert done.state is RunState.FAILED
    assert done.error is not None and "did not finish within 1 s" in done.error
    hook_pid = int(pid_file.read_text())
    await poll(lambda: not alive(hook_pid), timeout=5)  # the hook (in flight) was killed
    assert git_head(repo) == before  # the remote did not move
    # the slot stays occupied; its state reason is the recovery report
    slot = await ops.record("slot-2")
    assert slot.occupancy == "occupied" and slot.app == "app-slot-2"
    reason = slot.state_reason or ""
    assert reason.startswith("Reset of slot-2 failed; the slot stays occupied.")
    assert "Run reset-2 (slot.reset) failed." in reason
    assert "database db-slot-2: deleted" in reason
    assert "volumes of app-slot-2: deleted data" in reason
    assert "git.force_push_with_lease" in reason
    assert "python -m durable show reset-2 --step" in reason
    # exactly one notification: the failure, with the same report; never "finished"
    [note] = ops.services.notifications()
    assert note["body"]["outcome"] == "reset_failed" and note["body"]["text"] == reason
    # after the push only the failure path ran: the slot record and the notification
    journal = await ops.client.journal("reset-2")
    push_step = next(e.step for e in journal if e.name == "git.force_push_with_lease")
    later = {e.name for e in journal if e.step is not None and e.step > push_step}
    assert later == {"durable.set_records", "notify.send"}
    assert ops.services.ledger()[-1]["path"] == "/hooks/slots"  # the notification


async def test_a_superseded_attempt_deletes_nothing_more_and_reports_nothing(
        ops: Ops) -> None:
    """The attempt's lease lapses (no heartbeats) while a delete hangs: the call in flight
    is aborted, nothing later is sent or written; the next attempt finishes, notifying once."""
    await ops.slot("slot-4")
    ops.services.add_fault("/api/v1/applications/app-slot-4/storages/*", method="DELETE",
                           hang=True)
    await ops.client.start("slot.reset", "slot-4", id="reset-4", key="slot-4")
    [run] = await ops.client.store.claim("worker-a", 1.5, 1)
    async with httpx.AsyncHTTPTransport() as transport:
        attempt = Attempt(ops.client.store, run, durable.default_registry, lease=1.5,
                                  lease_sent_at=anyio.current_time(), transport=transport)
        await attempt.execute()  # nobody renews the lease: the attempt stops at its deadline

    [hung] = [e for e in ops.services.ledger() if "/storages/" in e["path"]]
    await ops.services.wait_until_ended(seq=hung["seq"])
    assert hung["seq"] == ops.services.ledger()[-1]["seq"]  # nothing was sent after it
    assert ops.services.ledger()[-1]["disconnected"]  # the call in flight was aborted
    assert ops.services.notifications() == []
    slot = await ops.record("slot-4")
    assert slot.occupancy == "occupied" and slot.state_reason is None  # nothing written
    stale = await ops.client.store.get_run("reset-4")
    assert stale is not None and stale.state is RunState.RUNNING and stale.epoch == run.epoch

    ops.services.clear_faults()
    await poll(lambda: ops.client.store.recover_stale("reset-4", run.epoch), timeout=5)
    async with running_worker(ops.client, durable.default_registry):
        done = await ops.client.wait("reset-4", timeout=30)
    assert done.state is RunState.COMPLETED, done.error
    [note] = ops.services.notifications()
    assert note["body"]["outcome"] == "reset_finished" and note["fencing_token"] == done.epoch
    journal = await ops.client.journal("reset-4")
    [doubt] = [e for e in journal if e.kind is durable.EntryKind.STEP_IN_DOUBT]
    assert doubt.name == "paas.delete_volumes"
    completed = [e.name for e in journal if e.kind is durable.EntryKind.STEP_COMPLETED]
    assert completed.count("paas.delete_database") == 1  # not repeated by the new attempt
    assert (await ops.record("slot-4")).occupancy == "vacant"


async def test_a_moved_remote_is_never_force_pushed_over(ops: Ops) -> None:
    """Someone pushes to the slot's repository after the reset recorded its commit."""
    await ops.slot("slot-5")
    repo = ops.services.repo_path("slots", "slot-5")
    ops.services.add_fault("/api/v1/databases/db-slot-5", method="DELETE", latency=0.3)
    await ops.client.start("slot.reset", "slot-5", id="reset-5", key="slot-5")
    async with running_worker(ops.client, durable.default_registry):
        await ops.services.wait_for_entry(lambda e: e["path"] == "/api/v1/databases/db-slot-5")
        moved = _push_a_commit(repo, ops.tmp_path / "clone")
        done = await ops.client.wait("reset-5", timeout=30)
    assert done.state is RunState.FAILED
    assert done.error is not None and "refusing to force-push" in done.error
    assert git_head(repo) == moved  # the other push survives
    slot = await ops.record("slot-5")
    assert slot.occupancy == "occupied"
    assert [n["body"]["outcome"] for n in ops.services.notifications()] == ["reset_failed"]
    # what to do next is in the report: a replay cannot succeed, a new reset can
    assert "A replay is refused the same way" in (slot.state_reason or "")
    assert "start a new reset" in (slot.state_reason or "")
    await ops.client.replay("reset-5")
    async with running_worker(ops.client, durable.default_registry):
        again = await ops.client.wait("reset-5", timeout=30)
    assert again.state is RunState.FAILED and "refusing to force-push" in (again.error or "")
    assert git_head(repo) == moved


def _push_a_commit(bare: Path, work: Path) -> str:
    env = {"GIT_AUTHOR_NAME": "x", "GIT_AUTHOR_EMAIL": "x@x", "GIT_COMMITTER_NAME": "x",
           "GIT_COMMITTER_EMAIL": "x@x", "PATH": "/usr/bin:/bin"}
    subprocess.run(["git", "clone", "-q", str(bare), str(work)], check=True, env=env)
    (work / "hotfix.txt").write_text("someone else's work\n")
    for args in (["add", "-A"], ["commit", "-qm", "hotfix"], ["push", "-q", "origin", "main"]):
        subprocess.run(["git", *args], cwd=work, check=True, env=env)
    return git_head(bare)


async def test_bad_input_and_missing_configuration_touch_nothing(
        ops: Ops, monkeypatch: pytest.MonkeyPatch) -> None:
    await ops.slot("slot-6")
    done = await ops.run("slot.reset", "no-such-slot", key="no-such-slot", id="reset-x")
    assert done.state is RunState.FAILED
    assert done.error is not None and "unknown slot 'no-such-slot'" in done.error

    monkeypatch.delenv("DURABLE_PAAS_TOKEN")
    done = await ops.run("slot.reset", "slot-6", key="slot-6", id="reset-6")
    assert done.state is RunState.FAILED
    assert done.error is not None and "set DURABLE_PAAS_TOKEN" in done.error
    assert ops.services.ledger() == [] and ops.services.notifications() == []
    assert (await ops.record("slot-6")).state_reason is None
    assert len(ops.services.state()["databases"]) == 1
    journal = await ops.client.journal("reset-6")
    assert [e.name for e in journal if e.kind.value == "step_failed"] == ["config.check"]
    assert ops.services.token not in json.dumps([dict(e.data) for e in journal])


async def test_a_service_that_saw_a_newer_fencing_token_stops_the_attempt(ops: Ops) -> None:
    """A 409 "stale fencing token" means a newer attempt holds the resource: this attempt
    stops at once (LeaseLostError), sending and writing nothing more."""
    await ops.slot("slot-10")
    db = "/api/v1/databases/db-slot-10"
    ops.services.add_fault(db, method="DELETE", hang=True, times=1)
    await ops.client.start("slot.reset", "slot-10", id="reset-10", key="slot-10")
    counters = durable.Counters()
    async with running_worker(ops.client, durable.default_registry, interceptors=[counters]):
        await ops.services.wait_for_entry(  # the delete is held (the fault took it)
            lambda e: e["path"] == db and e["faults"])
        async with httpx.AsyncClient() as http:  # meanwhile a newer attempt of the key
            newer = await http.get(f"{ops.services.url}{db}", headers={
                "Authorization": f"Bearer {ops.services.token}", durable.FENCING_HEADER: "999",
                durable.FENCING_SCOPE_HEADER: "key:slot-10"})
        assert newer.status_code == 200
        ops.services.release()  # the held delete is dropped; its retry meets the fence
        await poll(lambda: counters.claimed == counters.attempts_ended == 1)  # it ended
    [refused] = [e for e in ops.services.ledger() if e["refused"]]
    assert refused["method"] == "DELETE" and refused["path"] == db
    assert ops.services.ledger()[-1]["seq"] == refused["seq"]  # nothing sent after it
    assert ops.services.notifications() == []
    assert len(ops.services.state()["databases"]) == 1
    assert (await ops.record("slot-10")).state_reason is None  # nothing written either
    journal = await ops.client.journal("reset-10")
    assert journal[-1].kind is durable.EntryKind.STEP_STARTED
    assert journal[-1].name == "paas.delete_database"


async def test_a_service_that_echoes_the_token_in_its_error_does_not_leak_it(
        ops: Ops, caplog: pytest.LogCaptureFixture) -> None:
    """Some APIs quote the credential they refused ("invalid key sk-..."). The answer's
    text goes into the step's error, so into the journal, the logs, the slot's state
    reason and the failure notification: the token it sent is blanked out of it first."""
    await ops.slot("slot-t")
    token = ops.services.token
    ops.services.add_fault("/api/v1/applications/app-slot-t", method="GET", status=401,
                           body={"message": f"Unauthenticated: {token} is not a valid token"})
    done = await ops.run("slot.reset", "slot-t", key="slot-t", id="reset-t")

    assert done.state is RunState.FAILED
    assert done.error is not None and "HTTP 401: Unauthenticated: *** is not a valid" \
        in done.error  # the rest of the answer is kept: it says what was wrong
    journal = json.dumps([dict(e.data) for e in await ops.client.journal("reset-t")])
    reason = (await ops.record("slot-t")).state_reason or ""
    assert "check DURABLE_PAAS_TOKEN" in reason
    sent = json.dumps(ops.services.notifications())
    assert token not in journal + reason + sent + done.error + caplog.text


async def test_a_service_url_with_a_query_is_refused_before_anything_is_journaled(
        ops: Ops, monkeypatch: pytest.MonkeyPatch) -> None:
    """A base URL carrying a credential in its query (``?api_key=...``) is bad
    configuration: it would be journaled (the configuration check's result) and quoted in
    every error. The check refuses it naming the variable, never the value."""
    await ops.slot("slot-q")
    monkeypatch.setenv("DURABLE_PAAS_URL", ops.services.url + "/?api_key=QUERYSECRET123")
    done = await ops.run("slot.reset", "slot-q", key="slot-q", id="reset-q")
    assert done.state is RunState.FAILED
    assert done.error is not None and "DURABLE_PAAS_URL must be a base URL" in done.error
    journal = json.dumps([dict(e.data) for e in await ops.client.journal("reset-q")])
    assert "QUERYSECRET123" not in journal + done.error
    assert ops.services.ledger() == []  # nothing was sent


async def test_a_later_try_does_not_report_only_what_it_found_left(ops: Ops) -> None:
    """The first try deleted an env var and lost the answer; the retry lists what is left
    and deletes it. Its summary (the recovery report's list of what was done) must not
    read as if that were all this step deleted."""
    await ops.slot("slot-e")
    ops.services.add_fault("/api/v1/applications/app-slot-e/envs/*", method="DELETE",
                           phase="after", drop=True, times=1)
    done = await ops.run("slot.reset", "slot-e", key="slot-e", id="reset-e")
    assert done.state is RunState.COMPLETED, done.error
    [summary] = [e.data["summary"] for e in await ops.client.journal("reset-e")
                 if e.name == "paas.delete_env_vars" and e.kind.value == "step_completed"]
    assert summary.startswith("env vars of app-slot-e: deleted ")
    assert summary.endswith("; an earlier try of this step, whose answer was lost, may have "
                            "deleted more")
    assert ops.services.state()["applications"][0]["envs"] == []
