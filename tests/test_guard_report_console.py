"""The console never hides what is in doubt: a run's page over real HTTP (loopback).

An item whose step was cut off is counted *in doubt* in the progress bar (never done, never
left out of the count), and a run that still has to run a step an earlier attempt left in
doubt shows its recovery report, though it has not failed.
"""

from __future__ import annotations

import anyio
import pytest

import durable
from durable import RunState

from .helpers import poll, running_worker
from .test_console_http import console
from .test_guard_report_doubt import LEASE, _died_in_step_two, _flows
from .test_progress import _batch, _wanted

pytestmark = pytest.mark.anyio


async def test_the_progress_bar_counts_an_item_cut_off_by_a_cancel_as_in_doubt(
        client: durable.Client, registry: durable.Registry) -> None:
    _batch(registry, {1: anyio.Event()}, set())  # item 1 never finishes: cut off by the cancel
    async with running_worker(client, registry):
        await client.start("prog.batch", 3, id="c")
        await poll(lambda: _wanted(client, "c", done=2, in_flight=1))
        await client.cancel("c")
        assert (await client.wait("c")).state is RunState.CANCELLED
    async with console(client) as http:
        page = (await http.get("/runs/c")).text
    assert ('<p class="progress-text"><b>2 of 3 done</b> · 0 failed · 0 in flight · '
            "1 in doubt · 0 pending</p>") in page
    assert '<rect class="in_doubt"' in page


async def test_a_run_queued_after_its_worker_died_mid_step_shows_the_step_in_doubt(
        fclient: durable.Client, clock: durable.FakeClock, registry: durable.Registry) -> None:
    _flows(registry)
    run = await _died_in_step_two(fclient, "r2")
    clock.advance(LEASE + 1)
    assert await fclient.store.recover_stale(run.id, run.epoch)
    assert (await fclient.get("r2")).state is RunState.QUEUED  # no worker has taken it yet
    async with console(fclient) as http:
        page = (await http.get("/runs/r2")).text
    assert '<section class="report"><h2>Recovery report</h2>' in page
    assert ('<li class="doubt">In doubt: <a href="#step-2">step 2</a> g.charge: started, '
            "outcome unknown; the next attempt runs it again or fails, as its on_doubt "
            "says.") in page
    assert "Already done (will not be repeated): " in page
