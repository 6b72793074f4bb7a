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
from durable._types import EntryKind, Fence

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
