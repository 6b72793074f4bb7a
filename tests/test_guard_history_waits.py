"""Waits read back from the journal (durable/_history.py): a replay that runs a pending sleep
again starts it afresh; a journaled wait is not reused for another signal; a journaled
retry is not a try in doubt.

A run cancelled while it slept (released, waiting without a lease) and replayed later
sleeps its whole time again from the replay, on the store's clock: the wake time journaled
by the cancelled attempt is not reused (it may be long past). On SQLite and PostgreSQL,
asyncio and trio; time is a FakeClock.
"""

from __future__ import annotations

import pytest

import durable
from durable import EntryKind, RunState
from durable._clock import FakeClock

from .helpers import poll, running_worker
from .pg import pg_url, postgres_server
from .waiting import client, clock, store_url

__all__ = ["client", "clock", "pg_url", "postgres_server", "store_url"]

pytestmark = pytest.mark.anyio

HOUR = 3600.0


async def waiting_in(client: durable.Client, run_id: str, attempt: int) -> durable.Run:
    """The run once its attempt ``attempt`` released it to wait."""
    async def check() -> durable.Run | None:
        run = await client.store.get_run(run_id)
        return run if run and run.state is RunState.QUEUED and run.attempt == attempt else None

    found: durable.Run = await poll(check, timeout=15)
    return found


async def test_a_replayed_sleep_sleeps_afresh_from_the_replay(
        client: durable.Client, registry: durable.Registry, clock: FakeClock) -> None:
    @durable.workflow("fresh.nap", registry=registry)
    async def nap(ctx: durable.WorkflowContext) -> str:
        await ctx.sleep(HOUR)
        return "woke"

    async with running_worker(client, registry):
        await client.start("fresh.nap", id="nap")
        await waiting_in(client, "nap", 1)
        assert (await client.cancel("nap")).state is RunState.CANCELLED
        clock.advance(2 * HOUR)  # the first wake time is long past
        await client.replay("nap")
        again = await waiting_in(client, "nap", 2)
        assert again.run_at == pytest.approx(clock.now() + HOUR, abs=0.01)
        timers = [e for e in await client.store.journal("nap")
                  if e.kind is EntryKind.TIMER_STARTED]
        assert len(timers) == 2
        assert timers[1].data["until"] == pytest.approx(clock.now() + HOUR, abs=0.01)
        clock.advance(HOUR)
        done = await client.wait("nap", timeout=15)
    assert done.state is RunState.COMPLETED and done.result == "woke"


async def test_a_journaled_wait_for_another_signal_is_a_non_determinism_error(
        client: durable.Client, registry: durable.Registry) -> None:
    """A wait is known only as the n-th unkeyed call: journaled as a wait for "approve", it
    is not taken (with its journaled deadline and the signals it consumed) for a wait for
    another signal after a deploy changed the code; the run fails saying so."""
    waits_for = ["approve"]

    @durable.workflow("fresh.gate", registry=registry)
    async def gate(ctx: durable.WorkflowContext) -> str:
        return str(await ctx.wait_for(waits_for[0]))

    async with running_worker(client, registry):
        await client.start("fresh.gate", id="g")
        await waiting_in(client, "g", 1)
        waits_for[0] = "deny"  # a deploy changed the signal the step waits for
        assert await client.signal("g", "approve", "yes")
        done = await poll(lambda: finished(client, "g"), timeout=15)
    assert done.state is RunState.FAILED, done.state
    assert done.error is not None and "journaled as a wait for signal 'approve'" in done.error
    assert "now waits for 'deny'" in done.error


async def finished(client: durable.Client, run_id: str) -> durable.Run | None:
    run = await client.store.get_run(run_id)
    return run if run is not None and run.state.finished else None


async def test_a_released_retry_is_not_a_step_in_doubt_on_the_next_attempt(
        client: durable.Client, registry: durable.Registry, clock: FakeClock) -> None:
    """A try journaled as failed and retrying (after a delay long enough to release the run)
    ended for sure: the next attempt runs the next try, it does not find the step in doubt
    (an on_doubt="fail" step would fail the run as in doubt, though it never took effect)."""
    tries: list[int] = []

    @durable.activity("fresh.charge", registry=registry, on_doubt="fail",
                      retry=durable.RetryPolicy(max_tries=2, initial_delay=60,
                                                max_delay=60, jitter=0))
    async def charge(ctx: durable.ActivityContext) -> str:
        tries.append(ctx.try_number)
        if ctx.try_number == 1:
            raise RuntimeError("the service said 503")
        return "charged"

    @durable.workflow("fresh.pay", registry=registry)
    async def pay(ctx: durable.WorkflowContext) -> str:
        return str(await charge(ctx))

    async with running_worker(client, registry):
        await client.start("fresh.pay", id="p")
        waiting = await waiting_in(client, "p", 1)
        assert waiting.run_at == pytest.approx(clock.now() + 60, abs=0.01)
        clock.advance(60)
        done = await client.wait("p", timeout=15)
    assert done.state is RunState.COMPLETED, done.error
    assert done.result == "charged" and tries == [1, 2]
    journal = await client.store.journal("p")
    assert not [e for e in journal if e.kind is EntryKind.STEP_IN_DOUBT]
