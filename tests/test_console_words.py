"""The console says what ``durable show`` says, in the same words: a run's page over real
HTTP (loopback) on a real SQLite file, its tables of attempts and of a step's tries in the
phrases and states of show's timeline (never a journal entry's kind, a raw epoch-seconds
float or an empty ``from_step: ; in_doubt:``)."""

from __future__ import annotations

import re
from pathlib import Path

import anyio
import pytest

import durable
from durable import RunState

from .helpers import running_worker
from .test_cli import cli
from .test_console_http import console
from .test_guard_report_doubt import LEASE, _died_in_step_two, _flows

pytestmark = pytest.mark.anyio


@pytest.fixture
def db_dir(tmp_path: Path) -> Path:
    """Where ``fclient``'s SQLite file is (``clocked.db``)."""
    return tmp_path

RAW_KIND = re.compile(r"\b(run|step|signal)_[a-z_]+\b")
RAW_TIME = re.compile(r"\b\d{9,}\.\d+\b")


def _section(page: str, pattern: str) -> str:
    found = re.findall(pattern, page, re.S)
    assert found, pattern
    return "".join(found)


async def _failed_in_doubt(client: durable.Client, clock: durable.FakeClock,
                           registry: durable.Registry, run_id: str) -> None:
    """``run_id``'s worker died in step 2 (the lease ran out, the run was recovered), and the
    next attempt failed on the step in doubt (its on_doubt is fail)."""
    _flows(registry)
    run = await _died_in_step_two(client, run_id)
    clock.advance(LEASE + 1)
    assert await client.store.recover_stale(run.id, run.epoch)
    async with running_worker(client, registry):
        assert (await client.wait(run_id, timeout=20)).state is RunState.FAILED


async def _recovered_failed_and_replayed(client: durable.Client, clock: durable.FakeClock,
                                         registry: durable.Registry) -> str:
    """The page of r1, failed in doubt (:func:`_failed_in_doubt`), then replayed by an
    operator, then again accepting the step."""
    await _failed_in_doubt(client, clock, registry, "r1")
    async with running_worker(client, registry):
        await client.replay("r1")
        assert (await client.wait("r1", timeout=20)).state is RunState.FAILED
        await client.replay("r1", in_doubt="accept")
        assert (await client.wait("r1", timeout=20)).state is RunState.COMPLETED
    async with console(client) as http:
        return (await http.get("/runs/r1")).text


async def test_the_attempts_table_says_what_shows_timeline_says(
        fclient: durable.Client, clock: durable.FakeClock, registry: durable.Registry) -> None:
    page = await _recovered_failed_and_replayed(fclient, clock, registry)
    attempts = _section(page, r'<section class="attempts">.*?</section>')
    cells = re.sub(r"<time [^>]*>.*?</time>|<span class=\"ago\"[^>]*></span>", "", attempts)
    assert not RAW_KIND.findall(cells), cells
    assert not RAW_TIME.findall(cells), cells
    assert "from_step" not in cells and "in_doubt:" not in cells
    assert "attempt 1 started (epoch 1) by worker dead-worker" in cells
    assert "run recovered: the lease of worker dead-worker expired " in cells
    assert "run failed at step 2" in cells
    assert "<td>replay requested</td>" in cells
    assert "replay requested; steps in doubt accepted as done" in cells
    assert "run completed" in cells


async def test_a_steps_tries_are_shown_in_shows_states(
        fclient: durable.Client, clock: durable.FakeClock, registry: durable.Registry) -> None:
    page = await _recovered_failed_and_replayed(fclient, clock, registry)
    step = _section(page, r'<li class="step [^"]*" id="step-2">.*?</li>')
    tries = _section(step, r'<details class="tries">.*?</details>')
    assert not RAW_KIND.findall(tries), tries
    states = re.findall(r'<span class="badge state-([a-z_]+)">', tries)
    assert states == ["in_doubt", "accepted"], tries
    assert ("<td>unknown</td><td>started by an earlier attempt (epoch 1) with no recorded "
            "outcome") in tries
    assert "accepted by operator (replay --accept-in-doubt)" in tries


async def test_durable_list_and_the_console_name_the_notes_column_alike(
        client: durable.Client, db_url: str) -> None:
    """A failed run's error and a waiting run's note are in one column: ``durable list`` (a
    subprocess on the same SQLite file) and the console's runs list call it the same."""
    await client.start("w.any", id="q1")
    listed = await anyio.to_thread.run_sync(lambda: cli("list", db=db_url))
    assert listed.returncode == 0, listed.stderr
    cli_columns = listed.stdout.splitlines()[0].split()
    async with console(client) as http:
        page = (await http.get("/runs")).text
    table = _section(page, r'<table class="runs">.*?</thead>')
    console_columns = re.findall(r"<th>([^<]*)</th>", table)
    assert cli_columns[-1] == console_columns[-1] == "detail", (cli_columns, console_columns)


async def _in_doubt_then(client: durable.Client, clock: durable.FakeClock,
                         registry: durable.Registry, *, replayed: bool, ran: bool) -> str:
    """r2 failed on step 2 in doubt (its worker died in it; the next attempt's on_doubt is
    fail); ``replayed``: then replayed with no choice for it, ``ran``: and failed again."""
    await _failed_in_doubt(client, clock, registry, "r2")
    if replayed:
        await client.replay("r2")
    if ran:
        async with running_worker(client, registry):
            assert (await client.wait("r2", timeout=20)).state is RunState.FAILED
    async with console(client) as http:
        return (await http.get("/runs/r2")).text


def _said(page: str, text: str) -> str:
    """The console's help of step 2, its report, ``show`` and the report as text."""
    help_ = _section(page, r'<div class="doubt-help">.*?</div>')
    report = _section(page, r'<li class="doubt">.*?</li>')
    said = " | ".join(re.sub(r"<[^>]+>", "", part) for part in (help_, report, text))
    return re.sub(r"\s+", " ", said)  # show's lines wrapped to its width, joined


@pytest.mark.parametrize(("replayed", "ran"), [(False, False), (True, False), (True, True)])
async def test_the_help_for_a_step_in_doubt_follows_the_replays_since(
        fclient: durable.Client, clock: durable.FakeClock, registry: durable.Registry,
        db_dir: Path, replayed: bool, ran: bool) -> None:
    page = await _in_doubt_then(fclient, clock, registry, replayed=replayed, ran=ran)
    shown = await anyio.to_thread.run_sync(
        lambda: cli("show", "r2", db=f"sqlite:///{db_dir / 'clocked.db'}"))
    assert shown.returncode == 0, shown.stderr
    said = _said(page, shown.stdout + (await fclient.report("r2")).text())
    # the try in doubt was started under epoch 1 (its fencing token), noticed under epoch 2
    assert "started under epoch 1" in said and "fencing token 1," in said, said
    replay_said = re.findall(r"the replay at [-0-9: .]+UTC made no choice for it", said)
    if not replayed:  # failed: check, then replay
        assert not replay_said
        assert said.count("check whether it took effect, then replay: re-run it if it did "
                          "not, accept it if it did") == 4, said
    elif not ran:  # queued by the replay: its next attempt acts, as on_doubt says
        assert len(replay_said) == 4, said
        assert said.count("the next attempt runs it again or fails, as its on_doubt says") \
            == 4, said
        assert "check whether it took effect" not in said and "then replay" not in said
    else:  # the replay's attempt failed on it again: check it, and choose this time
        assert len(replay_said) == 4, said
        assert said.count("check whether it took effect, then replay: re-run it if it did "
                          "not, accept it if it did") == 4, said
