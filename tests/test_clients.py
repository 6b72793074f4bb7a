"""The API clients against the real fake-services subprocess, and git against real repos."""

from __future__ import annotations

import os
import pickle
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import anyio
import httpx
import pytest

import activities
from activities import (
    CreateOutcome,
    DeleteOutcome,
    GitHostClient,
    Lookup,
    NotFoundError,
    Notifier,
    PaasClient,
    RetryLaterError,
    ServiceError,
    ServiceUnreachableError,
    StaleFencingTokenError,
    TtsClient,
    git,
)
from activities.errors import parse_retry_after
from tests.services import FakeServices

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=5) as client:
        yield client


@pytest.fixture
def paas(fake_services: FakeServices, http: httpx.AsyncClient) -> PaasClient:
    return PaasClient(http, fake_services.url, fake_services.token)


@pytest.fixture
def githost(fake_services: FakeServices, http: httpx.AsyncClient) -> GitHostClient:
    return GitHostClient(http, fake_services.url, fake_services.token)


APP = {
    "uuid": "app-1",
    "name": "slot-1",
    "envs": [{"uuid": "env-1", "key": "API_KEY", "value": "s3cret"}],
    "volumes": [{"uuid": "vol-1", "name": "data", "mount_path": "/data"}],
    "file_storages": [{"uuid": "file-1", "mount_path": "/etc/app.conf"}],
}


# ---------------------------------------------------------------------------- surface


def test_public_surface() -> None:
    assert sorted(activities.__all__) == sorted(
        [
            "Application", "CreateOutcome", "CreateResult", "Database", "DeleteOutcome",
            "EnvVar", "GitHostClient", "Lookup", "LookupResult", "NotFoundError", "Notifier",
            "PaasClient", "Repository", "RetryLaterError", "ServiceError",
            "ServiceUnreachableError", "Speech", "StaleFencingTokenError", "TtsClient",
        ]
    )  # fmt: skip
    for name in activities.__all__:
        assert getattr(activities, name).__module__.startswith("activities.")
    for error in (NotFoundError, RetryLaterError, StaleFencingTokenError, ServiceUnreachableError):
        assert issubclass(error, ServiceError)


def test_retry_after_accepts_seconds_and_http_dates() -> None:
    assert parse_retry_after("3") == 3.0
    assert parse_retry_after(" 0.5 ") == 0.5
    assert parse_retry_after("-4") == 0.0
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:30 GMT", now=1445412480.0) == 30.0
    assert parse_retry_after("soon") is None and parse_retry_after(None) is None


# ---------------------------------------------------------------------------- PaaS


async def test_paas_reads_and_deletes(fake_services: FakeServices, paas: PaasClient) -> None:
    fake_services.seed(applications=[APP], databases=[{"uuid": "db-1", "name": "slot-1-db"}])
    app = await paas.get_application("app-1")
    assert app is not None and (app.uuid, app.name) == ("app-1", "slot-1")
    assert await paas.get_application("nope") is None
    [env] = await paas.list_envs("app-1")
    assert (env.uuid, env.key) == ("env-1", "API_KEY") and "s3cret" not in repr(env)
    storages = await paas.list_storages("app-1")
    assert [(s.uuid, s.kind) for s in storages] == [("vol-1", "persistent"), ("file-1", "file")]

    assert await paas.delete_env("app-1", "env-1") is DeleteOutcome.DELETED
    assert await paas.delete_env("app-1", "env-1") is DeleteOutcome.ALREADY_GONE
    assert await paas.delete_storage("app-1", "vol-1") is DeleteOutcome.DELETED
    assert await paas.delete_storage("app-1", "vol-1") is DeleteOutcome.ALREADY_GONE
    assert await paas.delete_application("app-1", delete_volumes=False) is DeleteOutcome.DELETED
    assert await paas.delete_application("app-1") is DeleteOutcome.ALREADY_GONE
    [first, _] = fake_services.ledger(method="DELETE", path="/api/v1/applications/app-1")
    assert "delete_volumes=false" in first["query"]

    database = await paas.get_database("db-1")
    assert database is not None and database.name == "slot-1-db"
    assert await paas.delete_database("db-1") is DeleteOutcome.DELETED
    assert await paas.delete_database("db-1") is DeleteOutcome.ALREADY_GONE
    assert await paas.get_database("db-1") is None
    assert DeleteOutcome("already_gone") is DeleteOutcome.ALREADY_GONE  # journals as text


