"""A resumed run whose journaled read is stale runs nothing (issue 8, found by the torture run).

A run reads a record (journaled), fails, and while it is failed someone else changes that
record. A replay would resume from the journal and act on the old value (the torture run saw
a replayed reset delete env vars and volumes of the app it had read, before its final record
write was refused). So a resumed attempt first checks every record the run read: a record
that changed since makes it fail at once, naming the record, before any step runs again.
"""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

import durable
from durable import RunState

from .helpers import running_worker

pytestmark = pytest.mark.anyio


def declare(registry: durable.Registry, calls: list[str]) -> None:
    @durable.activity("stale.delete", registry=registry, on_doubt="fail")
    async def delete(ctx: durable.ActivityContext, app: str) -> str:
        calls.append(app)
        if len(calls) == 1:
            raise durable.NonRetryableError(f"{app}: the service said no")
        return f"{app} deleted"

    @durable.workflow("stale.flow", registry=registry)
    async def flow(ctx: durable.WorkflowContext) -> str:
        slot = await ctx.get_record("slot", "s1")
        assert isinstance(slot, dict)
        return str(await delete(ctx, slot["app"]))


async def finished(client: durable.Client, run_id: str) -> durable.Run:
    with anyio.fail_after(20):  # a bounded poll
        while not (run := await client.get(run_id)).state.finished:
            await anyio.sleep(0.02)
    return run


@pytest.mark.parametrize("changed", [True, False])
async def test_a_replay_after_the_record_changed_runs_nothing(tmp_path: Path,
                                                              changed: bool) -> None:
    registry = durable.Registry()
    calls: list[str] = []
    declare(registry, calls)
    async with durable.testing.sqlite_client(tmp_path, registry=registry) as client:
        store = client.store
        assert await store.put_records(None, [("slot", "s1", {"app": "app-1"})])
        async with running_worker(client, registry):
            await client.start("stale.flow", id="r1", key="s1")
            assert (await finished(client, "r1")).state is RunState.FAILED
            if changed:  # meanwhile the slot went to someone else's app
                assert await store.put_records(None, [("slot", "s1", {"app": "app-2"})])
            await client.replay("r1")
            run = await finished(client, "r1")
    if changed:
        assert run.state is RunState.FAILED
        assert run.error is not None and "slot/s1 changed since this run read it" in run.error
        assert calls == ["app-1"]  # the replay sent nothing for the old app
    else:
        assert run.state is RunState.COMPLETED and run.result == "app-1 deleted"
        assert calls == ["app-1", "app-1"]


async def test_a_run_s_own_record_write_does_not_make_its_replay_stale(tmp_path: Path) -> None:
    """A resumed attempt does not write again the records a journaled step wrote, and the
    version that write produced is the one the resume compares and the next write is
    conditioned on: the run's own write is not a change by someone else."""
    registry = durable.Registry()
    calls: list[str] = []

    @durable.activity("stale.own_delete", registry=registry, on_doubt="fail")
    async def delete(ctx: durable.ActivityContext, app: str) -> str:
        calls.append(app)
        if len(calls) == 1:
            raise durable.NonRetryableError(f"{app}: the service said no")
        return f"{app} deleted"

    @durable.workflow("stale.own", registry=registry)
    async def own(ctx: durable.WorkflowContext) -> str:
        slot = await ctx.get_record("slot", "s1")
        assert isinstance(slot, dict)
        await ctx.set_records({("slot", "s1"): {**slot, "state": "resetting"}})
        deleted = await delete(ctx, slot["app"])
        await ctx.set_records({("slot", "s1"): {**slot, "state": "free"}})
        return str(deleted)

    async with durable.testing.sqlite_client(tmp_path, registry=registry) as client:
        store = client.store
        assert await store.put_records(None, [("slot", "s1", {"app": "app-1"})])
        async with running_worker(client, registry):
            await client.start("stale.own", id="r1", key="s1")
            assert (await finished(client, "r1")).state is RunState.FAILED
            await client.replay("r1")
            run = await finished(client, "r1")
        record = await store.get_record("slot", "s1")
    assert run.state is RunState.COMPLETED, run.error
    assert run.result == "app-1 deleted" and calls == ["app-1", "app-1"]
    assert record is not None and record.version == 3
    assert record.value == {"app": "app-1", "state": "free"}
