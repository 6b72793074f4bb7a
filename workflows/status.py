"""What a waiting screen shows for a slot's reset: found by a direct query, never guessed.

The incident's screen scanned the 40 newest jobs; past 40 it answered "none", and the client
showed "none" as "reset finished". Here the latest reset of a slot is one indexed query
(``client.latest``), and a run that cannot be found reads as ``"unknown"``, whose message
says so: it is never shown as success.
"""

from __future__ import annotations

from typing import Literal

import durable

from .records import read_slot

__all__ = ["MESSAGES", "Status", "reset_message", "reset_status", "run_status", "status_of"]

Status = Literal["done", "failed", "cancelled", "running", "unknown"]

MESSAGES: dict[Status, str] = {
    "done": "Reset finished: the slot is vacant.",
    "failed": "Reset failed: the slot stays occupied; its state reason says what was done.",
    "cancelled": "Reset cancelled before it finished: the slot stays occupied, and what the "
                 "reset had already done stays done (the run's report lists it).",
    "running": "Reset in progress.",
    "unknown": "Cannot confirm the reset: no run was found. This is not a success.",
}


def status_of(run: durable.Run | None) -> Status:
    """Map a run (or its absence) to what a user is told; absence is ``"unknown"``."""
    if run is None:
        return "unknown"
    state = run.state
    if state is durable.RunState.COMPLETED:
        return "done"
    if state is durable.RunState.FAILED:
        return "failed"
    if state is durable.RunState.CANCELLED:
        return "cancelled"
    return "running"  # queued (a delayed start counts) or running


async def reset_status(client: durable.Client, slot: str) -> Status:
    """The status of the latest ``slot.reset`` of ``slot``, by a direct query.

    What the user is told about the slot follows the slot's record, not only the run's
    state: once the reset's fenced write has marked the slot vacant (the record says so,
    written by this run), the reset is ``"done"``, even if the run then failed, was
    cancelled or is still sending its notification. Otherwise the run's state decides, so
    ``"failed"`` ("the slot stays occupied") is said only of a slot this run did not vacate.
    """
    return await _reset_status(client, slot, await client.latest("slot.reset", slot))


async def _reset_status(client: durable.Client, slot: str, run: durable.Run | None) -> Status:
    if run is None:
        return "unknown"
    record = await read_slot(client, slot)
    if record is not None and record.updated_by == run.id and record.occupancy == "vacant":
        return "done"
    return status_of(run)


async def reset_message(client: durable.Client, slot: str) -> str:
    """What the waiting screen says of the latest reset of ``slot``: its status's message
    and, for a failed or cancelled reset, the run's recovery report: what it had already
    done (deleted), what is in doubt, a link to each step and to the run. A cancel or a
    failure mid-way leaves deletions behind; the message never reads as "nothing happened".
    """
    run = await client.latest("slot.reset", slot)
    status = await _reset_status(client, slot, run)
    if run is None or status not in ("failed", "cancelled"):
        return MESSAGES[status]
    return f"{MESSAGES[status]}\n{(await client.report(run.id)).text()}"


async def run_status(client: durable.Client, run_id: str) -> Status:
    """The status of run ``run_id``; a run that cannot be found is ``"unknown"``."""
    return status_of(await client.find(run_id))
