"""The fake services over real HTTP: auth, shapes, faults, fencing, ledger, lifecycle."""

from __future__ import annotations

import os
import signal
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import httpx
import pytest

from scripts._fakes.harness import FakeServices, start_process

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def http(fake_services: FakeServices) -> AsyncIterator[httpx.AsyncClient]:
    headers = {"Authorization": f"Bearer {fake_services.token}"}
    async with httpx.AsyncClient(base_url=fake_services.url, headers=headers, timeout=5) as c:
        yield c


SEED_APP = {
    "uuid": "app-1",
    "name": "slot-1",
    "envs": [{"uuid": "env-1", "key": "DATABASE_URL", "value": "postgres://x"}],
    "volumes": [{"uuid": "vol-1", "name": "slot-1-data", "mount_path": "/data"}],
    "file_storages": [{"uuid": "file-1", "mount_path": "/etc/app.conf", "content": "x=1"}],
}


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/api/v1/applications/app-1"),
        ("DELETE", "/api/v1/databases/db-1"),
        ("GET", "/2.0/repositories/acme/site"),
        ("POST", "/v1/text-to-speech/voice-1"),
        ("POST", "/hooks/ops"),
    ],
)
async def test_every_api_needs_the_bearer_token(
    fake_services: FakeServices, method: str, path: str
) -> None:
    async with httpx.AsyncClient(base_url=fake_services.url) as anonymous:
        missing = await anonymous.request(method, path, json={"text": "hi"})
        wrong = await anonymous.request(
            method, path, json={"text": "hi"}, headers={"Authorization": "Bearer nope"}
        )
    assert (missing.status_code, wrong.status_code) == (401, 401)
    entries = fake_services.ledger(path=path)
    assert [e["status"] for e in entries] == [401, 401]
    assert not any(e["handled"] or e["billed"] for e in entries)
    assert fake_services.token not in str(entries)


async def test_paas_shapes_and_deletes(
    fake_services: FakeServices, http: httpx.AsyncClient
) -> None:
    fake_services.seed(applications=[SEED_APP], databases=[{"uuid": "db-1"}])
    app = (await http.get("/api/v1/applications/app-1")).json()
    assert (app["uuid"], app["name"]) == ("app-1", "slot-1")
    envs = (await http.get("/api/v1/applications/app-1/envs")).json()
    assert [(e["uuid"], e["key"]) for e in envs] == [("env-1", "DATABASE_URL")]
    storages = (await http.get("/api/v1/applications/app-1/storages")).json()
    assert [s["uuid"] for s in storages["persistent_storages"]] == ["vol-1"]
    assert [s["uuid"] for s in storages["file_storages"]] == ["file-1"]

    for path in (
        "/api/v1/applications/app-1/envs/env-1",
        "/api/v1/applications/app-1/storages/vol-1",
        "/api/v1/databases/db-1",
        "/api/v1/applications/app-1",
    ):
        first, again = await http.delete(path), await http.delete(path)
        assert (first.status_code, again.status_code) == (200, 404), path
        assert "message" in first.json() and "message" in again.json()
    assert (await http.get("/api/v1/applications/app-1")).status_code == 404
    state = fake_services.state()
    assert state["applications"] == [] and state["databases"] == []


async def test_deleting_an_app_without_its_volumes_orphans_them(
    fake_services: FakeServices, http: httpx.AsyncClient
) -> None:
    fake_services.seed(applications=[SEED_APP])
    response = await http.delete("/api/v1/applications/app-1", params={"delete_volumes": "false"})
    assert response.status_code == 200
    assert [v["uuid"] for v in fake_services.state()["orphaned_volumes"]] == ["vol-1"]


async def test_git_host_keeps_real_bare_repositories(
    fake_services: FakeServices, http: httpx.AsyncClient
) -> None:
    path = "/2.0/repositories/acme/site"
    assert (await http.get(path)).status_code == 404
    created = await http.post(path, json={"scm": "git", "is_private": True})
    assert created.status_code == 200
    repo = created.json()
    assert repo["full_name"] == "acme/site"
    [clone] = [link["href"] for link in repo["links"]["clone"] if link["name"] == "file"]
    assert Path(clone) == fake_services.repo_path("acme", "site")
    is_bare = await anyio.run_process(["git", "-C", clone, "rev-parse", "--is-bare-repository"])
    assert is_bare.stdout.strip() == b"true"

    conflict = await http.post(path, json={})
    assert conflict.status_code == 409
    assert "already exists" in conflict.json()["error"]["message"]
    assert (await http.get(path)).json()["uuid"] == repo["uuid"]

    assert (await http.delete(path)).status_code == 204
    assert not fake_services.repo_path("acme", "site").is_dir()
    assert (await http.delete(path)).status_code == 404


