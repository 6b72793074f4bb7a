"""Workflows for the claim-rides tests (tests/test_claim_rides.py), imported by a worker
process.

``ride.first`` runs one no-op step. ``ride.second`` first writes ``code`` to a log and, with
``where="code"`` and no gate file yet, blocks its worker's event loop in its workflow code,
before any journal write (so before its claim can commit); otherwise its one step writes
``step`` and waits for the gate."""

from __future__ import annotations

import time
from pathlib import Path

import anyio

import durable


def _write(log: str, line: str) -> None:
    with open(log, "a") as f:
        f.write(f"{line}\n")


@durable.activity("ride.noop")
async def ride_noop(ctx: durable.ActivityContext, i: int) -> int:
    return i


@durable.activity("ride.hold")
async def ride_hold(ctx: durable.ActivityContext, log: str, gate: str) -> str:
    _write(log, "step")
    while not Path(gate).exists():
        await anyio.sleep(0.02)  # the activity's own work: waiting for an outside event
    return "held"


@durable.workflow("ride.first")
async def ride_first(ctx: durable.WorkflowContext) -> int:
    return int(await ride_noop(ctx, 1))


@durable.workflow("ride.second")
async def ride_second(ctx: durable.WorkflowContext, log: str, gate: str, where: str) -> str:
    if where == "code" and not Path(gate).exists():
        _write(log, "code")
        time.sleep(120)  # noqa: ASYNC251 (on purpose: nothing else of this worker runs)
    return str(await ride_hold(ctx, log, gate))
