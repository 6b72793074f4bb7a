"""Schedules (docs/design.md, "Schedules"): on SQLite and PostgreSQL, asyncio and trio.

Time is an injected clock: a test moves it past a fire and wakes the schedulers; nothing
sleeps to synchronize (bounded polls on the store).
"""

from __future__ import annotations

import datetime as dt
import json
import re
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import anyio
import pytest

import durable
from durable._clock import FakeClock
from durable._schedules import SKIP_GRACE, Scheduler, ScheduleSpec, fire_id
from durable._types import NewRun, RunState
from durable.store import Store
from tests.conftest import ROOT, subprocess_env
from tests.helpers import poll
from tests.pg import pg_url, postgres_server
from tests.test_store_contract import opened, store_url

__all__ = ["pg_url", "postgres_server", "store_url"]  # the stores: test_store_contract.py

pytestmark = pytest.mark.anyio

START = 1_800_000_001.0  # 2027-01-15T08:00:01Z: one second after a fire of every schedule below
EVERY_10S = "* * * * * */10"


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(START)


def hello_registry() -> durable.Registry:
    reg = durable.Registry()

    @durable.workflow("hello", registry=reg)
    async def hello(ctx: durable.WorkflowContext, who: str) -> str:
        return f"hello {who}"

    return reg


async def fired_runs(store: Store, name: str) -> list[durable.Run]:
    return await store.list_runs(id_prefix=f"{name}@", limit=1000)


@asynccontextmanager
async def workers(stores: list[Store], reg: durable.Registry) -> AsyncIterator[list[Any]]:
    """One worker per store (as one per process), schedulers looking once a minute unless
    woken: the test wakes them after moving the clock."""
    async with AsyncExitStack() as stack:
        started = []
        for store in stores:
            client = durable.Client(store, registry=reg)
            started.append(await stack.enter_async_context(
                durable.testing.running_worker(client, schedule_interval=60.0)))
        yield started


async def ticks_after(ws: list[Any]) -> None:
    """Wake every worker's scheduler and wait until each has done a whole tick begun after
    now (so after the clock moved)."""
    begun = [w.scheduler.ticks_begun for w in ws]
    for w in ws:
        w.wake_scheduler()
    await poll(lambda: all(w.scheduler.ticks >= b + 1 for w, b in zip(ws, begun, strict=True)))


# -- definitions -------------------------------------------------------------------------------
def test_cron_with_seconds_and_timezones() -> None:
    spec = ScheduleSpec(name="s", workflow="w", args=[], cron=EVERY_10S)
    assert spec.next_fire(START) == START + 9
    assert spec.latest_fires(START - 35, START, 10) == [START - 31, START - 21, START - 11,
                                                          START - 1]
    assert spec.latest_fires(START - 35, START, 2) == [START - 11, START - 1]
    # 03:00 in Paris is 02:00Z in winter and 01:00Z in summer
    paris = ScheduleSpec(name="p", workflow="w", args=[], cron="0 3 * * *",
                         timezone="Europe/Paris")
    march = dt.datetime(2027, 3, 26, 12, tzinfo=dt.UTC).timestamp()  # DST: 28th
    first = paris.next_fire(march)
    assert dt.datetime.fromtimestamp(first, dt.UTC).hour == 2
    assert dt.datetime.fromtimestamp(paris.next_fire(first), dt.UTC).hour == 1
    assert fire_id("nightly", first) == "nightly@2027-03-27T02:00:00Z"


PARIS_FALL_BACK = dt.datetime(2027, 10, 30, 22, tzinfo=dt.UTC).timestamp()
"""Sunday 2027-10-31 00:00 in Paris: at 03:00 (01:00Z) the clocks go back to 02:00."""


