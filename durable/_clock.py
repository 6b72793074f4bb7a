"""Clocks. Stored times (leases, run_at, journal times) come from one injected wall clock."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    """A source of wall-clock time in seconds since the epoch."""

    def now(self) -> float: ...


class WallClock:
    """The system's wall clock."""

    def now(self) -> float:
        return time.time()


class FakeClock:
    """A clock that only moves when told to; for tests of leases, delays and recovery."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self._now = start

    def now(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("a clock cannot go back")
        self._now += seconds

    def set(self, when: float) -> None:
        self._now = when
