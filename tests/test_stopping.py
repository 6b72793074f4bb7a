"""Stopping an attempt (operator cancel, shutdown) is not losing its lease.

An attempt that is told to stop still holds its lease: cleanup code in an activity's
``finally`` may send its requests (shielded, bounded), and the outcome is journaled
(``run_cancelled``, or ``run_interrupted`` and a release). Only a real loss of the lease
refuses requests and writes nothing. A cancel that survived a recovery or a release is
honoured before any workflow code runs.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping, Sequence
from pathlib import Path

import anyio
import anyio.lowlevel
import pytest

import durable
import durable.testing
from durable import EntryKind, RunState
from durable._attempt import Attempt
from durable._history import History
from durable._types import JSON, Fence, JournalWrite, Renewal
from durable.store._sqlite import SqliteStore

from .helpers import kinds, poll, running_worker
from .httpserver import Rule, loopback_server

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("how", ["cancel", "shutdown"])
@pytest.mark.parametrize("shielded", [True, False], ids=["shielded", "unshielded"])
async def test_a_request_in_finally_is_sent_and_the_outcome_journaled(
        client: durable.Client, registry: durable.Registry, how: str, shielded: bool) -> None:
    async with loopback_server() as server:
        server.on("/delete", Rule(hang=True))

        @durable.activity(registry=registry)
        async def delete_volume(ctx: durable.ActivityContext) -> None:
            try:
                await ctx.http.delete(f"{server.url}/delete")
            finally:
                if shielded:
                    async with ctx.cleanup():
                        await ctx.http.post(f"{server.url}/unlock")
                else:  # no shield: the request is cancelled, but it is not a lost lease
                    await ctx.http.post(f"{server.url}/unlock")

        @durable.workflow("teardown", registry=registry)
        async def teardown(ctx: durable.WorkflowContext) -> None:
            await delete_volume(ctx)

        async with running_worker(client, registry, lease=5.0) as worker:
            await client.start("teardown", id="c1")
            await server.wait_for(lambda: len(server.seen("/delete")) == 1)
            if how == "cancel":
                await client.cancel("c1")
                done = await client.wait("c1")
            else:
                worker.shutdown(grace=0)
                await poll(lambda: not worker.active)
                done = await client.get("c1")
        unlocks = server.seen("/unlock")
    journal = await client.journal("c1")
    if how == "cancel":
        assert done.state is RunState.CANCELLED
        assert kinds(journal)[-2:] == ["step_in_doubt", "run_cancelled"]
    else:  # given back at once, not left on its lease
        assert done.state is RunState.QUEUED and done.lease_expires_at is None
        assert kinds(journal)[-2:] == ["step_in_doubt", "run_interrupted"]
    assert len(unlocks) == (1 if shielded else 0)
    if shielded:
        assert unlocks[0].headers["durable-fencing-token"] == str(done.epoch)


async def test_cleanup_is_bounded(client: durable.Client, registry: durable.Registry) -> None:
    """A cleanup that hangs is cut off after its timeout; the cancel is still journaled."""
    async with loopback_server() as server:
        server.on("/delete", Rule(hang=True))
        server.on("/unlock", Rule(hang=True))

        @durable.activity(registry=registry)
        async def delete_volume(ctx: durable.ActivityContext) -> None:
            try:
                await ctx.http.delete(f"{server.url}/delete")
            finally:
                async with ctx.cleanup(timeout=0.3):
                    await ctx.http.post(f"{server.url}/unlock")

        @durable.workflow("teardown", registry=registry)
        async def teardown(ctx: durable.WorkflowContext) -> None:
            await delete_volume(ctx)

        async with running_worker(client, registry, lease=5.0):
            await client.start("teardown", id="c2")
            await server.wait_for(lambda: len(server.seen("/delete")) == 1)
            await client.cancel("c2")
            await server.wait_for(lambda: len(server.seen("/unlock")) == 1)
            [unlock] = server.seen("/unlock")
            done = await client.wait("c2", timeout=5)
            await server.wait_for(lambda: unlock.disconnected_at is not None)
    assert done.state is RunState.CANCELLED
    assert unlock.disconnected_at is not None
    assert unlock.disconnected_at - unlock.arrived < 2.0


@pytest.mark.parametrize("handover", ["recover", "release"])
async def test_a_pending_cancel_is_honoured_before_any_step_runs_again(
        client: durable.Client, registry: durable.Registry, handover: str) -> None:
    """Cancelled while running; its worker died (or gave it back); nothing runs again,
    however fast the workflow, and the step it left is listed in doubt."""
    executed: list[str] = []

    @durable.activity("db.delete", registry=registry, on_doubt="retry")
    async def delete(ctx: durable.ActivityContext, name: str) -> None:
        executed.append(name)

    @durable.workflow("fast", registry=registry)
    async def fast(ctx: durable.WorkflowContext) -> str:
        await delete(ctx, "db-1")
        await delete(ctx, "db-2")
        return "done"

    await client.start("fast", id="p")
    [run] = await client.store.claim("dead-worker", 0.3, 1)
    fence = Fence(run.id, run.epoch)
    assert await client.store.append(fence, [JournalWrite(
        EntryKind.STEP_STARTED, 1, "1", "db.delete", 1, {"args": ["db-1"]})])
    await client.cancel("p")
    if handover == "recover":
        assert await poll(lambda: client.store.recover_stale("p", run.epoch), timeout=5)
    else:
        assert await client.store.release(fence, [])
    async with running_worker(client, registry):
        done = await client.wait("p")
    assert done.state is RunState.CANCELLED
    assert executed == []
    journal = await client.journal("p")
    assert kinds(journal)[-1] == "run_cancelled"
    assert "step_started" not in kinds(journal[kinds(journal).index("run_cancel_requested"):])


async def test_an_attempt_claimed_with_a_pending_cancel_runs_no_workflow_code(
        client: durable.Client, registry: durable.Registry) -> None:
    """The attempt's own guard, for a store that hands out such a claim: cancelled at once,
    the earlier attempt's step journaled in doubt."""
    executed: list[str] = []

    @durable.activity("db.delete", registry=registry, on_doubt="retry")
    async def delete(ctx: durable.ActivityContext, name: str) -> None:
        executed.append(name)

    @durable.workflow("fast", registry=registry)
    async def fast(ctx: durable.WorkflowContext) -> str:
        executed.append("workflow code")
        await delete(ctx, "db-1")
        return "done"

    await client.start("fast", id="p")
    [first] = await client.store.claim("dead-worker", 30, 1)
    assert await client.store.append(Fence(first.id, first.epoch), [JournalWrite(
        EntryKind.STEP_STARTED, 1, "1", "db.delete", 1, {"args": ["db-1"]})])
    assert await client.store.release(Fence(first.id, first.epoch), [])
    [run] = await client.store.claim("worker", 30, 1)
    attempt = Attempt(client.store, run.evolve(cancel_requested=True), registry,
                              lease=30, lease_sent_at=anyio.current_time())
    await attempt.execute()
    done = await client.get("p")
    assert done.state is RunState.CANCELLED
    assert executed == []
    last = [e for e in await client.journal("p") if e.epoch == run.epoch]
    assert kinds(last)[-2:] == ["step_in_doubt", "run_cancelled"]
    assert [e.step for e in last if e.kind is EntryKind.STEP_IN_DOUBT] == [1]


