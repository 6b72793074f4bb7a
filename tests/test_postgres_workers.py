"""Worker processes against PostgreSQL (issue 4): many workers, a SIGKILL, an operator's cancel.

Real processes on the machine's PostgreSQL server (``tests/pg.py``: one schema per test,
dropped at teardown). Workers run as ``python -m durable.worker`` (or ``python -m
tests.pgflows`` where the test needs a heartbeat interval of its own) in sessions of their
own; every process group is killed in ``finally``. The test process reads the database with
plain psycopg connections, in a thread, so those reads work on both backends. On trio the
store runs on an asyncio loop of its own, in a thread (durable/store/_loop.py); the
2,000-run test runs its workers on the test's loop too.
Nothing sleeps to synchronize: every wait polls with a bound.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

import durable
from durable.store import SCHEMA_VERSION

from . import pgflows
from .conftest import ROOT, subprocess_env
from .helpers import python_process
from .httpserver import Rule, loopback_server
from .pg import connect_sync, pg_url, postgres_server, psycopg, split_url

__all__ = ["pg_url", "postgres_server"]  # fixtures, used by name

N_RUNS = 2000
N_WORKERS = 4
LEASE = 2.0
STEPS = 3


# -- processes ------------------------------------------------------------------------------------
process = python_process


def run_cli(args: list[str], timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    """Run ``python ARGS`` to completion (bounded), killing its process group on the way out."""
    proc = subprocess.Popen([sys.executable, *args], cwd=ROOT, env=subprocess_env(),
                            start_new_session=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate(timeout=10)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def tail(path: Path, lines: int = 15) -> str:
    text = path.read_text(errors="replace") if path.exists() else ""
    return "\n".join(text.splitlines()[-lines:])


# -- the database, read directly --------------------------------------------------------------
class Db:
    """A plain psycopg connection on the test's schema; queries run in a thread."""

    def __init__(self, url: str) -> None:
        self.conn = connect_sync(url)

    def _rows(self, query: str, params: tuple[Any, ...]) -> list[dict[str, Any]]:
        cur = self.conn.execute(query, params)
        names = [d.name for d in cur.description or ()]
        return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]

    async def rows(self, query: str, *params: Any) -> list[dict[str, Any]]:
        return await anyio.to_thread.run_sync(self._rows, query, params)

    async def value(self, query: str, *params: Any) -> Any:
        rows = await self.rows(query, *params)
        return next(iter(rows[0].values())) if rows else None

    def close(self) -> None:
        self.conn.close()


@contextmanager
def db(url: str) -> Iterator[Db]:
    conn = Db(url)
    try:
        yield conn
    finally:
        conn.close()


async def wait_until(predicate: Callable[[], Any], *, timeout: float, interval: float,
                     explain: Callable[[], Any]) -> None:
    """Poll an async predicate until it is truthy; on timeout fail with ``explain()``."""
    deadline = time.monotonic() + timeout
    while not await predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"not reached within {timeout:g} s: {await explain()}")
        await anyio.sleep(interval)


def worker_of(entry: dict[str, Any]) -> str:
    return str(json.loads(entry["data"])["worker"])


def pid_of(worker_id: str) -> int:
    return int(worker_id.split(":")[-2])  # host:pid:nonce