async def test_seeded_repository_has_a_commit(fake_services: FakeServices) -> None:
    fake_services.seed(
        repositories=[{"workspace": "acme", "slug": "template", "files": {"README.md": "hi\n"}}]
    )
    bare = fake_services.repo_path("acme", "template")
    shown = await anyio.run_process(["git", "-C", str(bare), "show", "main:README.md"])
    assert shown.stdout == b"hi\n"


async def test_tts_bills_once_per_idempotency_key(
    fake_services: FakeServices, http: httpx.AsyncClient
) -> None:
    path = "/v1/text-to-speech/voice-1"

    async def speak(text: str, key: str) -> httpx.Response:
        return await http.post(path, json={"text": text}, headers={"Idempotency-Key": key})

    first, again, other = (
        await speak("hello", "k1"),
        await speak("hello", "k1"),
        await speak("hello", "k2"),
    )
    assert first.headers["content-type"] == "audio/mpeg"
    assert first.content == again.content == other.content
    assert first.content.startswith(b"ID3")
    assert (await speak("bye", "k3")).content != first.content
    assert [r.headers["idempotent-replayed"] for r in (first, again, other)] == [
        "false",
        "true",
        "false",
    ]
    assert [e["billed"] for e in fake_services.ledger(path=path)] == [True, False, True, True]
    assert fake_services.state()["tts"]["billed_calls"] == 3
    mismatch = await speak("something else", "k1")
    assert mismatch.status_code == 422


async def test_lower_fencing_token_is_refused_and_recorded(
    fake_services: FakeServices, http: httpx.AsyncClient
) -> None:
    fake_services.seed(applications=[SEED_APP, {"uuid": "app-2"}])

    async def get(app: str, token: int | None) -> int:
        headers = {} if token is None else {"Durable-Fencing-Token": str(token)}
        return (await http.get(f"/api/v1/applications/{app}", headers=headers)).status_code

    assert await get("app-1", 7) == 200
    assert await get("app-1", 7) == 200  # the same attempt may call again
    assert await get("app-1", 5) == 409  # an older attempt is fenced out
    assert await get("app-1", None) == 200  # plain clients are not fenced
    assert await get("app-2", 5) == 200  # fences are per resource
    stale = await http.delete(
        "/api/v1/applications/app-1/envs/env-1", headers={"Durable-Fencing-Token": "6"}
    )
    assert stale.status_code == 409 and stale.json() == {"error": "stale fencing token"}
    assert await get("app-1", 8) == 200

    entries = fake_services.ledger(resource="app:app-1")
    assert [(e["fencing_token"], e["refused"]) for e in entries] == [
        (7, False),
        (7, False),
        (5, True),
        (None, False),
        (6, True),
        (8, False),
    ]
    assert not entries[4]["handled"]
    assert len(fake_services.state()["applications"][0]["envs"]) == 1  # not deleted
    assert fake_services.state()["fences"]["app:app-1"] == 8


async def test_fencing_tokens_are_compared_within_their_scope_on_every_resource(
    fake_services: FakeServices, http: httpx.AsyncClient
) -> None:
    """The documented rule (docs/design.md): a token is compared within its scope (the
    run's concurrency key, or the run), across resources; other scopes are unrelated."""
    fake_services.seed(applications=[SEED_APP, {"uuid": "app-2"}])

    async def get(app: str, token: int, scope: str) -> int:
        headers = {"Durable-Fencing-Token": str(token), "Durable-Fencing-Scope": scope}
        return (await http.get(f"/api/v1/applications/{app}", headers=headers)).status_code

    assert await get("app-1", 7, "key:slot-1") == 200
    assert await get("app-2", 5, "key:slot-1") == 409  # superseded: refused on any resource
    assert await get("app-1", 5, "key:slot-2") == 200  # another scope: unrelated
    assert await get("app-1", 3, "run:r-9") == 200
    assert await get("app-2", 7, "key:slot-1") == 200  # the newest attempt goes on
    assert await get("app-2", 6, "key:slot-1") == 409
    empty = await http.get("/api/v1/applications/app-1", headers={
        "Durable-Fencing-Token": "9", "Durable-Fencing-Scope": ""})
    assert empty.status_code == 400
    entries = fake_services.ledger()
    assert [(e["fencing_scope"], e["fencing_token"], e["refused"]) for e in entries[:6]] == [
        ("key:slot-1", 7, False),
        ("key:slot-1", 5, True),
        ("key:slot-2", 5, False),
        ("run:r-9", 3, False),
        ("key:slot-1", 7, False),
        ("key:slot-1", 6, True),
    ]
    fences = fake_services.state()["scope_fences"]
    assert fences == {"key:slot-1": 7, "key:slot-2": 5, "run:r-9": 3}


