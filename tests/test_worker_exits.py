"""Worker processes that are told twice to stop, and a step that kills its worker each time."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import anyio
import pytest

import durable
from durable import RunState

from .helpers import kinds, poll
from .test_processes import lines, worker_process

pytestmark = pytest.mark.anyio


async def test_a_second_signal_cancels_at_once(
        db_url: str, tmp_path: Path, anyio_backend: str) -> None:
    log, gate = tmp_path / "log.txt", tmp_path / "gate"
    async with durable.Client.connect(db_url) as client:
        await client.start("crash.retry", str(log), str(gate), id="s2")
        with worker_process(db_url, "--lease", "30", "--grace", "8",
                            "--backend", anyio_backend) as proc:
            await poll(lambda: "hold" in lines(log), timeout=20)
            proc.send_signal(signal.SIGTERM)
            await anyio.sleep(0.5)  # the scenario: a second signal half a second later
            assert proc.poll() is None  # still in its grace period
            proc.send_signal(signal.SIGTERM)
            second = time.monotonic()
            with anyio.fail_after(15):
                while proc.poll() is None:
                    await anyio.sleep(0.02)
            took = time.monotonic() - second
            assert proc.returncode == 0
        assert took < 2.5, f"the worker exited {took:.1f} s after the second signal"
        run = await client.get("s2")
        assert run.state is RunState.QUEUED  # interrupted and given back, not abandoned
        assert kinds(await client.journal("s2"))[-1] == "run_interrupted"


async def test_a_step_that_kills_its_worker_every_time_ends_the_run(
        db_url: str, tmp_path: Path, anyio_backend: str) -> None:
    log = tmp_path / "log.txt"
    async with durable.Client.connect(db_url) as client:
        await client.start("crash.poison", str(log), id="pp")
        for _ in range(8):
            with worker_process(db_url, "--lease", "0.5", "--backend", anyio_backend) as proc:
                with anyio.fail_after(30):
                    while proc.poll() is None and not (await client.get("pp")).state.finished:
                        await anyio.sleep(0.05)
            if (await client.get("pp")).state.finished:
                break
        done = await client.get("pp")
    kills = [line for line in lines(log) if line.startswith("kill:")]
    assert kills == ["kill:1", "kill:2", "kill:3"]  # RetryPolicy().max_tries, across workers
    assert lines(log).count("before") == 1
    assert done.state is RunState.FAILED
    assert done.error is not None
    assert "step 2 (crash.kill_worker)" in done.error
    assert "died" in done.error and "3 tries" in done.error
