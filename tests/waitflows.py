"""Workflows that wait durably, imported by worker subprocesses (default registry) in the
durable waiting tests (tests/test_timers.py, tests/test_signals.py). Each activity appends a
line to a log file, so a test can count real executions across processes."""

from __future__ import annotations

import durable


@durable.activity("wait.mark")
async def mark(ctx: durable.ActivityContext, log: str, name: str) -> str:
    with open(log, "a") as f:
        f.write(f"{name}\n")
    return name


@durable.workflow("wait.nap")
async def nap(ctx: durable.WorkflowContext, log: str) -> str:
    await mark(ctx, log, "one")
    await ctx.sleep(3600)
    return str(await mark(ctx, log, "two"))


@durable.workflow("wait.approval")
async def approval(ctx: durable.WorkflowContext, log: str) -> object:
    await mark(ctx, log, "asked")
    answer = await ctx.wait_for("approve")
    await mark(ctx, log, f"got-{answer}")
    return answer