async def test_status_fault_with_retry_after_and_times(
    fake_services: FakeServices, http: httpx.AsyncClient
) -> None:
    fake_services.seed(databases=[{"uuid": "db-1"}])
    fault = fake_services.add_fault(
        "/api/v1/databases/*", method="GET", status=503, retry_after=7, times=1
    )
    busy = await http.get("/api/v1/databases/db-1")
    assert (busy.status_code, busy.headers["retry-after"]) == (503, "7")
    assert (await http.get("/api/v1/databases/db-1")).status_code == 200
    first, second = fake_services.ledger(path="/api/v1/databases/db-1")
    assert (first["faults"], first["handled"], second["faults"]) == ([fault], False, [])
    assert fake_services.faults()[0]["hits"] == 1


async def test_hang_records_the_client_disconnect(
    fake_services: FakeServices, http: httpx.AsyncClient
) -> None:
    fake_services.add_fault(path_regex=r"^/2\.0/repositories/", hang=True)
    with anyio.move_on_after(0.3) as scope:
        await http.get("/2.0/repositories/acme/site")
    assert scope.cancelled_caught
    entry = await fake_services.wait_until_ended(path="/2.0/repositories/acme/site")
    assert entry["disconnected"] is True and entry["status"] is None
    assert 0.2 < entry["ended_at"] - entry["arrived_at"] < 3
    assert entry["disconnected_at"] == pytest.approx(entry["ended_at"], abs=0.5)


async def test_drop_closes_the_connection_without_an_answer(
    fake_services: FakeServices, http: httpx.AsyncClient
) -> None:
    fake_services.add_fault("/hooks/*", drop=True, times=1)
    with pytest.raises(httpx.RemoteProtocolError):
        await http.post("/hooks/ops", json={"text": "hi"})
    assert (await http.post("/hooks/ops", json={"text": "hi"})).status_code == 200
    dropped, delivered = fake_services.ledger(path="/hooks/ops")
    assert (dropped["status"], dropped["dropped"], dropped["disconnected"]) == (None, True, False)
    assert delivered["status"] == 200
    assert len(fake_services.notifications()) == 1


async def test_after_phase_fault_acts_then_loses_the_answer(
    fake_services: FakeServices, http: httpx.AsyncClient
) -> None:
    fake_services.seed(applications=[SEED_APP])
    fake_services.add_fault("/api/v1/applications/*", method="DELETE", phase="after", status=502)
    response = await http.delete("/api/v1/applications/app-1")
    assert response.status_code == 502
    assert fake_services.state()["applications"] == []  # the delete did happen
    [entry] = fake_services.ledger(method="DELETE")
    assert entry["handled"] and entry["status"] == 502


async def test_latency_fault_delays_the_answer(
    fake_services: FakeServices, http: httpx.AsyncClient
) -> None:
    fake_services.add_fault("/hooks/*", latency=0.2)
    with anyio.fail_after(3):
        assert (await http.post("/hooks/ops", json={})).status_code == 200
    [entry] = fake_services.ledger()
    assert entry["ended_at"] - entry["arrived_at"] >= 0.2


async def test_notifications_and_reset(
    fake_services: FakeServices, http: httpx.AsyncClient
) -> None:
    fake_services.seed(repositories=[{"workspace": "acme", "slug": "site"}])
    await http.post(
        "/hooks/ops", json={"text": "reset finished"}, headers={"Idempotency-Key": "n1"}
    )
    [message] = fake_services.notifications()
    assert (message["hook"], message["body"], message["idempotency_key"]) == (
        "ops",
        {"text": "reset finished"},
        "n1",
    )
    fake_services.add_fault("/hooks/*", status=500)
    fake_services.reset()
    assert fake_services.notifications() == [] and fake_services.ledger() == []
    assert fake_services.faults() == [] and fake_services.state()["repositories"] == []
    assert not fake_services.repo_path("acme", "site").exists()


def test_bad_fault_rules_are_rejected(fake_services: FakeServices) -> None:
    for rule in ({"path": "/x"}, {"status": 500, "hang": True}, {"drop": True, "phase": "later"}):
        response = httpx.post(f"{fake_services.url}/_admin/faults", json=rule)
        assert response.status_code == 400, rule


async def test_sigterm_exits_cleanly_even_with_a_hanging_request() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        process, url = start_process(Path(tmp) / "git", Path(tmp) / "ready.json")
        try:
            async with httpx.AsyncClient(base_url=url, timeout=10) as http:
                (await http.post("/_admin/faults", json={"hang": True})).raise_for_status()

                async def hang() -> None:
                    with pytest.raises(httpx.TransportError):  # released by the shutdown
                        await http.get("/hooks/x", headers={"Authorization": "Bearer x"})

                async with anyio.create_task_group() as tg:
                    tg.start_soon(hang)
                    with anyio.fail_after(5):
                        while True:  # bounded poll: until the server has the request
                            if (await http.get("/_admin/ledger")).json()["entries"]:
                                break
                            await anyio.sleep(0.01)
                    os.killpg(process.pid, signal.SIGTERM)
            assert await anyio.to_thread.run_sync(process.wait, 10) == 0
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
