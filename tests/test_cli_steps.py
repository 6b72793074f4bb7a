"""Step numbers given to replay and show: out of range is refused; messages say what happens.

The replay message is checked against what the next attempt really runs.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import anyio
import pytest

import durable
import durable.testing
from durable import RunState
from durable._client import describe_replay

from .test_cli import assert_one_line_error, cli


def _define(registry: durable.Registry, executed: list[str], broken: set[str],
            gate: anyio.Event | None = None) -> None:
    @durable.activity("steps.do", registry=registry)
    async def do(ctx: durable.ActivityContext, name: str) -> str:
        executed.append(name)
        if name in broken:
            raise durable.NonRetryableError(f"{name} broke")
        if gate is not None and name == "two":
            await gate.wait()  # in flight until the operator cancels
        return name

    @durable.workflow("steps.three", registry=registry)
    async def three(ctx: durable.WorkflowContext) -> list[str]:
        return [await do(ctx, "one"), await do(ctx, "two"), await do(ctx, "three")]


def journal_rows(path: Path) -> int:
    conn = sqlite3.connect(path)
    try:
        return int(conn.execute("SELECT count(*) FROM durable_journal").fetchone()[0])
    finally:
        conn.close()


@pytest.fixture
def failed_runs(tmp_path: Path) -> Path:
    """A SQLite file with runs f1 and f2 of a three-step workflow, failed at step 3."""

    async def make() -> None:
        registry = durable.Registry()
        _define(registry, [], {"three"})
        async with durable.testing.sqlite_client(tmp_path, registry=registry) as client:
            async with durable.testing.running_worker(client):
                for run_id in ("f1", "f2"):
                    await client.start("steps.three", id=run_id)
                    assert (await client.wait(run_id)).state is RunState.FAILED

    anyio.run(make)
    return tmp_path / "durable.db"


def test_out_of_range_steps_are_refused_and_nothing_is_written(failed_runs: Path) -> None:
    url = f"sqlite:///{failed_runs}"
    before = journal_rows(failed_runs)
    for step in ("99", "4", "0", "-1"):
        result = cli("replay", "f1", "--from-step", step, db=url)
        assert result.returncode == 2, (step, result.stdout, result.stderr)
        assert result.stdout == ""
        assert_one_line_error(result, "--from-step")
        shown = cli("show", "f1", "--step", step, db=url)
        assert shown.returncode == 2 and shown.stdout == ""
        assert_one_line_error(shown, "--step")
        assert cli("show", "f1", "--step", step, "--json", db=url).returncode == 2
    assert_one_line_error(cli("replay", "f1", "--from-step", "99", db=url),
                          "run f1 has no step 99", "its journal has steps 1 to 3")
    assert_one_line_error(cli("show", "f1", "--step", "99", db=url),
                          "run f1 has no step 99", "steps 1 to 3")
    assert journal_rows(failed_runs) == before
    listed = cli("list", "--state", "failed", "--json", db=url)
    assert '"f1"' in listed.stdout  # still failed: the refused replay queued nothing
    assert cli("show", "f1", "--step", "3", db=url).returncode == 0


def test_replay_messages_say_which_steps_run_again(failed_runs: Path) -> None:
    url = f"sqlite:///{failed_runs}"
    result = cli("replay", "f1", "--from-step", "2", db=url)
    assert result.returncode == 0, result.stderr
    assert result.stdout == (
        "f1 queued again: step 2 and every later step will run again; step 1 will not run "
        "again (journaled results are used)\n")
    assert "completed steps will not run again" not in result.stdout

    result = cli("replay", "f2", "--accept-in-doubt", db=url)
    assert result.returncode == 0, result.stderr
    assert result.stdout == (
        "f2 queued again: steps 1 and 2 will not run again (journaled results are used); "
        "step 3 (failed or unfinished) will run again; no step is in doubt, so the in-doubt "
        "choice changes nothing\n")


@pytest.mark.anyio
async def test_the_replay_message_matches_what_runs(tmp_path: Path) -> None:
    registry = durable.Registry()
    executed: list[str] = []
    broken = {"three"}
    _define(registry, executed, broken)
    async with durable.testing.sqlite_client(tmp_path, registry=registry) as client:
        async with durable.testing.running_worker(client):
            await client.start("steps.three", id="r")
            assert (await client.wait("r")).state is RunState.FAILED
            with pytest.raises(durable.ConfigError, match="no step 4"):
                await client.replay("r", from_step=4)  # the API refuses too
            with pytest.raises(durable.ConfigError):
                await client.replay("r", from_step=0)
            assert (await client.get("r")).state is RunState.FAILED
            entries = await client.journal("r")
            message = describe_replay("r", entries, 2)
            assert "step 2 and every later step will run again" in message
            assert "step 1 will not run again" in message
            broken.clear()
            executed.clear()
            await client.replay("r", from_step=2)
            assert (await client.wait("r")).state is RunState.COMPLETED
    assert executed == ["two", "three"]  # as the message said: not step 1


@pytest.mark.anyio
async def test_in_doubt_steps_and_the_chosen_resolution(tmp_path: Path) -> None:
    registry = durable.Registry()
    executed: list[str] = []
    gate = anyio.Event()
    _define(registry, executed, set(), gate)

    @registry.activities["steps.do"].lookup
    async def what_it_did(ctx: durable.ActivityContext, name: str) -> str:
        return name  # an accepted step's result comes from its lookup, never a silent None

    async with durable.testing.sqlite_client(tmp_path, registry=registry) as client:
        async with durable.testing.running_worker(client):
            await client.start("steps.three", id="d")
            with anyio.fail_after(10):
                while executed != ["one", "two"]:
                    await anyio.sleep(0.01)  # bounded poll: step 2 is in flight
            await client.cancel("d")
            assert (await client.wait("d")).state is RunState.CANCELLED
            entries = await client.journal("d")
            undecided = describe_replay("d", entries)
            assert "step 1 will not run again" in undecided
            assert "step 2 in doubt: each runs again if its activity has on_doubt='retry'" \
                in undecided
            assert "(in doubt) will run again" in describe_replay(
                "d", entries, in_doubt="rerun")
            accepted = describe_replay("d", entries, in_doubt="accept")
            assert "step 2 (in doubt) will count as done, accepted by an operator" in accepted
            executed.clear()
            await client.replay("d", in_doubt="accept")
            run = await client.wait("d")
    assert run.state is RunState.COMPLETED
    assert run.result == ["one", "two", "three"]
    assert executed == ["three"]  # step 2 was not run again: it counted as done


@pytest.fixture
def in_doubt_run(tmp_path: Path) -> Path:
    """A SQLite file with run to1 of the three-step workflow, cancelled while step 2 was in
    flight: step 2 is in doubt."""

    async def make() -> None:
        registry = durable.Registry()
        executed: list[str] = []
        _define(registry, executed, set(), anyio.Event())
        async with durable.testing.sqlite_client(tmp_path, registry=registry) as client:
            async with durable.testing.running_worker(client):
                await client.start("steps.three", id="to1")
                with anyio.fail_after(10):
                    while executed != ["one", "two"]:
                        await anyio.sleep(0.01)  # bounded poll: step 2 is in flight
                await client.cancel("to1")
                assert (await client.wait("to1")).state is RunState.CANCELLED

    anyio.run(make)
    return tmp_path / "durable.db"


def test_accepting_a_step_in_doubt_that_from_step_runs_again_is_refused(
        in_doubt_run: Path) -> None:
    """--from-step 2 runs step 2 again, in doubt or not; --accept-in-doubt asks to count it
    as done. The two contradict each other on the one step whose outcome is unknown (it may
    have deleted something): refused in one line, nothing written (before: queued, the
    choice silently overridden, and "no step is in doubt" said)."""
    url = f"sqlite:///{in_doubt_run}"
    before = journal_rows(in_doubt_run)
    for from_step in ("1", "2"):
        refused = cli("replay", "to1", "--from-step", from_step, "--accept-in-doubt", db=url)
        assert refused.stdout == ""
        assert_one_line_error(refused, f"run to1: step 2 in doubt, and --from-step {from_step} "
                              "runs it again, where --accept-in-doubt asks to count in-doubt "
                              "steps as done; nothing was written")
        assert refused.returncode == 2
    assert journal_rows(in_doubt_run) == before
    assert '"cancelled"' in cli("show", "to1", "--json", db=url).stdout


@pytest.mark.parametrize("choice", [[], ["--rerun-in-doubt"]])
def test_the_replay_message_says_a_step_in_doubt_runs_again_from_the_step(
        in_doubt_run: Path, choice: list[str]) -> None:
    url = f"sqlite:///{in_doubt_run}"
    result = cli("replay", "to1", "--from-step", "2", *choice, db=url)
    assert result.returncode == 0, result.stderr
    assert result.stdout == (
        "to1 queued again: step 2 and every later step will run again, step 2 in doubt "
        "(outcome unknown) included; step 1 will not run again (journaled results are used)"
        "\n")


@pytest.mark.anyio
async def test_the_client_refuses_accepting_what_from_step_runs_again(
        in_doubt_run: Path) -> None:
    async with durable.Client.connect(f"sqlite:///{in_doubt_run}") as client:
        before = await client.journal("to1")
        with pytest.raises(durable.ConfigError, match=r"run to1: step 2 in doubt, and "
                           r"from_step 2 runs it again, where in_doubt='accept'"):
            await client.replay("to1", from_step=2, in_doubt="accept")
        assert await client.journal("to1") == before
        assert (await client.get("to1")).state is RunState.CANCELLED


def test_show_step_gives_the_header_in_full_too(tmp_path: Path) -> None:
    """``show ID --step N`` gives every text in full (README): the header's too, where the
    run's error was cut to the width (piped: 100 columns) with an ellipsis. Without
    ``--step`` every line still fits the width."""
    why = "the service said no: " + " ".join(f"reason-{i}" for i in range(40))

    async def make() -> None:
        registry = durable.Registry()

        @durable.activity("steps.refuse", registry=registry,
                          retry=durable.RetryPolicy(max_tries=1))
        async def refuse(ctx: durable.ActivityContext, name: str) -> str:
            raise durable.NonRetryableError(why)

        @durable.workflow("steps.long", registry=registry)
        async def long(ctx: durable.WorkflowContext, name: str) -> str:
            return await refuse(ctx, name)

        async with durable.testing.sqlite_client(tmp_path, registry=registry) as client:
            async with durable.testing.running_worker(client):
                await client.start("steps.long", "x" * 150, id="long")
                assert (await client.wait("long")).state is RunState.FAILED

    anyio.run(make)
    url = f"sqlite:///{tmp_path / 'durable.db'}"
    shown = cli("show", "long", "--step", "1", db=url)
    assert shown.returncode == 0, shown.stderr
    header = shown.stdout.split("\n\n")[0].splitlines()
    [error] = [line for line in header if line.startswith("error")]
    assert why in error and "…" not in shown.stdout, shown.stdout
    [args] = [line for line in header if line.startswith("args")]
    assert args.endswith("x" * 150 + '"]'), args
    timeline = cli("show", "long", db=url)
    assert timeline.returncode == 0, timeline.stderr
    assert max(len(line) for line in timeline.stdout.splitlines()) <= 100
    assert "…" in timeline.stdout
