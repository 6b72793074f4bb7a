"""Pausing a workflow (``Client.pause`` / ``resume``, ``durable pause`` / ``resume`` /
``paused``): no claim takes a run of a paused workflow (a new attempt, or one resuming after
a durable wait) until it is resumed; its queued runs keep their place, its running attempts
go on, other workflows run. A resume from another process wakes idle workers (SQLite's
data_version, PostgreSQL's NOTIFY) without their poll. On SQLite and PostgreSQL, asyncio and
trio; the operator is a client on a store object of its own, as another process would be."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest

import durable
from durable import RunState
from durable._clock import FakeClock

from .helpers import poll, running_worker
from .pg import pg_url, postgres_server
from .test_cli import assert_one_line_error, cli
from .test_guard_history_waits import waiting_in
from .waiting import client, clock, store_url

__all__ = ["client", "clock", "pg_url", "postgres_server", "store_url"]

pytestmark = pytest.mark.anyio

LONG_POLL = 60.0  # longer than any bound here: a run claimed in time was not found by a poll


@pytest.fixture
async def operator(store_url: str, clock: FakeClock,
                   registry: durable.Registry) -> AsyncIterator[durable.Client]:
    async with durable.Client.connect(store_url, clock=clock, registry=registry) as c:
        yield c


def flows(registry: durable.Registry, ran: list[str]) -> durable.Activity[[str], str]:
    """Workflows whose one step records that it ran (a step, not workflow code: a claim
    that rides on the first write runs workflow code up to that write, and a refused claim
    writes nothing and sends nothing: durable/_claims.py)."""
    @durable.activity("record", registry=registry)
    async def record(ctx: durable.ActivityContext, what: str) -> str:
        ran.append(what)
        return what

    @durable.workflow("teardown", registry=registry)
    async def teardown(ctx: durable.WorkflowContext, slot: str) -> str:
        return await record(ctx, slot)

    @durable.workflow("report", registry=registry)
    async def report(ctx: durable.WorkflowContext) -> str:
        await record(ctx, "report")
        return "ok"

    return record


async def running(client: durable.Client, run_id: str) -> bool:
    return (await client.get(run_id)).state is RunState.RUNNING


async def queued(client: durable.Client, run_id: str) -> durable.Run:
    run = await client.get(run_id)
    assert run.state is RunState.QUEUED and run.attempt == 0, run
    return run


@pytest.mark.parametrize("concurrency", [16, 1], ids=["claim", "read_claim"])
async def test_a_paused_workflow_s_runs_wait_others_run_and_a_resume_runs_them(
        client: durable.Client, operator: durable.Client, registry: durable.Registry,
        concurrency: int) -> None:
    """Paused, a run started while the worker runs (its start wakes the worker; on
    PostgreSQL its NOTIFY carries the row) is not claimed, though it is first in line: a
    run of another workflow started after it completes. The resume, from another store
    object, has it claimed at once (the worker's poll is a minute)."""
    ran: list[str] = []
    flows(registry, ran)
    pause = await operator.pause("teardown", origin={"via": "test", "user": "ops"})
    assert pause.workflow == "teardown" and pause.origin == {"via": "test", "user": "ops"}
    async with running_worker(client, registry, concurrency=concurrency,
                              poll_interval=LONG_POLL):
        await client.start("teardown", "slot-1", id="t1")
        await client.start("report", id="r1")
        assert (await client.wait("r1", timeout=15)).state is RunState.COMPLETED
        await queued(client, "t1")  # due before r1, and still not claimed
        assert ran == ["report"]
        ended = await operator.resume("teardown")
        assert ended == pause
        with anyio.fail_after(15):
            done = await client.wait("t1", timeout=15)
    assert done.state is RunState.COMPLETED and done.result == "slot-1"
    assert ran == ["report", "slot-1"]


async def test_a_running_attempt_goes_on_when_its_workflow_is_paused(
        client: durable.Client, operator: durable.Client, registry: durable.Registry) -> None:
    """Pause stops new attempts, not the ones running (cancel stops those)."""
    gate = anyio.Event()
    entered = anyio.Event()

    @durable.workflow("gated", registry=registry)
    async def gated(ctx: durable.WorkflowContext) -> str:
        entered.set()
        await gate.wait()
        return "went on"

    async with running_worker(client, registry):
        await client.start("gated", id="g1")
        with anyio.fail_after(15):
            await entered.wait()
        # claimed (a claim riding on the first write commits within RIDE_WAIT on its own)
        await poll(lambda: running(client, "g1"), timeout=15)
        await operator.pause("gated")
        gate.set()
        done = await client.wait("g1", timeout=15)
    assert done.state is RunState.COMPLETED and done.result == "went on"


async def test_a_run_released_to_sleep_does_not_resume_while_its_workflow_is_paused(
        client: durable.Client, operator: durable.Client, registry: durable.Registry,
        clock: FakeClock) -> None:
    """A run sleeping 2 min (released) is due; its workflow is paused: it stays queued even
    as a run of another workflow due after it completes, and wakes once resumed."""
    ran: list[str] = []
    record = flows(registry, ran)

    @durable.workflow("napper", registry=registry)
    async def napper(ctx: durable.WorkflowContext) -> str:
        await record(ctx, "nap")
        await ctx.sleep(120)
        await record(ctx, "woke")
        return "woke"

    async with running_worker(client, registry, poll_interval=LONG_POLL):
        await client.start("napper", id="n1")
        await waiting_in(client, "n1", 1)
        await operator.pause("napper")
        clock.advance(121)
        await client.start("report", id="r1")
        assert (await client.wait("r1", timeout=15)).state is RunState.COMPLETED
        asleep = await client.get("n1")
        assert asleep.state is RunState.QUEUED and asleep.attempt == 1
        assert await operator.resume("napper") is not None
        done = await client.wait("n1", timeout=15)
    assert done.state is RunState.COMPLETED and done.attempt == 2
    assert ran == ["nap", "report", "woke"]


async def test_pausing_twice_keeps_the_first_pause_and_resuming_twice_ends_it_once(
        client: durable.Client, operator: durable.Client, clock: FakeClock) -> None:
    first = await operator.pause("teardown", origin={"via": "cli", "user": "a"})
    clock.advance(5)
    again = await client.pause("teardown", origin={"via": "cli", "user": "b"})
    assert again == first
    await client.pause("other")
    assert [p.workflow for p in await operator.paused()] == ["other", "teardown"]
    assert await client.pause_of("teardown") == first
    assert await operator.resume("teardown") == first
    assert await client.resume("teardown") is None
    assert await client.pause_of("teardown") is None
    assert [p.workflow for p in await client.paused()] == ["other"]


async def test_a_pause_says_whether_the_workflow_is_known(
        client: durable.Client, operator: durable.Client, registry: durable.Registry) -> None:
    """``known`` of what ``pause`` returns: False for a name neither a run in the database
    nor the client's registry knows (a typo: paused all the same, as a new workflow may be
    paused before its first start); True once either knows it. A pause read back
    (``paused``, ``pause_of``) is not told (None), and compares equal all the same.
    Before: nothing told the caller of the typo (only the CLI looked, and printed a note)."""
    typo = await operator.pause("slot.teardwn")
    assert typo.known is False
    assert [(p.workflow, p.known) for p in await operator.paused()] == [("slot.teardwn", None)]
    assert await operator.pause_of("slot.teardwn") == typo
    assert (await operator.pause("slot.teardwn")).known is False  # paused already: the same
    await operator.start("other.flow", id="o1")  # by name: no registry knows it, a run does
    assert (await operator.pause("other.flow")).known is True
    flows(registry, [])  # declared in the client's registry, no run of it yet
    assert (await client.pause("report")).known is True


@pytest.mark.parametrize("bad", ["", "  ", None, 3])
async def test_a_workflow_that_is_no_name_is_refused(client: durable.Client,
                                                     bad: object) -> None:
    with pytest.raises(durable.ConfigError, match="a workflow is a Workflow or its name"):
        await client.pause(bad)  # type: ignore[arg-type]
    assert await client.paused() == []


def test_the_cli_pauses_lists_shows_and_resumes(tmp_path: Path) -> None:
    """``durable pause`` says who paused and how many runs wait; ``paused``, ``list`` and
    ``show`` say it; ``start`` of a paused workflow notes it; ``resume`` ends it."""
    db = f"sqlite:///{tmp_path / 'd.db'}"
    started = cli("start", "cli.hello", '"a"', "--import", "tests.cliflows", "--id", "h1",
                  db=db)
    assert started.returncode == 0, started.stderr
    paused = cli("pause", "cli.hello", db=db)
    assert paused.returncode == 0, paused.stderr
    assert paused.stdout.startswith("cli.hello paused since ")
    assert "(cli)" in paused.stdout and "(1 queued run waits; running ones go on)" in \
        paused.stdout
    assert paused.stderr == ""
    more = cli("start", "cli.hello", '"b"', "--import", "tests.cliflows", "--id", "h2", db=db)
    assert more.returncode == 0, more.stderr
    assert "cli.hello is paused" in more.stderr and "durable resume cli.hello" in more.stderr
    listed = cli("paused", db=db)
    assert listed.returncode == 0 and listed.stdout.startswith("cli.hello  paused since ")
    assert listed.stdout.rstrip().endswith("(2 queued)")
    runs = cli("list", db=db)
    [h1] = [line for line in runs.stdout.splitlines() if line.startswith("h1")]
    assert h1.rstrip().endswith("paused (durable resume cli.hello)"), h1
    shown = cli("show", "h1", db=db)
    [line] = [ln for ln in shown.stdout.splitlines() if ln.startswith("paused")]
    assert "its workflow is paused since" in line
    resumed = cli("resume", "cli.hello", db=db)
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout.startswith("cli.hello resumed (it was paused since ")
    assert cli("resume", "cli.hello", db=db).stdout.strip() == \
        ("cli.hello is not paused (resumed already, or never paused): its runs are claimed "
         "as usual; nothing to do")
    assert cli("paused", db=db).stdout.strip() == "no paused workflow"
    assert "paused" not in cli("show", "h1", db=db).stdout.split("time UTC")[0]


def test_pausing_a_workflow_no_run_ever_had_says_so(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'd.db'}"
    assert cli("migrate", db=db).returncode == 0
    paused = cli("pause", "slot.teardwn", db=db)
    assert paused.returncode == 0, paused.stderr
    assert "no run of 'slot.teardwn' was ever started in this database" in paused.stderr
    assert_one_line_error(cli("pause", db=db), "the following arguments are required")

