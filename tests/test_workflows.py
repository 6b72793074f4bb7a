"""Workflows run as journaled steps: results, retries, keys, delays, idempotent starts."""

from __future__ import annotations

import re
from typing import Any

import anyio
import pytest

import durable
from durable import RunState

from .helpers import kinds, running_worker
from .httpserver import Rule, loopback_server

pytestmark = pytest.mark.anyio


async def test_steps_are_journaled_in_order(client: durable.Client,
                                            registry: durable.Registry) -> None:
    calls: list[int] = []

    @durable.activity(registry=registry)
    async def add(ctx: durable.ActivityContext, a: int, b: int) -> int:
        calls.append(ctx.step)
        return a + b

    @durable.workflow("sum", registry=registry)
    async def total(ctx: durable.WorkflowContext, n: int) -> int:
        acc = 0
        for i in range(n):
            acc = await add(ctx, acc, i)
        return acc

    async with running_worker(client, registry):
        run = await client.start("sum", 4, id="s1")
        done = await client.wait(run.id)
    assert done.state is RunState.COMPLETED and done.result == 6
    assert calls == [1, 2, 3, 4]
    journal = await client.journal("s1")
    steps = [(e.step, e.kind.value) for e in journal if e.step is not None]
    assert steps == [(n, k) for n in range(1, 5) for k in ("step_started", "step_completed")]
    assert kinds(journal)[0] == "run_created" and kinds(journal)[-1] == "run_completed"


async def test_start_is_idempotent_by_id(client: durable.Client,
                                         registry: durable.Registry) -> None:
    @durable.workflow("noop", registry=registry)
    async def noop(ctx: durable.WorkflowContext, x: int) -> int:
        return x

    @durable.workflow("other", registry=registry)
    async def other(ctx: durable.WorkflowContext, x: int) -> int:
        return x

    first = await client.start("noop", 1, id="same")
    again = await client.start("noop", 1, id="same")
    assert again.id == first.id and again.created_at == first.created_at
    assert len(await client.list()) == 1
    with pytest.raises(durable.RunConflictError, match="already belongs"):
        await client.start("other", 1, id="same")
    with pytest.raises(durable.RunConflictError):
        await client.start("noop", 2, id="same")
    assert len(await client.list()) == 1


async def test_retries_with_backoff_and_retry_after(client: durable.Client,
                                                    registry: durable.Registry) -> None:
    async with loopback_server() as server:
        server.on("/busy", Rule(status=503, headers={"Retry-After": "0"}, times=2))

        @durable.activity(registry=registry,
                          retry=durable.RetryPolicy(max_tries=4, initial_delay=30))
        async def call(ctx: durable.ActivityContext) -> int:
            response = await ctx.http.get(f"{server.url}/busy")
            response.raise_for_status()
            return response.status_code

        @durable.workflow("retrying", registry=registry)
        async def retrying(ctx: durable.WorkflowContext) -> int:
            return int(await call(ctx))

        async with running_worker(client, registry):
            run = await client.start("retrying", id="r1")
            # initial_delay=30 s would time this out: only Retry-After: 0 lets it finish
            done = await client.wait(run.id, timeout=10)
    assert done.state is RunState.COMPLETED and done.result == 200
    journal = await client.journal("r1")
    assert kinds(journal).count("step_retrying") == 2
    assert [e.try_number for e in journal if e.kind.value == "step_started"] == [1, 2, 3]
    assert all(r.headers["idempotency-key"] == "r1/1" for r in server.seen("/busy"))


async def test_non_retryable_error_fails_at_once(client: durable.Client,
                                                 registry: durable.Registry) -> None:
    tries: list[int] = []

    class Refused(durable.NonRetryableError):
        pass

    @durable.activity(registry=registry, retry=durable.RetryPolicy(max_tries=5))
    async def refuse(ctx: durable.ActivityContext) -> None:
        tries.append(ctx.try_number)
        raise Refused("the service said no")

    @durable.workflow("refusing", registry=registry)
    async def refusing(ctx: durable.WorkflowContext) -> None:
        await refuse(ctx)

    async with running_worker(client, registry):
        run = await client.start("refusing", id="nr")
        done = await client.wait(run.id)
    assert tries == [1]
    assert done.state is RunState.FAILED
    assert done.error is not None and "step 1 (" in done.error
    assert "the service said no" in done.error


