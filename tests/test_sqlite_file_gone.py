"""A SQLite database file deleted, or replaced by another, under a process that has it open.

SQLite goes on with the file it opened, which nobody else sees any more: before, a worker
went on running its attempts' steps with their journal written where no one would read it
(and claimed nothing started since, in the new file). The store now looks, every half
second at most, whether its path still names the file it opened, and refuses every call
once it does not, saying why (``SqliteStore._same_file``).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import anyio
import pytest

import durable
from durable._errors import NotSentError, StoreUnavailableError
from durable._types import EntryKind, Fence, JournalWrite, NewRun
from durable.store import store_from_url

from .helpers import poll, running_worker

pytestmark = pytest.mark.anyio

STEP = JournalWrite(EntryKind.STEP_STARTED, 1, "1", "t.act", 1, {"args": []})


def take_away(path: Path, how: str) -> None:
    """Delete the database's files, or move another database over it (a backup put back)."""
    if how == "deleted":
        for suffix in ("", "-wal", "-shm"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)
    else:
        os.replace(path.with_name("other.db"), path)


@pytest.mark.parametrize("how", ["deleted", "replaced"])
async def test_a_store_whose_file_is_gone_refuses_every_call_and_says_why(
        tmp_path: Path, how: str) -> None:
    path = tmp_path / "d.db"
    async with durable.Client.connect(f"sqlite:///{tmp_path / 'other.db'}"):
        pass  # a database to move over the first
    store = store_from_url(f"sqlite:///{path}")
    await store.open()
    try:
        await store.create_run(NewRun("r1", "wf", [], None, store.clock.now()))
        [run] = await store.claim("w", 30.0, 1)
        fence = Fence(run.id, run.epoch)
        await store.append(fence, [STEP])  # the file is there: written
        take_away(path, how)

        async def refused() -> bool:
            try:
                await store.append(fence, [STEP])
            except NotSentError as exc:
                assert f"the file this process opened was {how}" in str(exc), exc
                return True
            return False

        await poll(refused, timeout=10)
        with pytest.raises(StoreUnavailableError, match=f"opened was {how}"):
            await store.get_run("r1")
        with pytest.raises(NotSentError, match="Stop this process"):
            await store.create_run(NewRun("r2", "wf", [], None, store.clock.now()))
    finally:
        await store.aclose()


async def test_a_worker_whose_file_was_deleted_runs_no_further_step(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Step 1 waits while the file is deleted; the worker's calls find out (within a
    second: the store looks every half second) and say so; once step 1 returns, its
    completion (deferred to step 2's start) is refused, so step 2, which would have acted,
    never runs, and the attempt is abandoned (a journal write refused). Before, nothing was
    said, step 2 ran and the run completed in a file nobody sees."""
    path = tmp_path / "d.db"
    registry = durable.Registry()
    entered, go, acted = anyio.Event(), anyio.Event(), []

    @durable.activity("gone.wait", registry=registry)
    async def wait(ctx: durable.ActivityContext) -> str:
        entered.set()
        await go.wait()
        return "waited"

    @durable.activity("gone.act", registry=registry)
    async def act(ctx: durable.ActivityContext) -> str:
        acted.append(ctx.workflow_id)
        return "acted"

    @durable.workflow("gone.two", registry=registry)
    async def two(ctx: durable.WorkflowContext) -> list[str]:
        return [await wait(ctx), await act(ctx)]

    async with durable.Client.connect(f"sqlite:///{path}", registry=registry) as client:
        await client.start(two, id="two")
        with caplog.at_level(logging.DEBUG, logger="durable"):
            async with running_worker(client, registry, lease=2.0):
                await entered.wait()
                take_away(path, "deleted")
                # the worker's own calls (its sweep, its renewals) find out within a second
                await poll(lambda: any("was deleted since" in r.getMessage()
                                       for r in caplog.records), timeout=10)
                go.set()
                await poll(lambda: any(getattr(r, "event", None) == "attempt_abandoned"
                                       for r in caplog.records), timeout=15)
        assert acted == []
        said = [r.getMessage() for r in caplog.records
                if getattr(r, "event", None) == "attempt_abandoned"]
        assert said and "a journal write was refused" in said[0], said
