"""A durable wait that workflow code swallows still waits.

``ctx.sleep``, ``ctx.wait_for`` and a long retry delay end the attempt by raising a
``BaseException`` (so ``except Exception`` cannot stop it). A bare ``except:`` or ``except
BaseException:`` around the wait stopped it: the workflow went on at once, and the delete
the one-hour grace period was for ran straight away; a wait for an approval went on with no
approval. The attempt now keeps the wait it raised: the workflow's next journaled call
raises it again, and a workflow that returns after swallowing it is released to wait all
the same.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest

import durable
from durable import RunState

from .helpers import kinds, running_worker

pytestmark = pytest.mark.anyio


async def _released(client: durable.Client, run_id: str) -> durable.Run:
    with anyio.fail_after(10):  # a bounded poll: released to wait, or (the bug) finished
        while True:
            run = await client.get(run_id)
            if run.state.finished or "run_waiting" in kinds(await client.journal(run_id)):
                return run
            await anyio.sleep(0.01)


@pytest.mark.parametrize("returns", [False, True])
async def test_a_swallowed_sleep_or_signal_wait_still_releases_the_run(
        client: durable.Client, registry: durable.Registry, returns: bool) -> None:
    deleted: list[str] = []

    @durable.activity("db.delete", registry=registry)
    async def delete(ctx: durable.ActivityContext, what: str) -> str:
        deleted.append(what)
        return what

    @durable.workflow("grace", registry=registry)
    async def grace(ctx: durable.WorkflowContext) -> Any:
        try:
            await ctx.sleep(3600)  # the grace period before the delete
        except BaseException:  # the mistake under test
            if returns:
                return "gave up"
        return await delete(ctx, "db-1")

    @durable.workflow("approved", registry=registry)
    async def approved(ctx: durable.WorkflowContext) -> Any:
        try:
            answer = await ctx.wait_for("approve")
        except:  # noqa: E722 - the mistake under test
            if returns:
                return "gave up"
            answer = None
        return await delete(ctx, f"db-2 approved by {answer}")

    async with running_worker(client, registry):
        await client.start("grace", id="grace")
        await client.start("approved", id="approved")
        for run_id in ("grace", "approved"):
            run = await _released(client, run_id)
            assert run.state is RunState.QUEUED, (run.state, run.result)
        assert deleted == []
        assert await client.signal("approved", "approve", "alice")
        done = await client.wait("approved")
    assert done.state is RunState.COMPLETED
    assert done.result == "db-2 approved by alice" and deleted == ["db-2 approved by alice"]
    assert (await client.get("grace")).state is RunState.QUEUED  # still sleeping
