"""While a worker runs, the collector walks young objects less often and a burst of new
objects makes no full collection (durable/_gc.py).

A claim of a thousand runs allocates ~130,000 objects that stay alive while the runs wait
for their responses; CPython's default thresholds run two or three full collections in such
a burst (a third of the worker's CPU from the claim to its last request), and a young
collection every 700 net allocations walks what the runs in flight hold for a few
milliseconds. The worker raises the first threshold and sets the third while it runs, and
gives the previous ones back when the last worker of the process stops.
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
    # than the policy's spacing of full collections (FULL_SPACING net allocations)
    count = max(280_000, len(gc.get_objects()) // 4 + 100_000)
    assert count < _gc.FULL_SPACING * 0.9, "a process this large: the test cannot tell"
    gc.callbacks.append(callback)
    try:
        alive = [[] for _ in range(count)]
    finally:
        gc.callbacks.remove(callback)
    del alive
    return len(seen)


def young_collections_while_objects_come_and_go() -> int:
    """Young collections while runs in flight each hold objects for a moment: batches of
    5,000 new objects, each batch freed before the next (from a fresh count)."""
    seen: list[int] = []

    def callback(phase: str, info: dict[str, Any]) -> None:
        if phase == "start" and info["generation"] == 0:
            seen.append(1)

    gc.collect()
    gc.callbacks.append(callback)
    try:
        for _ in range(40):
            held = [[] for _ in range(5_000)]
            del held
    finally:
        gc.callbacks.remove(callback)
    return len(seen)


def policy() -> tuple[int, int, int]:
    """What the defaults become: a full collection every 20,000 x 10 x 4 = 800,000 net
    allocations (at least FULL_SPACING), the third threshold counting on from the middle
    collections made since the last full one."""
    return (_gc.YOUNG_EVERY, 10, 4 + gc.get_count()[2])


def test_the_defaults_run_full_and_young_collections_in_such_bursts() -> None:
    """The premise (CPython's rules): what the policy is there to prevent."""
    assert full_collections_during_a_burst() >= 1
    assert young_collections_while_objects_come_and_go() >= 100  # one per 700


async def test_a_running_worker_defers_collections_and_restores_the_thresholds(
        client: durable.Client, registry: durable.Registry) -> None:
    async with running_worker(client, registry):
        assert gc.get_threshold() == policy()
        assert full_collections_during_a_burst() == 0
        assert young_collections_while_objects_come_and_go() == 0
    assert gc.get_threshold() == DEFAULTS


async def test_the_thresholds_come_back_when_the_last_worker_stops(
        client: durable.Client, registry: durable.Registry) -> None:
    async with running_worker(client, registry):
        async with running_worker(client, registry):
            assert gc.get_threshold()[:2] == (_gc.YOUNG_EVERY, 10)
        assert gc.get_threshold()[:2] == (_gc.YOUNG_EVERY, 10)  # the other still runs
    assert gc.get_threshold() == DEFAULTS


async def test_gc_policy_false_leaves_the_collector_alone(
        client: durable.Client, registry: durable.Registry) -> None:
    async with running_worker(client, registry, gc_policy=False):
        assert gc.get_threshold() == DEFAULTS
        assert full_collections_during_a_burst() >= 1
        assert young_collections_while_objects_come_and_go() >= 100


@pytest.mark.parametrize("current, wanted", [
    ((50_000, 10, 10), (50_000, 10, 10)),  # as few collections already: untouched
    ((0, 10, 10), (0, 10, 10)),  # automatic collection off: the application's choice
    ((700, 10, 500), (20_000, 10, 18)),  # young raised; full ones no more often than before
    ((1_000, 5, 2), (20_000, 5, 7)),  # full ones every 700,000 at least (20,000 x 5 x 7)
])
def test_the_policy_never_asks_for_more_collections(
        current: tuple[int, int, int], wanted: tuple[int, int, int]) -> None:
    assert _gc.policy_thresholds(current) == wanted
    if wanted != current:  # middle collections since the last full one count on
        assert _gc.policy_thresholds(current, 7) == (*wanted[:2], wanted[2] + 7)


def test_the_first_full_collection_is_a_whole_spacing_away() -> None:
    """Under the defaults, middle collections since the last full one have counted towards
    the next: the policy's lower third threshold must not make that next one come in the
    first burst."""
    gc.collect()
    for _ in range(9):  # nine middle collections since the full one: one short of it
        gc.collect(1)
    assert gc.get_count()[2] == 9
    with _gc.worker_policy():
        assert gc.get_threshold() == (_gc.YOUNG_EVERY, 10, 4 + 9)
        seen: list[int] = []

        def callback(phase: str, info: dict[str, Any]) -> None:
            if phase == "start" and info["generation"] == 2:
                seen.append(1)

        gc.callbacks.append(callback)
        try:
            alive = [[] for _ in range(600_000)]  # 30 young, 3 middle collections
        finally:
            gc.callbacks.remove(callback)
        del alive
        assert seen == []
    assert gc.get_threshold() == DEFAULTS


async def test_thresholds_the_application_sets_are_kept(
        client: durable.Client, registry: durable.Registry) -> None:
    gc.set_threshold(50_000, 10, 500)  # as few collections already: not touched
    async with running_worker(client, registry):
        assert gc.get_threshold() == (50_000, 10, 500)
    assert gc.get_threshold() == (50_000, 10, 500)
    gc.set_threshold(*DEFAULTS)
    async with running_worker(client, registry):
        gc.set_threshold(1000, 10, 10)  # changed while the worker ran: not undone
    assert gc.get_threshold() == (1000, 10, 10)