class FlakyRenewals(SqliteStore):
    """A real SQLite store whose renewals can be made to fail, counting those that held."""

    failing = False
    renewed: dict[int, int]

    async def renew(self, worker: str, held: Sequence[Fence], lease: float,
                    details: Mapping[str, JSON] | None = None) -> list[Renewal]:
        if self.failing:
            raise durable.StoreUnavailableError("database unreachable (injected)")
        answer = await super().renew(worker, held, lease, details)
        for r in answer:
            self.renewed[r.epoch] = self.renewed.get(r.epoch, 0) + 1
        return answer


async def test_the_older_attempt_does_not_drop_the_newer_one_from_the_worker(
        tmp_path: Path, registry: durable.Registry) -> None:
    store = FlakyRenewals(str(tmp_path / "a.db"))
    store.renewed = {}
    await store.open()
    client = durable.Client(store, registry=registry)
    first_in, first_go, second_in, second_go = (anyio.Event() for _ in range(4))
    calls: list[int] = []

    @durable.activity("stubborn", registry=registry)
    async def stubborn(ctx: durable.ActivityContext) -> None:
        calls.append(ctx.fencing_token or 0)
        if len(calls) == 1:
            first_in.set()
            with anyio.CancelScope(shield=True):  # like code in a thread: runs on
                await first_go.wait()
        else:
            second_in.set()
            await second_go.wait()

    @durable.workflow("wf", registry=registry)
    async def wf(ctx: durable.WorkflowContext) -> None:
        await stubborn(ctx)

    try:
        with durable.testing.capture_logs() as logs:
            async with running_worker(client, registry, lease=0.6, sweep_interval=0.05):
                await client.start("wf", id="r")
                await first_in.wait()
                store.failing = True  # the first attempt's lease lapses; it runs on, shielded
                await second_in.wait()  # recovered and claimed again by the same worker
                store.failing = False
                newer = calls[1]
                first_go.set()  # the older attempt ends now
                await poll(lambda: any(e["event"] == "attempt_abandoned" for e in logs))
                seen = store.renewed.get(newer, 0)
                # the newer attempt is still held: its lease keeps being renewed
                await poll(lambda: store.renewed.get(newer, 0) >= seen + 3, timeout=5)
                second_go.set()
                done = await client.wait("r")
    finally:
        await store.aclose()
    assert done.state is RunState.COMPLETED and done.attempt == 2


