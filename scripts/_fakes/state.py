"""State of the fake services: resources, ledger, faults, fences; seeding."""

from __future__ import annotations

import fnmatch
import hashlib
import itertools
import os
import re
import shutil
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

IDEMPOTENCY_HEADER = "idempotency-key"
FENCING_HEADER = "durable-fencing-token"
FENCING_SCOPE_HEADER = "durable-fencing-scope"
REPLAYED_HEADER = "idempotent-replayed"
STALE_FENCE = {"error": "stale fencing token"}
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
_GIT_ENV = {
    "GIT_AUTHOR_NAME": "fake-services",
    "GIT_AUTHOR_EMAIL": "fake-services@localhost",
    "GIT_COMMITTER_NAME": "fake-services",
    "GIT_COMMITTER_EMAIL": "fake-services@localhost",
    "GIT_TERMINAL_PROMPT": "0",
}


def fake_audio(voice_id: str, text: str) -> bytes:
    """Deterministic stand-in for an MP3: an ID3 header and frames derived from the input."""
    digest = hashlib.sha256(f"{voice_id}\0{text}".encode()).digest()
    return b"ID3\x04\x00\x00\x00\x00\x00\x00" + (b"\xff\xfb\x90\x64" + digest) * (
        len(text) // 32 + 1
    )


def now() -> float:
    return time.time()


def iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(t))


@dataclass
class Fault:
    id: str
    method: str = "*"
    path: str | None = None
    path_regex: str | None = None
    status: int | None = None
    latency: float = 0.0
    hang: bool = False
    drop: bool = False
    times: int | None = None
    retry_after: str | None = None
    phase: str = "before"
    body: Any = None
    hits: int = 0

    @classmethod
    def from_json(cls, fault_id: str, data: Any) -> Fault:
        if not isinstance(data, dict):
            raise ValueError("a fault rule is a JSON object")
        known = {
            "method",
            "path",
            "path_regex",
            "status",
            "latency",
            "hang",
            "drop",
            "times",
            "retry_after",
            "phase",
            "body",
        }
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown fault fields: {sorted(unknown)}")
        fault = cls(
            id=fault_id,
            method=str(data.get("method") or "*").upper(),
            path=data.get("path"),
            path_regex=data.get("path_regex"),
            status=data.get("status"),
            latency=float(data.get("latency") or 0.0),
            hang=bool(data.get("hang", False)),
            drop=bool(data.get("drop", False)),
            times=data.get("times"),
            retry_after=None if data.get("retry_after") is None else str(data["retry_after"]),
            phase=str(data.get("phase") or "before"),
            body=data.get("body"),
        )
        actions = [fault.status is not None, fault.hang, fault.drop]
        if sum(actions) > 1:
            raise ValueError("at most one of status, hang, drop")
        if not any(actions) and fault.latency <= 0:
            raise ValueError("a fault needs status, latency, hang or drop")
        if fault.status is not None and not (
            isinstance(fault.status, int) and 100 <= fault.status <= 599
        ):
            raise ValueError("status must be an HTTP status code")
        if fault.latency < 0:
            raise ValueError("latency must be >= 0 seconds")
        if fault.times is not None and not (isinstance(fault.times, int) and fault.times > 0):
            raise ValueError("times must be a positive integer")
        if fault.phase not in ("before", "after"):
            raise ValueError("phase is 'before' or 'after'")
        if fault.path is not None and fault.path_regex is not None:
            raise ValueError("give path (glob) or path_regex, not both")
        if fault.path_regex is not None:
            try:
                re.compile(fault.path_regex)
            except re.error as exc:
                raise ValueError(f"bad path_regex: {exc}") from exc
        return fault

    def matches(self, method: str, path: str, phase: str) -> bool:
        if self.phase != phase or self.times == 0:
            return False
        if self.method not in ("*", method):
            return False
        if self.path is not None:
            return fnmatch.fnmatchcase(path, self.path)
        if self.path_regex is not None:
            return re.search(self.path_regex, path) is not None
        return True

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items()}


@dataclass
class TtsRecord:
    fingerprint: str
    audio: bytes
    request_id: str
    characters: int