# -- 1. four workers, 2,000 runs, one SIGKILLed --------------------------------------------------
@pytest.mark.anyio
async def test_four_workers_complete_2000_runs_once_and_take_over_a_killed_workers_runs(
        pg_url: str, tmp_path: Path, anyio_backend: str) -> None:
    """On trio the client, and the four workers (``--backend trio``), run the store on its
    loop thread."""
    effects = tmp_path / "effects"
    effects.mkdir()
    timings: dict[str, float] = {}
    began = time.monotonic()

    async with durable.Client.connect(pg_url) as client:
        ids = [f"run-{i:04d}" for i in range(N_RUNS)]

        async def start(chunk: list[str]) -> None:
            for run_id in chunk:
                await client.start(pgflows.three, str(effects), id=run_id)

        async with anyio.create_task_group() as tg:
            for n in range(8):  # the client's pool has 10 connections
                tg.start_soon(start, ids[n::8])
    timings["start 2000 runs"] = time.monotonic() - began

    logs = [tmp_path / f"worker-{n}.log" for n in range(N_WORKERS)]
    command = ["-m", "durable.worker", "--db", pg_url, "--import", "tests.pgflows",
               "--backend", anyio_backend, "--concurrency", "32", "--lease", str(LEASE),
               "--poll", "0.05", "--log-level", "warning"]
    with db(pg_url) as conn, ExitStack() as stack:
        workers = [stack.enter_context(process(command, log)) for log in logs]
        victim = workers[0]
        started = time.monotonic()

        async def explain() -> str:
            states = await conn.rows("SELECT state, count(*) AS n FROM durable_runs GROUP BY 1")
            status = [w.poll() for w in workers]
            return f"runs {states}, worker exit codes {status}\n" + "\n".join(
                f"--- worker {n}:\n{tail(log)}" for n, log in enumerate(logs))

        async def live() -> None:
            for n, w in enumerate(workers):
                if w is not victim and w.poll() is not None:
                    pytest.fail(f"worker {n} exited with {w.returncode}: {await explain()}")

        async def victim_is_busy() -> bool:
            await live()
            done = await conn.value(
                "SELECT count(*) FROM durable_runs WHERE state = 'completed'")
            held = await conn.value(
                "SELECT count(*) FROM durable_runs WHERE state = 'running' AND worker LIKE %s",
                f"%:{victim.pid}:%")
            return bool(done >= N_RUNS // 4 and held > 0)

        # Mid-way: a quarter of the runs done, and the victim holds runs.
        await wait_until(victim_is_busy, timeout=60, interval=0.02, explain=explain)
        os.killpg(victim.pid, signal.SIGKILL)  # no finally, no exit hook runs
        victim.wait(timeout=10)
        killed_at = time.time()
        timings["workers up to the kill"] = time.monotonic() - started
        done_at_kill = await conn.value(
            "SELECT count(*) FROM durable_runs WHERE state = 'completed'")
        held = {r["id"]: r for r in await conn.rows(
            "SELECT id, epoch, worker, lease_expires_at FROM durable_runs"
            " WHERE state = 'running' AND worker LIKE %s", f"%:{victim.pid}:%")}
        assert held, "the victim held no run at the kill"

        async def all_completed() -> bool:
            await live()
            return bool(await conn.value(
                "SELECT count(*) FROM durable_runs WHERE state = 'completed'") == N_RUNS)

        await wait_until(all_completed, timeout=90, interval=0.1, explain=explain)
        timings["kill to all completed"] = time.time() - killed_at
        timings["workers, total"] = time.monotonic() - started

        runs = await conn.rows("SELECT id, state, result FROM durable_runs")
        journal = await conn.rows(
            "SELECT seq, run_id, epoch, kind, step, name, at, data FROM durable_journal"
            " ORDER BY seq")

    # Every run completed exactly once, with the result of all three steps.
    assert len(runs) == N_RUNS
    assert Counter(r["state"] for r in runs) == {"completed": N_RUNS}
    assert {r["result"] for r in runs} == {'["reserved","charged","confirmed"]'}
    completions = Counter(e["run_id"] for e in journal if e["kind"] == "run_completed")
    assert set(completions) == set(ids) and set(completions.values()) == {1}

    # No run was claimed twice at one epoch; epochs are distinct across all runs and workers;
    # a run was claimed again only after it was recovered.
    claims = [e for e in journal if e["kind"] == "run_claimed"]
    epochs = [e["epoch"] for e in claims]
    assert len(set(epochs)) == len(epochs)
    claimed_by = {e["epoch"]: worker_of(e) for e in claims}
    recoveries = [e for e in journal if e["kind"] == "run_recovered"]
    per_run_claims = Counter(e["run_id"] for e in claims)
    per_run_recoveries = Counter(e["run_id"] for e in recoveries)
    assert all(per_run_claims[i] == 1 + per_run_recoveries[i] for i in ids)
    assert len({pid_of(w) for w in claimed_by.values()}) == N_WORKERS
    victim_id = held[next(iter(held))]["worker"]
    assert pid_of(victim_id) == victim.pid

    # The killed worker's unfinished attempts, and only those, were recovered once their
    # lease had expired, then claimed and completed by the others.
    finished = {e["epoch"] for e in journal if e["kind"] == "run_completed"}
    unfinished = {(e["run_id"], e["epoch"]) for e in claims
                  if pid_of(worker_of(e)) == victim.pid and e["epoch"] not in finished}
    assert recoveries, "no run_recovered entry"
    assert {(e["run_id"], e["epoch"]) for e in recoveries} == unfinished
    # A statement the victim sent just before it died still runs on the server (a group-
    # committed batch of finishes takes a while): a run seen held right after the kill may
    # then end under the victim's epoch, fenced by its still valid lease. Every other held
    # run was recovered.
    assert {(i, r["epoch"]) for i, r in held.items() if r["epoch"] not in finished} <= unfinished
    for rec in recoveries:
        data = json.loads(rec["data"])
        assert data["worker"] == victim_id
        assert rec["at"] >= data["lease_expired_at"]
        assert data["lease_expired_at"] <= killed_at + LEASE  # the last renewal came before
        if rec["run_id"] in held:
            # the lease read after the kill, or later: a renewal the victim sent just
            # before it died may still have run on the server after that read (seen once
            # in CI: 0.18 s later), never beyond the bound above
            assert data["lease_expired_at"] >= held[rec["run_id"]]["lease_expires_at"]
        later = [e for e in journal if e["run_id"] == rec["run_id"] and e["seq"] > rec["seq"]]
        assert later[0]["kind"] == "run_claimed"
        assert later[0]["epoch"] > rec["epoch"] and later[0]["at"] >= data["lease_expired_at"]
        assert pid_of(worker_of(later[0])) != victim.pid
        assert later[-1]["kind"] == "run_completed" and later[-1]["epoch"] == later[0]["epoch"]
    timings["lease expiry to recovery, max"] = max(
        rec["at"] - json.loads(rec["data"])["lease_expired_at"] for rec in recoveries)

    # Side effects: each execution of a step left one line "run step epoch pid".
    executions: Counter[tuple[str, int]] = Counter()
    pids_of_epoch: dict[int, set[int]] = defaultdict(set)
    for path in effects.iterdir():
        for line in path.read_text().splitlines():
            run_id, step, epoch, pid = line.split()
            executions[run_id, int(step)] += 1
            pids_of_epoch[int(epoch)].add(int(pid))
    # ... each by the process that held the run at that epoch, and no epoch ran in two.
    assert all(pids == {pid_of(claimed_by[epoch])} for epoch, pids in pids_of_epoch.items())
    in_doubt = {(e["run_id"], e["step"]): e["name"] for e in journal
                if e["kind"] == "step_in_doubt"}
    assert {run_id for run_id, _ in in_doubt} <= {run_id for run_id, _ in unfinished}
    steps_completed = Counter((e["run_id"], e["step"]) for e in journal
                              if e["kind"] == "step_completed")
    assert set(steps_completed) == {(i, s) for i in ids for s in range(1, STEPS + 1)}
    assert set(steps_completed.values()) == {1}
    twice = set()
    for (run_id, step), count in executions.items():
        if (run_id, step) in in_doubt:  # in flight at the kill: it may have run before
            assert count in (1, 2), (run_id, step, count)
            assert durable.default_registry.activities[in_doubt[run_id, step]].on_doubt \
                == "retry"
            twice |= {(run_id, step)} if count == 2 else set()
        else:  # a completed step never ran again
            assert count == 1, (run_id, step, count)
    assert set(executions) == set(steps_completed)
    timings["total"] = time.monotonic() - began
    print(f"\n{N_RUNS} runs, {N_WORKERS} workers: {done_at_kill} completed at the kill, "
          f"{len(held)} held by the killed worker, {len(in_doubt)} steps in doubt, "
          f"{len(twice)} ran twice; "
          + ", ".join(f"{k} {v:.2f} s" for k, v in timings.items()))


# -- 2. an operator's cancel reaches a request in flight in another process ------------------
HEARTBEAT = 20.0


@pytest.mark.anyio
async def test_operator_cancel_reaches_the_in_flight_request_of_another_process(
        pg_url: str, tmp_path: Path, anyio_backend: str) -> None:
    """The worker renews every 20 s, so only NOTIFY can deliver the cancel within a second.

    On asyncio the test process cancels with ``Client.cancel``; on trio with ``python -m
    durable cancel``, a third process. Either way the worker process holding the run stops
    the request in flight.
    """
    log = tmp_path / "worker.log"
    async with loopback_server() as server:
        server.on("/hang", Rule(hang=True))
        url = f"{server.url}/hang"
        with db(pg_url) as conn, process(
                ["-m", "tests.pgflows", "--db", pg_url, "--lease", "60",
                 "--heartbeat", str(HEARTBEAT)], log) as worker:

            async def explain() -> str:
                runs = await conn.rows("SELECT id, state, worker FROM durable_runs")
                return f"runs {runs}, worker exit {worker.poll()}\n{tail(log)}"

            if anyio_backend == "asyncio":
                async with durable.Client.connect(pg_url) as client:
                    await client.start(pgflows.call, url, id="c1")
                    await server.wait_for(lambda: server.seen("/hang"), timeout=30)
                    cancelled = await client.cancel("c1")
                    assert cancelled.state.value == "running" and cancelled.cancel_requested
            else:
                started = await anyio.run_process(
                    [sys.executable, "-m", "durable", "start", "pg.call", json.dumps(url),
                     "--import", "tests.pgflows", "--id", "c1", "--db", pg_url],
                    cwd=ROOT, env=subprocess_env(), check=False)
                assert started.returncode == 0, started.stderr
                await server.wait_for(lambda: server.seen("/hang"), timeout=30)
                cancelled_cli = await anyio.run_process(
                    [sys.executable, "-m", "durable", "cancel", "c1", "--db", pg_url],
                    cwd=ROOT, env=subprocess_env(), check=False)
                assert cancelled_cli.returncode == 0, cancelled_cli.stderr
                assert b"cancel requested" in cancelled_cli.stdout
            [seen] = server.seen("/hang")
            await server.wait_for(lambda: seen.disconnected_at is not None, timeout=10)

            async def finished() -> bool:
                return await conn.value(
                    "SELECT state FROM durable_runs WHERE id = 'c1'") == "cancelled"

            await wait_until(finished, timeout=10, interval=0.02, explain=explain)
            [run] = await conn.rows("SELECT * FROM durable_runs WHERE id = 'c1'")
            journal = await conn.rows(
                "SELECT kind, step, epoch, at, data FROM durable_journal"
                " WHERE run_id = 'c1' ORDER BY seq")

    assert [e["kind"] for e in journal] == [
        "run_created", "run_claimed", "step_started", "run_cancel_requested",
        "step_in_doubt", "run_cancelled"]
    assert run["error"] == "cancelled by an operator"
    epoch = run["epoch"]
    assert seen.headers["durable-fencing-token"] == str(epoch)
    assert seen.headers["idempotency-key"] == "c1/1"
    assert pid_of(worker_of(journal[1])) == worker.pid
    claimed_at = journal[1]["at"]
    requested_at = journal[3]["at"]
    assert seen.disconnected_at is not None
    latency = seen.disconnected_at - requested_at
    # The periodic renewal comes every 20 s after the claim; NOTIFY woke the worker right
    # after the cancel and it read the held runs' cancel flags: no renewal (no write) since
    # the claim delivered it.
    assert 0 <= latency < 2.0, latency
    assert run["heartbeat_at"] is None or run["heartbeat_at"] < requested_at
    assert seen.disconnected_at < claimed_at + HEARTBEAT
    print(f"\ncancel ({anyio_backend}): request aborted {latency * 1000:.0f} ms after the "
          f"cancel was committed (next periodic renewal due "
          f"{claimed_at + HEARTBEAT - requested_at:.1f} s after it)")


# -- 3. migrate, and a newer schema refused ---------------------------------------------------
def test_migrate_creates_the_schema_and_a_newer_version_is_refused(pg_url: str) -> None:
    for _ in range(2):  # the second run finds it up to date
        done = run_cli(["-m", "durable", "migrate", "--db", pg_url])
        assert done.returncode == 0, done.stderr
        assert done.stdout == f"{pg_url}: schema version {SCHEMA_VERSION}\n"
    _, schema = split_url(pg_url)
    with connect_sync(pg_url) as conn:
        tables = {r[0] for r in conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = %s",
            (schema,))}
        assert {"durable_meta", "durable_runs", "durable_journal", "durable_records"} <= tables
        [(version,)] = conn.execute(
            "SELECT value FROM durable_meta WHERE key = 'schema_version'").fetchall()
        assert version == str(SCHEMA_VERSION)

    listed = run_cli(["-m", "durable", "list", "--db", pg_url])
    assert (listed.returncode, listed.stdout, listed.stderr) == (0, "no runs\n", "")

    newer = SCHEMA_VERSION + 1
    with connect_sync(pg_url) as conn:
        conn.execute("UPDATE durable_meta SET value = %s WHERE key = 'schema_version'",
                     (str(newer),))
    for command in ("list", "migrate"):
        refused = run_cli(["-m", "durable", command, "--db", pg_url])
        assert refused.returncode == 2, (command, refused.stdout, refused.stderr)
        assert refused.stdout == ""
        assert "Traceback" not in refused.stderr
        [line] = refused.stderr.splitlines()
        assert line.startswith("durable: error: ")
        assert f"schema version {newer}" in line and "newer than this durable" in line
    with connect_sync(pg_url) as conn:  # nothing was changed on the way
        [(version,)] = conn.execute(
            "SELECT value FROM durable_meta WHERE key = 'schema_version'").fetchall()
        assert version == str(newer)


# -- two bugs found while writing these tests, fixed ---------------------------------------
def test_migrate_does_not_print_the_password(pg_url: str) -> None:
    with_password = pg_url.replace("postgres@", "postgres:hunter2@", 1)  # trust auth
    done = run_cli(["-m", "durable", "migrate", "--db", with_password])
    assert done.returncode == 0, done.stderr
    assert "hunter2" not in done.stdout + done.stderr
    assert done.stdout == (f"{with_password.replace('hunter2', '***')}: "
                           f"schema version {SCHEMA_VERSION}\n")


def test_list_on_a_missing_schema_creates_nothing(pg_url: str) -> None:
    listed = run_cli(["-m", "durable", "list", "--db", pg_url])
    base, schema = split_url(pg_url)
    with psycopg.connect(base, autocommit=True) as conn:
        created = conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s",
                               (schema,)).fetchone() is not None
    assert not created, "a read-only command created the schema"
    assert listed.returncode == 2 and listed.stdout == ""
    [line] = listed.stderr.splitlines()
    assert line.startswith("durable: error: ") and schema in line