class BlockingAppend(SqliteStore):
    """A real store whose append of a chosen step's start waits for the test."""

    entered: anyio.Event
    go: anyio.Event

    async def append(self, fence: Fence, entries: Sequence[JournalWrite]) -> bool:
        if any(e.kind is EntryKind.STEP_STARTED and e.step == 2 for e in entries):
            self.entered.set()
            await self.go.wait()
        return await super().append(fence, entries)


async def test_a_deferred_completion_survives_a_cancel_of_the_next_write(
        tmp_path: Path, registry: durable.Registry) -> None:
    store = BlockingAppend(str(tmp_path / "d.db"))
    store.entered, store.go = anyio.Event(), anyio.Event()
    await store.open()
    client = durable.Client(store, registry=registry)

    @durable.activity("idem", registry=registry, on_doubt="retry")
    async def idem(ctx: durable.ActivityContext, n: int) -> int:
        await anyio.lowlevel.checkpoint()  # where a pending cancel lands
        return n

    @durable.workflow("two", registry=registry)
    async def two(ctx: durable.WorkflowContext) -> None:
        await idem(ctx, 1)
        await idem(ctx, 2)

    try:
        with durable.testing.capture_logs() as logs:
            async with running_worker(client, registry):
                await client.start("two", id="t")
                await store.entered.wait()
                await client.cancel("t")
                await poll(lambda: any(e["event"] == "attempt_stopping" for e in logs))
                store.go.set()
                done = await client.wait("t")
        journal = await client.journal("t")
        report = await client.report("t")
    finally:
        await store.aclose()
    assert done.state is RunState.CANCELLED
    step1 = History.fold(journal).steps["1"]
    assert step1.state is durable.StepState.COMPLETED and step1.result == 1
    assert [s.number for s in report.completed] == [1]
    assert 1 not in [s.number for s in report.in_doubt]


async def test_a_stop_inside_a_workflow_task_group_ends_the_same_on_both_backends(
        client: durable.Client, registry: durable.Registry) -> None:
    """Operator cancel while a task group in the workflow holds a step whose cleanup raises:
    the run is cancelled (on asyncio and on trio), not crashed and left on its lease."""
    async with loopback_server() as server:
        server.on("/hang", Rule(hang=True))

        @durable.activity(registry=registry, retry=durable.RetryPolicy(max_tries=1))
        async def hang(ctx: durable.ActivityContext) -> None:
            await ctx.http.get(f"{server.url}/hang")

        @durable.workflow("group", registry=registry)
        async def group(ctx: durable.WorkflowContext) -> None:
            async with anyio.create_task_group() as tg:
                tg.start_soon(lambda: ctx.step(hang, key="a"))
                try:
                    await anyio.sleep_forever()
                finally:
                    raise RuntimeError("the workflow's own cleanup failed")

        with durable.testing.capture_logs() as logs:
            async with running_worker(client, registry, lease=5.0) as worker:
                await client.start("group", id="g")
                await server.wait_for(lambda: len(server.seen("/hang")) == 1)
                await client.cancel("g")
                await poll(lambda: not worker.active)
                done = await client.get("g")
    assert "attempt_crashed" not in [e["event"] for e in logs]
    assert done.state is RunState.CANCELLED


async def test_a_journal_write_waiting_for_a_locked_database_ends_with_the_lease(
        tmp_path: Path, registry: durable.Registry) -> None:
    """Another connection holds SQLite's write lock: the step's completion cannot commit
    in the event loop's thread and waits in the database thread (which would wait 30 s for
    the lock). Its shielded scope sets its deadline only then (durable._lease.arm_bound),
    and the wait still ends at the local lease deadline: the attempt is abandoned while the
    lock is held (the completion's outcome is unknown to it: the queued job may commit once
    the lock goes, the database's fence deciding)."""
    path = tmp_path / "locked.db"
    store = SqliteStore(str(path))
    await store.open()
    client = durable.Client(store, registry=registry)
    entered, locked = anyio.Event(), anyio.Event()

    @durable.activity("once", registry=registry, on_doubt="fail")
    async def once(ctx: durable.ActivityContext) -> int:
        entered.set()
        await locked.wait()
        return 1

    @durable.workflow("held", registry=registry)
    async def held(ctx: durable.WorkflowContext) -> int:
        return int(await once(ctx))

    holder = sqlite3.connect(str(path), isolation_level=None)
    try:
        with durable.testing.capture_logs() as logs:
            async with running_worker(client, registry, lease=1.0):
                await client.start("held", id="h")
                await entered.wait()
                holder.execute("BEGIN IMMEDIATE")
                locked.set()
                await poll(lambda: any(e["event"] == "attempt_abandoned" for e in logs))
                assert holder.in_transaction  # the lock was held all along
                holder.rollback()
    finally:
        holder.close()
        await store.aclose()
    [stopping] = [e for e in logs if e["event"] == "attempt_stopping"]
    assert stopping["reason"] == "a journal write was refused, or its outcome is unknown"
