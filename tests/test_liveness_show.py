"""What ``durable show``, ``durable list`` and the console say of a running run whose worker
process died (SIGKILL), before a live worker takes the run over: the read probes the
holder's liveness lock (durable/_liveness.py) read-only and says the worker is gone, and
who takes the run over; where the probe cannot tell (no lock file, PostgreSQL) it says
nothing new. Real worker processes on a real SQLite file, real CLI processes, the console
on a loopback socket; asyncio and trio."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import anyio
import pytest

import durable
from durable import RunState, _liveness
from durable._clock import FakeClock

from .helpers import running_worker
from .test_cli import cli
from .test_console_http import console
from .test_liveness import folder_of, holding_in_process, taken_over, worker_process
from .test_store_contract import clock, pg_url, postgres_server, store_url

__all__ = ["clock", "pg_url", "postgres_server", "store_url"]

pytestmark = pytest.mark.anyio


async def read(*args: str, db: str) -> str:
    """A CLI command's output (a real process, run off the event loop)."""
    done: subprocess.CompletedProcess[str] = await anyio.to_thread.run_sync(
        lambda: cli(*args, db=db))
    assert done.returncode == 0, done.stderr
    return done.stdout


def line_of(listing: str, run_id: str) -> str:
    return next(line for line in listing.splitlines() if line.startswith(run_id + " "))


async def test_a_sigkilled_worker_s_run_is_said_to_wait_for_a_live_worker(
        db_url: str, tmp_path: Path, anyio_backend: str) -> None:
    """Before: show said the run was running and its step "in flight", list said nothing,
    the console showed the step in flight, all until a live worker's sweep took it over
    (and with no worker running, until one started or its lease ran out)."""
    log, gate = tmp_path / "log.txt", tmp_path / "gate"
    async with durable.Client.connect(db_url) as client:
        await client.start("live.hold", str(log), str(gate), id="d1")
        with worker_process(db_url, anyio_backend, "--lease", "30") as proc:
            before = await holding_in_process(client, log, "d1")
            shown = await read("show", "d1", db=db_url)  # alive: as it always said
            assert "in flight" in shown and "gone" not in shown
            # alive: the JSON says nothing of its worker either
            assert json.loads(await read("show", "d1", "--json", db=db_url)
                              )["run"]["worker_gone"] is None
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        [lock_file] = os.listdir(folder_of(db_url))

        # no worker runs: nothing takes the run over until one starts
        shown = await read("show", "d1", db=db_url)
        assert (f"worker {before.worker} is gone (its process died: its liveness lock is "
                "free); no live worker found: the first worker started takes the run over"
                ) in " ".join(shown.split())
        assert "in flight" not in shown and "its worker died during it" in shown
        assert "died" in line_of(await read("list", db=db_url), "d1")
        # the JSON says it too (before: nothing; show and list --json as of a live worker)
        gone = {"worker": before.worker, "live_worker_found": False, "phrase": (
            f"worker {before.worker} is gone (its process died: its liveness lock is free); "
            "no live worker found: the first worker started takes the run over")}
        shown_json = json.loads(await read("show", "d1", "--json", db=db_url))
        assert shown_json["run"]["worker_gone"] == gone
        [listed] = json.loads(await read("list", "--json", db=db_url))
        assert listed["id"] == "d1" and listed["worker_gone"] == gone
        # read-only: the run, its journal and the dead worker's lock file are as they were
        run = await client.store.get_run("d1")
        assert run is not None and run.state is RunState.RUNNING
        assert (run.epoch, run.worker) == (before.epoch, before.worker)
        assert "run_recovered" not in [e.kind.value for e in await client.journal("d1")]
        assert os.listdir(folder_of(db_url)) == [lock_file]

        # a live worker (any process holding its lock: this one) takes it over
        live = _liveness.hold(folder_of(db_url), "another-worker")
        try:
            shown = await read("show", "d1", db=db_url)
            assert "a live worker takes the run over within a second" in " ".join(
                shown.split())
            async with console(client) as http:
                page = (await http.get("/runs/d1")).text
                assert f"worker {before.worker} is gone" in page
                assert "its worker died during it" in page
                assert ">worker died</span>" in page and ">in flight</span>" not in page
                listing = (await http.get("/runs")).text
                assert f"worker {before.worker} died" in listing
                found = {"worker": before.worker, "live_worker_found": True}
                api = (await http.get("/api/runs/d1")).json()["run"]["worker_gone"]
                assert api.items() >= found.items()
                [api_run] = (await http.get("/api/runs")).json()["runs"]
                assert api_run["worker_gone"].items() >= found.items()
        finally:
            live.release()

        async with running_worker(client, durable.default_registry, lease=30.0,
                                  liveness_interval=0.02):
            await taken_over(client, before)
            shown = await read("show", "d1", db=db_url)
            assert "gone" not in shown and "in flight" in shown  # the new worker's attempt
            assert json.loads(await read("list", "--json", db=db_url)
                              )[0]["worker_gone"] is None
            gate.touch()
            assert (await client.wait("d1", timeout=20)).state is RunState.COMPLETED


async def test_nothing_new_is_said_where_the_probe_cannot_tell(store_url: str,
                                                               clock: FakeClock) -> None:
    """A run held by a worker id that no process ever locked (no lock file: a worker whose
    lock could not be made, one that stopped cleanly) on SQLite, and any run on PostgreSQL
    (no liveness lock): its worker is neither said gone nor alive."""
    async with durable.Client.connect(store_url, clock=clock) as client:
        await client.start("cx.work", id="h")
        [held] = await client.store.claim("w-without-a-lock", 30.0, 1, run_id="h")
        assert await client.gone_holders([held]) == {}


def test_the_read_probe_is_three_valued_and_writes_nothing(tmp_path: Path) -> None:
    """``holder_alive``: True while the lock is held (here by this process, on its own open
    file description, as a worker holds it), False once the holder's descriptor is gone (as
    at a death), None without a file; ``any_alive`` alike for the folder. No file is made
    or removed, and the holder keeps its lock through the probes."""
    folder = tmp_path / "db-workers"
    assert _liveness.holder_alive(folder, "w1") is None  # no folder
    assert _liveness.any_alive(folder) is False
    lock = _liveness.hold(folder, "w1")
    assert _liveness.holder_alive(folder, "w1") is True
    assert _liveness.any_alive(folder) is True
    with pytest.raises(_liveness.InUseError):  # the probes left the lock to its holder
        _liveness.hold(folder, "w1", attempts=2)
    assert _liveness.holder_alive(folder, "w2") is None  # no file: nothing told
    lock.forget()  # as a death: the descriptor closes, the file stays
    assert _liveness.holder_alive(folder, "w1") is False
    assert _liveness.any_alive(folder) is False
    assert os.listdir(folder) == [_liveness.lock_name("w1")]  # not removed by a read