async def test_listing_a_missing_app_raises_not_found(paas: PaasClient) -> None:
    with pytest.raises(NotFoundError) as caught:
        await paas.list_envs("gone")
    assert caught.value.status == 404


async def test_errors_carry_status_method_url_but_never_the_token(
    fake_services: FakeServices, http: httpx.AsyncClient
) -> None:
    token = "very-secret-token-value"
    fake_services.add_fault("/api/v1/applications/*", status=500, body={"message": "boom"})
    paas = PaasClient(http, fake_services.url + "/", token)
    with pytest.raises(ServiceError) as caught:
        await paas.delete_application("app-1")
    error = caught.value
    assert (error.status, error.method) == (500, "DELETE")
    assert error.url.startswith(f"{fake_services.url}/api/v1/applications/app-1")
    assert error.detail == "boom"
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is ServiceError and str(copy) == str(error)
    for text in (str(error), repr(error), repr(error.args), repr(paas)):
        assert token not in text


async def test_a_token_quoted_by_the_service_is_blanked_before_the_detail_is_cut(
    fake_services: FakeServices, http: httpx.AsyncClient
) -> None:
    """The error's detail is an excerpt of the answer: the token is blanked in the whole
    answer first, so an excerpt that ends inside it keeps no prefix of it either."""
    token = "very-secret-token-value"
    paas = PaasClient(http, fake_services.url, token)
    for padding in (0, 290):
        fake_services.clear_faults()
        fake_services.add_fault("/api/v1/applications/*", status=401,
                                body={"message": "x" * padding + f"bad key {token}!"})
        with pytest.raises(ServiceError) as caught:
            await paas.get_application("app-1")
        assert token[:6] not in str(caught.value)
    assert str(caught.value).endswith("x" * 8 + "bad key **")  # cut where the excerpt ends


@pytest.mark.parametrize("status", [429, 503])
async def test_retry_later_carries_retry_after(
    fake_services: FakeServices, paas: PaasClient, status: int
) -> None:
    fake_services.add_fault("/api/v1/databases/*", status=status, retry_after="2.5")
    with pytest.raises(RetryLaterError) as caught:
        await paas.delete_database("db-1")  # a throttled delete is not "already gone"
    assert (caught.value.status, caught.value.retry_after) == (status, 2.5)


async def test_a_cancelled_call_disconnects_and_the_server_sees_it(
    fake_services: FakeServices, paas: PaasClient
) -> None:
    fake_services.seed(applications=[APP])
    fake_services.add_fault("/api/v1/applications/*", method="DELETE", hang=True)
    with anyio.move_on_after(0.3) as scope:
        await paas.delete_application("app-1")
    assert scope.cancelled_caught
    entry = await fake_services.wait_until_ended(method="DELETE")
    assert entry["disconnected"] and entry["status"] is None and not entry["handled"]
    assert await paas.get_application("app-1") is not None


# ---------------------------------------------------------------------------- git host


async def test_lookup_found_and_absent(fake_services: FakeServices, githost: GitHostClient) -> None:
    fake_services.seed(repositories=[{"workspace": "acme", "slug": "site"}])
    found = await githost.lookup("acme", "site")
    assert found.outcome is Lookup.FOUND and found.repository is not None
    assert found.repository.full_name == "acme/site"
    assert found.repository.clone_url("file") == str(fake_services.repo_path("acme", "site"))
    absent = await githost.lookup("acme", "other")
    assert (absent.outcome, absent.repository, absent.error) == (Lookup.ABSENT, None, None)
    with pytest.raises(TypeError):
        bool(absent)  # "if await lookup(...)" must not silently mean something


@pytest.mark.parametrize("case", ["401", "403", "500", "503", "timeout", "drop"])
async def test_lookup_unknown_is_never_absent(
    fake_services: FakeServices, http: httpx.AsyncClient, case: str
) -> None:
    token = "wrong" if case == "401" else fake_services.token
    path = "/2.0/repositories/*"
    if case in ("403", "500", "503"):
        fake_services.add_fault(path, status=int(case), retry_after=1 if case == "503" else None)
    elif case == "timeout":
        fake_services.add_fault(path, hang=True)
    elif case == "drop":
        fake_services.add_fault(path, drop=True)
    async with httpx.AsyncClient(timeout=0.3) as short:
        githost = GitHostClient(short if case == "timeout" else http, fake_services.url, token)
        result = await githost.lookup("acme", "site")
    assert result.outcome is Lookup.UNKNOWN and result.repository is None
    assert result.error is not None
    if case in ("timeout", "drop"):
        assert isinstance(result.error, ServiceUnreachableError) and result.error.status is None
    else:
        assert result.error.status == int(case)
    if case == "503":
        assert isinstance(result.error, RetryLaterError) and result.error.retry_after == 1
    assert fake_services.token not in result.detail + repr(result)


