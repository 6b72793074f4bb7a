"""Leases are judged on a clock that cannot step (issue 8, item 5), on SQLite.

A lease is stored as an expiry time and judged against "now". Read from ``time.time()``, a
forward step of the wall clock larger than the lease (an NTP step, a VM resumed from a
snapshot) made a live attempt's lease look expired, so a reader recovered the run while its
attempt went on sending requests. The SQLite store now reads a boot-relative clock that every
process of the host shares (``CLOCK_BOOTTIME`` plus an anchor stored in the database), and the
attempt's local deadline also counts time spent suspended.

Why the wall clock is stepped by patching ``time.time`` rather than for real: stepping the
system clock needs CAP_SYS_TIME and would step it for every process on this shared machine.
The store reads the wall clock through ``time.time``, so a patched ``time.time`` is, as far as
the code under test can tell, a stepped wall clock. Suspend is simulated the same way, by
moving ``durable._clock.boottime`` (the suspend-counting clock) forward.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import anyio
import pytest

import durable
from durable import RunState
from durable._clock import BootClock
from durable._types import EntryKind, Fence, JournalWrite, NewRun
from durable.store._sqlite import SqliteStore

from .conftest import ROOT, subprocess_env
from .helpers import poll

pytestmark = pytest.mark.anyio

HOUR = 3600.0


def step_wall_clock(monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    """Step this process's wall clock (``time.time``) by ``seconds`` from now on."""
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + seconds)


async def test_a_forward_wall_step_does_not_let_a_reader_recover_a_live_run(
        client: durable.Client, registry: durable.Registry,
        monkeypatch: pytest.MonkeyPatch) -> None:
    @durable.workflow("noop", registry=registry)
    async def noop(ctx: durable.WorkflowContext) -> None:
        return None

    await client.start("noop", id="r1")
    [run] = await client.store.claim("worker-a", 30.0, 1)
    step_wall_clock(monkeypatch, HOUR)  # far more than the 30 s lease
    assert await client.store.recover_stale() == []
    seen = await client.get("r1")  # the read path's recovery
    assert seen.state is RunState.RUNNING and seen.epoch == run.epoch
    # the attempt's fenced writes still hold: it is the one holder
    assert await client.store.append(Fence("r1", run.epoch),
                                     [JournalWrite(EntryKind.STEP_STARTED, step=1, name="x")])


async def test_a_backward_wall_step_does_not_keep_a_dead_worker_lease_alive(
        client: durable.Client, registry: durable.Registry,
        monkeypatch: pytest.MonkeyPatch) -> None:
    @durable.workflow("noop", registry=registry)
    async def noop(ctx: durable.WorkflowContext) -> None:
        return None

    await client.start("noop", id="r1")
    [run] = await client.store.claim("dead-worker", 0.2, 1)  # nobody renews it
    step_wall_clock(monkeypatch, -HOUR)
    # judged on the wall clock, the lease would look valid for another hour
    recovered = await poll(lambda: client.store.recover_stale("r1", run.epoch), timeout=5)
    assert recovered == [Fence("r1", run.epoch)]


SUBPROCESS_NOW = """
import sys, time
real = time.time
time.time = lambda: real() + float(sys.argv[2])
import anyio
from durable.store._sqlite import SqliteStore

async def main():
    store = SqliteStore(sys.argv[1])
    await store.open()
    try:
        print(store.clock.now())
    finally:
        await store.aclose()

anyio.run(main)
"""


async def test_processes_with_different_wall_clocks_agree_on_now(tmp_path: Path) -> None:
    """The first process to open the database in a boot stores the anchor; every other
    process reads it, so a process whose wall clock is an hour off still agrees."""
    path = tmp_path / "d.db"
    store = SqliteStore(str(path))
    await store.open()
    try:
        def other_process() -> float:
            out = subprocess.run(
                [sys.executable, "-c", SUBPROCESS_NOW, str(path), str(HOUR)], cwd=ROOT,
                env=subprocess_env(), capture_output=True, text=True, timeout=60, check=True)
            return float(out.stdout.strip())

        before = store.clock.now()
        theirs = await anyio.to_thread.run_sync(other_process)
        after = store.clock.now()
        assert before <= theirs <= after
        conn = sqlite3.connect(path)
        meta = dict(conn.execute(
            "SELECT key, value FROM durable_meta WHERE key LIKE 'clock_%'").fetchall())
        conn.close()
        assert meta["clock_boot_id"] == Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        # the anchor is the wall time at boot, as this process saw it at the first open
        assert abs(float(meta["clock_anchor"]) + time.clock_gettime(time.CLOCK_BOOTTIME)
                   - time.time()) < 5
    finally:
        await store.aclose()


async def test_leases_from_a_previous_boot_count_as_expired(tmp_path: Path) -> None:
    path = tmp_path / "d.db"
    store = SqliteStore(str(path))
    await store.open()
    try:
        await store.create_run(NewRun("r1", "wf", [], None, store.clock.now(), None))
        [run] = await store.claim("worker-before-reboot", HOUR, 1)
    finally:
        await store.aclose()
    # the database as a previous boot left it: another boot id
    conn = sqlite3.connect(path)
    with conn:
        conn.execute("UPDATE durable_meta SET value = 'a-previous-boot' "
                     "WHERE key = 'clock_boot_id'")
    conn.close()
    store = SqliteStore(str(path))
    await store.open()
    try:
        # the worker that held the lease died with its boot: recovery need not wait an hour
        assert await store.recover_stale() == [Fence("r1", run.epoch)]
        assert not await store.append(Fence("r1", run.epoch),
                                      [JournalWrite(EntryKind.STEP_STARTED, step=1, name="x")])
    finally:
        await store.aclose()


async def test_the_first_open_of_a_boot_expires_leases_once(tmp_path: Path) -> None:
    """A later open in the same boot (another process) leaves running leases alone."""
    path = tmp_path / "d.db"
    wall = [1_800_000_000.0]
    boot = [100.0]

    def clock(boot_id: str) -> BootClock:
        return BootClock(wall=lambda: wall[0], boottime=lambda: boot[0], boot_id=lambda: boot_id)

    first = SqliteStore(str(path), clock=clock("boot-1"))
    await first.open()
    await first.create_run(NewRun("r1", "wf", [], None, first.clock.now(), None))
    [run] = await first.claim("w", 30.0, 1)
    wall[0] += HOUR  # the wall clock steps; boottime does not
    second = SqliteStore(str(path), clock=clock("boot-1"))
    await second.open()
    try:
        assert first.clock.now() == second.clock.now() == 1_800_000_000.0
        assert await second.recover_stale() == []
        boot[0] += 31  # the lease passes on the shared clock
        assert await second.recover_stale() == [Fence("r1", run.epoch)]
    finally:
        await second.aclose()
        await first.aclose()
    # a new boot: boottime restarts near zero, the anchor is taken again
    boot[0] = 5.0
    third = SqliteStore(str(path), clock=clock("boot-2"))
    await third.open()
    try:
        assert third.clock.now() == wall[0]
    finally:
        await third.aclose()


async def test_the_sqlite_store_defaults_to_the_boot_clock(tmp_path: Path) -> None:
    store = SqliteStore(str(tmp_path / "d.db"))
    assert isinstance(store.clock, BootClock)
    fake = durable.FakeClock()
    assert SqliteStore(str(tmp_path / "e.db"), clock=fake).clock is fake
