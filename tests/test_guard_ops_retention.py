"""Retention prunes only what it was asked for: finished runs of the states named that
ended before the cutoff. Every other run keeps its row and its whole journal."""

from __future__ import annotations

import pytest

import durable
from durable._clock import FakeClock
from durable._retention import prune
from durable._types import RunState
from durable.store._seed import Seed, seed_finished_runs
from tests.pg import pg_url, postgres_server
from tests.test_store_contract import opened, store_url

__all__ = ["pg_url", "postgres_server", "store_url"]  # the stores: test_store_contract.py

pytestmark = pytest.mark.anyio

NOW = 1_800_000_000.0
DAY = 86400.0


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(NOW)


async def test_prune_leaves_a_young_run_and_a_state_not_asked_for_with_their_journals(
        store_url: str, clock: FakeClock) -> None:
    async with opened(store_url, clock) as store:
        await seed_finished_runs(store, [
            Seed("old-completed", "r.flow", RunState.COMPLETED, NOW - 40 * DAY),
            Seed("old-failed", "r.flow", RunState.FAILED, NOW - 40 * DAY),
            Seed("young-completed", "r.flow", RunState.COMPLETED, NOW - DAY)])
        pruned: list[object] = []
        assert await prune(store, 30 * DAY, (RunState.COMPLETED,), seen=pruned.append) == 1
        assert [p.id for p in pruned] == ["old-completed"]  # type: ignore[attr-defined]
        assert await store.get_run("old-completed") is None
        for kept in ("old-failed", "young-completed"):
            assert await store.get_run(kept) is not None, kept
            assert await store.get_pruned(kept) is None, kept
            assert len(await store.journal(kept)) == 3, kept


async def test_a_negative_age_is_refused_and_prunes_nothing(
        store_url: str, clock: FakeClock) -> None:
    async with opened(store_url, clock) as store:
        await seed_finished_runs(store, [Seed("just-done", "r.flow", RunState.COMPLETED, NOW)])
        with pytest.raises(durable.ConfigError, match="must not be negative"):
            await prune(store, -60.0)
        assert await store.get_run("just-done") is not None
        assert len(await store.journal("just-done")) == 3
