"""Small helpers for engine tests (no mocks: real stores, real workers, real sockets)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio

import durable
import durable.testing


@asynccontextmanager
async def running_worker(client: durable.Client, registry: durable.Registry,
                         **options: Any) -> AsyncIterator[durable.Worker]:
    """A worker on ``client``'s store running ``registry``'s workflows for the block."""
    async with durable.testing.running_worker(client, registry=registry, **options) as worker:
        yield worker


async def poll(predicate: Callable[[], Any], *, timeout: float = 10.0,
               interval: float = 0.01) -> Any:
    """Evaluate an async or sync predicate until it is truthy; fail after ``timeout``."""
    with anyio.fail_after(timeout):
        while True:
            value = predicate()
            if hasattr(value, "__await__"):
                value = await value
            if value:
                return value
            await anyio.sleep(interval)


def kinds(entries: list[durable.JournalEntry]) -> list[str]:
    return [e.kind.value for e in entries]
