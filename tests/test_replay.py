"""Replay: completed steps return their journaled results; nothing is ever deleted."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import anyio
import pytest

import durable
from durable import RunState

from .helpers import kinds, poll, running_worker
from .pg import pg_url, postgres_server
from .test_store_contract import store_url

pytestmark = pytest.mark.anyio

__all__ = ["pg_url", "postgres_server", "store_url"]  # tests/pg.py, test_store_contract.py


def _define(registry: durable.Registry, executed: list[str], fail_at: set[str],
            swap: list[bool]) -> None:
    @durable.activity("step.a", registry=registry, retry=durable.RetryPolicy(max_tries=1))
    async def a(ctx: durable.ActivityContext, name: str) -> str:
        executed.append(name)
        if name in fail_at:
            raise RuntimeError(f"{name} broke")
        return name

    @durable.activity("step.b", registry=registry)
    async def b(ctx: durable.ActivityContext, name: str) -> str:
        executed.append(f"b:{name}")
        return name

    @durable.workflow("three", registry=registry)
    async def three(ctx: durable.WorkflowContext) -> list[str]:
        first = await a(ctx, "one")
        second = await (b(ctx, "two") if swap[0] else a(ctx, "two"))
        third = await a(ctx, "three")
        return [first, second, third]


async def test_replay_skips_completed_steps(client: durable.Client,
                                            registry: durable.Registry) -> None:
    executed: list[str] = []
    fail_at = {"two"}
    _define(registry, executed, fail_at, [False])
    async with running_worker(client, registry):
        await client.start("three", id="x")
        failed = await client.wait("x")
        assert failed.state is RunState.FAILED and failed.error is not None
        assert "step 2 (step.a)" in failed.error
        fail_at.clear()
        await client.replay("x")
        done = await client.wait("x")
    assert done.state is RunState.COMPLETED and done.result == ["one", "two", "three"]
    assert executed == ["one", "two", "two", "three"]
    journal = await client.journal("x")
    # the failed first attempt stays in the journal
    assert kinds(journal).count("step_failed") == 1
    assert kinds(journal).count("run_replayed") == 1
    assert done.attempt == 2 and done.epoch > failed.epoch


async def test_replay_from_step(client: durable.Client, registry: durable.Registry) -> None:
    executed: list[str] = []
    fail_at = {"three"}
    _define(registry, executed, fail_at, [False])
    async with running_worker(client, registry):
        await client.start("three", id="f")
        await client.wait("f")
        fail_at.clear()
        await client.replay("f", from_step=2)
        done = await client.wait("f")
    assert done.state is RunState.COMPLETED
    assert executed == ["one", "two", "three", "two", "three"]
    journal = await client.journal("f")
    started = [(e.step, e.epoch) for e in journal if e.kind.value == "step_started"]
    assert [s for s, _ in started] == [1, 2, 3, 2, 3]


async def test_replay_with_changed_code_is_a_non_determinism_error(
        client: durable.Client, registry: durable.Registry) -> None:
    executed: list[str] = []
    swap = [False]
    _define(registry, executed, {"three"}, swap)
    async with running_worker(client, registry):
        await client.start("three", id="n")
        await client.wait("n")
        swap[0] = True  # a deploy changed step 2 to another activity
        await client.replay("n")
        done = await client.wait("n")
    assert done.state is RunState.FAILED
    assert done.error is not None and "journaled as 'step.a'" in done.error
    assert "now calls 'step.b'" in done.error
    assert "b:two" not in executed


async def test_only_failed_or_cancelled_runs_replay(client: durable.Client,
                                                    registry: durable.Registry) -> None:
    _define(registry, [], set(), [False])
    async with running_worker(client, registry):
        await client.start("three", id="ok")
        await client.wait("ok")
    with pytest.raises(durable.InvalidStateError, match="only failed or cancelled"):
        await client.replay("ok")
    with pytest.raises(durable.RunNotFoundError):
        await client.replay("missing")


async def test_the_journal_is_append_only(client: durable.Client, registry: durable.Registry,
                                          tmp_path: Path) -> None:
    _define(registry, [], set(), [False])
    await client.start("three", id="j")
    conn = sqlite3.connect(tmp_path / "durable.db")
    try:
        with pytest.raises(sqlite3.DatabaseError, match="append-only"):
            conn.execute("DELETE FROM durable_journal")
        with pytest.raises(sqlite3.DatabaseError, match="append-only"):
            conn.execute("UPDATE durable_journal SET kind = 'x'")
    finally:
        conn.close()


async def test_a_resumed_attempt_sees_a_journaled_failure_again(
        client: durable.Client, registry: durable.Registry) -> None:
    """A step whose failure is journaled is not re-run by a later attempt (only by a replay)."""
    import anyio

    tries: list[int] = []
    release = anyio.Event()
    seen_failures: list[str] = []

    @durable.activity("flaky", registry=registry, retry=durable.RetryPolicy(max_tries=1))
    async def flaky(ctx: durable.ActivityContext) -> None:
        tries.append(ctx.try_number)
        raise RuntimeError("no")

    @durable.activity("wait", registry=registry)
    async def wait(ctx: durable.ActivityContext) -> None:
        await release.wait()

    @durable.workflow("tolerant", registry=registry)
    async def tolerant(ctx: durable.WorkflowContext) -> str:
        try:
            await flaky(ctx)
        except durable.ActivityError as exc:
            seen_failures.append(str(exc))
        await wait(ctx)
        return "done"

    async with running_worker(client, registry) as worker:
        await client.start("tolerant", id="t")
        await poll(lambda: len(seen_failures) == 1)
        worker.shutdown(grace=0)  # interrupted in step 2: released, queued again
    assert (await client.get("t")).state is RunState.QUEUED
    release.set()
    async with running_worker(client, registry):
        done = await client.wait("t")
    assert done.state is RunState.COMPLETED
    assert tries == [1]  # the failed step did not run again
    assert len(seen_failures) == 2 and seen_failures[0] == seen_failures[1]


def _backup_then_delete(registry: durable.Registry, target: dict[str, str],
                        done: list[str]) -> None:
    """Back a database up, wait (long enough to release the run), delete it: the argument
    is read from ``target``, outside the journal, so a test can change it between attempts
    as non-deterministic workflow code (or a deploy) would."""
    @durable.activity("db.backup", registry=registry, retry=durable.RetryPolicy(max_tries=1))
    async def backup(ctx: durable.ActivityContext, db: str) -> str:
        done.append(f"backup {db}")
        if db == "db-broken":
            raise RuntimeError("cannot back up db-broken")
        return f"backup of {db}"

    @durable.activity("db.delete", registry=registry)
    async def delete(ctx: durable.ActivityContext, db: str) -> str:
        done.append(f"delete {db}")
        return f"deleted {db}"

    @durable.workflow("db.retire", registry=registry)
    async def retire(ctx: durable.WorkflowContext, seconds: float) -> list[str]:
        saved = await backup(ctx, target["db"])
        await ctx.sleep(seconds)
        return [saved, await delete(ctx, target["db"])]


async def test_a_journaled_step_called_with_other_arguments_fails_the_run(
        client: durable.Client, registry: durable.Registry) -> None:
    """The run backs up db-A, sleeps (released: the next attempt runs the workflow again
    from the journal), and meanwhile the argument becomes db-B. Step 1's journaled result
    ("backup of db-A") must not stand for a backup of db-B: the run fails with
    NonDeterminismError naming both argument lists, and db-B is not deleted. Before, the
    journal answered the new call and the delete of db-B ran with no backup of it."""
    target, done = {"db": "db-A"}, []
    _backup_then_delete(registry, target, done)
    async with running_worker(client, registry, durable_wait_threshold=0.1):
        await client.start("db.retire", 0.3, id="retire-1")
        await poll(lambda: _waiting(client, "retire-1"))
        target["db"] = "db-B"
        run = await client.wait("retire-1")
    assert run.state is RunState.FAILED and run.attempt == 2, run
    assert run.error is not None
    assert 'step 1 (db.backup) was journaled with the arguments ["db-A"]' in run.error
    assert 'now calls it with ["db-B"]' in run.error, run.error
    assert done == ["backup db-A"]  # nothing ran for db-B
    assert "run_failed" in kinds(await client.journal("retire-1"))


async def test_the_same_arguments_in_another_form_reuse_the_journal(
        client: durable.Client, registry: durable.Registry) -> None:
    """Compared as JSON values: a tuple is the list it was journaled as, and a dict's key
    order does not matter. The resumed run reuses step 1 and completes."""
    given = [("db-A", {"a": 1, "b": 2})]

    @durable.activity("args.echo", registry=registry)
    async def echo(ctx: durable.ActivityContext, pair: Any) -> str:
        return "echoed"

    @durable.workflow("args.twice", registry=registry)
    async def twice(ctx: durable.WorkflowContext) -> str:
        first = await echo(ctx, given[0])
        await ctx.sleep(0.3)
        return first

    async with running_worker(client, registry, durable_wait_threshold=0.1):
        await client.start("args.twice", id="forms")
        await poll(lambda: _waiting(client, "forms"))
        given[0] = ("db-A", {"b": 2, "a": 1})  # another tuple, keys in another order
        run = await client.wait("forms")
    assert (run.state, run.result, run.attempt) == (RunState.COMPLETED, "echoed", 2), run


async def test_a_replay_runs_a_step_again_with_the_arguments_of_the_code_deployed_now(
        client: durable.Client, registry: durable.Registry) -> None:
    """The fix-and-replay flow: a step failed for a wrong argument, the fix changes it, and
    a replay runs that step again with the new argument (it reuses nothing of it)."""
    target, done = {"db": "db-broken"}, []
    _backup_then_delete(registry, target, done)
    async with running_worker(client, registry, durable_wait_threshold=0.1):
        await client.start("db.retire", 0.0, id="retire-2")
        failed = await client.wait("retire-2")
        assert failed.state is RunState.FAILED and "cannot back up" in (failed.error or "")
        target["db"] = "db-C"
        await client.replay("retire-2")
        run = await client.wait("retire-2")
    assert run.state is RunState.COMPLETED and run.result == ["backup of db-C", "deleted db-C"]
    assert done == ["backup db-broken", "backup db-C", "delete db-C"]


async def _waiting(client: durable.Client, run_id: str) -> bool:
    return "run_waiting" in kinds(await client.journal(run_id))


async def test_a_keyed_step_is_what_its_key_names_whatever_its_arguments(
        client: durable.Client, registry: durable.Registry) -> None:
    """A key names the operation: its arguments may describe it as the journal stands now
    (a notification's text with the recovery report, which a later attempt's journal makes
    longer), so a keyed step's journaled outcome is reused with other arguments, and the
    run completes."""
    text = ["report as of attempt 1"]
    sent: list[str] = []

    @durable.activity("keyed.notify", registry=registry)
    async def notify(ctx: durable.ActivityContext, message: str) -> str:
        sent.append(message)
        return "sent"

    @durable.workflow("keyed.twice", registry=registry)
    async def twice(ctx: durable.WorkflowContext) -> str:
        outcome = await ctx.step(notify, text[0], key="failure-notify")
        await ctx.sleep(0.3)
        return str(outcome)

    async with running_worker(client, registry, durable_wait_threshold=0.1):
        await client.start("keyed.twice", id="keyed")
        await poll(lambda: _waiting(client, "keyed"))
        text[0] = "report as of attempt 2"
        run = await client.wait("keyed")
    assert (run.state, run.result, run.attempt) == (RunState.COMPLETED, "sent", 2), run
    assert sent == ["report as of attempt 1"]


async def test_a_run_cancelled_while_running_replays_to_its_end(
        store_url: str, registry: durable.Registry) -> None:
    """A replay clears the cancel the operator asked of the run's last attempt: the new
    attempt runs (it is not handed that old cancel, which would end it cancelled again
    without running anything)."""
    entered = anyio.Event()
    calls: list[int] = []

    @durable.activity("c.hold", registry=registry)
    async def hold(ctx: durable.ActivityContext) -> str:
        calls.append(len(calls) + 1)
        if len(calls) == 1:
            entered.set()
            await anyio.sleep_forever()
        return "held"

    @durable.workflow("c.flow", registry=registry)
    async def flow(ctx: durable.WorkflowContext) -> str:
        return str(await hold(ctx))

    async with durable.Client.connect(store_url, registry=registry) as client, \
            running_worker(client, registry):
        await client.start("c.flow", id="cr")
        with anyio.fail_after(10):
            await entered.wait()
        await client.cancel("cr")
        cancelled = await client.wait("cr")
        assert cancelled.state is RunState.CANCELLED
        assert "run_cancel_requested" in kinds(await client.journal("cr"))
        await client.replay("cr")
        done = await client.wait("cr")
    assert done.state is RunState.COMPLETED and done.result == "held"
    assert calls == [1, 2] and not done.cancel_requested


async def test_a_completed_step_a_replay_runs_again_gets_a_new_idempotency_key(
        client: durable.Client, registry: durable.Registry) -> None:
    """A replay from a step asks for a completed step's effect again: the service must not
    take the new call for a retry of the old one, so its idempotency key changes (``~n``
    for the n-th rerun). A step that failed keeps its key (its effect did not happen)."""
    keys: list[tuple[str, str]] = []
    fail = {"three"}

    @durable.activity("idem.call", registry=registry, retry=durable.RetryPolicy(max_tries=1))
    async def call(ctx: durable.ActivityContext, name: str) -> str:
        keys.append((name, ctx.idempotency_key))
        if name in fail:
            raise RuntimeError(f"{name} broke")
        return name

    @durable.workflow("idem", registry=registry)
    async def idem(ctx: durable.WorkflowContext) -> list[str]:
        return [await call(ctx, "one"), await call(ctx, "two"), await call(ctx, "three")]

    async with running_worker(client, registry):
        await client.start("idem", id="k")
        assert (await client.wait("k")).state is RunState.FAILED
        await client.replay("k", from_step=2)
        assert (await client.wait("k")).state is RunState.FAILED
        fail.clear()
        await client.replay("k", from_step=2)
        done = await client.wait("k")
    assert done.state is RunState.COMPLETED
    assert keys == [("one", "k/1"), ("two", "k/2"), ("three", "k/3"),
                    ("two", "k/2~1"), ("three", "k/3"),
                    ("two", "k/2~2"), ("three", "k/3")]


async def test_a_step_first_run_by_a_resumed_attempt_is_numbered_after_the_journaled_ones(
        client: durable.Client, registry: durable.Registry) -> None:
    """Step numbers name steps (``replay --from-step N``, the timeline): a step that a later
    attempt runs for the first time is numbered after every step of the journal, never
    given the number of a journaled one."""
    fail = {"two"}

    @durable.activity("num.call", registry=registry, retry=durable.RetryPolicy(max_tries=1))
    async def call(ctx: durable.ActivityContext, name: str) -> str:
        if name in fail:
            raise RuntimeError(f"{name} broke")
        return name

    @durable.workflow("num", registry=registry)
    async def num(ctx: durable.WorkflowContext) -> list[str]:
        return [await ctx.step(call, "one", key="one"), await ctx.step(call, "two", key="two"),
                await ctx.step(call, "three", key="three")]

    async with running_worker(client, registry):
        await client.start("num", id="n")
        assert (await client.wait("n")).state is RunState.FAILED
        fail.clear()
        await client.replay("n")
        done = await client.wait("n")
    assert done.state is RunState.COMPLETED and done.result == ["one", "two", "three"]
    numbers = {(e.step_key, e.step) for e in await client.journal("n")
               if e.kind.value == "step_started"}
    assert numbers == {("one", 1), ("two", 2), ("three", 3)}
