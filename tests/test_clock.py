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
from collections.abc import Mapping, Sequence
from pathlib import Path

import anyio
import pytest

import durable
from durable import RunState
from durable._clock import BootClock
from durable._types import JSON, EntryKind, Fence, JournalWrite, NewRun, Renewal
from durable.store._sqlite import SqliteStore

from .conftest import ROOT, subprocess_env
from .helpers import poll, running_worker
from .httpserver import loopback_server

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


async def test_a_suspend_longer_than_the_lease_stops_requests(
        client: durable.Client, registry: durable.Registry,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The monotonic clock stops while the machine is suspended; the attempt's deadline
    must count that time too, or it sends requests long after its lease expired."""
    resumed = anyio.Event()
    refused: list[int] = []
    async with loopback_server() as server:

        @durable.activity(registry=registry, retry=durable.RetryPolicy(max_tries=1))
        async def call(ctx: durable.ActivityContext) -> None:
            await ctx.http.post(f"{server.url}/before")
            await resumed.wait()
            try:
                await ctx.http.post(f"{server.url}/after")
            except durable.LeaseLostError:
                refused.append(ctx.fencing_token or 0)
                raise

        @durable.workflow("calls", registry=registry)
        async def calls(ctx: durable.WorkflowContext) -> None:
            await call(ctx)

        async with running_worker(client, registry, lease=30.0):
            await client.start("calls", id="c1")
            await server.wait_for(lambda: server.seen("/before"))
            [before] = server.seen("/before")
            real = time.clock_gettime
            # the machine was suspended for an hour: only CLOCK_BOOTTIME moved on
            monkeypatch.setattr("durable._clock.boottime",
                                lambda: real(time.CLOCK_BOOTTIME) + HOUR, raising=False)
            resumed.set()
            await poll(lambda: refused, timeout=10)
        first_epoch = int(before.headers["durable-fencing-token"])
        assert refused[0] == first_epoch
        # a request to /after may only come from a later attempt
        assert all(int(s.headers["durable-fencing-token"]) > first_epoch
                   for s in server.seen("/after"))


class SuspendDuringRenewal(SqliteStore):
    """A real SQLite store; once armed, the machine "suspends" for an hour while a renewal's
    answer is on its way back (after the database judged it, before the worker reads it)."""

    armed = False
    monkeypatch: pytest.MonkeyPatch | None = None

    async def renew(self, worker: str, held: Sequence[Fence], lease: float,
                    details: Mapping[str, JSON] | None = None) -> list[Renewal]:
        answer = await super().renew(worker, held, lease, details)
        if self.armed and self.monkeypatch is not None and answer:
            self.armed = False
            real = time.clock_gettime
            self.monkeypatch.setattr("durable._clock.boottime",
                                     lambda: real(time.CLOCK_BOOTTIME) + HOUR, raising=False)
            self.resumed.set()
        return answer

    resumed: anyio.Event


async def test_a_suspend_during_a_renewal_does_not_extend_the_lease(
        tmp_path: Path, registry: durable.Registry, monkeypatch: pytest.MonkeyPatch) -> None:
    """The renewal's deadline counts from when it was *sent*, on the clock that counts
    suspend: an answer that arrives after an hour's suspend extends nothing."""
    store = SuspendDuringRenewal(str(tmp_path / "d.db"))
    store.monkeypatch = monkeypatch
    store.resumed = anyio.Event()
    await store.open()
    client = durable.Client(store, registry=registry)
    refused: list[int] = []
    try:
        async with loopback_server() as server:

            @durable.activity(registry=registry, retry=durable.RetryPolicy(max_tries=1))
            async def call(ctx: durable.ActivityContext) -> None:
                await ctx.http.post(f"{server.url}/before")
                store.armed = True
                await store.resumed.wait()
                try:
                    await ctx.http.post(f"{server.url}/after")
                except durable.LeaseLostError:
                    refused.append(ctx.fencing_token or 0)
                    raise

            @durable.workflow("calls", registry=registry)
            async def calls(ctx: durable.WorkflowContext) -> None:
                await call(ctx)

            async with running_worker(client, registry, lease=30.0, heartbeat_interval=0.05):
                await client.start("calls", id="c1")
                await poll(lambda: refused, timeout=10)
            [before] = server.seen("/before")
            first_epoch = int(before.headers["durable-fencing-token"])
            assert refused[0] == first_epoch
            assert all(int(s.headers["durable-fencing-token"]) > first_epoch
                       for s in server.seen("/after"))
    finally:
        await store.aclose()
