"""A run not due yet, started while every slot of the worker is taken, is claimed when it is
due, not at the worker's poll (docs/design.md, "A timer does not wait for a poll").

Found by the mutant sweep: the claim loop, woken by the start with no free slot, waited
without bounding its wait by the next due run, counting on the next attempt's end to wake
it; but that end's finish carried a claim (``Worker._carry``), whose read found nothing due
and said nothing more was queued, so the end did not wake the loop (``_claims_after``) and
the delayed run waited for the poll (60 s here). Now a wake while no slot is free is owed
to the next end that frees one. On SQLite the worker's own commit usually wakes the loop
through ``data_version``, so the SQLite case runs with the store's change signals off;
PostgreSQL missed it with its signals on.
"""

from __future__ import annotations

import anyio
import pytest

import durable
from durable import RunState
from durable.store import Store

from .helpers import poll
from .pg import pg_url, postgres_server
from .test_claim_wakes import opened
from .test_store_contract import store_url
from .test_wake import worker_on

__all__ = ["pg_url", "postgres_server", "store_url"]  # fixtures

pytestmark = pytest.mark.anyio

LONG = 60.0
BOUND = 10.0  # the run is due 1 s after its start: reaching this means the poll was needed


async def _is(client: durable.Client, run_id: str, state: RunState) -> bool:
    return (await client.get(run_id)).state is state


async def delayed_start_behind_a_busy_slot(store: Store, registry: durable.Registry) -> None:
    gate = anyio.Event()

    @durable.workflow("due.held", registry=registry)
    async def held(ctx: durable.WorkflowContext) -> str:
        await gate.wait()
        return "held"

    @durable.workflow("due.quick", registry=registry)
    async def quick(ctx: durable.WorkflowContext) -> str:
        return "quick"

    client = durable.Client(store, registry=registry)
    async with worker_on(store, registry, concurrency=1):
        with anyio.fail_after(BOUND):
            await client.start(held, id="busy")
            await poll(lambda: _is(client, "busy", RunState.RUNNING))
            await client.start(quick, id="later", delay=1.0)
            gate.set()
        with anyio.move_on_after(BOUND):  # due 1 s after its start
            await client.wait("later", poll=LONG)
    assert (await client.get("later")).state is RunState.COMPLETED, "claimed at the poll"


async def test_a_delayed_start_made_while_every_slot_was_taken_is_claimed_when_due(
        store_url: str, registry: durable.Registry) -> None:
    async with opened(store_url, signals=store_url.startswith("postgresql")) as store:
        await delayed_start_behind_a_busy_slot(store, registry)
