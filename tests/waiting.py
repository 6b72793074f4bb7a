"""Fixtures of the durable waiting tests (tests/test_timers.py, tests/test_signals.py): a
store on SQLite or PostgreSQL, a FakeClock, and a client on both."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

import durable
from durable._clock import FakeClock

from .test_store_contract import clock, store_url

__all__ = ["clock", "store_url"]


@pytest.fixture
async def client(store_url: str, clock: FakeClock,
                 registry: durable.Registry) -> AsyncIterator[durable.Client]:
    async with durable.Client.connect(store_url, clock=clock, registry=registry) as c:
        yield c
