"""A full disk: a real file system of a few MiB (a tmpfs mounted for the test, which needs
root; skipped, saying so, where mounting is not allowed), filled by a file. For PostgreSQL,
the store's tables go to a tablespace on such a tmpfs.

SQLite rolls back a transaction that finds the disk full (PostgreSQL aborts the transaction
of a statement that cannot extend a table), so the store raises
``NotSentError`` (nothing was written): a worker's journal and record writes are tried
again while their lease holds (``store_write_not_sent``), none of its runs fails for it, and
they go on, or resume from their journals, once space is freed, each step completed once
in the journal. The CLI, which cannot even open the database on a full disk (WAL mode
creates its shared-memory file at the first open), says how many bytes are free rather
than only SQLite's "disk I/O error", and the database is intact afterwards.
"""

from __future__ import annotations

import logging
import random
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import pytest

import durable
from durable._types import EntryKind, RunState
from tests.conftest import subprocess_env
from tests.helpers import poll, running_worker
from tests.pg import postgres_server, split_url
from tests.tmpfs import fill, free_bytes, pg_tablespace, tablespace_option, tmpfs

__all__ = ["postgres_server"]

pytestmark = pytest.mark.anyio

DISK = "8m"
RESULT = "y" * 4000  # a step's result: the journal grows by about this much a step


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Path]:
    """A tmpfs of DISK mounted on a folder of tmp_path, unmounted afterwards."""

    def refused(why: str) -> NoReturn:
        pytest.skip("a full disk needs a small file system of its own: mounting a tmpfs "
                    f"was refused ({why})")

    with tmpfs(tmp_path / "disk", DISK, refused) as where:
        yield where


def registry() -> tuple[durable.Registry, durable.Workflow[..., Any]]:
    reg = durable.Registry()

    @durable.activity("disk.write", registry=reg)
    async def write(ctx: durable.ActivityContext, i: int) -> str:
        return RESULT

    @durable.workflow("disk.steps", registry=reg)
    async def steps(ctx: durable.WorkflowContext, n: int) -> int:
        return sum([len(await write(ctx, i)) for i in range(n)])

    return reg, steps