async def test_create_reports_already_existed(
    fake_services: FakeServices, githost: GitHostClient
) -> None:
    created = await githost.create("acme", "site", description="slot 1")
    assert created.outcome is CreateOutcome.CREATED and created.repository is not None
    assert Path(created.repository.clone_url()).is_dir()
    again = await githost.create("acme", "site")
    assert (again.outcome, again.repository) == (CreateOutcome.ALREADY_EXISTED, None)
    with pytest.raises(TypeError):
        bool(again)
    assert await githost.delete("acme", "site") is DeleteOutcome.DELETED
    assert await githost.delete("acme", "site") is DeleteOutcome.ALREADY_GONE


async def test_create_failure_raises(fake_services: FakeServices, githost: GitHostClient) -> None:
    fake_services.add_fault("/2.0/repositories/*", method="POST", status=403)
    with pytest.raises(ServiceError) as caught:
        await githost.create("acme", "site")
    assert caught.value.status == 403


async def test_stale_fencing_token_raises_everywhere(fake_services: FakeServices) -> None:
    fake_services.seed(repositories=[{"workspace": "acme", "slug": "site"}])

    def fenced(token: int) -> httpx.AsyncClient:
        return httpx.AsyncClient(timeout=5, headers={"Durable-Fencing-Token": str(token)})

    async with fenced(9) as newer, fenced(5) as older:
        assert (
            await GitHostClient(newer, fake_services.url, fake_services.token).lookup(
                "acme", "site"
            )
        ).outcome is Lookup.FOUND
        stale = GitHostClient(older, fake_services.url, fake_services.token)
        with pytest.raises(StaleFencingTokenError):
            await stale.lookup("acme", "site")
        with pytest.raises(StaleFencingTokenError):
            await stale.create("acme", "site")
        with pytest.raises(StaleFencingTokenError):
            await stale.delete("acme", "site")
    entries = fake_services.ledger(resource="repo:acme/site")
    assert [e["refused"] for e in entries] == [False, True, True, True]
    assert fake_services.repo_path("acme", "site").is_dir()


# ---------------------------------------------------------------------------- TTS, notify


async def test_tts_is_billed_once_per_key(
    fake_services: FakeServices, http: httpx.AsyncClient
) -> None:
    tts = TtsClient(http, fake_services.url, fake_services.token)
    first = await tts.synthesize("voice-1", "Hello there", idempotency_key="job-1/item-1")
    again = await tts.synthesize("voice-1", "Hello there", idempotency_key="job-1/item-1")
    assert first.audio == again.audio and first.content_type == "audio/mpeg"
    assert (first.replayed, again.replayed) == (False, True)
    assert first.character_cost == len("Hello there")
    assert [e["billed"] for e in fake_services.ledger()] == [True, False]
    with pytest.raises(ValueError):
        await tts.synthesize("voice-1", "Hello", idempotency_key="")


async def test_tts_answer_lost_after_billing_is_not_billed_again(
    fake_services: FakeServices, http: httpx.AsyncClient
) -> None:
    fake_services.add_fault("/v1/text-to-speech/*", phase="after", drop=True, times=1)
    tts = TtsClient(http, fake_services.url, fake_services.token)
    with pytest.raises(ServiceUnreachableError):
        await tts.synthesize("voice-1", "long text", idempotency_key="job-1/item-2")
    retried = await tts.synthesize("voice-1", "long text", idempotency_key="job-1/item-2")
    assert retried.replayed
    assert [e["billed"] for e in fake_services.ledger()] == [True, False]
    assert fake_services.state()["tts"]["billed_calls"] == 1


async def test_notifier_delivers(fake_services: FakeServices, http: httpx.AsyncClient) -> None:
    notifier = Notifier(http, fake_services.url, fake_services.token)
    await notifier.send("ops", {"text": "slot 3 reset"}, idempotency_key="job-7/notify")
    [message] = fake_services.notifications()
    assert (message["hook"], message["body"]) == ("ops", {"text": "slot 3 reset"})
    assert message["idempotency_key"] == "job-7/notify"
    fake_services.add_fault("/hooks/*", status=500)
    with pytest.raises(ServiceError):
        await notifier.send("ops", {"text": "again"})


