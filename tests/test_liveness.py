"""Crash → resumed on one machine: a lock the kernel keeps tells a dead worker (its runs are
taken over at once, whatever the lease) from a frozen one (its runs wait for the lease).

Real worker processes on a real SQLite file, SIGKILL and SIGSTOP; no timing assertions:
"before the lease expired" is the run's new epoch seen while the old lease is still ahead."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from contextlib import closing, contextmanager, suppress
from pathlib import Path

import anyio
import pytest

import durable
from durable import RunState, _liveness
from durable.store._sqlite import SqliteStore

from . import livenessflows
from .conftest import ROOT
from .helpers import kinds, poll, python_process, running_worker
from .httpserver import Rule, loopback_server

pytestmark = pytest.mark.anyio


@contextmanager
def worker_process(db_url: str, backend: str, *extra: str) -> Iterator[subprocess.Popen[bytes]]:
    log = Path(db_url.removeprefix("sqlite:///")).with_suffix(".worker.log")
    with python_process(
        ["-m", "durable.worker", "--db", db_url, "--import", "tests.livenessflows",
         "--poll", "0.05", "--log-level", "warning", "--backend", backend, *extra],
        log,
    ) as proc:
        yield proc


def lines(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


def folder_of(db_url: str) -> Path:
    return _liveness.lock_dir(db_url.removeprefix("sqlite:///"))


async def held_by_process(client: durable.Client, run_id: str) -> durable.Run:
    """The run once its first attempt runs in the worker process."""
    async def running() -> durable.Run | None:
        run = await client.store.get_run(run_id)
        return run if run is not None and run.state is RunState.RUNNING else None
    run: durable.Run = await poll(running, timeout=20)
    return run


async def holding_in_process(client: durable.Client, log: Path, run_id: str) -> durable.Run:
    """The run once the worker process's step holds it (``hold:`` in the step's log)."""
    await poll(lambda: any(x.startswith("hold:") for x in lines(log)), timeout=20)
    return await held_by_process(client, run_id)


async def taken_over(client: durable.Client, before: durable.Run) -> durable.Run:
    """The run under a newer epoch (claimed again), asserting the old lease still held."""
    async def newer() -> durable.Run | None:
        run = await client.store.get_run(before.id)
        return run if run is not None and run.epoch > before.epoch else None
    run: durable.Run = await poll(newer, timeout=20, interval=0.005)
    assert before.lease_expires_at is not None
    assert await client.store.now() < before.lease_expires_at  # before the lease expired
    return run


async def test_a_sigkilled_worker_is_taken_over_before_its_lease_expires(
        db_url: str, tmp_path: Path, anyio_backend: str) -> None:
    log, gate = tmp_path / "log.txt", tmp_path / "gate"
    async with durable.Client.connect(db_url) as client:
        await client.start("live.hold", str(log), str(gate), id="d1")
        with worker_process(db_url, anyio_backend, "--lease", "30") as proc:
            await poll(lambda: any(x.startswith("hold:") for x in lines(log)), timeout=20)
            before = await held_by_process(client, "d1")
            [name] = os.listdir(folder_of(db_url))  # the process's own lock file
            assert name == _liveness.lock_name(before.worker or "")
            assert (folder_of(db_url) / name).stat().st_mode & 0o777 == 0o600
            async with running_worker(client, durable.default_registry, lease=30.0,
                                      liveness_interval=0.02):
                assert (await client.get("d1")).epoch == before.epoch  # alive: kept
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
                after = await taken_over(client, before)
                assert after.state is RunState.RUNNING and after.worker != before.worker
                gate.touch()
                done = await client.wait("d1", timeout=20)
            assert done.state is RunState.COMPLETED and done.result == "held"
        journal = await client.journal("d1")
        [recovered] = [e for e in journal if e.kind.value == "run_recovered"]
        assert recovered.data["worker_died"] is True
        assert recovered.data["worker"] == before.worker
        assert kinds(journal).count("run_claimed") == 2
        assert (await client.get("d1")).recoveries == 1
        assert name not in os.listdir(folder_of(db_url))  # the dead worker's file went


async def test_a_sigstopped_worker_keeps_its_run_while_its_lease_holds(
        db_url: str, tmp_path: Path, anyio_backend: str) -> None:
    log, gate = tmp_path / "log.txt", tmp_path / "gate"
    async with durable.Client.connect(db_url) as client:
        await client.start("live.hold", str(log), str(gate), id="s1")
        with worker_process(db_url, anyio_backend, "--lease", "30") as proc:
            await poll(lambda: any(x.startswith("hold:") for x in lines(log)), timeout=20)
            before = await held_by_process(client, "s1")
            async with running_worker(client, durable.default_registry, lease=30.0,
                                      liveness_interval=0.02) as other:
                os.kill(proc.pid, signal.SIGSTOP)
                try:
                    # frozen, not dead: its lock is held, so nothing is taken over
                    folder = folder_of(db_url)
                    assert _liveness.dead_lock_files(folder) == []
                    name = _liveness.lock_name(before.worker or "")
                    assert await other.take_over_dead(folder, {name}) == []
                    run = await client.get("s1")
                    assert run.epoch == before.epoch and run.worker == before.worker
                finally:
                    os.kill(proc.pid, signal.SIGCONT)
                gate.touch()
                done = await client.wait("s1", timeout=20)
        assert done.state is RunState.COMPLETED and done.epoch == before.epoch
        assert "run_recovered" not in kinds(await client.journal("s1"))


async def test_a_sigstopped_worker_loses_its_run_when_its_lease_lapses(
        db_url: str, tmp_path: Path, anyio_backend: str) -> None:
    log, gate = tmp_path / "log.txt", tmp_path / "gate"
    async with durable.Client.connect(db_url) as client:
        await client.start("live.hold", str(log), str(gate), id="s2")
        with worker_process(db_url, anyio_backend, "--lease", "2") as proc:
            await poll(lambda: any(x.startswith("hold:") for x in lines(log)), timeout=20)
            before = await held_by_process(client, "s2")
            os.kill(proc.pid, signal.SIGSTOP)
            try:
                async with running_worker(client, durable.default_registry, lease=2.0,
                                          liveness_interval=0.02):
                    async def newer() -> durable.Run | None:
                        run = await client.store.get_run("s2")
                        return run if run is not None and run.epoch > before.epoch else None
                    await poll(newer, timeout=30)
                    assert before.lease_expires_at is not None
                    assert await client.store.now() >= before.lease_expires_at
                    gate.touch()
                    done = await client.wait("s2", timeout=20)
            finally:
                os.kill(proc.pid, signal.SIGCONT)
        assert done.state is RunState.COMPLETED and done.epoch > before.epoch
        [recovered] = [e for e in await client.journal("s2") if e.kind.value == "run_recovered"]
        assert "worker_died" not in recovered.data  # the lease lapsed: not a death


async def freeze_outside_a_transaction(proc: subprocess.Popen[bytes], db: str) -> None:
    """SIGSTOP the worker, again if it stopped inside a write transaction (its renewal's,
    rarely): one that holds SQLite's write lock lets nobody take its runs over."""
    with anyio.fail_after(10):
        while True:
            os.kill(proc.pid, signal.SIGSTOP)
            with closing(sqlite3.connect(db, timeout=0, isolation_level=None)) as probe:
                try:
                    probe.execute("BEGIN IMMEDIATE")
                except sqlite3.OperationalError:  # locked: by the frozen worker, or another
                    os.kill(proc.pid, signal.SIGCONT)
                    await anyio.sleep(0.01)  # a moment for it to commit, then try again
                    continue
                probe.execute("ROLLBACK")
                return