async def test_a_worker_on_a_full_disk_fails_no_run_and_goes_on_once_space_is_freed(
        disk: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Three runs of 30 steps whose results fill the disk part-way through: their journal
    writes are refused as not sent and tried again; kept full past the lease, the attempts
    are lost; once the disk has room, every run completes, each step completed once."""
    reg, steps = registry()
    runs, n = 3, 30
    store = durable.store_from_url(f"sqlite:///{disk / 'd.db'}")
    await store.open()
    try:
        client = durable.Client(store, registry=reg)
        for i in range(runs):
            await client.start(steps, n, id=f"full-{i}")
        filler = fill(disk, leave=200_000)  # room for some steps of each run, not all
        with caplog.at_level(logging.INFO, logger="durable"):
            async with running_worker(client, reg, concurrency=runs, lease=1.0):
                await poll(lambda: any(getattr(r, "event", None) == "store_write_not_sent"
                                       for r in caplog.records), timeout=20)
                refused = [r for r in caplog.records
                           if getattr(r, "event", None) == "store_write_not_sent"]
                assert "disk is full" in refused[0].getMessage()
                assert "nothing was written" in refused[0].getMessage()
                # kept full past the lease (1 s), whose renewals fail too: attempts are lost
                await poll(lambda: any(getattr(r, "event", None) == "attempt_abandoned"
                                       for r in caplog.records), timeout=20)
                for i in range(runs):  # the disk's fault, not the runs': none failed
                    run = await store.get_run(f"full-{i}")
                    assert run is not None and run.state in (RunState.RUNNING,
                                                              RunState.QUEUED), run
                filler.unlink()
                done = [await client.wait(f"full-{i}", timeout=30) for i in range(runs)]
        assert [(r.state, r.result) for r in done] == [(RunState.COMPLETED, n * len(RESULT))] * runs
        assert max(r.attempt for r in done) >= 2  # recovered after the disk was freed
        for i in range(runs):
            journal = await store.journal(f"full-{i}")
            completed = Counter(e.step for e in journal if e.kind is EntryKind.STEP_COMPLETED)
            assert completed == Counter(range(1, n + 1)), completed  # each step once
    finally:
        await store.aclose()


def records_registry() -> tuple[durable.Registry, durable.Workflow[..., Any]]:
    reg = durable.Registry()

    @durable.workflow("disk.records", registry=reg)
    async def records(ctx: durable.WorkflowContext, size: int) -> str:
        # hex of seeded random bytes: a value no store can compress into the room left
        await ctx.set_records({("disk", "big"): random.Random(1).randbytes(size // 2).hex()})
        return "written"

    return reg, records


async def a_record_write_waits_for_room(url: str, disk: Path, size: int,
                                        caplog: pytest.LogCaptureFixture) -> None:
    """A record of ``size`` characters written while half its room is left on ``disk``
    (a finish or a renewal still fits): its transaction is rolled back, so it is a write
    that was not sent (``NotSentError``), tried again while the lease holds, and the run
    goes on once there is room. Before, the store's error failed the run (as if the
    database had refused the statement for good), or, when the finish found no room
    either, left it to a recovery after its lease."""
    reg, records = records_registry()
    store = durable.store_from_url(url)
    await store.open()
    try:
        client = durable.Client(store, registry=reg)
        await client.start(records, size, id="big-record")
        filler = fill(disk, leave=size // 2)

        async def tried() -> bool:
            run = await store.get_run("big-record")
            assert run is not None
            return run.state.finished or any(
                getattr(r, "event", None) == "store_write_not_sent" for r in caplog.records)

        with caplog.at_level(logging.INFO, logger="durable"):
            # a lease of 3 s: on a loaded machine one try of an 8 MB write can outlast a
            # 1 s lease, and the attempt (rightly) stops with its write's outcome unknown
            async with running_worker(client, reg, concurrency=1, lease=3.0):
                await poll(tried, timeout=20)
                run = await store.get_run("big-record")
                assert run is not None and run.state is RunState.RUNNING, run
                filler.unlink()
                done = await client.wait("big-record", timeout=30)
        assert (done.state, done.result, done.attempt) == (RunState.COMPLETED, "written", 1)
        assert await store.get_record("disk", "big") is not None
    finally:
        await store.aclose()


async def test_a_record_write_that_finds_the_disk_full_waits_for_room_and_fails_nothing(
        disk: Path, caplog: pytest.LogCaptureFixture) -> None:
    await a_record_write_waits_for_room(f"sqlite:///{disk / 'd.db'}", disk, 2_000_000, caplog)


@pytest.fixture
def pg_small_disk(postgres_server: str) -> Iterator[tuple[str, Path]]:
    """A store URL whose tables go to a tablespace on a tmpfs of its own (16 MiB), and that
    tmpfs. The folder is outside pytest's own (which the server's user cannot enter)."""
    pytest.importorskip("psycopg")
    from tests.pg import connect_sync

    def refused(why: str) -> NoReturn:
        pytest.skip(f"a full disk for PostgreSQL needs a tablespace on a small file system "
                    f"of its own: {why}")

    base = Path(tempfile.mkdtemp(prefix="durable-pg-disk-"))
    base.chmod(0o755)
    url = f"{postgres_server}?schema=durable_disk_{uuid.uuid4().hex[:12]}"
    try:
        with tmpfs(base / "disk", "16m", refused) as disk, \
                pg_tablespace(postgres_server, disk, refused) as name:
            try:
                yield f"{url}&{tablespace_option(name)}", disk
            finally:  # the schema's tables go before their tablespace
                with connect_sync(url) as conn:
                    conn.execute(f"DROP SCHEMA IF EXISTS {split_url(url)[1]} CASCADE")
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # the PostgreSQL store's loop
async def test_a_record_write_that_finds_postgresql_s_disk_full_waits_for_room(
        pg_small_disk: tuple[str, Path], caplog: pytest.LogCaptureFixture) -> None:
    """The same on PostgreSQL (``disk_full``, SQLSTATE 53100: "could not extend file"),
    whose tables are on a tablespace of their own on the small disk (its WAL is not)."""
    url, disk = pg_small_disk
    await a_record_write_waits_for_room(url, disk, 8_000_000, caplog)


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "durable", *args], capture_output=True,
                          text=True, env=subprocess_env(), timeout=60, check=False)


def test_the_cli_on_a_full_disk_says_so_in_one_line_and_loses_nothing(disk: Path) -> None:
    url = f"sqlite:///{disk / 'd.db'}"
    assert cli("migrate", "--db", url).returncode == 0
    started = cli("start", "--db", url, "--import", "workflows", "--id", "before-full",
                  "slot.reset", '"slot-1"')
    assert started.returncode == 0, started.stderr
    filler = fill(disk)
    assert free_bytes(disk) < 65536
    for args in (("list",), ("show", "before-full"),
                 ("start", "--import", "workflows", "slot.reset", '"slot-2"')):
        done = cli(*args, "--db", url)
        assert done.returncode == 2, (args, done)
        assert "Traceback" not in done.stderr
        assert done.stderr.count("\n") == 1, done.stderr
        assert "bytes free" in done.stderr, done.stderr
    filler.unlink()
    listed = cli("list", "--db", url)
    assert listed.returncode == 0, listed.stderr
    assert "before-full" in listed.stdout
    assert listed.stdout.count("slot.reset") == 1  # the refused start wrote nothing


def test_with_the_database_open_elsewhere_reads_work_on_a_full_disk_and_writes_say_so(
        disk: Path) -> None:
    """While another process has the database open (a worker, here a plain connection),
    its shared-memory file exists: the CLI's reads work on a full disk, and a start is
    refused in one line that says nothing was written."""
    url = f"sqlite:///{disk / 'd.db'}"
    assert cli("migrate", "--db", url).returncode == 0
    assert cli("start", "--db", url, "--import", "workflows", "--id", "before-full",
               "slot.reset", '"slot-1"').returncode == 0
    holder = sqlite3.connect(disk / "d.db")
    try:
        holder.execute("SELECT count(*) FROM durable_runs").fetchone()  # WAL files open
        filler = fill(disk)
        listed = cli("list", "--db", url)
        assert listed.returncode == 0, listed.stderr
        assert "before-full" in listed.stdout
        shown = cli("show", "before-full", "--db", url)
        assert shown.returncode == 0, shown.stderr
        refused = cli("start", "--db", url, "--import", "workflows", "slot.reset",
                      '"slot-2"')
        assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused
        assert refused.stderr.count("\n") == 1, refused.stderr
        assert "database or disk is full" in refused.stderr, refused.stderr
        assert "nothing was written" in refused.stderr, refused.stderr
        filler.unlink()
    finally:
        holder.close()
    listed = cli("list", "--db", url)
    assert listed.stdout.count("slot.reset") == 1, listed.stdout  # nothing half-written
