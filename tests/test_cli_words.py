"""What the CLI says of a run is what the store returned, in words a person (or a script's
log) reads right: a real ``durable`` subprocess on a real SQLite file."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import anyio
import pytest

import durable
import durable.testing
from durable import RunState

from .test_cli import cli
from .test_cli_steps import _define


@pytest.fixture
def db(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'words.db'}"


def _start(db: str, *more: str) -> tuple[int, str, str]:
    done = cli("start", "cli.hello", '"world"', "--import", "tests.cliflows", "--id", "h1",
               *more, db=db)
    return done.returncode, done.stdout.strip(), done.stderr


def test_a_start_again_of_an_existing_run_says_it_returned_that_run(db: str) -> None:
    code, first, _ = _start(db)
    assert code == 0 and first == "h1  cli.hello  queued"
    code, again, err = _start(db)
    assert code == 0, err
    assert again == ("h1  cli.hello  queued  (started before with these arguments: that run, "
                     "as it is; nothing new queued)")
    assert cli("cancel", "h1", db=db).returncode == 0
    code, after_cancel, err = _start(db)  # a re-start does not start a cancelled run again
    assert code == 0, err
    assert after_cancel.startswith("h1  cli.hello  cancelled  (started before with these ")
    code, text, err = _start(db, "--json")
    assert code == 0, err
    data = json.loads(text)
    assert data["state"] == "cancelled" and data["created"] is False


def test_a_new_start_in_json_says_it_created_the_run(db: str) -> None:
    code, text, err = _start(db, "--json")
    assert code == 0, err
    data = json.loads(text)
    assert data["id"] == "h1" and data["state"] == "queued" and data["created"] is True


def test_a_resume_sent_again_says_the_workflow_is_not_paused_without_alarm(db: str) -> None:
    assert _start(db)[0] == 0
    assert cli("pause", "cli.hello", db=db).returncode == 0
    resumed = cli("resume", "cli.hello", db=db)
    assert resumed.returncode == 0 and resumed.stdout.startswith("cli.hello resumed (it was ")
    again = cli("resume", "cli.hello", db=db)  # a script's retry after a lost answer
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip() == ("cli.hello is not paused (resumed already, or never "
                                    "paused): its runs are claimed as usual; nothing to do")


ODD_ID = "slot 7 $HOME it's"
"""A run id a shell would split, expand and end a quote in, pasted unquoted."""


@pytest.fixture
def failed_odd(tmp_path: Path) -> tuple[str, str]:
    """A SQLite file with a run of id :data:`ODD_ID` failed at its step 3: its URL, and the
    run's recovery report as text."""

    async def make() -> str:
        registry = durable.Registry()
        _define(registry, [], {"three"})
        async with durable.testing.sqlite_client(tmp_path, registry=registry) as client:
            async with durable.testing.running_worker(client):
                await client.start("steps.three", id=ODD_ID)
                assert (await client.wait(ODD_ID)).state is RunState.FAILED
            return (await client.report(ODD_ID)).text()

    return f"sqlite:///{tmp_path / 'durable.db'}", anyio.run(make)


def _commands(text: str) -> list[list[str]]:
    """Every ``durable`` command in ``text``, as a POSIX shell splits it when pasted."""
    found = re.findall(r"((?:python -m )?durable (?:show|replay|approve|reject|cancel) .*?)"
                       r"(?:  \||\)?$)", text, re.M)
    return [shlex.split(command) for command in found]


def test_the_commands_show_prints_name_the_run_when_pasted_into_a_shell(
        failed_odd: tuple[str, str]) -> None:
    shown = cli("show", ODD_ID, db=failed_odd[0])
    assert shown.returncode == 0, shown.stderr
    commands = _commands(shown.stdout)
    assert ["python", "-m", "durable", "replay", ODD_ID] in commands, shown.stdout
    assert ["python", "-m", "durable", "show", ODD_ID, "--step", "3"] in commands
    assert all(ODD_ID in words for words in commands), commands


def test_the_recovery_report_names_the_run_quoted(failed_odd: tuple[str, str]) -> None:
    commands = _commands(failed_odd[1])
    assert ["python", "-m", "durable", "show", ODD_ID] in commands
    assert ["python", "-m", "durable", "show", ODD_ID, "--step", "3"] in commands


TEXT = "café ☕ Zürich"
TRAP = "\x1b[2J\x9b31m\x7f"
"""A terminal's escapes (clear the screen; a C1 CSI; DEL) in a journaled value."""


def _accents(registry: durable.Registry) -> None:
    @durable.activity("acc.echo", registry=registry)
    async def echo(ctx: durable.ActivityContext, value: object) -> object:
        return value

    @durable.activity("acc.refuse", registry=registry)
    async def refuse(ctx: durable.ActivityContext) -> None:
        raise durable.NonRetryableError(f"the bank said naïve {TRAP}\nsecond line")

    @durable.workflow("acc.flow", registry=registry)
    async def flow(ctx: durable.WorkflowContext, text: str, more: object) -> None:
        await echo(ctx, {"text": text, "more": more})
        await refuse(ctx)


@pytest.fixture
def accented(tmp_path: Path) -> str:
    """A SQLite file with run ``acc``: arguments and a step's result in non-ASCII text and
    terminal escapes, failed with an error holding both."""

    async def make() -> None:
        registry = durable.Registry()
        _accents(registry)
        async with durable.testing.sqlite_client(tmp_path, registry=registry) as client:
            async with durable.testing.running_worker(client):
                await client.start("acc.flow", TEXT, {"trap": TRAP}, id="acc")
                assert (await client.wait("acc")).state is RunState.FAILED

    anyio.run(make)
    return f"sqlite:///{tmp_path / 'durable.db'}"


@pytest.mark.parametrize("step", [None, "1", "2"])
def test_show_prints_text_as_text_and_no_control_character(accented: str,
                                                            step: str | None) -> None:
    more = ["--step", step] if step else []
    shown = cli("show", "acc", *more, "--color", "never", db=accented)
    assert shown.returncode == 0, shown.stderr
    out = shown.stdout
    assert not [c for c in out if c != "\n" and (ord(c) < 32 or 0x7f <= ord(c) <= 0x9f)], out
    assert "\\u00e9" not in out and "\\u2615" not in out, out
    if step != "2":
        assert TEXT in out, out
    if step != "2":  # the arguments (and step 1's result), escapes shown escaped
        assert '"trap": "\\u001b[2J\\u009b31m\\u007f"' in out, out
    if step == "2":
        assert "the bank said naïve \\u001b[2J\\u009b31m\\u007f" in out, out
    data = json.loads(cli("show", "acc", *more, "--json", db=accented).stdout)
    assert data["run"]["args"] == [TEXT, {"trap": TRAP}]


@pytest.mark.anyio
async def test_a_start_returns_whether_it_queued_the_run_and_equals_it(
        client: durable.Client) -> None:
    """What ``durable start`` says comes from here (``StartedRun.created``, the store's
    answer); the run returned compares equal to the run read back, either way round."""
    first = await client.start("t.any", 1, id="s")
    again = await client.start("t.any", 1, id="s")
    assert first.created and not again.created
    read = await client.get("s")
    assert first == read and read == first and (read,) == (again,)
    assert not (read != again) and read != read.evolve(attempt=1)
