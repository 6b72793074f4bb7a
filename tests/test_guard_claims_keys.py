"""A run waiting behind its concurrency key is no candidate of a claim: it is left out by
the claim's own conditions (claimable_where), not by the one-running-run-per-key index,
whose violation would make the whole statement claim nothing, the free runs beside it too.

Real stores (a SQLite file, PostgreSQL)."""

from __future__ import annotations

import pytest

from durable._clock import FakeClock
from durable._types import NewRun
from durable.store import Store
from tests.pg import pg_url, postgres_server
from tests.test_store_contract import clock, store, store_url

__all__ = ["clock", "pg_url", "postgres_server", "store", "store_url"]  # test_store_contract.py

pytestmark = pytest.mark.anyio

LEASE = 30.0


async def test_a_run_waiting_behind_its_running_key_does_not_stop_a_claim_of_free_runs(
        store: Store, clock: FakeClock) -> None:
    await store.create_run(NewRun("k1", "wf", [], "K", None))
    [k1] = await store.claim("w1", LEASE, 10)
    assert k1.id == "k1"
    clock.advance(1)
    await store.create_run(NewRun("k2", "wf", [], "K", None))  # first in the queue
    clock.advance(1)
    await store.create_run(NewRun("free", "wf", [], None, None))
    claimed = await store.claim("w2", LEASE, 10)
    assert [r.id for r in claimed] == ["free"]
    assert [r.id for r in await store.claimable("w2", 10)] == []
