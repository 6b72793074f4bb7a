"""Real worker processes: SIGKILL mid-run and resume; graceful shutdown on SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import anyio
import pytest

import durable
from durable import RunState

from . import crashflows
from .githttp import commit, git
from .helpers import kinds, poll, python_process, running_worker
from .ops import alive

pytestmark = pytest.mark.anyio


@contextmanager
def worker_process(db_url: str, *extra: str) -> Iterator[subprocess.Popen[bytes]]:
    log = Path(db_url.removeprefix("sqlite:///")).with_suffix(".worker.log")
    with python_process(
        ["-m", "durable.worker", "--db", db_url, "--import", "tests.crashflows",
         "--poll", "0.05", "--log-level", "warning", *extra],
        log,
    ) as proc:
        yield proc


def lines(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path]:
    return tmp_path / "log.txt", tmp_path / "gate"


@pytest.mark.parametrize("workflow", ["crash.retry", "crash.fail"])
async def test_sigkill_mid_run_then_another_worker_resumes(
        db_url: str, files: tuple[Path, Path], workflow: str, anyio_backend: str) -> None:
    log, gate = files
    async with durable.Client.connect(db_url) as client:
        await client.start(workflow, str(log), str(gate), id="k1")
        with worker_process(db_url, "--lease", "1", "--backend", anyio_backend) as proc:
            await poll(lambda: "hold" in lines(log), timeout=20)
            os.killpg(proc.pid, signal.SIGKILL)  # no finally, no exit hook runs
            proc.wait(timeout=10)
        assert lines(log) == ["one", "two", "hold"]
        assert (await client.store.get_run("k1")).state is RunState.RUNNING  # type: ignore[union-attr]
        gate.touch()
        async with running_worker(client, durable.default_registry, lease=1.0,
                                  sweep_interval=0.05):
            done = await client.wait("k1", timeout=20)
        journal = await client.journal("k1")
        assert "run_recovered" in kinds(journal)
        [doubt] = [e for e in journal if e.kind.value == "step_in_doubt"]
        assert doubt.step == 3
        if workflow == "crash.retry":
            # completed steps did not run again; the idempotent in-doubt step did
            assert done.state is RunState.COMPLETED and done.result == "three"
            assert lines(log) == ["one", "two", "hold", "hold", "three"]
        else:
            assert done.state is RunState.FAILED
            assert done.error is not None
            assert "step 3 (crash.hold_once)" in done.error and "outcome is unknown" in done.error
            assert lines(log) == ["one", "two", "hold"]
            # the operator checked: it did take effect; count it as done and go on
            await client.replay("k1", in_doubt="accept")
            async with running_worker(client, durable.default_registry):
                done = await client.wait("k1", timeout=20)
            assert done.state is RunState.COMPLETED
            assert lines(log) == ["one", "two", "hold", "three"]


async def test_sigterm_releases_the_lease_for_an_immediate_resume(
        db_url: str, files: tuple[Path, Path], anyio_backend: str) -> None:
    log, gate = files
    async with durable.Client.connect(db_url) as client:
        await client.start("crash.retry", str(log), str(gate), id="g1")
        with worker_process(db_url, "--lease", "600", "--grace", "0.2",
                            "--backend", anyio_backend) as proc:
            await poll(lambda: "hold" in lines(log), timeout=20)
            proc.send_signal(signal.SIGTERM)
            with anyio.fail_after(15):
                while proc.poll() is None:
                    await anyio.sleep(0.02)
            assert proc.returncode == 0
        run = await client.get("g1")
        # a 600 s lease, yet the run is back in the queue at once
        assert run.state is RunState.QUEUED and run.lease_expires_at is None
        journal = await client.journal("g1")
        assert kinds(journal)[-2:] == ["step_in_doubt", "run_interrupted"]
        gate.touch()
        async with running_worker(client, durable.default_registry):
            done = await client.wait("g1", timeout=20)
        assert done.state is RunState.COMPLETED
        assert lines(log) == ["one", "two", "hold", "hold", "three"]


def test_crashflows_module_is_importable() -> None:
    assert crashflows.crash_retry.name == "crash.retry"


async def test_several_worker_processes_share_one_sqlite_file(
        db_url: str, tmp_path: Path, anyio_backend: str) -> None:
    log, gate = tmp_path / "count.txt", tmp_path / "gate"
    runs = 120
    async with durable.Client.connect(db_url) as client:
        for i in range(runs):
            await client.start("crash.count", str(log), str(gate), id=f"m{i:03d}")
        with (worker_process(db_url, "--concurrency", "8", "--backend", "asyncio") as a,
              worker_process(db_url, "--concurrency", "8", "--backend", "trio") as b,
              worker_process(db_url, "--concurrency", "8", "--backend", anyio_backend) as c):
            # every process claims a first batch and holds it; then the gate opens
            await poll(lambda: _claimers(client, runs, 3), timeout=30, interval=0.05)
            gate.touch()
            await poll(lambda: _all_done(client, runs), timeout=60, interval=0.05)
            procs = (a, b, c)
            assert all(p.poll() is None for p in procs)
        executed = [line.rsplit(":", 1)[0] for line in lines(log)]
        # every step of every run ran exactly once, whichever process claimed it
        assert sorted(executed) == sorted(f"m{i:03d}:{s}" for i in range(runs) for s in "abc")
        assert await _claimers(client, runs, 3)  # the processes really competed


async def _claimers(client: durable.Client, runs: int, wanted: int) -> bool:
    workers = {e.data["worker"] for i in range(runs)
               for e in await client.store.journal(f"m{i:03d}")
               if e.kind.value == "run_claimed"}
    return len(workers) >= wanted


async def _all_done(client: durable.Client, runs: int) -> bool:
    done = await client.list(state="completed", limit=runs + 1)
    return len(done) == runs


def _slow_remote(tmp_path: Path) -> tuple[Path, Path, str, str, Path, Path]:
    """A working copy and a bare remote whose pre-receive hook writes its pid and waits
    for a gate file (a slow remote): (remote, work, before, after, hook pid file, gate)."""
    remote, work = tmp_path / "remote.git", tmp_path / "work"
    git("init", "--quiet", "--bare", "-b", "main", str(remote), cwd=tmp_path)
    before = commit(work, {"README": "before\n"}, "before")
    git("push", "--quiet", str(remote), "HEAD:refs/heads/main", cwd=work)
    after = commit(work, {"README": "after\n"}, "after")
    hook_pid, gate = tmp_path / "hook.pid", tmp_path / "gate"
    hook = remote / "hooks" / "pre-receive"
    hook.write_text(f"#!/bin/sh\necho $$ > {hook_pid}\n"
                    f"while [ ! -e {gate} ]; do sleep 0.05; done\n")
    hook.chmod(0o755)
    return remote, work, before, after, hook_pid, gate


@pytest.mark.parametrize("fate", ["killed", "frozen"])
async def test_a_push_does_not_outlive_its_worker_or_its_lease(
        db_url: str, tmp_path: Path, anyio_backend: str, fate: str) -> None:
    """git runs in a process group of its own (so that a cancel can kill all of it), which
    a signal to the worker does not reach. A worker SIGKILLed (the OOM killer, a crash)
    while git pushes: the group dies with it (its watcher reads a pipe only the worker
    held). A worker frozen (SIGSTOP: as a VM paused, an event loop blocked) cannot cancel
    anything: the watcher kills the group when the lease's local deadline passes without a
    renewal (a 2 s lease here), before another worker may take the run over. Either way the
    remote's pre-receive hook in flight dies and the push never lands. Before, the push
    went on for the attempt that was gone, and landed once the hook finished."""
    remote, work, before, after, hook_pid, gate = _slow_remote(tmp_path)
    async with durable.Client.connect(db_url) as client:
        await client.start("crash.push", str(work), str(remote), after, id="p1")
        with worker_process(db_url, "--backend", anyio_backend, "--lease", "2") as proc:
            await poll(lambda: hook_pid.exists() and hook_pid.read_text().strip(), timeout=20)
            pid = int(hook_pid.read_text())
            # the worker's group: git is not in it
            os.killpg(proc.pid, signal.SIGKILL if fate == "killed" else signal.SIGSTOP)
            try:
                await poll(lambda: not alive(pid), timeout=6)
            except TimeoutError:
                pytest.fail(f"the {fate} worker's push goes on: the remote's hook still runs")
            finally:
                gate.touch()
                os.killpg(proc.pid, signal.SIGKILL)
    assert git("rev-parse", "main", cwd=remote) == before
