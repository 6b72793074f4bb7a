"""The store's fault guarantees seen through a real worker (SQLite file, asyncio and trio).

An interrupted run keeps its key across the restart (a teardown queued behind a reset of
the same slot waits for the reset to finish), and a record written from a stale read is
refused instead of overwriting what another writer put there.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest

import durable
from durable import RunState

from .helpers import kinds, poll, running_worker

pytestmark = pytest.mark.anyio


@pytest.fixture
async def client(tmp_path: Path, registry: durable.Registry) -> AsyncIterator[durable.Client]:
    async with durable.Client.connect(f"sqlite:///{tmp_path / 'k.db'}",
                                      registry=registry) as c:
        yield c


async def test_an_interrupted_reset_finishes_before_a_teardown_queued_behind_it(
        client: durable.Client, registry: durable.Registry) -> None:
    order: list[str] = []
    hang = anyio.Event()
    first_try = True

    @durable.activity("slot.delete_volume", registry=registry)
    async def delete_volume(ctx: durable.ActivityContext, who: str) -> None:
        nonlocal first_try
        order.append(f"{who} starts")
        if who == "reset" and first_try:
            first_try = False
            hang.set()
            await anyio.sleep_forever()  # hangs until the worker shuts down
        order.append(f"{who} done")

    @durable.workflow("slot.job", registry=registry)
    async def job(ctx: durable.WorkflowContext, who: str) -> None:
        await delete_volume(ctx, who)

    async with running_worker(client, registry) as worker:
        await client.start("slot.job", "reset", id="reset", key="slot-1")
        await hang.wait()
        await client.start("slot.job", "teardown", id="teardown", key="slot-1")
        worker.shutdown(grace=0)
    assert kinds(await client.journal("reset"))[-1] == "run_interrupted"
    assert (await client.get("teardown")).state is RunState.QUEUED

    async with running_worker(client, registry):  # the restart
        await poll(lambda: order[-1:] == ["teardown done"])
    assert order == ["reset starts", "reset starts", "reset done", "teardown starts",
                     "teardown done"]
    assert (await client.get("reset")).state is RunState.COMPLETED


async def test_a_record_written_from_a_stale_read_is_refused(
        client: durable.Client, registry: durable.Registry) -> None:
    await client.store.put_records(None, [("slots", "s1", {"state": "active", "db": "db-1"})])
    hang = anyio.Event()
    first_try = True

    @durable.activity("slot.wait", registry=registry)
    async def wait(ctx: durable.ActivityContext) -> None:
        nonlocal first_try
        if first_try:
            first_try = False
            hang.set()
            await anyio.sleep_forever()

    @durable.workflow("slot.reset", registry=registry)
    async def reset(ctx: durable.WorkflowContext) -> None:
        slot = await ctx.get_record("slots", "s1")  # journaled: replayed by attempt 2
        await wait(ctx)
        await ctx.set_records({("slots", "s1"): {**slot, "state": "reset"}})

    async with running_worker(client, registry) as worker:
        await client.start("slot.reset", id="r1")
        await hang.wait()
        worker.shutdown(grace=0)
    # between the attempts another writer retires the slot
    await client.store.put_records(None, [("slots", "s1", {"state": "retired"})])

    async with running_worker(client, registry):
        run = await poll(lambda: _finished(client, "r1"))
    assert run.state is RunState.FAILED
    assert run.error is not None and "slots/s1 changed since this run read it" in run.error
    record = await client.store.get_record("slots", "s1")
    assert record is not None and record.value == {"state": "retired"}


async def _finished(client: durable.Client, run_id: str) -> durable.Run | None:
    run = await client.get(run_id)
    return run if run.state.finished else None


async def test_a_replay_that_rewrites_its_own_record_is_not_stale(
        client: durable.Client, registry: durable.Registry) -> None:
    await client.store.put_records(None, [("slots", "s1", {"n": 1})])
    fail = True

    @durable.activity("slot.check", registry=registry)
    async def check(ctx: durable.ActivityContext) -> None:
        if fail:
            raise durable.NonRetryableError("not yet")

    @durable.workflow("slot.bump", registry=registry)
    async def bump(ctx: durable.WorkflowContext) -> None:
        slot = await ctx.get_record("slots", "s1")                  # step 1
        await ctx.set_records({("slots", "s1"): {"n": slot["n"] + 1}})  # step 2
        await check(ctx)                                             # step 3

    async with running_worker(client, registry):
        await client.start("slot.bump", id="b1")
        assert (await poll(lambda: _finished(client, "b1"))).state is RunState.FAILED
        fail = False
        # step 2 runs again from the same journaled read: the only write since was its own
        await client.replay("b1", from_step=2)
        run = await poll(lambda: _finished(client, "b1"))
    assert run.state is RunState.COMPLETED, run.error
    record = await client.store.get_record("slots", "s1")
    assert record is not None and (record.value, record.version) == ({"n": 2}, 3)
