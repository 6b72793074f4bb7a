"""Shared by the operations tests (``test_ops_*.py``): the ``ops`` fixture and seeding.

A test module uses the fixture with ``from .ops import ops_fixture  # noqa: F401``.

``ops`` gives a client on a fresh SQLite file with the default registry (where importing
``workflows`` registered the operations), the fake services reset for the test, and the
service configuration in the environment (``DURABLE_*``, read by the activities at call
time; :meth:`Ops.env` hands the same to a worker subprocess).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import pytest

import durable
import workflows
from workflows.records import Slot, read_slot, seed_slot

from .conftest import subprocess_env
from .helpers import python_process, running_worker
from .services import FakeServices

TEMPLATE = "templates/starter"
TEMPLATE_FILES = {"README.md": "# starter\n", "app.py": "print('hello')\n"}


def service_env(services: FakeServices, tmp_path: Path) -> dict[str, str]:
    env = {f"DURABLE_{name}_URL": services.url for name in ("PAAS", "GITHOST", "TTS", "NOTIFY")}
    env.update({f"DURABLE_{name}_TOKEN": services.token
                for name in ("PAAS", "GITHOST", "TTS", "NOTIFY")})
    env["DURABLE_AUDIO_DIR"] = str(tmp_path / "audio")
    env["DURABLE_GIT_WORKDIR"] = str(tmp_path / "git-work")
    env["DURABLE_NOTIFY_HOOK"] = "slots"
    return env


class Ops:
    def __init__(self, client: durable.Client, services: FakeServices, tmp_path: Path,
                 db_url: str) -> None:
        self.client = client
        self.services = services
        self.tmp_path = tmp_path
        self.db_url = db_url
        self._template_seeded = False

    def env(self) -> dict[str, str]:
        return {**subprocess_env(), **service_env(self.services, self.tmp_path)}

    async def slot(self, name: str, **fields: Any) -> Slot:
        """Seed a slot's PaaS app and database, its repository (and the template), and its
        record; answers the record."""
        repositories = [{"workspace": "slots", "slug": name,
                         "files": {"README.md": f"work done in {name}\n"}}]
        if not self._template_seeded:
            repositories.append({"workspace": "templates", "slug": "starter",
                                 "files": TEMPLATE_FILES})
            self._template_seeded = True
        self.services.seed(
            applications=[{
                "uuid": f"app-{name}", "name": name,
                "envs": [{"key": "API_KEY", "value": "s3cret-value"},
                         {"key": "DEBUG", "value": "1"}],
                "volumes": [{"uuid": f"vol-{name}", "name": "data", "mount_path": "/data"}],
                "file_storages": [{"uuid": f"file-{name}", "mount_path": "/etc/app.conf"}],
            }],
            databases=[{"uuid": f"db-{name}"}],
            repositories=repositories,
        )
        slot = Slot(name, app=f"app-{name}", project=f"proj-{name}", database=f"db-{name}",
                    repository=f"slots/{name}", template=TEMPLATE, **fields)
        await seed_slot(self.client, slot)
        return slot

    async def record(self, name: str) -> Slot:
        slot = await read_slot(self.client, name)
        assert slot is not None
        return slot

    async def run(self, workflow: str, *args: Any, key: str, id: str,
                  **worker_options: Any) -> durable.Run:
        """Start a run, work it with an in-process worker until it is finished."""
        await self.client.start(workflow, *args, id=id, key=key)
        async with running_worker(self.client, durable.default_registry, **worker_options):
            return await self.client.wait(id, timeout=30)

    async def journal_text(self, run_id: str) -> str:
        return json.dumps([[e.kind.value, e.name, dict(e.data)]
                           for e in await self.client.journal(run_id)])

    def requests(self, method: str | None = None, prefix: str = "") -> list[dict[str, Any]]:
        return [e for e in self.services.ledger(method=method) if e["path"].startswith(prefix)]


@asynccontextmanager
async def open_ops(fake_services: FakeServices, tmp_path: Path,
                   monkeypatch: pytest.MonkeyPatch, url: str | None = None
                   ) -> AsyncIterator[Ops]:
    """The operations' environment on the store at ``url`` (default: a fresh SQLite file)."""
    assert workflows.slots.reset.name == "slot.reset"  # registered by the import
    for name, value in service_env(fake_services, tmp_path).items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("DURABLE_GIT_TIMEOUT", raising=False)
    url = url or f"sqlite:///{tmp_path / 'ops.db'}"
    async with durable.Client.connect(url) as client:
        yield Ops(client, fake_services, tmp_path, url)


@pytest.fixture(name="ops")
async def ops_fixture(fake_services: FakeServices, tmp_path: Path,
              monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Ops]:
    async with open_ops(fake_services, tmp_path, monkeypatch) as ops:
        yield ops


def git_head(bare_repo: Path, branch: str = "main") -> str:
    return subprocess.run(["git", "rev-parse", f"refs/heads/{branch}"], cwd=bare_repo,
                          check=True, capture_output=True, text=True).stdout.strip()


def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie waiting to be reaped counts as dead)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


@contextmanager
def worker_process(ops: Ops, *extra: str) -> Iterator[subprocess.Popen[bytes]]:
    """``python -m durable.worker --import workflows`` in its own process group."""
    with python_process(
        ["-m", "durable.worker", "--db", ops.db_url, "--import", "workflows",
         "--poll", "0.05", "--log-level", "warning", *extra],
        ops.tmp_path / "worker.log", env=ops.env(),
    ) as proc:
        yield proc


__all__ = ["TEMPLATE", "Ops", "alive", "git_head", "open_ops", "ops_fixture", "service_env",
           "worker_process"]
