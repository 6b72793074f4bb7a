"""A deferred completion (an idempotent step's, riding on the attempt's next write) is never
lost: when the write it was handed to writes nothing (a stale record write), or when the
attempt ends with a release instead of a journal write (a long wait), it is committed all
the same, so the step is never run again. Real SQLite files, asyncio and trio.
"""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

import durable
import durable.testing
from durable import EntryKind, RunState
from durable._history import History

from .helpers import poll, running_worker

pytestmark = pytest.mark.anyio


async def test_a_deferred_completion_handed_to_a_stale_record_write_is_still_committed(
        tmp_path: Path) -> None:
    """The step's completion is deferred; the next write, a record write, is refused as
    stale (it wrote nothing, the deferred entry with it). The completion goes with the
    write after that: the run's finish journals it."""
    registry = durable.Registry()
    calls: list[int] = []
    async with durable.testing.sqlite_client(tmp_path, registry=registry) as client:
        store = client.store
        assert await store.put_records(None, [("slot", "s1", "mine")])

        @durable.activity("guard.idem", registry=registry, on_doubt="retry")
        async def idem(ctx: durable.ActivityContext) -> int:
            calls.append(1)
            # someone else takes the slot while the step runs: the run's read is stale now
            assert await store.put_records(None, [("slot", "s1", "theirs")])
            return 7

        @durable.workflow("guard.stale", registry=registry)
        async def flow(ctx: durable.WorkflowContext) -> str:
            assert await ctx.get_record("slot", "s1") == "mine"
            assert await idem(ctx) == 7  # its completion is deferred
            try:
                await ctx.set_records({("slot", "s1"): "mine again"})
            except durable.StaleRecordError:
                return "stale"
            return "written"

        async with running_worker(client, registry):
            await client.start("guard.stale", id="r1")
            with anyio.fail_after(20):
                run = await client.wait("r1")
        journal = await client.journal("r1")
    assert run.state is RunState.COMPLETED and run.result == "stale"
    step = History.fold(journal).steps["2"]
    assert step.state is durable.StepState.COMPLETED and step.result == 7
    assert [e.kind for e in journal].count(EntryKind.STEP_COMPLETED) == 1
    assert calls == [1]


async def test_a_deferred_completion_rides_on_the_release_of_a_long_wait(
        tmp_path: Path) -> None:
    """A step completes (deferred) while a wait for a signal, begun beside it, holds the
    attempt; with the step done the wait releases the run, writing no entry of its own.
    The release journals the completion: once the signal comes, the run goes on without
    running the step again."""
    registry = durable.Registry()
    calls: list[int] = []
    entered, go = anyio.Event(), anyio.Event()

    @durable.activity("guard.idem", registry=registry, on_doubt="retry")
    async def idem(ctx: durable.ActivityContext) -> int:
        calls.append(1)
        entered.set()
        await go.wait()
        return 5

    @durable.workflow("guard.wait", registry=registry)
    async def flow(ctx: durable.WorkflowContext) -> list[object]:
        got: list[object] = []

        async def step() -> None:
            got.append(await ctx.step(idem, key="idem"))

        async with anyio.create_task_group() as tg:
            tg.start_soon(step)
            await entered.wait()  # the step is in flight: the wait stays in the attempt
            got.append(await ctx.wait_for("go"))
        return sorted(got, key=str)

    async with durable.testing.sqlite_client(tmp_path, registry=registry) as client:
        async with running_worker(client, registry):
            await client.start("guard.wait", id="w1")

            async def waiting() -> bool:
                return EntryKind.WAIT_STARTED in [e.kind for e in await client.journal("w1")]

            await poll(waiting)
            go.set()  # the step completes, deferred; the wait then releases the run
            await poll(lambda: _released(client, "w1"))
            journal = await client.journal("w1")
            await client.signal("w1", "go", "signal")
            with anyio.fail_after(20):
                run = await client.wait("w1")
    assert EntryKind.RUN_WAITING in [e.kind for e in journal]
    assert EntryKind.STEP_COMPLETED in [e.kind for e in journal]  # with the release
    assert run.state is RunState.COMPLETED and run.result == [5, "signal"]
    assert calls == [1]  # never run again


async def _released(client: durable.Client, run_id: str) -> bool:
    run = await client.get(run_id)
    return run is not None and run.state is not RunState.RUNNING
