"""The console says what ``durable show`` says, in the same words: a run's page over real
HTTP (loopback) on a real SQLite file, its tables of attempts and of a step's tries in the
phrases and states of show's timeline (never a journal entry's kind, a raw epoch-seconds
float or an empty ``from_step: ; in_doubt:``)."""

from __future__ import annotations

import re

import anyio
import pytest

import durable
from durable import RunState

from .helpers import running_worker
from .test_cli import cli
from .test_console_http import console
from .test_guard_report_doubt import LEASE, _died_in_step_two, _flows

pytestmark = pytest.mark.anyio

RAW_KIND = re.compile(r"\b(run|step|signal)_[a-z_]+\b")
RAW_TIME = re.compile(r"\b\d{9,}\.\d+\b")


def _section(page: str, pattern: str) -> str:
    found = re.findall(pattern, page, re.S)
    assert found, pattern
    return "".join(found)


async def _recovered_failed_and_replayed(client: durable.Client, clock: durable.FakeClock,
                                         registry: durable.Registry) -> str:
    """The page of r1: its worker died in step 2 (lease ran out, recovered), the next attempt
    failed on the step in doubt, and an operator replayed it, then again accepting the
    step."""
    _flows(registry)
    run = await _died_in_step_two(client, "r1")
    clock.advance(LEASE + 1)
    assert await client.store.recover_stale(run.id, run.epoch)
    async with running_worker(client, registry):
        assert (await client.wait("r1", timeout=20)).state is RunState.FAILED
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
