"""An attempt that lost its lease can do nothing more, even from code a cancel cannot reach.

Each test takes a run over by hand (the store's clock moved past the lease, a recovery, a
claim by another worker) while the first attempt still holds it locally: its local deadline
is far off, so only the loss it was told of, or the database, can stop it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

import durable
from durable import RunState
from durable._attempt import Attempt
from durable._clock import FakeClock
from durable._types import EntryKind

from .helpers import poll, running_worker
from .httpserver import Rule, loopback_server
from .test_cancellation import careful_flow

pytestmark = pytest.mark.anyio


async def _claimed(client: durable.Client, registry: durable.Registry, workflow: str,
                   run_id: str, *, stored: float, local: float) -> tuple[durable.Run, Attempt]:
    """Start and claim ``run_id`` as ``worker-a`` with a lease of ``stored`` seconds in the
    database and ``local`` seconds on this process's clock, with no worker renewing it."""
    await client.start(workflow, id=run_id)
    [run] = await client.store.claim("worker-a", stored, 1)
    return run, Attempt(client.store, run, registry, lease=local,
                        lease_sent_at=anyio.current_time())


async def _took_over(client: durable.Client, clock: FakeClock, run: durable.Run) -> durable.Run:
    """The database's lease of ``run`` runs out; another worker recovers and claims it."""
    clock.advance(31)
    assert await client.store.recover_stale(run.id, run.epoch)
    [newer] = await client.store.claim("worker-b", 30, 1)
    assert newer.epoch > run.epoch
    return newer


async def _journaled_step(store: Any, run_id: str, key: str) -> bool:
    return any(e.kind is EntryKind.STEP_STARTED and e.step_key == key
               for e in await store.journal(run_id))


async def test_a_cleanup_is_cut_off_when_the_lease_is_lost_and_one_begun_after_runs_nothing(
        tmp_path: Path, registry: durable.Registry) -> None:
    """``ctx.cleanup()`` is shielded from a stop, never from a loss: the request it has in
    flight is aborted the moment a refused write tells the attempt it lost the run, and a
    cleanup entered afterwards (from code that outlives the cancel) is cancelled at once.
    Both end well before the local deadline (10 s lease), the cleanups' timeouts longer
    still: only the loss can cut them."""
    clock = FakeClock()
    url = f"sqlite:///{tmp_path / 'c.db'}"
    done_a, after = anyio.Event(), anyio.Event()
    outcome: list[str] = []
    ended: list[float] = []
    async with (
        durable.Client.connect(url, registry=registry, clock=clock) as client,
        loopback_server() as server,
    ):
        server.on("/unlock", Rule(hang=True))

        @durable.activity(registry=registry, on_doubt="fail")  # its end is written at once
        async def quick(ctx: durable.ActivityContext) -> str:
            await done_a.wait()
            return "a"

        @durable.activity(registry=registry)
        async def unlocking(ctx: durable.ActivityContext) -> None:
            with anyio.CancelScope(shield=True):  # like code in a thread: not interruptible
                async with ctx.cleanup(timeout=60):
                    await ctx.http.post(f"{server.url}/unlock")
                    outcome.append("the request returned")
                ended.append(anyio.current_time())
                with anyio.move_on_after(10):
                    await after.wait()
                async with ctx.cleanup(timeout=60):
                    await anyio.sleep(60)
                    outcome.append("the second cleanup ran")
                ended.append(anyio.current_time())

        @durable.workflow("two", registry=registry)
        async def wf(ctx: durable.WorkflowContext) -> None:
            async with anyio.create_task_group() as tg:
                tg.start_soon(lambda: ctx.step(unlocking, key="b"))
                await server.wait_for(lambda: len(server.seen("/unlock")) == 1)
                await ctx.step(quick, key="a")

        run, attempt = await _claimed(client, registry, "two", "c1", stored=30, local=10)
        async with anyio.create_task_group() as tg:
            tg.start_soon(attempt.execute)
            try:
                await poll(lambda: _journaled_step(client.store, "c1", "a"))
                newer = await _took_over(client, clock, run)
            finally:
                done_a.set()  # step a's completion is refused: the attempt learns it lost
            try:
                await poll(lambda: attempt.lost)
                [unlock] = server.seen("/unlock")
                await server.wait_for(lambda: unlock.disconnected_at is not None)
            finally:
                after.set()
        assert outcome == []
        assert len(ended) == 2 and max(ended) < attempt.lease.deadline, (
            ended, attempt.lease.deadline)
        final = await client.get("c1")
        assert final.state is RunState.RUNNING and final.epoch == newer.epoch