# ---------------------------------------------------------------------------- git


async def _working_copy(path: Path, remote: str, content: str) -> str:
    await git.clone(remote, path)
    (path / "slot.txt").write_text(content)
    return await git.commit(path, content)


async def test_force_push_with_lease(
    fake_services: FakeServices, githost: GitHostClient, tmp_path: Path
) -> None:
    created = await githost.create("acme", "site")
    assert created.repository is not None
    remote = created.repository.clone_url("file")
    assert await git.remote_sha(remote, "main") is None

    await git.init(tmp_path / "a")
    (tmp_path / "a" / "slot.txt").write_text("template\n")
    base = await git.commit(tmp_path / "a", "template")
    pushed = await git.push(tmp_path / "a", remote, "main")
    assert (pushed.status, pushed.sha) == (git.PushStatus.CREATED, base)
    assert await git.remote_sha(remote, "refs/heads/main") == base

    # Someone else moves the remote on.
    moved = await _working_copy(tmp_path / "b", remote, "someone else\n")
    assert (await git.push(tmp_path / "b", remote, "main")).status is git.PushStatus.UPDATED

    # Our force push still expects the old commit: refused, and the remote is untouched.
    (tmp_path / "a" / "slot.txt").write_text("reset\n")
    reset = await git.commit(tmp_path / "a", "reset")
    with pytest.raises(git.StaleLeaseError) as caught:
        await git.force_push_with_lease(tmp_path / "a", remote, "main", expected_sha=base)
    assert caught.value.ref == "refs/heads/main" and caught.value.reason == "stale info"
    assert await git.remote_sha(remote, "main") == moved

    # A plain push of diverged history is refused too, and is not a lease error.
    with pytest.raises(git.PushRejectedError) as plain:
        await git.push(tmp_path / "a", remote, "main")
    assert not isinstance(plain.value, git.StaleLeaseError)

    # With the right lease it forces; repeating the same push is harmless.
    forced = await git.force_push_with_lease(tmp_path / "a", remote, "main", expected_sha=moved)
    assert (forced.status, forced.sha) == (git.PushStatus.FORCED, reset)
    repeat = await git.force_push_with_lease(tmp_path / "a", remote, "main", expected_sha=moved)
    assert repeat.status is git.PushStatus.UP_TO_DATE
    assert await git.remote_sha(remote, "main") == reset


async def test_git_failures_are_distinguishable_and_redacted(tmp_path: Path) -> None:
    with pytest.raises(git.GitError) as caught:
        await git.remote_sha(str(tmp_path / "missing.git"), "main")
    assert caught.value.returncode not in (0, 2)
    with pytest.raises(git.GitError) as clone_error:
        await git.clone("http://user:hunter2@127.0.0.1:9/repo.git", tmp_path / "c")
    assert "hunter2" not in str(clone_error.value) + repr(clone_error.value)


def _live_processes_with(variable: str) -> list[int]:
    """Pids of non-zombie processes whose environment holds ``variable``."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                environ = f.read().split(b"\0")
            with open(f"/proc/{name}/stat") as f:
                state = f.read().rpartition(")")[2].split()[0]
        except OSError:
            continue
        if variable.encode() in environ and state != "Z":
            found.append(int(name))
    return found


async def _poll(check: Callable[[], object]) -> None:
    """Bounded poll: until ``check()`` is true, for at most 5 s."""
    with anyio.fail_after(5):
        while not check():
            await anyio.sleep(0.01)


async def test_cancelling_git_kills_it_and_its_children(tmp_path: Path) -> None:
    remote = tmp_path / "remote.git"
    await git.init(remote, bare=True)
    started = tmp_path / "hook-started"
    hook = remote / "hooks" / "pre-receive"
    hook.write_text(f"#!/bin/sh\necho $$ > '{started}'\nexec sleep 60\n")
    hook.chmod(0o755)
    await git.init(tmp_path / "work")
    (tmp_path / "work" / "f").write_text("x")
    await git.commit(tmp_path / "work", "x")
    marker = f"DURABLE_TEST_MARKER={uuid.uuid4()}"
    env = dict([marker.split("=", 1)])

    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: git.push(tmp_path / "work", str(remote), "main", env=env))
            await _poll(started.exists)  # git push -> receive-pack -> hook (sleep) runs
            assert len(_live_processes_with(marker)) >= 3
            tg.cancel_scope.cancel()
        await _poll(lambda: not _live_processes_with(marker))
    assert await git.remote_sha(str(remote), "main") is None
