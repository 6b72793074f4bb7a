"""Fixtures of the durable waiting tests (tests/test_timers.py, tests/test_signals.py): a
store on SQLite or PostgreSQL (asyncio only), a FakeClock, and a client on both."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import durable
from durable._clock import FakeClock

from .pg import TRIO_SKIP


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path, anyio_backend: str) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'waiting.db'}"
    if anyio_backend == "trio":
        pytest.skip(TRIO_SKIP)
    return str(request.getfixturevalue("pg_url"))


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def client(store_url: str, clock: FakeClock,
                 registry: durable.Registry) -> AsyncIterator[durable.Client]:
    async with durable.Client.connect(store_url, clock=clock, registry=registry) as c:
        yield c
