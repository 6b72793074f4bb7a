"""Retention (docs/design.md, "Retention"): prune deletes finished runs and their journals in
short batches, leaves tombstones, and never touches an unfinished run's journal.

The large test seeds 100,000 runs on SQLite (durable/store/_seed.py, one transaction); the
same checks run on PostgreSQL with 3,000. Time is an injected clock.
"""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

import durable
from durable._clock import FakeClock
from durable._retention import PrunedRun, parse_duration, parse_states, prune
from durable._types import RunState
from durable.store import Store
from durable.store._seed import Seed, seed_finished_runs
from tests.conftest import subprocess_env
from tests.helpers import poll, python_process
from tests.pg import connect_sync, pg_url, postgres_server, psycopg
from tests.test_console_http import console
from tests.test_store_contract import opened, store_url

__all__ = ["pg_url", "postgres_server", "store_url"]  # the stores: test_store_contract.py

pytestmark = pytest.mark.anyio

NOW = 1_800_000_000.0
DAY = 86400.0
APPEND_ONLY = "the durable journal is append-only"


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(NOW)


def registry() -> durable.Registry:
    reg = durable.Registry()

    @durable.activity("r.echo", registry=reg)
    async def echo(ctx: durable.ActivityContext, value: str) -> str:
        return value

    @durable.workflow("r.flow", registry=reg)
    async def flow(ctx: durable.WorkflowContext, value: str) -> str:
        await ctx.set_records({("slots", value): {"state": "vacant"}}, summary="vacated")
        return str(await ctx.step(echo, value))

    return reg


def seeds(n: int) -> list[Seed]:
    """n finished runs: 6/10 completed 40 days ago, 2/10 failed 40 days ago, 1/10 cancelled
    40 days ago, 1/10 completed a day ago."""
    out: list[Seed] = []
    for i in range(n):
        kind = i % 10
        state = (RunState.COMPLETED if kind < 6 or kind == 9 else
                 RunState.FAILED if kind < 8 else RunState.CANCELLED)
        ended = NOW - (1 if kind == 9 else 40) * DAY + i * 1e-3
        out.append(Seed(f"seed-{i:06d}", "r.flow", state, ended, key=f"k{i % 7}"))
    return out


def delete_journal(url: str, run_id: str) -> str:
    """Try to delete a run's journal directly in the database; the error, or "" if done."""
    if url.startswith("sqlite:///"):
        conn = sqlite3.connect(url[len("sqlite:///"):])
        try:
            conn.execute("DELETE FROM durable_journal WHERE run_id = ?", (run_id,))
            conn.commit()
            return ""
        except sqlite3.DatabaseError as exc:
            return str(exc)
        finally:
            conn.close()
    with connect_sync(url) as conn:
        try:
            conn.execute("DELETE FROM durable_journal WHERE run_id = %s", (run_id,))
            return ""
        except psycopg.Error as exc:
            return str(exc)


async def live_runs(client: durable.Client, clock: FakeClock) -> dict[str, durable.Run]:
    """Through the engine, 50 days ago: a run finished by a worker (its journal and a record
    written), a queued run, a running one (claimed, never finished) and a failed one."""
    reg = client.registry
    async with durable.testing.running_worker(client, schedules=False) as _:
        done = await client.start("r.flow", "old", id="old-done")
        await client.wait(done.id, timeout=20)
    queued = await client.start("r.flow", "q", id="old-queued")
    running = await client.start("r.flow", "r", id="old-running")
    [claimed] = await client.store.claim("w", 10 * 365 * DAY, 1, run_id=running.id)
    assert reg is client.registry and claimed.state is RunState.RUNNING
    return {"done": (await client.get(done.id)), "queued": queued, "running": claimed}


