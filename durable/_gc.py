"""The worker's garbage-collector policy: no full collection in the middle of a burst.

A claim of 1,000 runs that each await a request keeps about 130 tracked objects alive per
run (the coroutine stack through httpx, httpcore and anyio, cancel scopes, events): about
130,000 new objects within a second. CPython's defaults (thresholds 700, 10, 10) run a
full collection every 10 collections of the middle generation, that is every ~70,000 net
allocations (whenever the objects waiting for one are more than a quarter of those that
survived the last): two or three in such a burst, each walking every tracked object of the
process (70 to 130 ms each on the test machine), a third of the CPU the worker spends
from the claim to its last request (docs/benchmarks.md, target 1).

While a worker runs, :func:`worker_policy` raises the third threshold to at least
:data:`FULL_EVERY` (100): a full collection at most every ~700,000 net allocations, so
bursts of a few thousand runs pass without one, and the collector's own rule (no full
collection before the survivors since the last grew by a quarter) still bounds the work.
The young generations are untouched, so cycles die as young as before; what survives them
waits longer for a full collection (more memory in the meantime, never a leak: the
collection still comes). The previous thresholds come back when the last worker of the
process stops, unless someone set others meanwhile. ``Worker(gc_policy=False)`` leaves
the collector alone.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator

FULL_EVERY = 100
"""The least third threshold while a worker runs: collections of the middle generation
between two full collections (CPython's default: 10)."""

_lock = threading.Lock()
_holders = 0
_saved: tuple[int, int, int] | None = None
_set: tuple[int, int, int] | None = None


@contextlib.contextmanager
def worker_policy(enabled: bool = True) -> Iterator[None]:
    """Hold :data:`FULL_EVERY` for the duration (reference counted across the workers of
    the process, and their threads)."""
    global _holders, _saved, _set
    if not enabled:
        yield
        return
    with _lock:
        _holders += 1
        if _holders == 1:
            current = gc.get_threshold()
            _saved = (current[0], current[1], current[2])
            if _saved[2] < FULL_EVERY:
                _set = (_saved[0], _saved[1], FULL_EVERY)
                gc.set_threshold(*_set)
            else:
                _set = None  # already as high (or set by the application): left alone
    try:
        yield
    finally:
        with _lock:
            _holders -= 1
            if _holders == 0:
                if _set is not None and _saved is not None and gc.get_threshold() == _set:
                    gc.set_threshold(*_saved)  # unless the application changed it since
                _saved = _set = None
