"""A cron that names no date (30 February) is refused; one stored anyway (by an older
version) is skipped by the scheduler and listed as unable to fire (docs/design.md,
"Schedules"). On SQLite and PostgreSQL, asyncio and trio; time is an injected clock.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import sqlite3
from pathlib import Path

import pytest

import durable
from durable._clock import FakeClock
from durable._schedules import Scheduler, ScheduleSpec
from tests.pg import pg_url, postgres_server
from tests.test_schedules import (
    START,
    cli,
    clock,
    fired_runs,
    flows,
    hello_registry,
    ticks_after,
    workers,
)
from tests.test_store_contract import opened, raw_execute, store_url

__all__ = ["clock", "flows", "pg_url", "postgres_server", "store_url"]

pytestmark = pytest.mark.anyio

EVERY_10S = "* * * * * */10"


def utc(year: int, month: int, day: int) -> float:
    return dt.datetime(year, month, day, tzinfo=dt.UTC).timestamp()


@pytest.mark.parametrize("cron", ["0 0 30 2 *", "0 0 31 4,6,9,11 *", "0 0 30 2 * 0",
                                  "0 0 31 2 1#5"])
def test_a_cron_that_never_fires_is_refused(cron: str) -> None:
    message = f"cron {cron!r} never fires"
    with pytest.raises(durable.ConfigError, match=re.escape(message)):
        ScheduleSpec(name="s", workflow="w", args=[], cron=cron)
    with pytest.raises(durable.ConfigError, match=re.escape(message)):
        durable.schedule("s", "w", cron=cron, registry=durable.Registry())


def test_a_rare_cron_is_accepted_and_fires() -> None:
    """croniter looks 50 years for a fire; whatever exists comes round within 40. The fifth
    Monday of February (29 February on a Monday) fires in 2044, 2072, then 2112 (2100 is
    no leap year), found forwards and backwards. ``0 0 29 2 1`` is not that: a day of month
    and a weekday both given are either (Vixie cron's rule, croniter's), so it fires on
    every Monday of February too."""
    rare = ScheduleSpec(name="r", workflow="w", args=[], cron="0 0 * 2 1#5")
    assert rare.next_fire(START) == utc(2044, 2, 29)
    assert rare.next_fire(utc(2072, 3, 1)) == utc(2112, 2, 29)
    assert rare.latest_fires(utc(2000, 1, 1), utc(2111, 12, 31), 10) == [
        utc(2016, 2, 29), utc(2044, 2, 29), utc(2072, 2, 29)]
    assert rare.latest_fires(utc(2072, 3, 1), utc(2112, 2, 28), 10) == []
    either = ScheduleSpec(name="e", workflow="w", args=[], cron="0 0 29 2 1")
    assert either.next_fire(START) == utc(2027, 2, 1)


@pytest.mark.parametrize(("column", "value", "why"), [
    ("cron", "0 0 30 2 *", "cron '0 0 30 2 *' never fires"),
    ("timezone", "Mars/Olympus", "in timezone 'Mars/Olympus' cannot fire"),
])
async def test_a_stored_schedule_that_cannot_fire_is_skipped(
        store_url: str, clock: FakeClock, column: str, value: str, why: str) -> None:
    """A definition stored before it was refused (an older version wrote it, or croniter or
    the timezone database later refuses it): the worker logs it once and goes on firing the
    other schedules, where its scheduler died at the first tick (and every worker after it);
    the client lists it and says why it cannot fire."""
    reg = hello_registry()
    async with opened(store_url, clock) as store:
        client = durable.Client(store, registry=reg)
        for name in ("broken", "often"):
            await client.add_schedule(ScheduleSpec(name=name, workflow="hello", args=[name],
                                                   cron=EVERY_10S))
        raw_execute(store_url, f"UPDATE durable_schedules SET {column} = '{value}' "
                               "WHERE name = 'broken'")
        with durable.testing.capture_logs() as logs:
            async with workers([store], reg) as ws:
                for n in range(3):
                    clock.advance(10)
                    await ticks_after(ws)
                    assert len(await fired_runs(store, "often")) == n + 1
                assert ws[0].scheduler.ticks >= 4
        assert await fired_runs(store, "broken") == []
        told = [e for e in logs if e["event"] == "schedule_cannot_fire"]
        assert len(told) == 1, told  # once, not every tick
        assert told[0]["schedule"] == "broken" and told[0]["log_level"] == "error"
        assert why in told[0]["error"] and told[0][column] == value
        listed = {s.name: s for s in await client.schedules()}
        assert listed["broken"].next_fire_or_why()[0] is None
        assert why in str(listed["broken"].next_fire_or_why()[1])
        shown = (await client.get_schedule("broken")).to_json()
        assert shown["next_fire_at"] is None and why in str(shown["cannot_fire"])
        assert listed["often"].to_json()["cannot_fire"] is None


async def test_a_schedule_logged_unable_to_fire_is_logged_again_after_a_fix(
        tmp_path: Path, clock: FakeClock) -> None:
    """Once per breakage: mended, then broken again, it is logged again."""
    url = f"sqlite:///{tmp_path / 'fix.db'}"
    async with opened(url, clock) as store:
        await durable.Client(store).add_schedule(ScheduleSpec(
            name="b", workflow="hello", args=[], cron="0 3 * * *"))
        scheduler = Scheduler(store)
        with durable.testing.capture_logs() as logs:
            for cron in ("0 0 30 2 *", "0 0 30 2 *", "0 3 * * *", "0 0 30 2 *"):
                raw_execute(url, f"UPDATE durable_schedules SET cron = '{cron}'")
                await scheduler.tick()
        assert len([e for e in logs if e["event"] == "schedule_cannot_fire"]) == 2


def test_cli_lists_and_shows_a_stored_schedule_that_cannot_fire(flows: Path) -> None:
    path = flows / "cli.db"
    db = ["--db", f"sqlite:///{path}"]
    for name in ("broken", "nightly"):
        done = cli("schedule", "add", name, "hello", '"x"', "--cron", "0 3 * * *",
                   "--import", "schedflows", *db, cwd=flows)
        assert done.returncode == 0, done.stderr
    conn = sqlite3.connect(path)
    with conn:
        conn.execute("UPDATE durable_schedules SET cron = '0 0 30 2 *' WHERE name = 'broken'")
    conn.close()
    why = "cron '0 0 30 2 *' never fires"
    table = cli("schedule", "list", *db, cwd=flows)
    assert table.returncode == 0 and table.stderr == "", table.stderr
    lines = table.stdout.splitlines()
    assert "cannot fire" in lines[1] and lines[1].startswith("broken")
    assert lines[2].startswith("nightly") and "T03:00:00Z" in lines[2]
    assert lines[3].startswith(f"broken: cannot fire: {why}")
    listed = cli("schedule", "list", "--json", *db, cwd=flows)
    assert listed.returncode == 0, listed.stderr
    by_name = {s["name"]: s for s in json.loads(listed.stdout)}
    assert by_name["broken"]["next_fire_at"] is None and why in by_name["broken"]["cannot_fire"]
    assert by_name["nightly"]["cannot_fire"] is None
    one = cli("schedule", "show", "broken", *db, cwd=flows)
    assert one.returncode == 0 and f"cannot_fire:   {why}" in one.stdout, one.stderr
    assert "cannot_fire" not in cli("schedule", "show", "nightly", *db, cwd=flows).stdout
    assert cli("schedule", "pause", "broken", *db, cwd=flows).returncode == 0
    resumed = cli("schedule", "resume", "broken", *db, cwd=flows)
    assert resumed.returncode == 0 and f"cannot fire: {why}" in resumed.stdout, resumed.stderr

