"""``durable cancel`` of many runs: by ids, or every queued and running run a filter
matches (an incident's stop), with ``--dry-run`` and ``--yes``. Real CLI processes on a
real SQLite file; the runs are set up through the store (queued, one claimed as a worker
would, one finished)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import anyio
import pytest

import durable
from durable import RunState
from durable._clock import FakeClock
from durable._types import EntryKind, Fence, JournalWrite

from .helpers import poll
from .test_cli import assert_one_line_error, cli

T = TypeVar("T")


def on_store(url: str, work: Callable[[durable.Client], Awaitable[T]]) -> T:
    async def main() -> T:
        async with durable.Client.connect(url) as client:
            return await work(client)

    return anyio.run(main)


@pytest.fixture
def runs(tmp_path: Path) -> str:
    """A database with four queued runs of cli.hello (two with key k1), one of cli.other,
    one of cli.hello claimed as a worker would (key k1, running) and one completed."""
    url = f"sqlite:///{tmp_path / 'd.db'}"

    async def setup(client: durable.Client) -> None:
        for i in range(4):
            await client.start("cli.hello", f"n{i}", id=f"q{i}", key="k1" if i < 2 else None)
        await client.start("cli.other", "x", id="other")
        await client.start("cli.hello", "r", id="running")
        [claimed] = await client.store.claim("w-1", 300.0, 1, run_id="running")
        assert claimed.state is RunState.RUNNING
        await client.start("cli.hello", "d", id="done")
        [ran] = await client.store.claim("w-1", 300.0, 1, run_id="done")
        assert await client.store.finish(Fence(ran.id, ran.epoch), RunState.COMPLETED)

    on_store(url, setup)
    return url


def states(url: str, limit: int = 100) -> dict[str, str]:
    async def read(client: durable.Client) -> dict[str, str]:
        out = {}
        for run in await client.list(limit=limit):
            flag = "+cancel" if run.cancel_requested and not run.state.finished else ""
            out[run.id] = run.state.value + flag
        return out

    return on_store(url, read)


BEFORE = {"q0": "queued", "q1": "queued", "q2": "queued", "q3": "queued", "other": "queued",
          "running": "running", "done": "completed"}


def test_a_filter_without_yes_is_refused_and_a_dry_run_lists_and_writes_nothing(
        runs: str) -> None:
    refused = cli("cancel", "--workflow", "cli.hello", db=runs)
    assert_one_line_error(refused, "cancelling by filter needs --yes")
    assert refused.returncode == 2
    dry = cli("cancel", "--workflow", "cli.hello", "--dry-run", db=runs)
    assert dry.returncode == 0, dry.stderr
    lines = dry.stdout.splitlines()
    assert lines[0] == "5 runs matched (--workflow cli.hello)"
    assert sorted(line.split()[0] for line in lines[1:]) == ["q0", "q1", "q2", "q3",
                                                             "running"]
    assert all(line.endswith("would be cancelled") for line in lines[1:])
    assert states(runs) == BEFORE


def test_a_filter_cancels_the_queued_runs_and_stops_the_running_one_and_says_so(
        runs: str) -> None:
    """--workflow cli.hello --yes: the four queued runs are cancelled at once, the running
    one has its cancel requested, the other workflow's run and the finished one are left.
    Each cancel is journaled with who sent it and the filter."""
    done = cli("cancel", "--workflow", "cli.hello", "--yes", db=runs)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "5 runs matched (--workflow cli.hello)"
    said = {line.split()[0]: line.split(" ", 1)[1] for line in lines[1:]}
    assert said == {"q0": "cancelled before it started", "q1": "cancelled before it started",
                    "q2": "cancelled before it started", "q3": "cancelled before it started",
                    "running": "cancel requested; the worker holding it stops it now"}
    assert states(runs) == {**BEFORE, "q0": "cancelled", "q1": "cancelled",
                            "q2": "cancelled", "q3": "cancelled",
                            "running": "running+cancel"}

    async def origins(client: durable.Client) -> list[Any]:
        return [e.data.get("origin") for e in await client.journal("q2")
                if e.kind in (EntryKind.RUN_CANCEL_REQUESTED, EntryKind.RUN_CANCELLED)]

    found = [o for o in on_store(runs, origins) if o is not None]
    assert found and all(o["via"] == "cli" and o["filter"] == "--workflow cli.hello"
                         for o in found), found


def test_a_key_and_a_state_narrow_the_filter(runs: str) -> None:
    done = cli("cancel", "--key", "k1", "--state", "queued", "--yes", db=runs)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == "2 runs matched (--key k1 --state queued)"
    assert states(runs) == {**BEFORE, "q0": "cancelled", "q1": "cancelled"}
    none = cli("cancel", "--workflow", "no.such", "--yes", db=runs)
    assert (none.returncode, none.stdout.strip()) == (
        0, "no queued or running run matched (--workflow no.such)"), none.stdout


def test_all_cancels_every_unfinished_run(runs: str) -> None:
    done = cli("cancel", "--all", "--yes", db=runs)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == "6 runs matched (--all)"
    assert states(runs) == {**{k: "cancelled" for k in BEFORE}, "running": "running+cancel",
                            "done": "completed"}


def test_several_ids_each_get_a_line_and_a_missing_or_ended_one_exits_1(runs: str) -> None:
    done = cli("cancel", "q0", "done", "nope", "running", "q0", db=runs)
    assert done.returncode == 1, done.stderr
    assert done.stdout.splitlines() == [
        "q0 cancelled before it started",
        "done had already ended (completed); nothing to cancel",
        "nope no such run",
        "running cancel requested; the worker holding it stops it now",
    ]
    assert states(runs) == {**BEFORE, "q0": "cancelled", "running": "running+cancel"}
    again = cli("cancel", "q1", "q2", db=runs)
    assert again.returncode == 0, again.stderr


@pytest.mark.parametrize(("args", "says"), [
    (["q0", "--workflow", "cli.hello"], "give run ids or a filter"),
    (["--all", "--workflow", "cli.hello", "--yes"], "--all cancels every queued and running"),
    ([], "name the runs to cancel"),
    (["q0", "q1", "--dry-run"], "--dry-run lists what a filter matches"),
    (["--key", "", "--yes"], "key"),
])
def test_a_cancel_it_cannot_do_is_one_line_and_cancels_nothing(
        runs: str, args: list[str], says: str) -> None:
    assert_one_line_error(cli("cancel", *args, db=runs), says)
    assert states(runs) == BEFORE


def test_a_filter_matching_more_than_a_page_cancels_them_all(tmp_path: Path) -> None:
    """1,201 queued runs (a page is 500): every one is cancelled."""
    from durable._cli import CANCEL_PAGE

    url = f"sqlite:///{tmp_path / 'd.db'}"
    n = 2 * CANCEL_PAGE + 201

    async def setup(client: durable.Client) -> None:
        for i in range(n):
            await client.start("cli.hello", "x", id=f"bulk-{i:05d}")

    on_store(url, setup)
    done = cli("cancel", "--workflow", "cli.hello", "--yes", db=url)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == f"{n} runs matched (--workflow cli.hello)"
    assert set(states(url, limit=n + 10).values()) == {"cancelled"}


def test_a_cancel_says_what_the_run_s_attempts_had_done(tmp_path: Path) -> None:
    """A run cancelled at once was cancelled *before it started* only if no attempt ran.
    One that slept after a step, waited for a signal, or was recovered with a step in
    doubt is said to be cancelled while it waited (or was queued between attempts), with
    the steps done and those in doubt, from its journal. Before, each was "cancelled
    before it started", hiding a step that had deleted something."""
    from durable._types import JournalWrite

    url = f"sqlite:///{tmp_path / 'd.db'}"

    async def setup(client: durable.Client) -> None:
        store = client.store
        for run_id in ("slept", "signalled", "doubt", "fresh"):
            await client.start("cli.hello", run_id, id=run_id)
        for run_id in ("slept", "signalled", "doubt"):
            [run] = await store.claim("w-1", 0.2 if run_id == "doubt" else 300.0, 1,
                                      run_id=run_id)
            fence = Fence(run.id, run.epoch)
            started = JournalWrite(EntryKind.STEP_STARTED, 1, "1", "cli.echo", 1,
                                   {"args": []})
            done = JournalWrite(EntryKind.STEP_COMPLETED, 1, "1", "cli.echo", 1,
                                {"result": "deleted"})
            if run_id == "doubt":  # its worker died in step 1: recovered, queued again
                assert await store.append(fence, [started])
                await poll(lambda f=fence: store.recover_stale(f.run_id, f.epoch), timeout=10)
                continue
            waiting = JournalWrite(EntryKind.RUN_WAITING, data={
                "until": None, "reason": "sleep" if run_id == "slept" else "signal",
                "signal": None if run_id == "slept" else "go"})
            assert await store.append(fence, [started, done])
            assert await store.release(fence, [waiting], run_at=await store.now() + 3600,
                                       waiting_for=None if run_id == "slept" else "go")

    on_store(url, setup)
    said = {}
    for run_id in ("slept", "signalled", "doubt", "fresh"):
        result = cli("cancel", run_id, db=url)
        assert result.returncode == 0, result.stderr
        said[run_id] = result.stdout.strip()
    assert said == {
        "slept": "slept cancelled while it slept (attempt 1 had run: step 1 done)",
        "signalled": "signalled cancelled while it waited for signal 'go' (attempt 1 had "
                     "run: step 1 done)",
        "doubt": "doubt cancelled while queued between attempts (attempt 1 had run: no "
                 "step done; step 1 in doubt: check it before any replay)",
        "fresh": "fresh cancelled before it started"}


