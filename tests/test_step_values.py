"""What an activity hands the engine besides its result (``ctx.annotate``'s summary,
``ctx.heartbeat``'s detail) is checked when it is handed over, not when it is written.

A summary that is not JSON was found only when the step's completion was journaled,
after the activity had done its work: the step was left in doubt or the attempt crashed
(``attempt_crashed``), the run failing with ``journal data must be JSON values``, which
names neither the step nor the call; an idempotent step's completion rides on the next
write, and a run taken back after such a crash ran the step again. A heartbeat detail that
is not JSON failed the worker's lease renewal and ended the worker, with every run it
held.
"""

from __future__ import annotations

import math

import anyio
import pytest

import durable
from durable import RunState

from .helpers import kinds, running_worker

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("on_doubt", ["retry", "fail"])
@pytest.mark.parametrize(("summary", "says"), [
    ({"ids": {1, 2}}, "Object of type set is not JSON serializable"),
    (math.nan, "Out of range float values are not JSON compliant"),
])
async def test_a_summary_that_is_not_json_fails_the_step_at_the_call_once(
        client: durable.Client, registry: durable.Registry, on_doubt: str, summary: object,
        says: str) -> None:
    deleted: list[str] = []

    @durable.activity("db.delete", registry=registry, on_doubt=on_doubt,  # type: ignore[arg-type]
                      retry=durable.RetryPolicy(max_tries=3, initial_delay=0))
    async def delete(ctx: durable.ActivityContext, name: str) -> str:
        deleted.append(name)  # done: not to be done again for the summary's sake
        ctx.annotate(summary)  # type: ignore[arg-type]
        return name

    @durable.workflow("deletes", registry=registry)
    async def deletes(ctx: durable.WorkflowContext) -> str:
        return await delete(ctx, "db-1")

    async with running_worker(client, registry):
        await client.start("deletes", id="summary")
        done = await client.wait("summary", timeout=10)
    assert done.state is RunState.FAILED
    assert done.error is not None
    assert done.error.startswith(
        "step 1 (db.delete) failed after 1 try: NotJsonError: ctx.annotate's summary must be "
        f"JSON values: {says}"), done.error
    assert deleted == ["db-1"]  # not retried: the same call would fail the same way
    assert kinds(await client.journal("summary")) == [
        "run_created", "run_claimed", "step_started", "step_failed", "run_failed"]


async def test_a_heartbeat_detail_that_is_not_json_fails_the_step_and_the_worker_goes_on(
        client: durable.Client, registry: durable.Registry) -> None:
    counters = durable.Counters()

    @durable.activity("audio.render", registry=registry,
                      retry=durable.RetryPolicy(max_tries=1))
    async def render(ctx: durable.ActivityContext, detail: str) -> str:
        ctx.heartbeat({"done": {1, 2}} if detail == "set" else {"done": 2})
        seen = counters.renewals
        with anyio.fail_after(10):  # in flight until a renewal has carried the detail
            while counters.renewals < seen + 2:
                await anyio.sleep(0.01)
        return detail

    @durable.workflow("renders", registry=registry)
    async def renders(ctx: durable.WorkflowContext, detail: str) -> str:
        return await render(ctx, detail)

    async with running_worker(client, registry, interceptors=[counters]):
        await client.start("renders", "set", id="bad")
        bad = await client.wait("bad", timeout=10)
        await client.start("renders", "json", id="good")  # renewed with its detail
        good = await client.wait("good", timeout=10)
    assert bad.state is RunState.FAILED and bad.error is not None
    assert bad.error.startswith(
        "step 1 (audio.render) failed after 1 try: NotJsonError: ctx.heartbeat's detail must "
        "be JSON values: Object of type set is not JSON serializable"), bad.error
    assert good.state is RunState.COMPLETED and good.result == "json"
