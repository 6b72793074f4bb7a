"""The recovery report never hides a step in doubt, and every line of it links to the journal.

A worker that dies mid-step leaves the step ``started``, with no outcome. Once its attempt
is over (the lease ran out and the run was recovered, ended by a pending cancel, or queued
again) the step is *in doubt*: the report and the progress say so, never "done" and never
"in flight", and the report's text names it with the command that shows it.
"""

from __future__ import annotations

import pytest

import durable
from durable import EntryKind, RunState
from durable._progress import states_by_key
from durable._report import RecoveryReport
from durable._types import Fence, JournalWrite

from .helpers import running_worker

pytestmark = pytest.mark.anyio
LEASE = 30.0


def _flows(registry: durable.Registry) -> None:
    @durable.activity("g.lookup", registry=registry)
    async def lookup(ctx: durable.ActivityContext) -> str:
        ctx.annotate("found the account")
        return "acct-1"

    @durable.activity("g.charge", registry=registry, on_doubt="fail")
    async def charge(ctx: durable.ActivityContext, account: str) -> str:
        return account

    @durable.workflow("g.flow", registry=registry)
    async def flow(ctx: durable.WorkflowContext) -> str:
        account = await lookup(ctx)
        return str(await charge(ctx, account))

    @durable.activity("g.refuse", registry=registry, retry=durable.RetryPolicy(max_tries=1))
    async def refuse(ctx: durable.ActivityContext) -> None:
        raise PermissionError("the bank said 403")

    @durable.workflow("g.refused", registry=registry)
    async def refused(ctx: durable.WorkflowContext) -> None:
        await lookup(ctx)
        await refuse(ctx)

    @durable.workflow("g.broken", registry=registry)
    async def broken(ctx: durable.WorkflowContext) -> str:
        await lookup(ctx)
        raise ValueError("the account is closed")


async def _died_in_step_two(client: durable.Client, run_id: str) -> durable.Run:
    """``run_id`` as a worker that died in step 2 leaves it: step 1 done, step 2 started."""
    await client.start("g.flow", id=run_id)
    [run] = await client.store.claim("dead-worker", LEASE, 1, run_id=run_id)
    fence = Fence(run.id, run.epoch)
    assert await client.store.append(fence, [
        JournalWrite(EntryKind.STEP_STARTED, 1, "1", "g.lookup", 1, {"args": []}),
        JournalWrite(EntryKind.STEP_COMPLETED, 1, "1", "g.lookup", 1,
                     {"result": "acct-1", "summary": "found the account"}),
        JournalWrite(EntryKind.STEP_STARTED, 2, "2", "g.charge", 1, {"args": ["acct-1"]})])
    return run


def _assert_step_two_in_doubt(run: durable.Run, journal: list[durable.JournalEntry]) -> None:
    report = RecoveryReport.build(run, journal)
    assert [s.number for s in report.completed] == [1]
    assert [s.number for s in report.in_doubt] == [2]
    assert report.not_done == ()
    text = report.text()
    assert "In doubt (started, outcome unknown" in text
    assert (f"  step 2 g.charge: {report.in_doubt[0].advice} (its request at the service: "
            f"idempotency key {run.id}/2, fencing token 1, scope run:{run.id})  -> "
            f"python -m durable show {run.id} --step 2") in text
    assert (f"  step 1 g.lookup - found the account  -> python -m durable show {run.id} "
            "--step 1") in text
    assert text.endswith(f"Journal: python -m durable show {run.id}")
    assert states_by_key(journal, ["1", "2"], run) == {"1": "done", "2": "in_doubt"}


async def test_a_step_of_a_dead_worker_is_in_doubt_once_a_pending_cancel_ends_the_run(
        fclient: durable.Client, clock: durable.FakeClock, registry: durable.Registry) -> None:
    _flows(registry)
    run = await _died_in_step_two(fclient, "r1")
    await fclient.cancel("r1")  # asks the (dead) attempt: the run is running
    clock.advance(LEASE + 1)
    assert await fclient.store.recover_stale(run.id, run.epoch)
    ended = await fclient.get("r1")
    assert ended.state is RunState.CANCELLED  # no attempt ran after the dead one
    _assert_step_two_in_doubt(ended, await fclient.journal("r1"))


async def test_a_step_of_a_dead_worker_is_in_doubt_while_its_run_waits_for_a_worker(
        fclient: durable.Client, clock: durable.FakeClock, registry: durable.Registry) -> None:
    _flows(registry)
    run = await _died_in_step_two(fclient, "r2")
    clock.advance(LEASE + 1)
    assert await fclient.store.recover_stale(run.id, run.epoch)
    queued = await fclient.get("r2")
    assert queued.state is RunState.QUEUED
    _assert_step_two_in_doubt(queued, await fclient.journal("r2"))


async def test_a_failure_that_is_no_step_s_is_in_the_report_with_what_was_done(
        client: durable.Client, registry: durable.Registry) -> None:
    _flows(registry)
    await client.start("g.broken", id="b1")
    async with running_worker(client, registry):
        failed = await client.wait("b1", timeout=20)
    assert failed.state is RunState.FAILED
    text = RecoveryReport.build(failed, await client.journal("b1")).text().splitlines()
    assert text[0] == "Run b1 (g.broken) failed."
    assert text[1].startswith("Error: ") and "the account is closed" in text[1]
    assert text[2:] == ["Already done (will not be repeated):",
                        "  step 1 g.lookup - found the account  -> "
                        "python -m durable show b1 --step 1",
                        "Journal: python -m durable show b1"]


async def test_a_failed_step_is_in_the_report_with_its_link_and_what_was_done(
        client: durable.Client, registry: durable.Registry) -> None:
    _flows(registry)
    await client.start("g.refused", id="f1")
    async with running_worker(client, registry):
        failed = await client.wait("f1", timeout=20)
    assert failed.state is RunState.FAILED
    text = RecoveryReport.build(failed, await client.journal("f1")).text().splitlines()
    assert text[0] == "Run f1 (g.refused) failed."
    assert text[1].startswith("Failed: step 2 g.refuse after 1 try: ")
    assert "the bank said 403" in text[1]
    assert text[1].endswith("  -> python -m durable show f1 --step 2")
    assert text[2:] == ["Already done (will not be repeated):",
                        "  step 1 g.lookup - found the account  -> "
                        "python -m durable show f1 --step 1",
                        "Journal: python -m durable show f1"]
