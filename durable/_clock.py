"""Clocks. Stored times (leases, run_at, journal times) come from the store's one clock.

Leases are written and judged on that clock, so it must not step: a forward step of the
wall clock larger than a lease (an NTP step, a VM resumed from a snapshot) would make a live
attempt's lease look expired, and a reader would recover the run while its attempt still
sends requests. So:

- the SQLite store (one machine) reads :class:`BootClock`: ``CLOCK_BOOTTIME`` (seconds since
  boot, counting suspend, shared by every process of the host, never stepped) plus an anchor
  (the wall time at boot) that the first process to open the database in a boot stores in
  ``durable_meta``, with the boot's id; every later process of that boot reads it, so all
  agree on "now" and a wall-clock step changes nothing. The first open of a new boot expires
  every running lease: the processes that held them died with the previous boot.
- the PostgreSQL store judges time in SQL by the server's clock (``statement_timestamp()``).
- an attempt's local deadline is kept on :func:`boottime` too, so time spent suspended
  (when the monotonic clock stops) counts against it.

Tests inject :class:`FakeClock` (``clock=``), which the stores then use for everything.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

BOOT_ID_FILE = Path("/proc/sys/kernel/random/boot_id")
"""Linux's id of the running boot: a new random UUID at every boot."""

class Clock(Protocol):
    """A source of time in seconds since the epoch."""

    def now(self) -> float: ...


def boottime() -> float:
    """Seconds since boot, counting time suspended; never steps. The monotonic clock where
    the platform has no ``CLOCK_BOOTTIME`` (it stops during suspend there)."""
    return time.clock_gettime(time.CLOCK_BOOTTIME) if _HAS_BOOTTIME else time.monotonic()


_HAS_BOOTTIME = hasattr(time, "CLOCK_BOOTTIME")


def read_boot_id() -> str:
    return BOOT_ID_FILE.read_text().strip()


def boot_clock_supported() -> bool:
    """Whether this platform has what :class:`BootClock` needs (Linux)."""
    return _HAS_BOOTTIME and BOOT_ID_FILE.is_file()


class WallClock:
    """The system's wall clock. It steps; stores do not judge leases on it by default."""

    def now(self) -> float:
        return time.time()


class BootClock:
    """Wall time as of boot plus ``CLOCK_BOOTTIME``: one clock for all processes of a host.

    Readings are seconds since the epoch (for display and absolute ``run_at``), but they move
    with ``CLOCK_BOOTTIME`` only, so a step of the wall clock after the anchor was taken
    changes nothing. Until :meth:`bind_sqlite` adopts the database's anchor, the anchor is
    this process's own guess (wall clock minus boottime when the clock was made).

    ``wall``, ``boottime`` and ``boot_id`` are the sources, injectable for tests.
    """

    def __init__(
        self,
        *,
        wall: Callable[[], float] | None = None,
        boottime: Callable[[], float] | None = None,
        boot_id: Callable[[], str] | None = None,
    ) -> None:
        self._wall = wall or (lambda: time.time())
        self._boottime = boottime or (lambda: _boottime_now())
        self._boot_id = boot_id or read_boot_id
        self.anchor = self._wall() - self._boottime()
        self.boot_id: str | None = None

    def now(self) -> float:
        return self.anchor + self._boottime()

    def current_boot(self) -> str:
        """This boot's id (from the injected source)."""
        return self._boot_id()

    def guess_anchor(self) -> float:
        """The wall time at boot as this process sees it now (wall clock minus boottime)."""
        return self._wall() - self._boottime()

    def adopt(self, boot_id: str, anchor: float) -> None:
        """Use the anchor the database holds for this boot (the store reads and stores it)."""
        self.boot_id, self.anchor = boot_id, anchor


def _boottime_now() -> float:
    return boottime()  # looked up at each call: tests replace durable._clock.boottime


def default_sqlite_clock() -> Clock:
    """The SQLite store's clock when none is injected: :class:`BootClock` where the platform
    has it, else the wall clock (and a wall-clock step can then expire a live lease)."""
    return BootClock() if boot_clock_supported() else WallClock()


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
