"""The crash-wedge write-up's five tests, and exactly-once claims.

A lock needs a lifetime: a run whose worker died (SIGKILL, OOM, deploy) must be recovered;
liveness is judged by the last heartbeat, never by the start time; recovery is itself a
compare-and-set that backs off when it loses the race.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest

import durable
from durable import EntryKind, FakeClock, RunState
from durable._report import render_timeline
from durable._types import Fence, JournalWrite

from .helpers import died_in_step_one, kinds, running_worker

pytestmark = pytest.mark.anyio
LEASE = 60.0


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def fclient(tmp_path: Path, clock: FakeClock,
                  registry: durable.Registry) -> AsyncIterator[durable.Client]:
    @durable.workflow("job", registry=registry)
    async def job(ctx: durable.WorkflowContext) -> None:
        return None

    async with durable.Client.connect(f"sqlite:///{tmp_path / 'r.db'}", clock=clock,
                                      registry=registry) as c:
        yield c


async def _claimed(client: durable.Client, run_id: str = "job-1") -> durable.Run:
    await client.start("job", id=run_id)
    [run] = await client.store.claim("worker-a", LEASE, 1, run_id=run_id)
    return run


async def test_a_stuck_run_is_recovered(fclient: durable.Client, clock: FakeClock) -> None:
    run = await _claimed(fclient)
    clock.advance(LEASE + 1)  # the worker died: no heartbeat since
    seen = await fclient.get(run.id)
    assert seen.state is RunState.QUEUED and seen.worker is None
    journal = await fclient.journal(run.id)
    assert kinds(journal).count("run_recovered") == 1
    [again] = await fclient.store.claim("worker-b", LEASE, 1)
    assert again.id == run.id and again.epoch > run.epoch and again.attempt == 2


async def test_a_run_whose_last_step_is_stuck_is_recovered(
        fclient: durable.Client, clock: FakeClock) -> None:
    run = await _claimed(fclient)
    fence = Fence(run.id, run.epoch)
    assert await fclient.store.append(fence, [
        JournalWrite(EntryKind.STEP_STARTED, 1, "1", "delete", 1),
        JournalWrite(EntryKind.STEP_COMPLETED, 1, "1", "delete", 1, {"result": None}),
        JournalWrite(EntryKind.STEP_STARTED, 2, "2", "push", 1),
    ])
    clock.advance(LEASE + 1)
    assert (await fclient.list(state="running")) == []
    assert (await fclient.get(run.id)).state is RunState.QUEUED
    report = await fclient.report(run.id)
    assert [s.number for s in report.completed] == [1]
    assert [s.number for s in report.in_doubt] == [2]


async def test_a_just_started_run_is_left_alone(fclient: durable.Client,
                                                clock: FakeClock) -> None:
    run = await _claimed(fclient)
    clock.advance(5)
    assert (await fclient.get(run.id)).state is RunState.RUNNING
    assert await fclient.store.recover_stale() == []
    assert "run_recovered" not in kinds(await fclient.journal(run.id))


async def test_an_old_run_that_is_still_progressing_is_left_alone(
        fclient: durable.Client, clock: FakeClock) -> None:
    run = await _claimed(fclient)
    for _ in range(50):  # 50 minutes of honest work, a heartbeat every minute
        clock.advance(LEASE - 1)
        renewed = await fclient.store.renew("worker-a", [Fence(run.id, run.epoch)], LEASE)
        assert [r.run_id for r in renewed] == [run.id]
    assert clock.now() - run.created_at > 40 * LEASE
    seen = await fclient.get(run.id)
    assert seen.state is RunState.RUNNING and seen.epoch == run.epoch
    assert await fclient.store.recover_stale() == []


async def test_a_recovery_that_loses_the_race_backs_off(
        fclient: durable.Client, clock: FakeClock) -> None:
    run = await _claimed(fclient)
    clock.advance(LEASE + 1)
    results: list[list[Fence]] = []

    async def recover() -> None:
        results.append(await fclient.store.recover_stale(run.id, run.epoch))

    async with anyio.create_task_group() as tg:
        for _ in range(5):
            tg.start_soon(recover)
        for _ in range(3):
            tg.start_soon(fclient.get, run.id)  # readers recover on the read path too
    assert sorted(len(r) for r in results) == [0, 0, 0, 0, 1]
    assert kinds(await fclient.journal(run.id)).count("run_recovered") == 1


async def test_the_dead_worker_finishing_late_is_refused(
        fclient: durable.Client, clock: FakeClock) -> None:
    run = await _claimed(fclient)
    clock.advance(LEASE + 1)
    await fclient.get(run.id)  # recovered
    fence = Fence(run.id, run.epoch)
    assert not await fclient.store.finish(fence, RunState.COMPLETED)
    assert not await fclient.store.append(fence, [JournalWrite(EntryKind.STEP_STARTED, 1, "1",
                                                               "x", 1)])
    assert (await fclient.get(run.id)).state is RunState.QUEUED


async def test_recovery_after_a_new_claim_does_nothing(
        fclient: durable.Client, clock: FakeClock) -> None:
    run = await _claimed(fclient)
    clock.advance(LEASE + 1)
    assert await fclient.store.recover_stale(run.id, run.epoch)
    [again] = await fclient.store.claim("worker-b", LEASE, 1)
    # a slow reader still holding the old epoch must not recover the new attempt
    assert await fclient.store.recover_stale(run.id, run.epoch) == []
    assert (await fclient.get(run.id)).epoch == again.epoch


async def test_five_concurrent_claims_one_wins(fclient: durable.Client) -> None:
    await fclient.start("job", id="only")
    winners: list[list[durable.Run]] = []

    async def claim(name: str) -> None:
        winners.append(await fclient.store.claim(name, LEASE, 1, run_id="only"))

    async with anyio.create_task_group() as tg:
        for i in range(5):
            tg.start_soon(claim, f"w{i}")
    assert sorted(len(w) for w in winners) == [0, 0, 0, 0, 1]


async def test_five_concurrent_claims_across_connections(tmp_path: Path,
                                                         registry: durable.Registry) -> None:
    """Five separate connections (as five worker processes would have) race for one run."""

    @durable.workflow("job", registry=registry)
    async def job(ctx: durable.WorkflowContext) -> None:
        return None

    url = f"sqlite:///{tmp_path / 'c.db'}"
    async with durable.Client.connect(url, registry=registry) as c:
        await c.start("job", id="only")
    stores = [durable.store_from_url(url) for _ in range(5)]
    for s in stores:
        await s.open()
    won: list[int] = []

    async def claim(store: durable.Store) -> None:
        won.append(len(await store.claim("w", LEASE, 1)))

    try:
        async with anyio.create_task_group() as tg:
            for s in stores:
                tg.start_soon(claim, s)
    finally:
        for s in stores:
            await s.aclose()
    assert sorted(won) == [0, 0, 0, 0, 1]


async def test_finished_runs_are_never_claimed(fclient: durable.Client) -> None:
    for state in (RunState.COMPLETED, RunState.FAILED):
        run = await _claimed(fclient, f"done-{state.value}")
        assert await fclient.store.finish(Fence(run.id, run.epoch), state, error="x")
    cancelled = await fclient.start("job", id="cancelled")
    await fclient.cancel(cancelled.id)
    assert await fclient.store.claim("w", LEASE, 10) == []
    for run_id in ("done-completed", "done-failed", "cancelled"):
        assert await fclient.store.claim("w", LEASE, 1, run_id=run_id) == []


async def test_show_prints_the_recovery_report_of_an_in_doubt_run(
        fclient: durable.Client, clock: FakeClock) -> None:
    run = await _claimed(fclient)
    assert await fclient.store.append(Fence(run.id, run.epoch), [
        JournalWrite(EntryKind.STEP_STARTED, 1, "1", "delete_database", 1),
        JournalWrite(EntryKind.STEP_COMPLETED, 1, "1", "delete_database", 1,
                     {"result": None, "summary": "database db-1: deleted"}),
        JournalWrite(EntryKind.STEP_STARTED, 2, "2", "force_push", 1),
    ])
    clock.advance(LEASE + 1)
    recovered = await fclient.get(run.id)
    text = render_timeline(recovered, await fclient.journal(run.id),
                                   console_url="https://console.example")
    assert "done (not repeated by a replay): step 1\n" in text
    assert "in doubt: step 2 force_push: the next attempt runs it again or fails" in text
    assert "https://console.example/runs/job-1#step-2" in text
    assert "python -m durable show job-1 --step 2" in text


async def test_a_step_in_doubt_is_not_run_again_by_a_worker_with_one_free_slot(
        tmp_path: Path, registry: durable.Registry) -> None:
    """A worker with one free slot claims by a read and lets the claim ride on the first
    write (durable/_claims.py), but only for a run that never started: a run its dead
    worker left with a step in doubt is claimed first, so its attempt judges the doubt
    under its own epoch. A step that is not safe to repeat (on_doubt="fail") fails the run
    and never runs again."""
    calls: list[int] = []

    @durable.activity("once.charge", registry=registry, on_doubt="fail")
    async def charge(ctx: durable.ActivityContext) -> None:
        calls.append(1)

    @durable.workflow("once.flow", registry=registry)
    async def flow(ctx: durable.WorkflowContext) -> None:
        await charge(ctx)

    clock = FakeClock()
    async with durable.Client.connect(f"sqlite:///{tmp_path / 'd.db'}", clock=clock,
                                      registry=registry) as client:
        run = await died_in_step_one(client, "once.flow", "charged", "once.charge")
        clock.advance(LEASE + 1)
        assert await client.store.recover_stale(run.id, run.epoch)
        async with running_worker(client, registry, concurrency=1):
            done = await client.wait("charged", timeout=20)
        journal = kinds(await client.journal("charged"))
    assert done.state is RunState.FAILED and calls == []
    assert "step_in_doubt" in journal and "step_completed" not in journal