@pytest.mark.parametrize("how", ["taken over", "local deadline passed"])
async def test_assert_still_mine_refuses_a_run_taken_over_or_past_its_local_deadline(
        tmp_path: Path, registry: durable.Registry, how: str) -> None:
    """``assert_still_mine`` refuses when the run is another attempt's in the database,
    though its lease there holds (another worker's) and the local one too; and when the
    local deadline passed (renewals unanswered), though the database's lease still holds:
    each check refuses on its own."""
    clock = FakeClock()
    url = f"sqlite:///{tmp_path / 'm.db'}"
    inside, go, outcome = careful_flow(registry)
    async with durable.Client.connect(url, registry=registry, clock=clock) as client:
        local = 30.0 if how == "taken over" else 0.3
        run, attempt = await _claimed(client, registry, "careful", "m1", stored=30,
                                      local=local)
        async with anyio.create_task_group() as tg:
            tg.start_soon(attempt.execute)
            await inside.wait()
            if how == "taken over":
                newer = await _took_over(client, clock, run)
                assert attempt.holds_lease()
            else:  # nothing renews: the local deadline passes, the database's clock stood
                await poll(lambda: not attempt.holds_lease(), timeout=5)
            go.set()
        assert outcome == ["refused"]
        current = await client.store.get_run("m1")
        assert current is not None and current.state is RunState.RUNNING
        if how == "taken over":
            assert current.epoch == newer.epoch
        else:
            assert current.epoch == run.epoch and current.lease_expires_at is not None
            assert current.lease_expires_at > clock.now()  # the database's lease held


async def test_a_renewal_that_finds_the_lease_gone_aborts_the_call_in_flight_at_once(
        fclient: durable.Client, clock: FakeClock, registry: durable.Registry) -> None:
    """The worker's renewal finds the run's lease run out in the database (the store's
    clock moved past it while the worker stalled): the attempt lost the run, and its request
    in flight is aborted then, not at its local deadline 27 s later."""
    calls: list[int] = []
    async with loopback_server() as server:
        server.on("/push", Rule(hang=True))

        @durable.activity(registry=registry)
        async def push(ctx: durable.ActivityContext) -> None:
            calls.append(ctx.fencing_token or 0)
            if len(calls) == 1:
                await ctx.http.post(f"{server.url}/push")

        @durable.workflow("pushing", registry=registry)
        async def pushing(ctx: durable.WorkflowContext) -> None:
            await push(ctx)

        async with running_worker(fclient, registry, lease=30.0,
                                  heartbeat_interval=0.05) as worker:
            await fclient.start("pushing", id="p1")
            await server.wait_for(lambda: len(server.seen("/push")) == 1)
            [attempt] = worker.active.values()
            [seen] = server.seen("/push")
            clock.advance(31)  # the database's lease ran out; locally 27 s are left
            with anyio.fail_after(10):
                await server.wait_for(lambda: seen.disconnected_at is not None)
            assert attempt.lost
            assert anyio.current_time() < attempt.lease.deadline
            done = await fclient.wait("p1", timeout=10)  # recovered, and run again
    assert done.state is RunState.COMPLETED
    assert calls[0] < calls[-1]