def fires_in(spec: ScheduleSpec, after: float, until: float) -> list[str]:
    """The fires after ``after`` up to ``until`` as Paris wall times, by next_fire."""
    out, when = [], spec.next_fire(after)
    while when <= until:
        out.append(dt.datetime.fromtimestamp(when, ZoneInfo(spec.timezone)).strftime(
            "%d %H:%M%z"))
        when = spec.next_fire(when)
    return out


@pytest.mark.parametrize(("cron", "hours", "expected"), [
    # a fixed time of the day: once, at its first 02:30 (croniter alone: both)
    ("30 2 * * *", 28, ["31 02:30+0200", "01 02:30+0100"]),
    ("0 2 * * *", 28, ["31 02:00+0200", "01 02:00+0100"]),
    ("15,45 2 * * *", 28, ["31 02:15+0200", "31 02:45+0200", "01 02:15+0100",
                           "01 02:45+0100"]),
    ("30 2 * * * 0", 28, ["31 02:30+0200", "01 02:30+0100"]),  # seconds last
    ("@daily", 28, ["31 00:00+0200", "01 00:00+0100"]),
    # a star in the minute or the hour runs on elapsed time: the hour again, both times
    ("0 * * * *", 4, ["31 00:00+0200", "31 01:00+0200", "31 02:00+0200", "31 02:00+0100",
                      "31 03:00+0100"]),
    ("*/30 2 * * *", 28, ["31 02:00+0200", "31 02:30+0200", "31 02:00+0100",
                          "31 02:30+0100", "01 02:00+0100", "01 02:30+0100"]),
])
def test_a_wall_time_the_clocks_go_back_over_fires_once(cron: str, hours: int,
                                                         expected: list[str]) -> None:
    """When the clocks go back, 02:00-03:00 comes twice: a schedule at fixed times of the
    day fires once (its first occurrence), as Vixie cron does, so a nightly reset does not
    run twice; one whose minute or hour field starts with ``*`` fires in both. next_fire
    and latest_fires (the catch-up's read, backwards) agree. From Paris's Sunday 00:00 to
    ``hours`` later (28: Monday 03:00)."""
    spec = ScheduleSpec(name="p", workflow="w", args=[], cron=cron, timezone="Europe/Paris")
    after, until = PARIS_FALL_BACK - 1, PARIS_FALL_BACK + 3600 * hours
    got = fires_in(spec, after, until)
    assert got == expected
    backwards = spec.latest_fires(after, until, 100)
    assert len(backwards) == len(got) and backwards[0] == spec.next_fire(after)


@pytest.mark.parametrize(("field", "value", "message"), [
    ("cron", "0 25 * * *", "bad cron expression '0 25 * * *'"),
    ("cron", "* * *", "give 5 fields"),
    ("cron", "* * * * * * 2030", "not 7"),
    ("timezone", "Mars/Olympus", "unknown timezone 'Mars/Olympus'"),
    ("catchup", -1, "catchup must be 'skip' or a whole number"),
    ("name", "a b", "schedule name"),
    ("name", "a@b", "schedule name"),
])
def test_bad_definitions_are_refused(field: str, value: Any, message: str) -> None:
    fields: dict[str, Any] = {"name": "s", "workflow": "w", "args": [], "cron": "0 3 * * *"}
    fields[field] = value
    with pytest.raises(durable.ConfigError, match=re.escape(message)):
        ScheduleSpec(**fields)


