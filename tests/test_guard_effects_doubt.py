"""An ``on_doubt="fail"`` step whose worker died while it ran is never run again by a plain
replay: only ``--rerun-in-doubt`` runs it, ``--accept-in-doubt`` counts it as done.

With ``max_tries=1`` (``durable.NO_RETRY``, the policy of a step that must not run twice)
the death used the step's last try. The step used to be failed then as out of tries
(``WorkerDied``) instead of being left in doubt, and a plain ``replay``, which runs failed
steps again, ran it although its outcome was unknown: ``_steps.py`` counted the tries
before it applied ``on_doubt``.
"""

from __future__ import annotations

import pytest

import durable
from durable import EntryKind, RunState

from .helpers import running_worker
from .test_step_rules import _in_doubt_run

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("max_tries", [1, 3])
async def test_a_plain_replay_never_runs_an_on_doubt_fail_step_its_worker_died_in(
        client: durable.Client, registry: durable.Registry, max_tries: int) -> None:
    creates: list[int] = []

    @durable.activity("payment.charge", registry=registry, on_doubt="fail",
                      retry=durable.RetryPolicy(max_tries=max_tries))
    async def charge(ctx: durable.ActivityContext, order: str) -> int:
        creates.append(ctx.try_number)
        return 1

    @durable.workflow("checkout", registry=registry)
    async def checkout(ctx: durable.WorkflowContext, order: str) -> int:
        return await charge(ctx, order)

    await client.start("checkout", "o-1", id="c")
    await _in_doubt_run(client, "c", "payment.charge", ["o-1"])  # its worker died in try 1
    async with running_worker(client, registry):
        failed = await client.wait("c", timeout=10)
        assert failed.state is RunState.FAILED
        await client.replay("c")  # neither --rerun-in-doubt nor --accept-in-doubt
        again = await client.wait("c", timeout=10)
        assert creates == [], "a plain replay charged again a payment whose outcome is unknown"
        assert again.state is RunState.FAILED
        assert again.error is not None and "--rerun-in-doubt" in again.error, again.error
        assert not [e for e in await client.journal("c")
                    if e.kind in (EntryKind.STEP_COMPLETED, EntryKind.STEP_FAILED)]
        await client.replay("c", in_doubt="rerun")  # the operator checked: not charged
        rerun = await client.wait("c", timeout=10)
    assert (rerun.state, rerun.result, len(creates)) == (RunState.COMPLETED, 1, 1), rerun