async def test_concurrency_key_runs_one_at_a_time(client: durable.Client,
                                                  registry: durable.Registry) -> None:
    running: set[str] = set()
    overlaps: list[set[str]] = []
    gate = anyio.Event()

    @durable.activity(registry=registry)
    async def hold(ctx: durable.ActivityContext, name: str) -> None:
        running.add(name)
        if len(running) > 1:
            overlaps.append(set(running))
        await gate.wait()
        running.discard(name)

    @durable.workflow("slot.op", registry=registry)
    async def op(ctx: durable.WorkflowContext, name: str) -> None:
        await hold(ctx, name)

    async with running_worker(client, registry, concurrency=8):
        for i in range(3):
            await client.start("slot.op", f"a{i}", id=f"a{i}", key="slot-1")
        await client.start("slot.op", "b0", id="b0", key="slot-2")
        with anyio.fail_after(5):
            while len(running) < 2:
                await anyio.sleep(0.01)
        assert (await client.list(state="running")).__len__() == 2
        queued = await client.list(state="queued")
        assert sorted(r.id for r in queued) == ["a1", "a2"]
        gate.set()
        for rid in ("a0", "a1", "a2", "b0"):
            assert (await client.wait(rid)).state is RunState.COMPLETED
    assert all("b0" in o for o in overlaps), overlaps


async def test_delayed_start_can_be_cancelled_before_it_starts(
        client: durable.Client, registry: durable.Registry) -> None:
    ran: list[str] = []

    @durable.workflow("later", registry=registry)
    async def later(ctx: durable.WorkflowContext) -> None:
        ran.append("ran")

    async with running_worker(client, registry):
        run = await client.start("later", id="d1", delay=3600)
        assert run.state is RunState.QUEUED
        cancelled = await client.cancel("d1")
        assert cancelled.state is RunState.CANCELLED
        soon = await client.start("later", id="d2", delay=0.05)
        assert (await client.wait(soon.id)).state is RunState.COMPLETED
    assert ran == ["ran"]
    assert "run_cancelled" in kinds(await client.journal("d1"))
    with pytest.raises(durable.InvalidStateError):
        await client.cancel("d1")


async def test_keyed_concurrent_steps_are_stable_across_replays(
        client: durable.Client, registry: durable.Registry) -> None:
    executed: list[str] = []
    fail_item = {"c"}

    @durable.activity(registry=registry, retry=durable.RetryPolicy(max_tries=1))
    async def make(ctx: durable.ActivityContext, item: str) -> str:
        executed.append(item)
        if item in fail_item:
            raise RuntimeError(f"{item} failed")
        return item.upper()

    @durable.workflow("batch", registry=registry)
    async def batch(ctx: durable.WorkflowContext, items: list[str]) -> list[str]:
        results: dict[str, str] = {}
        limiter = anyio.CapacityLimiter(3)

        async def one(item: str) -> None:
            async with limiter:
                results[item] = await ctx.step(make, item, key=f"item-{item}")

        async with anyio.create_task_group() as tg:
            for item in items:
                tg.start_soon(one, item)
        return [results[i] for i in items]

    items = ["a", "b", "c", "d", "e"]
    async with running_worker(client, registry):
        run = await client.start("batch", items, id="b1")
        failed = await client.wait(run.id)
        assert failed.state is RunState.FAILED
        first_round = list(executed)
        fail_item.clear()
        await client.replay("b1")
        done = await client.wait("b1")
    assert done.state is RunState.COMPLETED and done.result == ["A", "B", "C", "D", "E"]
    # the items that had completed were not executed again
    second_round = executed[len(first_round):]
    completed_first = {
        e.step_key for e in await client.journal("b1")
        if e.kind.value == "step_completed" and e.epoch == failed.epoch
    }
    assert not completed_first & {f"item-{i}" for i in second_round}
    assert "c" in second_round
    keys = {e.step_key: e.step for e in await client.journal("b1") if e.step_key}
    assert len(set(keys.values())) == len(keys)  # one number per key, kept across attempts


