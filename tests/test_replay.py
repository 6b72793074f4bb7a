"""Replay: completed steps return their journaled results; nothing is ever deleted."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

import durable
from durable import RunState

from .helpers import kinds, poll, running_worker

pytestmark = pytest.mark.anyio


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
