"""Text no store can hold (a NUL: PostgreSQL's text and jsonb refuse it; a lone surrogate:
not UTF-8) is the caller's error when it is to be written, and matches nothing when it is
only looked up: the same answer on SQLite and PostgreSQL, decided before the store is asked.

Found from outside: ``client.signal(run_id, "g\\x00o")`` raised a plain StoreError on
PostgreSQL (SQLite took it), and the console answered ``GET /api/runs/a%00b`` and
``/api/runs?workflow=a%00b`` with 503 (``console_error``): bad input looked like an outage.
"""

from __future__ import annotations

import anyio
import pytest

import durable

from .helpers import running_worker
from .pg import both, pg_url, postgres_server  # noqa: F401  (fixtures)
from .test_cli import assert_one_line_error, cli
from .test_console_http import console

pytestmark = pytest.mark.anyio

BAD = ["a\x00b", "a\ud800b"]


@pytest.fixture
def flows(registry: durable.Registry) -> durable.Registry:
    @durable.workflow("t.waits", registry=registry)
    async def waits(ctx: durable.WorkflowContext) -> object:
        return await ctx.wait_for("go")
    return registry


@pytest.mark.parametrize("bad", BAD)
async def test_a_value_to_write_is_refused_alike_on_both_stores(
        flows: durable.Registry, both: durable.Client, bad: str) -> None:  # noqa: F811
    run = await both.start("t.waits", id="r1")
    with pytest.raises(durable.ConfigError, match="signal name"):
        await both.signal(run.id, f"g{bad}o")
    with pytest.raises(durable.NotJsonError, match="payload"):
        await both.signal(run.id, "go", {"note": [f"x{bad}"]})
    with pytest.raises(durable.NotJsonError, match="payload"):
        await both.signal(run.id, "go", {f"k{bad}": 1})
    with pytest.raises(durable.NotJsonError, match="origin"):
        await both.signal(run.id, "go", origin={"via": bad})
    with pytest.raises(durable.NotJsonError, match="arguments"):
        await both.start("t.waits", bad)
    with pytest.raises(durable.ConfigError, match="workflow"):
        await both.pause(f"t{bad}")
    with pytest.raises(durable.ConfigError, match="schedule name"):
        await both.add_schedule(durable.ScheduleSpec(
            name=f"s{bad}", workflow="t.waits", args=[], cron="0 3 * * *"))
    assert await both.store.list_signals(run.id) == []
    assert await both.paused() == []
    assert await both.store.list_schedules() == []
    # a character outside the BMP (a surrogate pair in JSON's escapes) is storable
    assert await both.signal(run.id, "go", "ok \U0001f600")


@pytest.mark.parametrize("bad", ["a\x00b"])
async def test_a_value_only_looked_up_matches_nothing(
        flows: durable.Registry, both: durable.Client, bad: str) -> None:  # noqa: F811
    await both.start("t.waits", id="r1")
    with pytest.raises(durable.RunNotFoundError):
        await both.get(f"r{bad}1")
    with pytest.raises(durable.RunNotFoundError):
        await both.signal(f"r{bad}1", "go")
    with pytest.raises(durable.RunNotFoundError):
        await both.cancel(f"r{bad}1")
    assert await both.list(workflow=f"t{bad}") == []
    assert sum((await both.store.count_runs(workflow=f"t{bad}")).values()) == 0


async def test_the_console_answers_not_found_or_nothing_not_an_outage(
        flows: durable.Registry, both: durable.Client) -> None:  # noqa: F811
    await both.start("t.waits", id="r1")
    async with console(both) as http:
        assert (await http.get("/api/runs/r%001")).status_code == 404
        listed = await http.get("/api/runs", params={"workflow": "t\x00waits"})
        assert listed.status_code == 200, listed.text
        assert listed.json()["runs"] == []
        page = await http.get("/runs", params={"workflow": "t\x00waits"})
        assert page.status_code == 200


async def test_the_cli_refuses_a_nul_payload_in_one_line(
        flows: durable.Registry, both: durable.Client) -> None:  # noqa: F811
    await both.start("t.waits", id="r1")
    url = both.store.url
    result = await anyio.to_thread.run_sync(
        lambda: cli("signal", "r1", "go", '"a\\u0000b"', db=url))
    assert result.returncode == 2, result.stderr
    assert_one_line_error(result, "payload")
    assert await both.store.list_signals("r1") == []



async def test_the_cli_refuses_an_argument_that_is_not_utf8_in_one_line(
        flows: durable.Registry, both: durable.Client) -> None:  # noqa: F811
    """A word of the command line that is not valid UTF-8 (``durable show $'r\\xff'``)
    reaches Python as a lone surrogate, which SQLite's driver cannot encode: a lookup by it
    was a traceback. Refused before the store is opened, on either store."""
    await both.start("t.waits", id="r1")
    url = both.store.url
    for args in (("show", "r\udcff"), ("list", "--workflow", "t.w\udcfe"),
                 ("signal", "r1", "g\udcffo", "1"), ("cancel", "r\udcff")):
        result = await anyio.to_thread.run_sync(lambda args=args: cli(*args, db=url))
        assert result.returncode == 2, (args, result.stderr)
        assert_one_line_error(result, "is not valid UTF-8")
    assert await both.store.list_signals("r1") == []
    run = await both.get("r1")
    assert run is not None and run.state is durable.RunState.QUEUED


@pytest.fixture
def attempt_flows(registry: durable.Registry) -> durable.Registry:
    @durable.workflow("t.records", registry=registry)
    async def records(ctx: durable.WorkflowContext, how: str) -> object:
        try:
            if how == "set":
                await ctx.set_records({("ns", "k\x00"): 1})
            elif how == "get":
                await ctx.get_record("n\x00s", "k")
            else:
                await ctx.wait_for("g\x00o", timeout=1)
        except durable.ConfigError as exc:
            return str(exc)
        return "taken"
    return registry


@pytest.mark.parametrize("how", ["set", "get", "wait"])
async def test_an_attempt_refuses_unstorable_text_at_the_call(
        attempt_flows: durable.Registry, both: durable.Client, how: str) -> None:  # noqa: F811
    """A record's name, a signal waited for: refused where the workflow calls, as a run id
    is, not sent to a store that refuses it (a StoreError mid-attempt: an unknown outcome
    that lost the attempt's lease)."""
    await both.start("t.records", how, id="r")
    async with running_worker(both, attempt_flows):
        run = await both.wait("r", timeout=30)
    assert run.state is durable.RunState.COMPLETED, run
    said = {"set": "ctx.set_records: a record's name", "get": "ctx.get_record: a record's name",
            "wait": "ctx.wait_for: the signal name"}[how]
    assert str(run.result).startswith(f"{said} must not hold "), run.result
    assert "'\\x00'" in str(run.result)
    assert run.attempt == 1