async def check_prune(url: str, clock: FakeClock, n: int) -> None:
    clock.set(NOW - 50 * DAY)
    async with opened(url, clock) as store:
        client = durable.Client(store, registry=registry())
        live = await live_runs(client, clock)
        clock.set(NOW)
        await seed_finished_runs(store, seeds(n))
        before = await store.count_runs()
        assert before[RunState.COMPLETED] == n * 7 // 10 + 1

        # another writer goes on while prune runs: it starts runs between the batches
        progress: list[int] = []
        started: list[int] = []
        pruned: list[PrunedRun] = []

        def seen(item: Any) -> None:
            pruned.append(item)
            progress.append(len(pruned))

        async def writer(stop: anyio.Event) -> None:
            i = 0
            while not stop.is_set():
                await client.start("r.flow", "new", id=f"new-{i}")
                started.append(len(pruned))
                i += 1

        stop = anyio.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(writer, stop)
            total = await prune(store, 30 * DAY, (RunState.COMPLETED, RunState.CANCELLED),
                                seen=seen, batch=500)
            stop.set()
        expected = n * 6 // 10 + n // 10 + 1  # old completed + old cancelled + old-done
        assert total == expected == len(pruned)
        between = {p for p in started if 0 < p < total}
        assert len(between) >= 3, f"writes went in between batches only at {between}"

        after = await store.count_runs()
        assert after[RunState.COMPLETED] == n // 10  # the recent ones
        assert after[RunState.CANCELLED] == 0
        assert after[RunState.FAILED] == n * 2 // 10  # not asked for
        assert after[RunState.QUEUED] == 1 + len(started) and after[RunState.RUNNING] == 1

        # the rest stays readable
        kept_failed = await client.list(state="failed", limit=5)
        assert len(kept_failed) == 5
        assert [e.kind.value for e in await client.journal(kept_failed[0].id)] == [
            "run_created", "run_claimed", "run_failed"]
        recent = await client.list(state="completed", limit=3)
        assert all(r.updated_at > NOW - 2 * DAY for r in recent)
        for name in ("queued", "running"):
            entries = await client.journal(live[name].id)
            assert entries and entries[0].kind.value == "run_created"
        # the pruned are gone, with a tombstone that says how they ended
        with pytest.raises(durable.RunPrunedError, match=r"was pruned on .* ended completed"):
            await client.get("old-done")
        tomb = await client.pruned("seed-000000")
        assert tomb is not None and tomb.state is RunState.COMPLETED and tomb.key == "k0"
        assert await store.journal("old-done") == []
        # an id names one run, even after pruning: a start with it is refused, nothing written
        with pytest.raises(durable.RunConflictError, match="was pruned on"):
            await client.start("r.flow", "old", id="old-done")
        assert await store.get_run("old-done") is None
        # records are not a run's: they stay
        record = await store.get_record("slots", "old")
        assert record is not None and record.value == {"state": "vacant"}

    # the journal of an unfinished run, or of a finished run not being pruned, still
    # refuses deletion, in the database itself
    for run_id in ("old-queued", "old-running", kept_failed[0].id, recent[0].id):
        assert APPEND_ONLY in delete_journal(url, run_id), run_id


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # SQL at scale; trio: the others
async def test_prune_100000_runs_on_sqlite(tmp_path: Path, clock: FakeClock) -> None:
    await check_prune(f"sqlite:///{tmp_path / 'big.db'}", clock, 100_000)


async def test_prune_on_postgres(pg_url: str, clock: FakeClock, anyio_backend: str) -> None:
    await check_prune(pg_url, clock, 3_000)


async def test_dry_run_lists_and_deletes_nothing(store_url: str, clock: FakeClock) -> None:
    async with opened(store_url, clock) as store:
        await seed_finished_runs(store, seeds(40))
        listed: list[Any] = []
        assert await prune(store, 30 * DAY, dry_run=True, batch=7, seen=listed.append) == 36
        assert sorted(r.id for r in listed) == sorted(
            s.id for s in seeds(40) if s.ended_at < NOW - 30 * DAY)
        assert sum((await store.count_runs()).values()) == 40
        assert await store.get_pruned(listed[0].id) is None
        # 0s: every finished run, whatever its age
        assert await prune(store, 0.0, (RunState.COMPLETED,), batch=7) == 28
        assert await prune(store, 0.0, batch=3) == 12
        assert sum((await store.count_runs()).values()) == 0


async def test_a_replayed_run_is_not_pruned(store_url: str, clock: FakeClock) -> None:
    """A finished run queued again (replay) is unfinished: prune passes it by, and its
    journal stays whole."""
    async with opened(store_url, clock) as store:
        await seed_finished_runs(store, [Seed("f", "r.flow", RunState.FAILED, NOW - DAY)])
        assert await store.requeue("f", None, None) is not None
        assert await prune(store, 0.0) == 0
        assert len(await store.journal("f")) == 4
        assert APPEND_ONLY in delete_journal(store_url, "f")


async def test_worker_prunes_periodically(tmp_path: Path, clock: FakeClock) -> None:
    async with opened(f"sqlite:///{tmp_path / 'w.db'}", clock) as store:
        await seed_finished_runs(store, seeds(20))
        client = durable.Client(store, registry=registry())
        async with durable.testing.running_worker(client, schedules=False,
                                                  prune_older_than=30 * DAY) as worker:
            await poll(lambda: worker.pruned == 18)
        assert (await store.count_runs())[RunState.COMPLETED] == 2
        async with durable.testing.running_worker(client, schedules=False) as worker:
            pass
        assert worker.pruned == 0  # off by default