def after_the_first_read(store: Any, act: Callable[[], Awaitable[None]]) -> list[str]:
    """Run ``act`` once, right after the store's first read of a runs list (whichever
    listing the filtered cancel uses); the names of the listings read, in order."""
    reads: list[str] = []
    for name in ("list_runs", "list_unfinished"):
        listed = getattr(store, name, None)
        if listed is None:  # (the code before the one listing of both states)
            continue

        async def hooked(*args: Any, _listed: Any = listed, _name: str = name,
                         **filters: Any) -> Any:
            page = await _listed(*args, **filters)
            reads.append(_name)
            if len(reads) == 1:
                await act()
            return page

        setattr(store, name, hooked)
    return reads


@pytest.mark.anyio
async def test_a_run_claimed_after_the_filter_s_first_read_is_cancelled_once(
        tmp_path: Path) -> None:
    """``cancel --workflow`` reads what the filter matches before cancelling. A worker's
    claim right after the first read (driven there, on a real SQLite file) moves a run from
    queued to running: it is listed once, and cancelled (before 563cc68: running was read
    first, then queued, so a run claimed between the reads was in neither list)."""
    from durable._cli import _unfinished

    async with durable.Client.connect(f"sqlite:///{tmp_path / 'c.db'}") as client:
        await client.start("cx.work", id="a")
        await client.start("cx.work", id="b")

        async def claim() -> None:
            [claimed] = await client.store.claim("w1", 30.0, 1, run_id="a")
            assert claimed.state is RunState.RUNNING

        reads = after_the_first_read(client.store, claim)
        found = await _unfinished(client, "cx.work", None, None)
        assert reads
        assert sorted(run_id for run_id, _, _ in found) == ["a", "b"]


