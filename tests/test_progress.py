"""Per-item progress of a batch run (``ctx.items``), derived from the journal.

What an operator's progress bar must never do: count an item in doubt as done, keep counting
a failed item as failed once a replay is redoing it, or change its total when a replayed
attempt's code computes another one.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest

import durable
from durable import EntryKind, RunState
from durable._progress import Progress, item_states, progress
from durable._report import render_timeline
from durable._shapes import show_json

from .helpers import poll, running_worker

pytestmark = pytest.mark.anyio


def _batch(registry: durable.Registry, gates: dict[int, anyio.Event],
           failing: set[int]) -> None:
    """``prog.batch(n)``: item i waits for ``gates[i]`` (if any), fails if in ``failing``."""

    # on_doubt="fail": each completion is committed at once (an idempotent step's rides on
    # the next journal write), so the test sees every item's outcome as it happens
    @durable.activity("prog.item", registry=registry, on_doubt="fail",
                      retry=durable.RetryPolicy(max_tries=1))
    async def item(ctx: durable.ActivityContext, i: int) -> int:
        if i in gates:
            await gates[i].wait()
        if i in failing:
            raise RuntimeError(f"item {i} broke")
        return i

    @durable.workflow("prog.batch", registry=registry)
    async def batch(ctx: durable.WorkflowContext, n: int) -> int:
        await ctx.items(n)
        errors: list[str] = []

        async def one(i: int) -> None:
            try:
                await ctx.step(item, i, key=f"item-{i}")
            except durable.ActivityError as exc:
                errors.append(str(exc))

        async with anyio.create_task_group() as tg:
            for i in range(n):
                tg.start_soon(one, i)
        if errors:
            raise RuntimeError("; ".join(errors))
        return n


async def _progress(client: durable.Client, run_id: str) -> Progress | None:
    return progress(await client.get(run_id), await client.journal(run_id))


async def test_progress_counts_items_as_they_run_fail_and_are_replayed(
        client: durable.Client, registry: durable.Registry) -> None:
    gates = {i: anyio.Event() for i in range(4)}
    failing = {2}
    _batch(registry, gates, failing)
    async with running_worker(client, registry):
        await client.start("prog.batch", 5, id="b")
        # item 4 has no gate: done at once; the others are in flight until their gate opens
        seen = await poll(lambda: _wanted(client, "b", done=1, in_flight=4))
        assert seen == Progress(total=5, done=1, failed=0, in_flight=4, in_doubt=0, pending=0)
        gates[0].set()
        await poll(lambda: _wanted(client, "b", done=2, in_flight=3))
        gates[2].set()
        await poll(lambda: _wanted(client, "b", done=2, failed=1, in_flight=2))
        gates[1].set()
        gates[3].set()
        failed = await client.wait("b")
    assert failed.state is RunState.FAILED
    assert await _progress(client, "b") == Progress(5, 4, 1, 0, 0, 0)
    states = item_states(failed, await client.journal("b"))
    assert states is not None and states["item-2"] == "failed"

    # a replay will run the failed item again: it is pending, not failed, until it runs
    await client.replay("b")
    assert await _progress(client, "b") == Progress(5, 4, 0, 0, 0, 1)
    failing.clear()
    async with running_worker(client, registry):
        done = await client.wait("b")
    assert done.state is RunState.COMPLETED, done.error
    assert await _progress(client, "b") == Progress(5, 5, 0, 0, 0, 0)
    data = show_json(done, await client.journal("b"))
    assert data["progress"] == {"total": 5, "done": 5, "failed": 0, "in_flight": 0,
                                "in_doubt": 0, "pending": 0}


async def _wanted(client: durable.Client, run_id: str, **counts: int) -> Progress | None:
    found = await _progress(client, run_id)
    if found is None or any(getattr(found, k) != v for k, v in counts.items()):
        return None
    return found


async def test_an_item_cut_off_by_a_cancel_is_in_doubt_never_done(
        client: durable.Client, registry: durable.Registry) -> None:
    gates = {1: anyio.Event()}  # never set: item 1 is in flight until the cancel
    _batch(registry, gates, set())
    async with running_worker(client, registry):
        await client.start("prog.batch", 3, id="c")
        await poll(lambda: _wanted(client, "c", done=2, in_flight=1))
        await client.cancel("c")
        cancelled = await client.wait("c")
    assert cancelled.state is RunState.CANCELLED
    assert await _progress(client, "c") == Progress(3, 2, 0, 0, 1, 0)


async def test_a_run_that_declares_no_items_has_no_progress(
        client: durable.Client, registry: durable.Registry) -> None:
    @durable.workflow("prog.plain", registry=registry)
    async def plain(ctx: durable.WorkflowContext) -> float:
        return await ctx.now()

    async with running_worker(client, registry):
        await client.start("prog.plain", id="p")
        done = await client.wait("p")
    assert done.state is RunState.COMPLETED
    assert await _progress(client, "p") is None
    assert show_json(done, await client.journal("p"))["progress"] is None


async def test_items_not_started_are_pending_and_zero_items_is_a_total(
        client: durable.Client, registry: durable.Registry) -> None:
    release = anyio.Event()

    @durable.workflow("prog.slow", registry=registry)
    async def slow(ctx: durable.WorkflowContext, n: int) -> None:
        await ctx.items(n, key_prefix="file:")
        await release.wait()  # declared, nothing started yet

    async with running_worker(client, registry):
        await client.start("prog.slow", 3, id="s3")
        await client.start("prog.slow", 0, id="s0")
        await poll(lambda: _wanted(client, "s3", pending=3))
        await poll(lambda: _wanted(client, "s0", total=0))
        release.set()
        await client.wait("s3")
        await client.wait("s0")
    assert await _progress(client, "s0") == Progress(0, 0, 0, 0, 0, 0)


async def test_a_replayed_attempt_keeps_the_journaled_declaration(
        client: durable.Client, registry: durable.Registry) -> None:
    calls: list[int] = []

    @durable.workflow("prog.changing", registry=registry)
    async def changing(ctx: durable.WorkflowContext) -> None:
        calls.append(1)
        await ctx.items(len(calls) * 10)  # another total on each attempt
        if len(calls) == 1:
            raise RuntimeError("first attempt fails")

    async with running_worker(client, registry):
        await client.start("prog.changing", id="r")
        await client.wait("r")
        await client.replay("r")
        done = await client.wait("r")
    assert done.state is RunState.COMPLETED, done.error
    assert len(calls) == 2
    journal = await client.journal("r")
    declared = [e for e in journal if e.name == "durable.items"]
    assert len(declared) == 1 and declared[0].kind is EntryKind.VALUE
    assert declared[0].data["result"] == {"total": 10, "key_prefix": "item-"}
    found = await _progress(client, "r")
    assert found is not None and found.total == 10


@pytest.mark.parametrize(("args", "needle"), [
    ((-1,), "total must be a whole number >= 0, not -1"),
    (("3",), "not '3'"),
    ((True,), "not True"),
    ((2.0,), "not 2.0"),
    ((3, ""), "key_prefix must be a non-numeric string"),
    ((3, "7"), "key_prefix must be a non-numeric string"),
])
async def test_a_bad_declaration_is_a_config_error_and_journals_nothing(
        client: durable.Client, registry: durable.Registry, args: tuple[Any, ...],
        needle: str) -> None:
    caught: list[BaseException] = []

    @durable.workflow("prog.bad", registry=registry)
    async def bad(ctx: durable.WorkflowContext) -> None:
        try:
            await ctx.items(*args)
        except durable.ConfigError as exc:
            caught.append(exc)
            raise

    async with running_worker(client, registry):
        await client.start("prog.bad", id="x")
        failed = await client.wait("x")
    assert failed.state is RunState.FAILED
    assert len(caught) == 1 and needle in str(caught[0])
    assert failed.error is not None and needle in failed.error
    journal = await client.journal("x")
    assert not [e for e in journal if e.name == "durable.items"]
    assert await _progress(client, "x") is None


async def test_the_report_does_not_list_the_declaration_as_a_step(
        client: durable.Client, registry: durable.Registry) -> None:
    _batch(registry, {}, set())
    async with running_worker(client, registry):
        await client.start("prog.batch", 2, id="rep")
        done = await client.wait("rep")
    assert done.state is RunState.COMPLETED, done.error
    report = await client.report("rep")
    assert sorted(s.key for s in report.completed) == ["item-0", "item-1"]
    assert "durable.items" not in report.text()
    # the timeline shows it as the journaled value it is, saying what was declared
    text = render_timeline(done, await client.journal("rep"), width=120)
    assert "2 items: item-0, item-1" in text


async def test_an_item_waiting_to_be_tried_again_is_in_flight(
        client: durable.Client, registry: durable.Registry) -> None:
    @durable.activity("prog.flaky", registry=registry, on_doubt="fail",
                      retry=durable.RetryPolicy(max_tries=3, initial_delay=60, jitter=0))
    async def flaky(ctx: durable.ActivityContext) -> None:
        raise RuntimeError("not yet")

    @durable.workflow("prog.retrying", registry=registry)
    async def retrying(ctx: durable.WorkflowContext) -> None:
        await ctx.items(1)
        await ctx.step(flaky, key="item-0")

    async with running_worker(client, registry):
        await client.start("prog.retrying", id="w")
        journal = await poll(lambda: _retrying(client, "w"))
        assert progress(await client.get("w"), journal) == Progress(1, 0, 0, 1, 0, 0)
        await client.cancel("w")  # ends the wait for the next try
        cancelled = await client.wait("w")
    assert cancelled.state is RunState.CANCELLED
    assert await _progress(client, "w") == Progress(1, 0, 0, 0, 0, 1)  # never retried


async def _retrying(client: durable.Client, run_id: str) -> list[durable.JournalEntry] | None:
    journal = await client.journal(run_id)
    # a 60 s delay releases the run to wait for the next try (durable waiting)
    last = [e.kind for e in journal if e.kind is not EntryKind.RUN_WAITING][-1]
    return journal if last is EntryKind.STEP_RETRYING else None