# -- the store ---------------------------------------------------------------------------------
async def test_a_fire_is_one_compare_and_set(store_url: str, clock: FakeClock) -> None:
    """Three stores (three processes) fire the same fire from the same read: one wins, one
    run exists; the losers wrote nothing."""
    spec = ScheduleSpec(name="every10", workflow="hello", args=["x"], cron=EVERY_10S)
    async with AsyncExitStack() as stack:
        stores = [await stack.enter_async_context(opened(store_url, clock)) for _ in range(3)]
        sched, created = await stores[0].put_schedule(spec, origin="cli", replace=False)
        assert created and sched.fired_through == START and sched.version == 1
        clock.advance(10)
        fire_at = START + 9
        new = NewRun(fire_id(spec.name, fire_at), "hello", ["x"], None, fire_at)
        results: list[bool] = []

        async def fire(store: Store) -> None:
            results.append(await store.fire_schedule(spec.name, sched.version, fire_at, new))

        async with anyio.create_task_group() as tg:
            for store in stores:
                tg.start_soon(fire, store)
        assert sorted(results) == [False, False, True]
        runs = await fired_runs(stores[1], "every10")
        assert [r.id for r in runs] == ["every10@2027-01-15T08:00:10Z"]
        assert runs[0].state is RunState.QUEUED and runs[0].run_at == fire_at
        assert [e.kind.value for e in await stores[2].journal(runs[0].id)] == ["run_created"]
        after = await stores[2].get_schedule("every10")
        assert after is not None
        assert (after.version, after.fired_through, after.last_run_id) == (
            2, fire_at, runs[0].id)
        # a stale version writes nothing, even for a later fire
        assert not await stores[0].fire_schedule(spec.name, 1, fire_at + 10, None)
        # a paused schedule fires nothing, even from its current version
        paused = await stores[0].pause_schedule(spec.name, True)
        assert paused is not None
        later = NewRun(fire_id(spec.name, fire_at + 10), "hello", ["x"], None, fire_at + 10)
        assert not await stores[1].fire_schedule(spec.name, paused.version, fire_at + 10, later)
        assert len(await fired_runs(stores[0], "every10")) == 1
        # a fire whose run id exists (started before by hand) moves on and starts nothing
        resumed = await stores[0].pause_schedule(spec.name, False)
        assert resumed is not None
        clock.advance(20)
        taken = NewRun(fire_id(spec.name, fire_at + 20), "hello", ["by hand"], None, 0.0)
        assert (await stores[2].create_run(taken))[1]
        again = NewRun(taken.id, "hello", ["x"], None, fire_at + 20)
        assert await stores[1].fire_schedule(spec.name, resumed.version, fire_at + 20, again)
        kept = await stores[0].get_run(taken.id)
        assert kept is not None and kept.args == ["by hand"]
        assert [e.kind.value for e in await stores[0].journal(taken.id)] == ["run_created"]


async def test_schedule_crud_on_the_store(store_url: str, clock: FakeClock) -> None:
    spec = ScheduleSpec(name="nightly", workflow="hello", args=["n"], cron="0 3 * * *",
                        timezone="Europe/Paris", key="k", catchup=2)
    async with opened(store_url, clock) as store:
        assert await store.list_schedules() == []
        first, created = await store.put_schedule(spec, origin="cli", replace=False)
        assert created and first.spec == spec and first.origin == "cli"
        again, created = await store.put_schedule(spec, origin="cli", replace=False)
        assert not created and again == first
        other = ScheduleSpec(name="nightly", workflow="hello", args=["m"], cron="0 4 * * *")
        kept, created = await store.put_schedule(other, origin="cli", replace=False)
        assert not created and kept.spec == spec
        same, created = await store.put_schedule(spec, origin="cli", replace=True)
        assert not created and same.version == 1  # no change: no write
        clock.advance(5)
        paused = await store.pause_schedule("nightly", True)
        assert paused is not None and paused.paused and paused.version == 2
        replaced, created = await store.put_schedule(other, origin="code", replace=True)
        assert created and replaced.spec == other and replaced.paused  # state kept
        assert replaced.fired_through == START
        clock.advance(100)
        resumed = await store.pause_schedule("nightly", False)
        assert resumed is not None and not resumed.paused
        assert resumed.fired_through == START + 105  # fires while paused never start
        assert await store.pause_schedule("missing", True) is None
        assert [s.name for s in await store.list_schedules()] == ["nightly"]
        assert await store.delete_schedule("nightly")
        assert not await store.delete_schedule("nightly")
        assert await store.get_schedule("nightly") is None


