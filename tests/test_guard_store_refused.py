"""A refused write stops the attempt: once a fenced write of the attempt is refused (the run
was taken over: another attempt holds it now), no more of its workflow code runs, and what
it wrote is not there. Real SQLite files, asyncio and trio.
"""

from __future__ import annotations

import time
from pathlib import Path

import anyio
import pytest

import durable
import durable.testing
from durable import RunState
from durable._clock import FakeClock

from .helpers import poll, running_worker

pytestmark = pytest.mark.anyio


async def test_an_attempt_whose_record_write_was_refused_runs_no_further_workflow_code(
        tmp_path: Path) -> None:
    """The run is taken over while a step runs (its lease lapsed in the store, another
    worker claimed it); the step's completion is deferred, so the attempt's next write is
    the record write, which the fence refuses. The workflow does not go on past it: the
    code after it never runs, and the record is not written."""
    clock = FakeClock()
    registry = durable.Registry()
    after: list[str] = []
    async with durable.testing.sqlite_client(tmp_path, registry=registry,
                                             clock=clock) as client:
        store = client.store

        @durable.activity("guard.takeover", registry=registry, on_doubt="retry")
        async def takeover(ctx: durable.ActivityContext) -> None:
            clock.advance(3600.0)  # the attempt's lease lapsed in the store
            await store.recover_stale()
            assert await store.claim("another-worker", 3600.0, 1, run_id="r1")

        @durable.workflow("guard.records", registry=registry)
        async def flow(ctx: durable.WorkflowContext) -> str:
            await takeover(ctx)
            await ctx.set_records({("slot", "s1"): "mine"})
            after.append("ran on")
            return "done"

        with durable.testing.capture_logs() as logs:
            # one slot, taken by the attempt: the worker claims nothing else meanwhile
            async with running_worker(client, registry, concurrency=1):
                await client.start("guard.records", id="r1")
                await poll(lambda: any(e["event"] in ("attempt_abandoned",
                                                      "attempt_superseded") for e in logs))
        run = await client.get("r1")
        record = await store.get_record("slot", "s1")
    assert after == []
    assert record is None
    assert run is not None and run.state is RunState.RUNNING and run.epoch == 2
    assert "attempt_abandoned" in [e["event"] for e in logs]


async def test_an_attempt_whose_local_lease_ran_out_in_a_suspend_writes_nothing_more(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The machine is suspended for an hour while a step runs (simulated as in
    tests/test_clock.py: only ``durable._clock.boottime`` moves on). The attempt's local
    lease, counted on that clock, has run out, though the event loop's clock and the
    store's (a fake one here, so the stored lease still holds) say otherwise: the step's
    completion is not sent, and the attempt stops."""
    registry = durable.Registry()
    entered, resumed = anyio.Event(), anyio.Event()
    async with durable.testing.sqlite_client(tmp_path, registry=registry,
                                             clock=FakeClock()) as client:

        @durable.activity("guard.strict", registry=registry, on_doubt="fail")
        async def strict(ctx: durable.ActivityContext) -> str:
            entered.set()
            await resumed.wait()
            return "done"

        @durable.workflow("guard.suspended", registry=registry)
        async def flow(ctx: durable.WorkflowContext) -> str:
            return str(await strict(ctx))

        with durable.testing.capture_logs() as logs:
            async with running_worker(client, registry, lease=30.0):
                await client.start("guard.suspended", id="s1")
                await entered.wait()
                real = time.clock_gettime
                monkeypatch.setattr("durable._clock.boottime",
                                    lambda: real(time.CLOCK_BOOTTIME) + 3600.0,
                                    raising=False)
                resumed.set()
                await poll(lambda: any(e["event"] == "attempt_abandoned" for e in logs))
        journal = await client.journal("s1")
    assert "step_completed" not in [e.kind.value for e in journal]