async def test_journaled_values_are_the_same_on_replay(client: durable.Client,
                                                       registry: durable.Registry) -> None:
    seen: list[tuple[float, str]] = []
    fail = [True]

    @durable.activity(registry=registry, retry=durable.RetryPolicy(max_tries=1))
    async def maybe(ctx: durable.ActivityContext) -> None:
        if fail[0]:
            raise RuntimeError("first time")

    @durable.workflow("values", registry=registry)
    async def values(ctx: durable.WorkflowContext) -> None:
        seen.append((await ctx.now(), await ctx.uuid4()))
        await maybe(ctx)

    async with running_worker(client, registry):
        await client.start("values", id="v1")
        await client.wait("v1")
        fail[0] = False
        await client.replay("v1")
        assert (await client.wait("v1")).state is RunState.COMPLETED
    assert len(seen) == 2 and seen[0] == seen[1]


async def test_activity_outside_a_workflow_is_a_plain_call(registry: durable.Registry) -> None:
    @durable.activity(registry=registry)
    async def double(ctx: durable.ActivityContext, x: int) -> int:
        await ctx.assert_still_mine()
        return 2 * x

    assert await double(durable.ActivityContext.standalone(), 21) == 42


async def test_a_worker_claims_only_workflows_it_knows(client: durable.Client,
                                                       registry: durable.Registry) -> None:
    @durable.workflow("known", registry=registry)
    async def known(ctx: durable.WorkflowContext) -> str:
        return "ok"

    other = durable.Registry()

    @durable.workflow("elsewhere", registry=other)
    async def elsewhere(ctx: durable.WorkflowContext) -> str:
        return "ok"

    await client.start(elsewhere, id="e1")
    async with running_worker(client, registry):
        await client.start("known", id="k1")
        assert (await client.wait("k1")).state is RunState.COMPLETED
        assert (await client.get("e1")).state is RunState.QUEUED


@pytest.mark.parametrize("options", [
    {"timeout": 0}, {"timeout": -5}, {"timeout": float("nan")}, {"timeout": float("inf")},
    {"timeout": True}, {"delay": float("nan")}, {"delay": float("inf")}, {"delay": -1},
    {"run_at": float("nan")}, {"run_at": float("-inf")},
])
async def test_a_start_with_a_time_it_cannot_use_is_refused_and_writes_nothing(
        client: durable.Client, options: dict[str, object]) -> None:
    """A run's timeout is positive seconds, a delay zero or more, a start time a finite
    time: anything else (0 timed the run out at its first await, NaN and infinity were
    kept and never came) is a ConfigError naming the option, and no run is queued."""
    name = next(iter(options))
    with pytest.raises(durable.ConfigError, match=rf"^{name} must be "):
        await client.start("any.workflow", id="timed", **options)  # type: ignore[arg-type]
    assert await client.list() == []


@pytest.mark.parametrize(("make", "says"), [
    (lambda: durable.RetryPolicy(initial_delay=float("nan")), "RetryPolicy.initial_delay"),
    (lambda: durable.RetryPolicy(max_delay=float("nan")), "RetryPolicy.max_delay"),
    (lambda: durable.RetryPolicy(backoff=float("nan")), "RetryPolicy.backoff"),
    (lambda: durable.RetryPolicy(backoff=float("inf")), "RetryPolicy.backoff"),
    (lambda: durable.RetryPolicy(jitter=float("nan")), "RetryPolicy.jitter"),
    (lambda: durable.activity(timeout=float("nan"))(_no_op), "an activity timeout"),
    (lambda: durable.workflow("nan.timeout", timeout=float("nan"))(_no_flow),
     "a workflow timeout"),
])
def test_a_declared_time_that_is_not_a_finite_number_is_refused(make: Any, says: str) -> None:
    """NaN compares false with every bound, so it passed the range checks: a retry delay
    of NaN, a deadline of NaN. Each is a ConfigError naming the field."""
    refused = rf"^{re.escape(says)} must be .*, not (nan|inf)$"
    with pytest.raises(durable.ConfigError, match=refused):
        make()


async def _no_op(ctx: durable.ActivityContext) -> None: ...


async def _no_flow(ctx: durable.WorkflowContext) -> None: ...


@pytest.mark.parametrize("options", [{"timeout": float("nan")}, {"timeout": 0},
                                     {"poll": float("nan")}, {"poll": 0}])
async def test_a_wait_with_a_time_it_cannot_use_is_refused(
        client: durable.Client, options: dict[str, float]) -> None:
    """NaN raised a ValueError out of anyio; 0 timed out before the first look."""
    run = await client.start("any.workflow", id="waited")
    with pytest.raises(durable.ConfigError, match=rf"^{next(iter(options))} must be "):
        await client.wait(run.id, **options)
