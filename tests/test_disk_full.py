"""A full disk under SQLite: a real file system of a few MiB (a tmpfs mounted for the test,
which needs root; skipped, saying so, where mounting is not allowed), filled by a file.

SQLite rolls back a transaction that finds the disk full, so the store raises
``NotSentError`` (nothing was written): a worker's journal and record writes are tried
again while their lease holds (``store_write_not_sent``), none of its runs fails for it, and
they go on, or resume from their journals, once space is freed, each step completed once
in the journal. The CLI, which cannot even open the database on a full disk (WAL mode
creates its shared-memory file at the first open), says how many bytes are free rather
than only SQLite's "disk I/O error", and the database is intact afterwards.
"""

from __future__ import annotations

import logging
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

import pytest

import durable
from durable._types import EntryKind, RunState
from tests.conftest import subprocess_env
from tests.helpers import poll, running_worker
from tests.tmpfs import fill, free_bytes, tmpfs

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


def registry(calls: Counter[tuple[str, int]]) -> tuple[durable.Registry, durable.Workflow]:
    reg = durable.Registry()

    @durable.activity("disk.write", registry=reg)
    async def write(ctx: durable.ActivityContext, i: int) -> str:
        calls[(ctx.workflow_id, i)] += 1
        return RESULT

    @durable.workflow("disk.steps", registry=reg)
    async def steps(ctx: durable.WorkflowContext, n: int) -> int:
        return sum([len(await write(ctx, i)) for i in range(n)])

    return reg, steps


async def test_a_worker_on_a_full_disk_fails_no_run_and_goes_on_once_space_is_freed(
        disk: Path, caplog: pytest.LogCaptureFixture) -> None:
    calls: Counter[tuple[str, int]] = Counter()
    reg, steps = registry(calls)
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


async def test_a_record_write_that_finds_the_disk_full_waits_for_room_and_fails_nothing(
        disk: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A record too large for the room left (a finish or a renewal still fits): its
    transaction is rolled back, so it is a write that was not sent (``NotSentError``),
    tried again while the lease holds, and the run goes on once there is room. Before, the
    store's error failed the run, as if the database had refused the statement for good."""
    reg = durable.Registry()

    @durable.workflow("disk.records", registry=reg)
    async def records(ctx: durable.WorkflowContext, size: int) -> str:
        await ctx.set_records({("disk", "big"): "z" * size})
        return "written"

    store = durable.store_from_url(f"sqlite:///{disk / 'd.db'}")
    await store.open()
    try:
        client = durable.Client(store, registry=reg)
        await client.start(records, 2_000_000, id="big-record")
        filler = fill(disk, leave=1_000_000)  # half the record's room

        async def tried() -> bool:
            run = await store.get_run("big-record")
            assert run is not None
            return run.state.finished or any(
                getattr(r, "event", None) == "store_write_not_sent" for r in caplog.records)

        with caplog.at_level(logging.INFO, logger="durable"):
            async with running_worker(client, reg, concurrency=1, lease=1.0):
                await poll(tried, timeout=20)
                run = await store.get_run("big-record")
                assert run is not None and run.state is RunState.RUNNING, run
                filler.unlink()
                done = await client.wait("big-record", timeout=30)
        assert (done.state, done.result) == (RunState.COMPLETED, "written"), done
        assert await store.get_record("disk", "big") is not None
    finally:
        await store.aclose()


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