@pytest.mark.anyio
async def test_a_run_released_after_the_filter_s_first_read_is_cancelled(
        tmp_path: Path) -> None:
    """A worker's shutdown release right after the first read (driven there, on a real
    SQLite file) moves a run from running back to queued: it matched the filter all through
    the command, and is listed (before: the queued runs were read first, then the running
    ones, so a run released between the two reads was in neither, and not cancelled)."""
    from durable._cli import _unfinished

    async with durable.Client.connect(f"sqlite:///{tmp_path / 'c.db'}") as client:
        await client.start("cx.work", id="a")
        await client.start("cx.work", id="b")
        [held] = await client.store.claim("w1", 30.0, 1, run_id="a")

        async def release() -> None:  # what a worker's shutdown writes
            assert await client.store.release(Fence(held.id, held.epoch), [JournalWrite(
                EntryKind.RUN_INTERRUPTED, data={"reason": "worker shutdown"})])

        reads = after_the_first_read(client.store, release)
        found = await _unfinished(client, "cx.work", None, None)
        assert reads
        assert (await client.get("a")).state is RunState.QUEUED
        assert sorted((run_id, state) for run_id, _, state in found) == [
            ("a", "running"), ("b", "queued")]


@pytest.mark.anyio
async def test_a_run_whose_lease_expired_is_listed_by_the_filter(tmp_path: Path) -> None:
    """A running run whose worker died (its lease expired) is recovered by the read that
    finds it, running back to queued: it is listed, queued (before: the running runs' read
    recovered it and dropped it as no longer running, after the queued runs were read)."""
    from durable._cli import _unfinished

    clock = FakeClock(start=1000.0)
    async with durable.Client.connect(f"sqlite:///{tmp_path / 'c.db'}",
                                      clock=clock) as client:
        await client.start("cx.work", id="a")
        await client.start("cx.work", id="b")
        await client.store.claim("w1", 30.0, 1, run_id="a")
        clock.advance(31.0)
        found = await _unfinished(client, "cx.work", None, None)
        assert sorted((run_id, state) for run_id, _, state in found) == [
            ("a", "queued"), ("b", "queued")]


@pytest.mark.anyio
async def test_a_filter_s_pages_list_each_run_once_while_runs_move(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Pages of two runs: after the first page a worker's shutdown releases one running
    run of a later page and a claim takes a queued one; every run of the filter is listed
    once (the other workflow's not), in the state of its page's read."""
    from durable import _cli

    monkeypatch.setattr(_cli, "CANCEL_PAGE", 2)
    async with durable.Client.connect(f"sqlite:///{tmp_path / 'c.db'}") as client:
        for i in range(5):
            await client.start("cx.work", id=f"r{i}")
        await client.start("cx.other", id="o")
        [held] = await client.store.claim("w1", 30.0, 1, run_id="r1")

        async def move() -> None:
            assert await client.store.release(Fence(held.id, held.epoch), [JournalWrite(
                EntryKind.RUN_INTERRUPTED, data={"reason": "worker shutdown"})])
            assert await client.store.claim("w2", 30.0, 1, run_id="r0")

        reads = after_the_first_read(client.store, move)
        found = await _cli._unfinished(client, "cx.work", None, None)
        assert len(reads) == 3
        assert [(run_id, state) for run_id, _, state in found] == [
            ("r4", "queued"), ("r3", "queued"), ("r2", "queued"), ("r1", "queued"),
            ("r0", "running")]
        running = await _cli._unfinished(client, "cx.work", None, "running")
        assert [run_id for run_id, _, _ in running] == ["r0"]
