"""Workflows that worker subprocesses in the crash tests import (default registry).

Each activity appends a line to a log file, so the test can count real executions across
processes; ``hold`` blocks until a gate file appears, so the test can kill the worker while
the step is in flight.
"""

from __future__ import annotations

from pathlib import Path

import anyio

import durable


@durable.activity("crash.mark")
async def mark(ctx: durable.ActivityContext, log: str, name: str) -> str:
    with open(log, "a") as f:
        f.write(f"{name}\n")
    return name


async def _hold(log: str, gate: str) -> None:
    with open(log, "a") as f:
        f.write("hold\n")
    while not Path(gate).exists():
        await anyio.sleep(0.02)  # the activity's own work: waiting for an outside event


@durable.activity("crash.hold_idempotent", on_doubt="retry")
async def hold_idempotent(ctx: durable.ActivityContext, log: str, gate: str) -> None:
    await _hold(log, gate)


@durable.activity("crash.hold_once", on_doubt="fail")
async def hold_once(ctx: durable.ActivityContext, log: str, gate: str) -> None:
    await _hold(log, gate)


@durable.workflow("crash.retry")
async def crash_retry(ctx: durable.WorkflowContext, log: str, gate: str) -> str:
    await mark(ctx, log, "one")
    await mark(ctx, log, "two")
    await hold_idempotent(ctx, log, gate)
    return str(await mark(ctx, log, "three"))


@durable.workflow("crash.fail")
async def crash_fail(ctx: durable.WorkflowContext, log: str, gate: str) -> str:
    await mark(ctx, log, "one")
    await mark(ctx, log, "two")
    await hold_once(ctx, log, gate)
    return str(await mark(ctx, log, "three"))


@durable.workflow("crash.count")
async def crash_count(ctx: durable.WorkflowContext, log: str, gate: str) -> None:
    await hold_idempotent(ctx, f"{log}.holds", gate)
    for step in ("a", "b", "c"):
        await mark(ctx, log, f"{ctx.workflow_id}:{step}:{ctx.epoch}")


@durable.activity("crash.kill_worker")
async def kill_worker(ctx: durable.ActivityContext, log: str) -> None:
    """A poison pill: kills the worker process that runs it, every time."""
    import os
    import signal

    with open(log, "a") as f:
        f.write(f"kill:{ctx.try_number}\n")
    os.kill(os.getpid(), signal.SIGKILL)


@durable.workflow("crash.poison")
async def crash_poison(ctx: durable.WorkflowContext, log: str) -> None:
    await mark(ctx, log, "before")
    await kill_worker(ctx, log)


@durable.activity("crash.git_push", on_doubt="fail")
async def git_push(ctx: durable.ActivityContext, work: str, remote: str, sha: str) -> str:
    from activities import git

    return (await git.push(work, remote, "main", src=sha, ctx=ctx)).sha


@durable.workflow("crash.push")
async def crash_push(ctx: durable.WorkflowContext, work: str, remote: str, sha: str) -> str:
    return str(await git_push(ctx, work, remote, sha))
