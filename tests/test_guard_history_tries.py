"""Tries counted across attempts, as the journal tells them (durable/_history.py).

A try that its own attempt stopped (a shutdown, with the step in flight) is journaled as
``step_in_doubt`` by that same attempt: it is not charged to ``RetryPolicy.max_tries``, so
the next attempt runs the step again even when it had a single try. A try whose attempt
never reported is charged (tests/test_step_rules.py, tests/test_recovery.py).
"""

from __future__ import annotations

import anyio
import pytest

import durable
from durable import EntryKind, RunState

from .helpers import kinds, poll, running_worker

pytestmark = pytest.mark.anyio


async def test_a_try_its_own_attempt_stopped_is_not_charged_to_max_tries(
        client: durable.Client, registry: durable.Registry) -> None:
    started = anyio.Event()
    tries: list[int] = []

    @durable.activity("tries.once", registry=registry, retry=durable.RetryPolicy(max_tries=1))
    async def once(ctx: durable.ActivityContext) -> str:
        tries.append(ctx.try_number)
        if len(tries) == 1:
            started.set()
            await anyio.sleep_forever()  # in flight when the worker shuts down
        return "done"

    @durable.workflow("tries.flow", registry=registry)
    async def flow(ctx: durable.WorkflowContext) -> str:
        return str(await once(ctx))

    async with running_worker(client, registry) as worker:
        await client.start("tries.flow", id="t")
        with anyio.fail_after(10):
            await started.wait()
        worker.shutdown(grace=0)
        await poll(lambda: not worker.active)
    interrupted = await client.get("t")
    assert interrupted.state is RunState.QUEUED  # given back, not failed
    journal = await client.journal("t")
    [doubt] = [e for e in journal if e.kind is EntryKind.STEP_IN_DOUBT]
    [first] = [e for e in journal if e.kind is EntryKind.STEP_STARTED]
    assert doubt.epoch == first.epoch  # its own attempt said so
    async with running_worker(client, registry):
        done = await client.wait("t", timeout=15)
    assert done.state is RunState.COMPLETED, done.error
    assert done.result == "done" and tries == [1, 2]
    assert kinds(await client.journal("t")).count("step_started") == 2
