"""While a worker runs, a burst of new objects makes no full garbage collection (durable/_gc.py).

A claim of a thousand runs allocates ~130,000 objects that stay alive while the runs wait
for their responses; CPython's default thresholds run two or three full collections in such
a burst (a third of the worker's CPU from the claim to its last request). The worker
raises the third threshold while it runs and gives the previous ones back when the last
worker of the process stops.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import Any

import pytest

import durable
from durable import _gc

from .helpers import running_worker

pytestmark = pytest.mark.anyio

DEFAULTS = (700, 10, 10)


@pytest.fixture(autouse=True)
def default_thresholds() -> Iterator[None]:
    before = gc.get_threshold()
    gc.set_threshold(*DEFAULTS)
    try:
        yield
    finally:
        gc.set_threshold(*before)


def full_collections_during_a_burst() -> int:
    """Full collections while objects that stay alive are made, as many as a claim of a few
    thousand waiting runs holds (from a fresh count: ``gc.collect()`` first)."""
    seen: list[int] = []

    def callback(phase: str, info: dict[str, Any]) -> None:
        if phase == "start" and info["generation"] == 2:
            seen.append(1)

    gc.collect()
    # enough survivors that CPython's rule (those since the last full collection above a
    # quarter of the process's) lets a full collection run, few enough that they make fewer
    # than FULL_EVERY collections of generation 1 (one per ~7,000 net allocations)
    count = max(280_000, len(gc.get_objects()) // 4 + 100_000)
    assert count < 7_000 * _gc.FULL_EVERY * 0.9, "a process this large: the test cannot tell"
    gc.callbacks.append(callback)
    try:
        alive = [[] for _ in range(count)]
    finally:
        gc.callbacks.remove(callback)
    del alive
    return len(seen)


def test_the_defaults_run_full_collections_in_such_a_burst() -> None:
    """The premise (CPython's rule): what the policy is there to prevent."""
    assert full_collections_during_a_burst() >= 1


async def test_a_running_worker_defers_full_collections_and_restores_the_thresholds(
        client: durable.Client, registry: durable.Registry) -> None:
    async with running_worker(client, registry):
        assert gc.get_threshold() == (700, 10, _gc.FULL_EVERY)
        assert full_collections_during_a_burst() == 0
    assert gc.get_threshold() == DEFAULTS


async def test_the_thresholds_come_back_when_the_last_worker_stops(
        client: durable.Client, registry: durable.Registry) -> None:
    async with running_worker(client, registry):
        async with running_worker(client, registry):
            assert gc.get_threshold()[2] == _gc.FULL_EVERY
        assert gc.get_threshold()[2] == _gc.FULL_EVERY  # the other still runs
    assert gc.get_threshold() == DEFAULTS


async def test_gc_policy_false_leaves_the_collector_alone(
        client: durable.Client, registry: durable.Registry) -> None:
    async with running_worker(client, registry, gc_policy=False):
        assert gc.get_threshold() == DEFAULTS
        assert full_collections_during_a_burst() >= 1


async def test_thresholds_the_application_sets_are_kept(
        client: durable.Client, registry: durable.Registry) -> None:
    gc.set_threshold(700, 10, 500)  # higher already: not lowered, not touched
    async with running_worker(client, registry):
        assert gc.get_threshold() == (700, 10, 500)
    assert gc.get_threshold() == (700, 10, 500)
    gc.set_threshold(*DEFAULTS)
    async with running_worker(client, registry):
        gc.set_threshold(1000, 10, 10)  # changed while the worker ran: not undone
    assert gc.get_threshold() == (1000, 10, 10)