# -- workers -----------------------------------------------------------------------------------
async def test_three_workers_start_one_run_per_fire(store_url: str, clock: FakeClock) -> None:
    reg = hello_registry()
    durable.schedule("every10", "hello", ["world"], cron=EVERY_10S, registry=reg)
    async with AsyncExitStack() as stack:
        stores = [await stack.enter_async_context(opened(store_url, clock)) for _ in range(3)]
        async with workers(stores, reg) as ws:
            # each worker wrote the declaration at start: one schedule, one definition
            await poll(lambda: all(w.scheduler.ticks >= 1 for w in ws))
            [sched] = await stores[0].list_schedules()
            assert sched.origin == "code" and sched.version == 1
            for n in range(3):
                clock.advance(10)  # past the next fire (each is 1 s late)
                await ticks_after(ws)
                runs = await fired_runs(stores[0], "every10")
                assert len(runs) == n + 1, [r.id for r in runs]
            assert sum(w.scheduler.started for w in ws) == 3
            ids = sorted(r.id for r in runs)
            assert ids == [f"every10@2027-01-15T08:00:{s}Z" for s in (10, 20, 30)]
            done = [await durable.Client(stores[1]).wait(i, timeout=10) for i in ids]
            assert {r.result for r in done} == {"hello world"}
            last = await stores[2].get_schedule("every10")
            assert last is not None and last.last_run_id == ids[-1]


async def test_paused_schedule_starts_nothing(store_url: str, clock: FakeClock) -> None:
    reg = hello_registry()
    async with opened(store_url, clock) as store:
        client = durable.Client(store, registry=reg)
        await client.add_schedule(ScheduleSpec(name="p", workflow="hello", args=["p"],
                                               cron=EVERY_10S, catchup=5))
        await client.pause_schedule("p")
        async with workers([store], reg) as ws:
            clock.advance(30)  # three fires while paused
            await ticks_after(ws)
            assert await fired_runs(store, "p") == []
            resumed = await client.pause_schedule("p", paused=False)
            assert resumed.next_fire() == START + 39  # after the resume, not the missed ones
            await ticks_after(ws)
            assert await fired_runs(store, "p") == []  # catch-up does not reach into a pause
            clock.advance(10)
            await ticks_after(ws)
            assert [r.id for r in await fired_runs(store, "p")] == ["p@2027-01-15T08:00:40Z"]


@pytest.mark.parametrize(("catchup", "expected"), [
    ("skip", []),
    (2, ["hourly@2027-01-15T10:00:00Z", "hourly@2027-01-15T11:00:00Z"]),
    (10, [f"hourly@2027-01-15T{h:02d}:00:00Z" for h in (9, 10, 11)]),
])
async def test_missed_fires_follow_the_catchup_policy(
        store_url: str, clock: FakeClock, catchup: Any, expected: list[str]) -> None:
    reg = hello_registry()
    async with opened(store_url, clock) as store:
        client = durable.Client(store, registry=reg)
        await client.add_schedule(ScheduleSpec(name="hourly", workflow="hello", args=["h"],
                                               cron="0 * * * *", catchup=catchup))
        # nothing ran from 08:00:01 to 11:30: the 09:00, 10:00 and 11:00 fires were missed
        clock.advance(3 * 3600 + 30 * 60 - 1)
        scheduler = Scheduler(store)
        upcoming = await scheduler.tick()
        assert upcoming == START - 1 + 4 * 3600  # 12:00
        runs = await fired_runs(store, "hourly")
        assert sorted(r.id for r in runs) == expected
        assert sorted(r.run_at for r in runs) == [
            dt.datetime.fromisoformat(i.split("@")[1]).timestamp() for i in expected]
        sched = await store.get_schedule("hourly")
        assert sched is not None and sched.fired_through == START - 1 + 3 * 3600
        assert await scheduler.tick() == upcoming and len(await fired_runs(store, "hourly")) \
            == len(expected)  # nothing is due twice
        # a fire found within the grace is on time, whatever the policy
        clock.set(START - 1 + 4 * 3600 + SKIP_GRACE - 1)
        await scheduler.tick()
        assert "hourly@2027-01-15T12:00:00Z" in {r.id for r in await fired_runs(store, "hourly")}


