"""Helpers for testing code built on durable: a fake clock, log capture, a worker in a block.

Example::

    async with durable.testing.sqlite_client(tmp_path, registry=reg) as client:
        async with durable.testing.running_worker(client) as worker:
            run = await client.start("my.workflow", 1)
            assert (await client.wait(run.id)).state is durable.RunState.COMPLETED
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import anyio

from ._client import Client
from ._clock import FakeClock as FakeClock
from ._logging import ROOT, event_dict
from ._registry import Registry
from ._worker import Worker

__all__ = ["FakeClock", "capture_logs", "running_worker", "sqlite_client"]


class _Capture(logging.Handler):
    def __init__(self, into: list[dict[str, Any]]) -> None:
        super().__init__(logging.DEBUG)
        self.into = into

    def emit(self, record: logging.LogRecord) -> None:
        entry = event_dict(record)
        entry["log_level"] = entry.pop("level")
        del entry["timestamp"]
        entry["logger"] = record.name
        self.into.append(entry)


@contextmanager
def capture_logs() -> Iterator[list[dict[str, Any]]]:
    """Collect durable's log records, every level, as they were emitted (redacted), instead of
    passing them on: ``{"event": "run_completed", "log_level": "info", "logger":
    "durable.attempt", "workflow_id": ..., ...}`` (plus ``"exception"``, a traceback)."""
    logger = logging.getLogger(ROOT)
    entries: list[dict[str, Any]] = []
    handler = _Capture(entries)
    saved = logger.level, logger.propagate, logger.handlers
    logger.handlers = [handler]
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    try:
        yield entries
    finally:
        logger.handlers = saved[2]
        logger.setLevel(saved[0])
        logger.propagate = saved[1]


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
