"""Helpers for testing code built on durable: a fake clock, log capture, a worker in a block.

Example::

    async with durable.testing.sqlite_client(tmp_path, registry=reg) as client:
        async with durable.testing.running_worker(client) as worker:
            run = await client.start("my.workflow", 1)
            assert (await client.wait(run.id)).state is durable.RunState.COMPLETED
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
from structlog.testing import capture_logs as capture_logs

from ._client import Client
from ._clock import FakeClock as FakeClock
from ._registry import Registry
from ._worker import Worker

__all__ = ["FakeClock", "capture_logs", "running_worker", "sqlite_client"]


@asynccontextmanager
async def sqlite_client(folder: str | Path, *, registry: Registry | None = None,
                        clock: Any = None, name: str = "durable.db") -> AsyncIterator[Client]:
    """A client on a new SQLite file in ``folder`` (a test's temporary directory)."""
    async with Client.connect(f"sqlite:///{Path(folder) / name}", registry=registry,
                              clock=clock) as client:
        yield client


@asynccontextmanager
async def running_worker(client: Client, **options: Any) -> AsyncIterator[Worker]:
    """A worker on the client's store and registry, running for the block, polling fast."""
    options.setdefault("poll_interval", 0.01)
    options.setdefault("registry", client.registry)
    worker = Worker(client.store, **options)
    async with anyio.create_task_group() as tg:
        await tg.start(worker.run)
        try:
            yield worker
        finally:
            worker.shutdown(grace=0)