@dataclass
class ServiceState:
    git_root: Path
    token: str
    applications: dict[str, dict[str, Any]] = field(default_factory=dict)
    databases: dict[str, dict[str, Any]] = field(default_factory=dict)
    repositories: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    orphaned_volumes: list[dict[str, Any]] = field(default_factory=list)
    tts: dict[str, TtsRecord] = field(default_factory=dict)
    billed_calls: int = 0
    billed_characters: int = 0
    notifications: list[dict[str, Any]] = field(default_factory=list)
    ledger: list[dict[str, Any]] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
    fences: dict[str, int] = field(default_factory=dict)
    """The highest token seen per resource, for requests that name no fencing scope."""
    scope_fences: dict[str, int] = field(default_factory=dict)
    """The highest token seen per fencing scope (``Durable-Fencing-Scope``), any resource."""
    release: anyio.Event | None = None
    url: str = ""
    """Where the services listen (set once serving): the repositories' hooks report to it."""
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    @staticmethod
    def parse_token(raw: str) -> int | None:
        """A ``Durable-Fencing-Token`` as sent, as an integer; None if it is not one."""
        return int(raw) if re.fullmatch(r"\d{1,18}", raw.strip()) else None

    def fence(self, token: int, scope: str | None, resource: str | None) -> bool:
        """Whether a request with fencing ``token`` may act: not lower than the highest
        seen in its ``scope`` (any resource), or, naming no scope, on its ``resource``; the
        highest is moved on when it may."""
        if scope is not None:
            fences, name = self.scope_fences, scope
        elif resource is not None:
            fences, name = self.fences, resource
        else:
            return True
        highest = fences.get(name)
        if highest is not None and token < highest:
            return False
        fences[name] = token
        return True

    def next_id(self) -> int:
        return next(self._ids)

    def record(self, method: str, path: str, *, query: str = "", resource: str | None,
               idempotency_key: str | None, fencing_scope: str | None) -> dict[str, Any]:
        """A new ledger entry for a request as it arrives (the front fills in the rest as
        it goes: token, status, faults, when it ended)."""
        entry: dict[str, Any] = {
            "seq": self.next_id(),
            "method": method,
            "path": path,
            "query": query,
            "resource": resource,
            "idempotency_key": idempotency_key,
            "fencing_token": None,
            "fencing_scope": fencing_scope,
            "arrived_at": now(),
            "ended_at": None,
            "status": None,
            "handled": False,
            "disconnected": False,
            "disconnected_at": None,
            "dropped": False,
            "refused": False,
            "billed": False,
            "faults": [],
        }
        self.ledger.append(entry)
        return entry

    def release_event(self) -> anyio.Event:
        if self.release is None:
            self.release = anyio.Event()
        return self.release

    def release_all(self) -> None:
        """Wake every hanging request (their connections are dropped)."""
        if self.release is not None:
            self.release.set()
        self.release = None

    def take_fault(self, method: str, path: str, phase: str) -> Fault | None:
        for fault in self.faults:
            if fault.matches(method, path, phase):
                fault.hits += 1
                if fault.times is not None:
                    fault.times -= 1
                return fault
        return None

    def repo_path(self, workspace: str, slug: str) -> Path:
        return self.git_root / workspace / f"{slug}.git"

    def reset(self) -> None:
        for workspace, slug in list(self.repositories):
            shutil.rmtree(self.repo_path(workspace, slug), ignore_errors=True)
        self.release_all()
        for name in ("applications", "databases", "repositories", "tts", "fences",
                     "scope_fences"):
            getattr(self, name).clear()
        for name in ("orphaned_volumes", "notifications", "ledger", "faults"):
            getattr(self, name).clear()
        self.billed_calls = self.billed_characters = 0

    def snapshot(self) -> dict[str, Any]:
        return {
            "applications": [_app_state(app) for app in self.applications.values()],
            "databases": list(self.databases.values()),
            "repositories": list(self.repositories.values()),
            "orphaned_volumes": list(self.orphaned_volumes),
            "fences": dict(self.fences),
            "scope_fences": dict(self.scope_fences),
            "tts": {
                "billed_calls": self.billed_calls,
                "billed_characters": self.billed_characters,
                "idempotency_keys": sorted(self.tts),
            },
            "notifications": len(self.notifications),
        }


def _app_state(app: dict[str, Any]) -> dict[str, Any]:
    out = dict(app["json"])
    out["envs"] = list(app["envs"].values())
    out["persistent_storages"] = list(app["persistent_storages"].values())
    out["file_storages"] = list(app["file_storages"].values())
    return out


async def _git(*args: str, cwd: Path | None = None) -> None:
    await anyio.run_process(["git", *args], cwd=cwd, env={**os.environ, **_GIT_ENV})


_FENCE_HOOK = """#!{python}
# The git host's fence, as the HTTP services': a push by a durable step (its fencing token,
# scope and idempotency key in the environment, which a local push's hooks inherit) is
# reported to the services, which record it in the ledger and refuse a superseded token.
import json, os, sys, urllib.error, urllib.request
token = os.environ.get("DURABLE_FENCING_TOKEN")
if token is None:
    sys.exit(0)  # not a durable step's push (a test's own setup, the seed)
refs = [line.split()[2] for line in sys.stdin if len(line.split()) == 3]
report = {{"repo": {repo!r}, "token": token, "refs": refs,
          "scope": os.environ.get("DURABLE_FENCING_SCOPE"),
          "idempotency_key": os.environ.get("DURABLE_IDEMPOTENCY_KEY")}}
request = urllib.request.Request({url!r} + "/_admin/git-push", json.dumps(report).encode(),
                                 {{"Content-Type": "application/json"}})
try:
    urllib.request.urlopen(request, timeout=30).close()
except urllib.error.HTTPError as exc:
    print(json.loads(exc.read()).get("error", exc.reason), file=sys.stderr)
    sys.exit(1)
except OSError as exc:
    print(f"the git host's fence cannot be asked: {{exc}}", file=sys.stderr)
    sys.exit(1)
"""