async def test_a_nightly_schedule_starts_one_run_in_the_night_the_clocks_go_back(
        store_url: str) -> None:
    """Through Paris's night of 2027-10-31, the scheduler looking every 20 minutes (a
    fire found late starts: catchup=3): the
    nightly 02:30 starts one run (its first 02:30, 00:30Z), where croniter's second 02:30
    (01:30Z) started a second run of a nightly reset; the hourly one starts at both 02:15."""
    clock = FakeClock(PARIS_FALL_BACK)
    reg = hello_registry()
    async with opened(store_url, clock) as store:
        client = durable.Client(store, registry=reg)
        for name, cron in (("nightly", "30 2 * * *"), ("hourly", "15 * * * *")):
            await client.add_schedule(ScheduleSpec(  # catchup: a fire up to 20 min late
                name=name, workflow="hello", args=[name], cron=cron, timezone="Europe/Paris",
                catchup=3))
        scheduler = Scheduler(store)
        for _ in range(5 * 3):  # to 04:00 in Paris (03:00Z): a look every 20 minutes
            clock.advance(20 * 60)
            await scheduler.tick()
        assert sorted(r.id for r in await fired_runs(store, "nightly")) == [
            "nightly@2027-10-31T00:30:00Z"]
        assert sorted(r.id for r in await fired_runs(store, "hourly")) == [
            f"hourly@2027-10-{d}T{h}:15:00Z" for d, h in (
                ("30", "22"), ("30", "23"), ("31", "00"), ("31", "01"), ("31", "02"))]
        nightly = await store.get_schedule("nightly")
        assert nightly is not None and nightly.next_fire() == (
            dt.datetime(2027, 11, 1, 1, 30, tzinfo=dt.UTC).timestamp())  # 02:30 CET


# -- the command line --------------------------------------------------------------------------
def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "durable", *args], cwd=cwd,
                          env=subprocess_env(), capture_output=True, text=True, timeout=60)


@pytest.fixture
def flows(tmp_path: Path) -> Path:
    (tmp_path / "schedflows.py").write_text(
        "import durable\n\n"
        "@durable.workflow('hello')\n"
        "async def hello(ctx, who):\n"
        "    return who\n")
    return tmp_path


def test_cli_schedules(flows: Path) -> None:
    db = ["--db", f"sqlite:///{flows / 'cli.db'}"]
    add = cli("schedule", "add", "nightly", "hello", '"slot-1"', "--cron", "0 3 * * *",
              "--timezone", "Europe/Paris", "--import", "schedflows", *db, cwd=flows)
    assert add.returncode == 0, add.stderr
    assert "next fire" in add.stdout
    listed = cli("schedule", "list", "--json", *db, cwd=flows)
    [shown] = json.loads(listed.stdout)
    assert shown["name"] == "nightly" and shown["timezone"] == "Europe/Paris"
    assert shown["next_fire_at"].endswith(("T02:00:00Z", "T01:00:00Z")) and not shown["paused"]
    assert cli("schedule", "pause", "nightly", *db, cwd=flows).returncode == 0
    table = cli("schedule", "list", *db, cwd=flows).stdout
    assert "paused" in table.splitlines()[1]
    assert cli("schedule", "resume", "nightly", *db, cwd=flows).returncode == 0
    one = cli("schedule", "show", "nightly", *db, cwd=flows).stdout
    assert "Europe/Paris" in one and "last_run_id:   -" in one
    assert cli("schedule", "delete", "nightly", *db, cwd=flows).returncode == 0
    assert cli("schedule", "list", *db, cwd=flows).stdout.strip() == "no schedules"