async def test_console_and_show_say_pruned(tmp_path: Path, clock: FakeClock) -> None:
    url = f"sqlite:///{tmp_path / 'c.db'}"
    async with opened(url, clock) as store:
        gone = Seed("gone", "r.flow", RunState.COMPLETED, NOW - 40 * DAY)
        await seed_finished_runs(store, [gone])
        await prune(store, 30 * DAY)
        client = durable.Client(store, registry=registry())
        async with console(client) as http:
            page = await http.get("/runs/gone")
            assert page.status_code == 410 and "pruned on" in page.text
            api = await http.get("/api/runs/gone")
            assert api.status_code == 410 and api.json()["status"] == "pruned"
            assert api.json()["state"] == "completed"
            status = (await http.get("/api/status", params={"id": "gone"})).json()
            assert status["status"] == "completed" and "pruned on" in status["reason"]
            missing = await http.get("/runs/never")
            assert missing.status_code == 404 and "cannot confirm" in missing.text
    shown = await anyio.run_process([sys.executable, "-m", "durable", "show", "gone", "--db",
                                     url], env=subprocess_env(), check=False)
    assert shown.returncode == 2
    error = shown.stderr.decode()
    assert "was pruned on" in error and "ended completed" in error


# -- input -------------------------------------------------------------------------------------
def test_durations_are_parsed_strictly() -> None:
    assert parse_duration("30d") == 30 * DAY
    assert parse_duration("0s") == 0
    assert parse_duration("1w2d3h4m5s") == 9 * DAY + 3 * 3600 + 4 * 60 + 5
    for bad in ("30", "", "3x", "1.5d", "-1d", "1h1d", "1d1d", "d", " 1 d", "1d 2h"):
        with pytest.raises(durable.ConfigError, match="takes an age"):
            parse_duration(bad)
    assert parse_states("completed,cancelled") == (RunState.COMPLETED, RunState.CANCELLED)
    for bad in ("running", "queued", "done", ""):
        with pytest.raises(durable.ConfigError, match="takes finished states"):
            parse_states(bad)


def test_cli_prune(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'cli.db'}"

    async def seed() -> None:
        async with opened(url, FakeClock(1_000.0)) as store:
            await seed_finished_runs(store, [Seed(f"s{i}", "r.flow", RunState.COMPLETED, 500.0)
                                             for i in range(3)])

    anyio.run(seed)

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "durable", "prune", *args, "--db", url],
                              env=subprocess_env(), capture_output=True, text=True,
                              timeout=60)

    dry = cli("--older-than", "1d", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert [line.split()[0] for line in dry.stdout.splitlines()[:-1]] == ["s0", "s1", "s2"]
    assert dry.stdout.splitlines()[-1].startswith("would prune 3 runs (completed 3")
    for args, message in ((["--older-than", "30"], "takes an age"),
                          (["--older-than", "1d", "--state", "running"], "finished states")):
        bad = cli(*args)
        assert bad.returncode == 2 and message in bad.stderr and bad.stderr.count("\n") == 1
    done = cli("--older-than", "0s", "--state", "completed")
    assert done.returncode == 0 and done.stdout.startswith("pruned 3 runs (completed 3)")
    assert cli("--older-than", "0s").stdout.startswith("pruned 0 runs")


async def test_worker_command_prunes(tmp_path: Path) -> None:
    """``worker --prune-older-than 0s`` prunes the finished runs at start (a subprocess)."""
    url = f"sqlite:///{tmp_path / 'wc.db'}"
    async with opened(url, FakeClock(1_000.0)) as store:
        await seed_finished_runs(store, [Seed(f"w{i}", "cli.hello", RunState.FAILED, 500.0)
                                         for i in range(5)])
    log = tmp_path / "worker.log"
    with python_process(["-m", "durable.worker", "--db", url, "--import", "tests.cliflows",
                         "--no-schedules", "--prune-older-than", "0s"], log) as proc:
        async with durable.Client.connect(url) as client:
            await poll(lambda: client.store.get_pruned("w4"), timeout=30)
            assert sum((await client.counts()).values()) == 0
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
    assert "runs_pruned" in log.read_text()


async def test_two_pruners_at_once_take_different_runs(store_url: str, clock: FakeClock) -> None:
    """Two stores (two workers) prune the same database at once: every run goes once, no
    batch fails (PostgreSQL: SKIP LOCKED; SQLite: one writer at a time)."""
    async with opened(store_url, clock) as first, opened(store_url, clock) as second:
        await seed_finished_runs(first, seeds(2_000))
        counts: list[int] = []

        async def one(store: Store) -> None:
            counts.append(await prune(store, 30 * DAY, batch=50))

        async with anyio.create_task_group() as tg:
            tg.start_soon(one, first)
            tg.start_soon(one, second)
        assert sum(counts) == 1_800
        assert (await first.count_runs())[RunState.COMPLETED] == 200
