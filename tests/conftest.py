"""Shared fixtures: every async test runs on asyncio and on trio."""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import durable

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

pytest_plugins = ["tests.services"] if (ROOT / "tests" / "services.py").exists() else []


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def db_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'durable.db'}"


@pytest.fixture
def registry() -> durable.Registry:
    return durable.Registry()


@pytest.fixture
async def client(db_url: str, registry: durable.Registry) -> AsyncIterator[durable.Client]:
    async with durable.Client.connect(db_url, registry=registry) as c:
        yield c


@pytest.fixture
def clock() -> durable.FakeClock:
    return durable.FakeClock()


@pytest.fixture
async def fclient(tmp_path: Path, clock: durable.FakeClock,
                  registry: durable.Registry) -> AsyncIterator[durable.Client]:
    """A client whose store runs on the fake ``clock`` (leases expire when it is moved)."""
    async with durable.Client.connect(f"sqlite:///{tmp_path / 'clocked.db'}", clock=clock,
                                      registry=registry) as c:
        yield c


def subprocess_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env
