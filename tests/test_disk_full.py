"""A full disk under SQLite: a real file system of a few MiB (a tmpfs mounted for the test,
which needs root; skipped, saying so, where mounting is not allowed), filled by a file.

A worker whose journal writes find the disk full stops its attempts (``journal_write_failed``)
without failing its runs, and they resume from their journals once space is freed, each
step completed once in the journal; the CLI, which cannot even open the database on a full
disk (WAL mode creates its shared-memory file at the first open), says that the disk is
full rather than SQLite's "disk I/O error", and the database is intact afterwards.
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


async def test_a_worker_on_a_full_disk_stops_its_attempts_and_resumes_once_space_is_freed(
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
                await poll(lambda: any(getattr(r, "event", None) == "journal_write_failed"
                                       for r in caplog.records), timeout=20)
                failed = [r for r in caplog.records
                          if getattr(r, "event", None) == "journal_write_failed"]
                assert "disk is full" in failed[0].getMessage()
                for i in range(runs):  # the disk's fault, not the runs': none failed
                    run = await store.get_run(f"full-{i}")
                    assert run is not None and run.state in (RunState.RUNNING,
                                                              RunState.QUEUED), run
                filler.unlink()
                done = [await client.wait(f"full-{i}", timeout=30) for i in range(runs)]
        assert [(r.state, r.result) for r in done] == [(RunState.COMPLETED, n * len(RESULT))] * runs
        assert max(r.attempt for r in done) >= 2  # some attempt was stopped by the disk
        for i in range(runs):
            journal = await store.journal(f"full-{i}")
            completed = Counter(e.step for e in journal if e.kind is EntryKind.STEP_COMPLETED)
            assert completed == Counter(range(1, n + 1)), completed  # each step once
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
