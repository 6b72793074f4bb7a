"""Workflows for the console's browser tests, run by a worker subprocess.

Steps wait for files the test creates (``gate``), so the test decides when each step ends
without sleeping: the activity polls its file, bounded by its own timeout.
"""

from __future__ import annotations

from pathlib import Path

import anyio

import durable

SECRET = "sk-live-5e2f8a90c1d3"


@durable.activity("console.wait_for", timeout=60)
async def wait_for(ctx: durable.ActivityContext, path: str) -> str:
    while not Path(path).exists():
        await anyio.sleep(0.02)
    ctx.annotate(f"gate {Path(path).name} opened")
    return Path(path).name


@durable.activity("console.note")
async def note(ctx: durable.ActivityContext, text: str) -> str:
    ctx.annotate(text)
    return text


@durable.activity("console.careless")
async def careless(ctx: durable.ActivityContext) -> None:
    ctx.annotate(f"called with Authorization: Bearer {SECRET}")


@durable.activity("console.boom", retry=durable.RetryPolicy(max_tries=1))
async def boom(ctx: durable.ActivityContext, what: str) -> None:
    raise RuntimeError(f"{what}: the PaaS answered 500 (token={SECRET})")


@durable.workflow("console.gated")
async def gated(ctx: durable.WorkflowContext, folder: str, steps: int) -> int:
    for i in range(steps):
        await ctx.step(wait_for, f"{folder}/step-{i + 1}")
    return steps


@durable.workflow("console.many")
async def many(ctx: durable.WorkflowContext, steps: int) -> int:
    for i in range(steps):
        await ctx.step(note, f"step {i + 1} of {steps}")
    return steps


@durable.workflow("console.fails")
async def fails(ctx: durable.WorkflowContext, folder: str) -> None:
    await ctx.step(note, "deleted the database")
    await ctx.step(careless)
    await ctx.step(boom, "deleting the volume")


@durable.workflow("console.batch")
async def batch(ctx: durable.WorkflowContext, folder: str, total: int) -> int:
    await ctx.items(total)
    limiter = anyio.CapacityLimiter(3)

    async def item(i: int) -> None:
        async with limiter:
            await ctx.step(wait_for, f"{folder}/item-{i}", key=f"item-{i}")

    async with anyio.create_task_group() as tg:
        for i in range(total):
            tg.start_soon(item, i)
    return total


@durable.activity("console.plan")
async def plan(ctx: durable.ActivityContext, what: str) -> dict[str, object]:
    return {"title": f"This run will delete {what}:",
            "items": [{"action": "delete", "kind": "database", "id": what,
                       "detail": "postgres, 3 GB"}]}


@durable.workflow("console.approved")
async def approved(ctx: durable.WorkflowContext, what: str) -> str:
    await durable.approval_gate(ctx, plan, what)
    return str(await ctx.step(note, f"deleted {what}"))


@durable.workflow("console.waits")
async def waits(ctx: durable.WorkflowContext) -> object:
    return await ctx.wait_for("go")


@durable.workflow("console.fails_later")
async def fails_later(ctx: durable.WorkflowContext, folder: str) -> None:
    await ctx.step(wait_for, f"{folder}/fail")
    await ctx.step(boom, "deleting the volume")
