"""The fake external services as a real subprocess: a handle for tests and the demo.

:func:`running_fake_services` starts a private server process for the duration of a block;
``tests/services.py`` wraps it in pytest fixtures.

The admin helpers are synchronous (plain ``httpx.Client``): the server runs in another
process, so a short blocking call from an async test cannot deadlock it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import anyio
import httpx

SCRIPT = Path(__file__).resolve().parent.parent / "fake_services.py"
DEFAULT_TOKEN = "test-token"
START_TIMEOUT = 15.0
STOP_TIMEOUT = 5.0
POLL_LIMIT = 5.0
POLL_INTERVAL = 0.01

Entry = dict[str, Any]


class FakeServices:
    """Handle on a running fake services process."""

    def __init__(self, url: str, token: str, git_root: Path, process: subprocess.Popen[bytes]):
        self.url = url
        self.token = token
        self.git_root = git_root
        self.process = process
        self._admin = httpx.Client(base_url=url, timeout=10.0)

    @property
    def pid(self) -> int:
        return self.process.pid

    def worker_env(self, tmp: Path, *, git_timeout: float = 5.0) -> dict[str, str]:
        """The environment of a worker running the operations (``--import workflows``)
        against these services: every API's URL and token, the audio and git folders under
        ``tmp``, and the checkout on PYTHONPATH."""
        root = SCRIPT.parent.parent
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), env.get("PYTHONPATH")]))
        for name in ("PAAS", "GITHOST", "TTS", "NOTIFY"):
            env[f"DURABLE_{name}_URL"] = self.url
            env[f"DURABLE_{name}_TOKEN"] = self.token
        env.update({"DURABLE_AUDIO_DIR": str(tmp / "audio"),
                    "DURABLE_GIT_WORKDIR": str(tmp / "git-work"),
                    "DURABLE_GIT_TIMEOUT": f"{git_timeout:g}",
                    "DURABLE_NOTIFY_HOOK": "slots"})
        return env

    def close(self) -> None:
        self._admin.close()

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        response = self._admin.request(method, path, json=body)
        if response.is_error:
            raise AssertionError(f"admin {method} {path}: {response.status_code} {response.text}")
        return response.json()

    # admin ------------------------------------------------------------------
    def reset(self) -> None:
        """Forget every resource, fault, fence, ledger entry and notification."""
        self._call("POST", "/_admin/reset")

    def seed(
        self,
        *,
        applications: Sequence[Mapping[str, Any]] = (),
        databases: Sequence[Mapping[str, Any]] = (),
        repositories: Sequence[Mapping[str, Any]] = (),
    ) -> dict[str, Any]:
        """Create resources; answers the new ``state()``. See the server's docstring."""
        spec = {
            "applications": list(applications),
            "databases": list(databases),
            "repositories": list(repositories),
        }
        result: dict[str, Any] = self._call("POST", "/_admin/seed", spec)
        return result

    def add_fault(
        self,
        path: str | None = None,
        *,
        method: str = "*",
        path_regex: str | None = None,
        status: int | None = None,
        latency: float | None = None,
        hang: bool = False,
        drop: bool = False,
        times: int | None = None,
        retry_after: float | str | None = None,
        phase: str = "before",
        body: Any = None,
    ) -> str:
        """Add a fault rule (``path`` is a glob); answers its id."""
        rule: dict[str, Any] = {"method": method, "phase": phase, "hang": hang, "drop": drop}
        optional = {
            "path": path,
            "path_regex": path_regex,
            "status": status,
            "latency": latency,
            "times": times,
            "retry_after": retry_after,
            "body": body,
        }
        rule.update({k: v for k, v in optional.items() if v is not None})
        fault_id: str = self._call("POST", "/_admin/faults", rule)["id"]
        return fault_id

    def release(self) -> None:
        """Wake the requests held by ``hang`` faults; their connections are dropped."""
        self._call("POST", "/_admin/release")

    def faults(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self._call("GET", "/_admin/faults")["faults"]
        return result

    def clear_faults(self) -> None:
        self._call("DELETE", "/_admin/faults")

    def ledger(
        self, *, method: str | None = None, path: str | None = None, resource: str | None = None
    ) -> list[Entry]:
        """Ledger entries, oldest first, optionally filtered by exact method/path/resource."""
        entries: list[Entry] = self._call("GET", "/_admin/ledger")["entries"]
        wanted = {"method": method, "path": path, "resource": resource}
        return [e for e in entries if all(v is None or e[k] == v for k, v in wanted.items())]

    def state(self) -> dict[str, Any]:
        result: dict[str, Any] = self._call("GET", "/_admin/state")
        return result

    def notifications(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self._call("GET", "/_admin/notifications")["notifications"]
        return result

    def repo_path(self, workspace: str, slug: str) -> Path:
        return self.git_root / workspace / f"{slug}.git"

    # waiting ----------------------------------------------------------------
    async def wait_for_entry(self, predicate: Callable[[Entry], bool]) -> Entry:
        """Poll the ledger until an entry satisfies ``predicate``, for at most POLL_LIMIT s.

        Wrap the call in ``anyio.fail_after`` for a tighter bound.
        """
        with anyio.fail_after(POLL_LIMIT):
            while True:
                for entry in self.ledger():
                    if predicate(entry):
                        return entry
                await anyio.sleep(POLL_INTERVAL)

    async def wait_until_ended(self, seq: int | None = None, **filters: Any) -> Entry:
        """The first entry matching ``seq``/filters once its ``ended_at`` is set."""

        def ended(entry: Entry) -> bool:
            if seq is not None and entry["seq"] != seq:
                return False
            if any(entry[k] != v for k, v in filters.items()):
                return False
            return entry["ended_at"] is not None

        return await self.wait_for_entry(ended)


def _stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM the server's process group, then SIGKILL whatever is left."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=STOP_TIMEOUT)
    except subprocess.TimeoutExpired:
        pass
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=STOP_TIMEOUT)


def start_process(
    git_root: Path, ready_file: Path, *, token: str = DEFAULT_TOKEN
) -> tuple[subprocess.Popen[bytes], str]:
    """Start the server in a new session; answers the process and its URL once it is ready."""
    ready_file.unlink(missing_ok=True)
    env = {**os.environ, "FAKE_SERVICES_TOKEN": token}  # keeps the token out of argv
    process = subprocess.Popen(
        [
            sys.executable,
            str(SCRIPT),
            "--port",
            "0",
            "--git-root",
            str(git_root),
            "--ready-file",
            str(ready_file),
        ],
        env=env,
        start_new_session=True,
        stdin=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + START_TIMEOUT
    try:
        while not ready_file.exists():
            if time.monotonic() > deadline:
                raise TimeoutError(f"fake services not ready after {START_TIMEOUT}s")
            try:
                code = process.wait(timeout=0.02)  # the poll interval, and a death check
            except subprocess.TimeoutExpired:
                continue
            raise RuntimeError(f"fake services exited with {code} before becoming ready")
        url: str = json.loads(ready_file.read_text())["url"]
    except BaseException:
        _stop(process)
        raise
    return process, url


@contextlib.contextmanager
def running_fake_services(
    git_root: Path | None = None, *, token: str = DEFAULT_TOKEN
) -> Iterator[FakeServices]:
    """Run a private fake services process for the duration of the block."""
    with tempfile.TemporaryDirectory(prefix="fake-services-") as tmp:
        root = git_root if git_root is not None else Path(tmp) / "git"
        process, url = start_process(root, Path(tmp) / "ready.json", token=token)
        services = FakeServices(url, token, root, process)
        try:
            yield services
        finally:
            services.close()
            _stop(process)
