"""The worker's garbage-collector policy: fewer collections of young objects, and no full
collection in the middle of a burst.

A claim of 1,000 runs that each await a request keeps about 130 tracked objects alive per
run (the coroutine stack through httpx, httpcore and anyio, cancel scopes, events): about
130,000 new objects within a second. CPython's defaults (thresholds 700, 10, 10) run a
full collection every 10 collections of the middle generation, that is every ~70,000 net
allocations (whenever the objects waiting for one are more than a quarter of those that
survived the last): two or three in such a burst, each walking every tracked object of the
process (70 to 130 ms each on the test machine), a third of the CPU the worker spends
from the claim to its last request (docs/benchmarks.md, target 1).

And a young collection every 700 net allocations walks, each time, the objects that the
runs in flight keep alive for a few milliseconds (a step's entries, its coroutine frames,
the batch it waits in): with a thousand runs in flight, a young object is alive at one or
two collections before it dies by its reference count, and is walked again in the middle
generation. 1,000 concurrent runs of 5 steps on PostgreSQL spent a quarter of the worker's
time in the collector (2.6 of 9.6 s for 5,000 runs; docs/benchmarks.md, target 7).

While a worker runs, :func:`worker_policy` sets:

- the first threshold to at least :data:`YOUNG_EVERY` (20,000 net allocations): most
  short-lived objects die by their reference count before any collection sees them;
  cycles wait longer to be collected (a few megabytes at most);
- the third so that a full collection comes at most every :data:`FULL_SPACING` (~700,000)
  net allocations, never more often than the thresholds it found would have: bursts of a
  few thousand runs pass without one, and the collector's own rule (no full collection
  before the survivors since the last grew by a quarter) still bounds the work.

What survives waits longer for a full collection
(more memory in the meantime, never a leak: the collection still comes). The previous
thresholds come back when the last worker of the process stops, unless someone set
others meanwhile; thresholds that already ask for as few collections are left alone, and
so is a collector whose automatic collections are off (first threshold 0).
``Worker(gc_policy=False)`` leaves the collector alone.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator

YOUNG_EVERY = 20_000
"""The least first threshold while a worker runs: net allocations of tracked objects
between two collections of the young generation (CPython's default: 700)."""

FULL_SPACING = 700_000
"""The fewest net allocations between two full collections while a worker runs (CPython's
defaults: 70,000); the third threshold is set to give at least this spacing."""


def policy_thresholds(current: tuple[int, int, int],
                      middle_done: int = 0) -> tuple[int, int, int]:
    """The thresholds a worker runs with, from the process's ``current`` ones: the first
    at least :data:`YOUNG_EVERY`, the middle one as it is, and the third giving a full
    collection no more often than every :data:`FULL_SPACING` net allocations, nor more
    often than ``current`` would. ``middle_done``: the middle-generation collections
    since the last full one (``gc.get_count()[2]``), which the third threshold counts
    too: added, so that the first full collection is a whole spacing away as well."""
    young, middle, old = current
    if young <= 0:  # automatic collection is off: the application's choice
        return current
    raised = max(young, YOUNG_EVERY)
    per_old = max(middle, 1)
    spacing = young * per_old * max(old, 1)
    if raised == young and spacing >= FULL_SPACING:
        return current
    wanted = max(spacing, FULL_SPACING)
    return (raised, middle, max(1, -(-wanted // (raised * per_old))) + middle_done)


_lock = threading.Lock()
_holders = 0
_saved: tuple[int, int, int] | None = None
_set: tuple[int, int, int] | None = None


@contextlib.contextmanager
def worker_policy(enabled: bool = True) -> Iterator[None]:
    """Hold :func:`policy_thresholds` for the duration (reference counted across the
    workers of the process, and their threads)."""
    global _holders, _saved, _set
    if not enabled:
        yield
        return
    with _lock:
        _holders += 1
        if _holders == 1:
            current = gc.get_threshold()
            _saved = (current[0], current[1], current[2])
            wanted = policy_thresholds(_saved, gc.get_count()[2])
            if wanted != _saved:
                _set = wanted
                gc.set_threshold(*_set)
            else:
                _set = None  # already as few collections (or set so): left alone
    try:
        yield
    finally:
        with _lock:
            _holders -= 1
            if _holders == 0:
                if _set is not None and _saved is not None and gc.get_threshold() == _set:
                    gc.set_threshold(*_saved)  # unless the application changed it since
                _saved = _set = None