async def test_a_worker_frozen_past_its_lease_mid_request_sends_nothing_once_thawed(
        db_url: str, tmp_path: Path, anyio_backend: str) -> None:
    """The faults together that the torture run meets only by chance: a worker frozen
    (SIGSTOP) with a request at the service, past its lease, holding its liveness lock (so
    its run is taken over by the lease, not as a death); the service answers it while it
    is frozen; it is thawed while its successor's own request is in flight and while the
    database is busy, so no renewal can answer it. The thawed attempt holds the answer to
    its GET and its step's next call is a DELETE: it must send nothing and write nothing
    (the service's ledger and the journal say so)."""
    token = durable.FENCING_HEADER.lower()
    answer_frozen, answer_successor = anyio.Event(), anyio.Event()
    async with loopback_server() as server, durable.Client.connect(db_url) as client:
        server.on("/read", Rule(answer_after=answer_frozen, times=1))
        server.on("/read", Rule(answer_after=answer_successor, times=1))
        await client.start("live.relay", server.url, id="f1")
        db = db_url.removeprefix("sqlite:///")
        log = Path(db).with_suffix(".worker.log")
        with worker_process(db_url, anyio_backend, "--lease", "2") as proc:
            await server.wait_for(lambda: len(server.seen("/read")) == 1, timeout=20)
            before = await held_by_process(client, "f1")
            await freeze_outside_a_transaction(proc, db)
            try:
                async with running_worker(client, durable.default_registry, lease=2.0,
                                          liveness_interval=0.02):
                    # taken over once the lease lapsed (the frozen worker's lock is held)
                    await server.wait_for(lambda: len(server.seen("/read")) == 2, timeout=30)
                    first, second = server.seen("/read")
                    assert (first.headers[token], second.headers[token]) == (
                        str(before.epoch), str(before.epoch + 1))
                    answer_frozen.set()  # the answer lands in the frozen worker's socket
                    await server.wait_for(lambda: first.answered_at is not None)
                    # the database busy at the thaw (its write lock held, as by another
                    # worker frozen in a transaction): no renewal can tell the thawed
                    # worker that its lease is gone; its own deadline must
                    with closing(sqlite3.connect(db, timeout=10, isolation_level=None)) as busy:
                        busy.execute("BEGIN IMMEDIATE")
                        os.kill(proc.pid, signal.SIGCONT)
                        await poll(lambda: "attempt_abandoned" in log.read_text()
                                   or server.seen("/thing"), timeout=20)
                        busy.execute("ROLLBACK")
                    answer_successor.set()
                    done = await client.wait("f1", timeout=20)
            finally:
                os.kill(proc.pid, signal.SIGCONT)
        journal = await client.journal("f1")
    assert done.state is RunState.COMPLETED and done.epoch == before.epoch + 1
    # nothing of the frozen attempt reached the service after its first request
    assert [(r.method, r.headers[token]) for r in server.seen()] == [
        ("GET", str(before.epoch)), ("GET", str(done.epoch)), ("DELETE", str(done.epoch))]
    claimed = [e.seq for e in journal if e.kind.value == "run_claimed"][-1]
    assert all(e.epoch == done.epoch for e in journal if e.seq > claimed)
    [recovered] = [e for e in journal if e.kind.value == "run_recovered"]
    assert "worker_died" not in recovered.data  # taken over by the lease: the lock was held