@pytest.mark.parametrize(("args", "message"), [
    (["add", "s", "hello", "--cron", "0 25 * * *"], "bad cron expression '0 25 * * *'"),
    (["add", "s", "hello", '"x"', "--cron", "0 0 30 2 *"], "cron '0 0 30 2 *' never fires"),
    (["add", "s", "hello", "--cron", "0 3 * * *", "--timezone", "Mars/Olympus"],
     "unknown timezone 'Mars/Olympus'"),
    (["add", "s", "hello", "--cron", "0 3 * * *", "--catchup", "many"], "catchup must be"),
    (["add", "s", "nope", "--cron", "0 3 * * *"], "unknown workflow 'nope'"),
    (["pause", "missing"], "no schedule named 'missing'"),
    (["resume", "missing"], "no schedule named 'missing'"),
    (["delete", "missing"], "no schedule named 'missing'"),
    (["show", "missing"], "no schedule named 'missing'"),
])
def test_cli_bad_input_is_one_line_and_writes_nothing(flows: Path, args: list[str],
                                                     message: str) -> None:
    db = ["--db", f"sqlite:///{flows / 'bad.db'}"]
    assert cli("migrate", *db, cwd=flows).returncode == 0
    done = cli("schedule", *args, "--import", "schedflows", *db, cwd=flows) \
        if args[0] == "add" else cli("schedule", *args, *db, cwd=flows)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and message in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert cli("schedule", "list", *db, cwd=flows).stdout.strip() == "no schedules"


def test_cli_help_names_the_defaults() -> None:
    done = subprocess.run([sys.executable, "-m", "durable", "schedule", "add", "--help"],
                          cwd=ROOT, env=subprocess_env(), capture_output=True, text=True,
                          timeout=60)
    text = " ".join(done.stdout.split())
    assert "(default: UTC)" in text and "(default: skip)" in text and "croniter" in text


@pytest.mark.parametrize("catchup", ["skip", 1, 5])
async def test_every_fire_found_within_the_grace_starts_whatever_the_policy(
        store_url: str, clock: FakeClock, catchup: Any) -> None:
    """A scheduler held up for less than the grace (a worker frozen, a store locked, a
    restart) finds several fires of a frequent schedule due at once: each of them is on
    time and starts. Before, only the latest started (the others were passed over without
    a word) under "skip" and any catch-up smaller than the number due."""
    reg = hello_registry()
    async with opened(store_url, clock) as store:
        client = durable.Client(store, registry=reg)
        await client.add_schedule(ScheduleSpec(name="often", workflow="hello", args=["o"],
                                               cron=EVERY_10S, catchup=catchup))
        scheduler = Scheduler(store)
        await scheduler.tick()  # 08:00:01: nothing due yet
        clock.advance(35)  # held up from 08:00:01 to 08:00:36: 08:00:10, :20 and :30 due
        await scheduler.tick()
        assert sorted(r.id for r in await fired_runs(store, "often")) == [
            f"often@2027-01-15T08:00:{s}Z" for s in ("10", "20", "30")]
        # held up again, to 08:02:06: 08:00:40, :50 and 08:01:00 are more than the grace
        # late and follow the policy; 08:01:10 .. 08:02:00 are on time
        clock.advance(90)
        await scheduler.tick()
        started = sorted(r.id for r in await fired_runs(store, "often"))[3:]
        missed = {"skip": [], 1: ["08:01:00"], 5: ["08:00:40", "08:00:50", "08:01:00"]}
        on_time = ["08:01:10", "08:01:20", "08:01:30", "08:01:40", "08:01:50", "08:02:00"]
        assert started == [f"often@2027-01-15T{t}Z"
                           for t in [*missed[catchup], *on_time]], started
        sched = await store.get_schedule("often")
        assert sched is not None and sched.fired_through == START - 1 + 120  # 08:02:00
