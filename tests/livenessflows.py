"""Workflows for the liveness tests (tests/test_liveness.py), imported by worker processes.

``live.hold`` writes ``hold`` to a log and waits for a gate file; ``live.spawn`` first starts
a long-lived child process (exec'd, or forked without exec) that outlives its worker, and
writes the child's pid to the log, so the test can kill it. ``live.relay`` sends a GET and
then a DELETE to a loopback server in one step."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import anyio

import durable


def _write(log: str, line: str) -> None:
    with open(log, "a") as f:
        f.write(f"{line}\n")


async def _wait_gate(gate: str) -> None:
    while not Path(gate).exists():
        await anyio.sleep(0.02)  # the activity's own work: waiting for an outside event


@durable.activity("live.hold_step", on_doubt="retry")
async def hold_step(ctx: durable.ActivityContext, log: str, gate: str) -> str:
    _write(log, f"hold:{ctx.fencing_token}")
    await _wait_gate(gate)
    return "held"


@durable.activity("live.spawn_step", on_doubt="retry")
async def spawn_step(ctx: durable.ActivityContext, log: str, gate: str, how: str) -> str:
    if "child:" not in (Path(log).read_text() if Path(log).exists() else ""):
        if how == "exec":
            # close_fds=False on purpose: the lock's descriptor is close-on-exec anyway
            child = subprocess.Popen(  # noqa: ASYNC220 (a child left running on purpose)
                [sys.executable, "-c", "import time; time.sleep(120)"], close_fds=False,
                start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL)
            pid = child.pid
        else:
            pid = os.fork()
            if pid == 0:  # the child: no exec, it only lives on (closing nothing itself)
                os.setsid()
                time.sleep(120)  # noqa: ASYNC251 (the forked child runs no event loop)
                os._exit(0)
        _write(log, f"child:{pid}")
    _write(log, f"hold:{ctx.fencing_token}")
    await _wait_gate(gate)
    return "spawned"


@durable.workflow("live.hold")
async def live_hold(ctx: durable.WorkflowContext, log: str, gate: str) -> str:
    return str(await hold_step(ctx, log, gate))


@durable.workflow("live.spawn")
async def live_spawn(ctx: durable.WorkflowContext, log: str, gate: str, how: str) -> str:
    return str(await spawn_step(ctx, log, gate, how))


@durable.activity("live.read_then_delete", on_doubt="retry")
async def read_then_delete(ctx: durable.ActivityContext, url: str) -> str:
    """Two requests in one step, as a teardown's look-then-delete: a GET, then a DELETE."""
    await ctx.http.get(f"{url}/read")
    await ctx.http.delete(f"{url}/thing")
    return "deleted"


@durable.workflow("live.relay")
async def live_relay(ctx: durable.WorkflowContext, url: str) -> str:
    return str(await read_then_delete(ctx, url))