@pytest.mark.parametrize("how", ["exec", "fork"])
async def test_a_child_that_outlives_its_worker_does_not_keep_it_alive(
        db_url: str, tmp_path: Path, anyio_backend: str, how: str) -> None:
    log, gate = tmp_path / "log.txt", tmp_path / "gate"
    child = 0
    try:
        async with durable.Client.connect(db_url) as client:
            await client.start("live.spawn", str(log), str(gate), how, id="c1")
            with worker_process(db_url, anyio_backend, "--lease", "30") as proc:
                await poll(lambda: any(x.startswith("hold:") for x in lines(log)), timeout=20)
                [child] = [int(x.split(":")[1]) for x in lines(log) if x.startswith("child:")]
                before = await held_by_process(client, "c1")
                async with running_worker(client, durable.default_registry, lease=30.0,
                                          liveness_interval=0.02):
                    os.kill(proc.pid, signal.SIGKILL)  # the worker only: the child lives on
                    proc.wait(timeout=10)
                    os.kill(child, 0)  # still alive
                    await taken_over(client, before)
                    gate.touch()
                    done = await client.wait("c1", timeout=20)
            assert done.state is RunState.COMPLETED
    finally:
        if child:
            with suppress(ProcessLookupError):  # the dead worker's child: init reaps it
                os.kill(child, signal.SIGKILL)


