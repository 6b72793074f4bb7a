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

import sqlite3
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol

BOOT_ID_FILE = Path("/proc/sys/kernel/random/boot_id")
"""Linux's id of the running boot: a new random UUID at every boot."""

CLOCK_BOOT_ID = "clock_boot_id"
CLOCK_ANCHOR = "clock_anchor"
"""The ``durable_meta`` keys of the SQLite store's clock: the boot id, and the wall time at
boot (seconds since the epoch) as the first process to open the database in it saw it."""


SqliteRunner = Callable[..., Awaitable[Any]]
"""The SQLite store's ``_run(fn, *, write=True)``: runs ``fn(conn)`` in its database thread."""


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

    async def bind_sqlite(self, run: SqliteRunner) -> bool:
        """Adopt the anchor the database holds for this boot, or store one.

        ``run`` is the SQLite store's ``_run`` (a job in its database thread, a write inside
        ``BEGIN IMMEDIATE``). A read first: in a boot whose anchor is stored, opening writes
        nothing. Otherwise a write transaction stores it, checking again under the lock, so
        exactly one process per boot writes the anchor and all others adopt it. When the
        stored boot id is another boot's, that transaction also expires every running lease.
        Returns whether this call stored the anchor.
        """
        if await run(self._adopt, write=False):
            return False
        return bool(await run(self._store_anchor))

    def _adopt(self, conn: sqlite3.Connection) -> bool:
        boot_id = self._boot_id()
        stored = dict(conn.execute(
            "SELECT key, value FROM durable_meta WHERE key IN (?, ?)",
            (CLOCK_BOOT_ID, CLOCK_ANCHOR)).fetchall())
        if stored.get(CLOCK_BOOT_ID) != boot_id or CLOCK_ANCHOR not in stored:
            return False
        self.anchor = float(stored[CLOCK_ANCHOR])
        self.boot_id = boot_id
        return True

    def _store_anchor(self, conn: sqlite3.Connection) -> bool:
        if self._adopt(conn):  # another process stored it since our read
            return False
        boot_id = self._boot_id()
        previous = conn.execute("SELECT 1 FROM durable_meta WHERE key = ?",
                                (CLOCK_BOOT_ID,)).fetchone()
        anchor = self._wall() - self._boottime()
        conn.executemany(
            "INSERT INTO durable_meta (key, value) VALUES (?, ?) "
            "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            [(CLOCK_BOOT_ID, boot_id), (CLOCK_ANCHOR, repr(anchor))])
        self.anchor = anchor
        self.boot_id = boot_id
        if previous is not None:
            # leases of another boot: their holders died with it (one machine). Expired as of
            # now; recovery (the sweep or the read path) requeues and journals them as usual.
            now = self.now()
            conn.execute(
                "UPDATE durable_runs SET lease_expires_at = ? "
                "WHERE state = 'running' AND lease_expires_at > ?", (now, now))
        return True


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