def _install_fence(state: ServiceState, path: Path, repo: str) -> None:
    """The repository's pre-receive hook: its pushes fenced like the API's requests."""
    if not state.url:  # not serving (an app built in a test): no one to ask
        return
    hook = path / "hooks" / "pre-receive"
    hook.write_text(_FENCE_HOOK.format(python=sys.executable, repo=repo, url=state.url))
    hook.chmod(0o755)


def _write_files(work: Path, files: dict[str, str]) -> None:
    for name, content in files.items():
        target = (work / name).resolve()
        if work.resolve() not in target.parents:
            raise ValueError(f"file outside the repository: {name}")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content)


async def create_repository(
    state: ServiceState,
    workspace: str,
    slug: str,
    body: dict[str, Any],
    files: dict[str, str] | None = None,
    branch: str = "main",
) -> dict[str, Any]:
    """Record the repository first (a concurrent create then sees 409), then init it."""
    path = state.repo_path(workspace, slug)
    stamp = iso(now())
    repo = {
        "type": "repository",
        "uuid": "{" + str(uuid.uuid4()) + "}",
        "name": body.get("name", slug),
        "slug": slug,
        "full_name": f"{workspace}/{slug}",
        "is_private": bool(body.get("is_private", True)),
        "scm": "git",
        "description": body.get("description", ""),
        "workspace": {"type": "workspace", "slug": workspace},
        "project": body.get("project"),
        "mainbranch": {"type": "branch", "name": branch},
        "created_on": stamp,
        "updated_on": stamp,
        "links": {
            "self": {"href": f"/2.0/repositories/{workspace}/{slug}"},
            "clone": [{"name": "file", "href": str(path)}],
        },
    }
    state.repositories[(workspace, slug)] = repo
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        await _git("init", "--quiet", "--bare", "-b", branch, str(path))
        _install_fence(state, path, f"{workspace}/{slug}")
        if files:
            with tempfile.TemporaryDirectory() as tmp:
                work = Path(tmp)
                _write_files(work, files)
                await _git("init", "--quiet", "-b", branch, cwd=work)
                await _git("add", "-A", cwd=work)
                await _git("commit", "--quiet", "-m", "seed", cwd=work)
                await _git("push", "--quiet", str(path), f"HEAD:refs/heads/{branch}", cwd=work)
    except BaseException:
        state.repositories.pop((workspace, slug), None)
        shutil.rmtree(path, ignore_errors=True)
        raise
    return repo


async def seed(state: ServiceState, spec: Any) -> None:
    """Add applications and databases (replacing same uuids) and new repositories."""
    if not isinstance(spec, dict):
        raise ValueError("seed is a JSON object")
    for app in spec.get("applications", []):
        app_uuid = str(app.get("uuid") or uuid.uuid4())
        stamp = iso(now())
        json_body = {
            "uuid": app_uuid,
            "name": app_uuid,
            "status": "running:healthy",
            "build_pack": "nixpacks",
            "created_at": stamp,
            "updated_at": stamp,
        }
        json_body.update(
            {k: v for k, v in app.items() if k not in ("envs", "volumes", "file_storages")}
        )
        json_body["uuid"] = app_uuid
        envs = [
            {
                "uuid": str(e.get("uuid") or uuid.uuid4()),
                "key": e["key"],
                "value": e.get("value", ""),
                "is_preview": bool(e.get("is_preview", False)),
                "is_literal": True,
            }
            for e in app.get("envs", [])
        ]
        volumes = [
            {
                "uuid": str(v.get("uuid") or uuid.uuid4()),
                "name": v["name"],
                "mount_path": v.get("mount_path", "/data"),
                "host_path": v.get("host_path"),
                "resource_type": "App\\Models\\Application",
            }
            for v in app.get("volumes", [])
        ]
        files = [
            {
                "uuid": str(f.get("uuid") or uuid.uuid4()),
                "mount_path": f["mount_path"],
                "content": f.get("content", ""),
                "is_directory": False,
            }
            for f in app.get("file_storages", [])
        ]
        state.applications[app_uuid] = {
            "json": json_body,
            "envs": {e["uuid"]: e for e in envs},
            "persistent_storages": {v["uuid"]: v for v in volumes},
            "file_storages": {f["uuid"]: f for f in files},
        }
    for database in spec.get("databases", []):
        db_uuid = str(database.get("uuid") or uuid.uuid4())
        state.databases[db_uuid] = {
            "uuid": db_uuid,
            "name": db_uuid,
            "database_type": "standalone-postgresql",
            "status": "running:healthy",
            **database,
        }
        state.databases[db_uuid]["uuid"] = db_uuid
    for repo in spec.get("repositories", []):
        workspace, slug = str(repo["workspace"]), str(repo["slug"])
        if not (NAME.match(workspace) and NAME.match(slug)):
            raise ValueError(f"bad repository name {workspace}/{slug}")
        if (workspace, slug) in state.repositories:
            raise FileExistsError(f"repository {workspace}/{slug} already exists")
        await create_repository(
            state, workspace, slug, {}, repo.get("files"), repo.get("branch", "main")
        )