async def test_a_clean_stop_removes_the_lock_file_and_a_dead_idle_workers_file_goes(
        db_url: str, tmp_path: Path, anyio_backend: str) -> None:
    folder = folder_of(db_url)
    with worker_process(db_url, anyio_backend) as proc:
        await poll(lambda: folder.is_dir() and len(os.listdir(folder)) == 1, timeout=20)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=15)
    assert os.listdir(folder) == []
    with worker_process(db_url, anyio_backend) as proc:
        await poll(lambda: len(os.listdir(folder)) == 1, timeout=20)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    [stale] = os.listdir(folder)  # a dead worker's file stays...
    async with durable.Client.connect(db_url) as client:
        async with running_worker(client, durable.default_registry, liveness_interval=0.02):
            await poll(lambda: stale not in os.listdir(folder), timeout=20)  # ...till found
            assert len(os.listdir(folder)) == 1  # the live worker's own
        assert os.listdir(folder) == []


def test_lock_names_are_one_per_worker_id() -> None:
    ids = ["host:1:abc", "host%3A1%3Aabc", "a/b", "a%2Fb", "", ".", "..", "x" * 300,
           "x" * 299, "é", "%C3%A9", "=abc"]
    names = [_liveness.lock_name(i) for i in ids]
    assert len(set(names)) == len(names)
    assert all("/" not in n and len(n) < 255 and n not in (".lock",) for n in names)


def test_the_lock_is_exclusive_within_a_process_and_probes_do_not_drop_it(
        tmp_path: Path) -> None:
    folder = tmp_path / "db-workers"
    lock = _liveness.hold(folder, "w1")
    with _liveness.probe_dead(folder, "w1") as dead:
        assert not dead
    with pytest.raises(_liveness.InUseError):
        _liveness.hold(folder, "w1", attempts=2)
    assert _liveness.dead_lock_files(folder) == []  # the probes closed, the lock held
    lock.forget()  # as a death: the descriptor closes, the file stays
    assert _liveness.dead_lock_files(folder) == [_liveness.lock_name("w1")]
    with _liveness.probe_dead(folder, "w1") as dead:
        assert dead
    assert os.listdir(folder) == []
    with _liveness.probe_dead(folder, "w1") as dead:  # no file proves nothing
        assert not dead


def test_a_dead_workers_file_that_a_new_process_of_its_id_holds_is_not_removed(
        tmp_path: Path) -> None:
    """A dead worker's file is listed as dead, then a new process of that id takes its lock
    before the file is cleaned up: the clean-up takes the lock again first, so it leaves
    the file of the live process (whose death it must prove later), and a third process of
    the id is still refused."""
    folder = tmp_path / "db-workers"
    _liveness.hold(folder, "w3").forget()  # as a death: the file stays, unlocked
    [name] = _liveness.dead_lock_files(folder)
    live = _liveness.hold(folder, "w3")  # a new process of the id, on the same file
    assert not _liveness.remove_if_dead(folder, name)
    assert os.listdir(folder) == [name]
    with pytest.raises(_liveness.InUseError):
        _liveness.hold(folder, "w3", attempts=2)
    live.release()
    assert os.listdir(folder) == []


def test_an_exec_child_never_holds_the_lock(tmp_path: Path) -> None:
    folder = tmp_path / "db-workers"
    lock = _liveness.hold(folder, "w2")
    code = ("import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDWR); "
            "fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB); print('got it')")
    # the child opens the file itself: only its own, inherited descriptors could help it
    child = subprocess.run([sys.executable, "-c", code, str(lock.path)], close_fds=False,
                           capture_output=True, text=True, cwd=ROOT, timeout=30)
    assert child.returncode != 0 and "BlockingIOError" in child.stderr
    lock.release()


async def test_stores_without_liveness_recover_nothing_early() -> None:
    store = SqliteStore(":memory:")
    assert store.liveness_dir() is None
    assert livenessflows.live_hold.name == "live.hold"
