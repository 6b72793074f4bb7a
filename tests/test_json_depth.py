"""Journaled values nest at most :data:`durable._types.MAX_JSON_DEPTH` levels, on both stores:
a value as deep as that goes through every place a value is journaled (a start's
arguments, a step's arguments and result, a signal's payload, a record, the workflow's
result) and is read back by the next attempt, a level deeper is refused before anything is
written. (The wrappers each place adds, a list of arguments, an entry's data, count on top:
a store that counted them against the value would refuse the deepest allowed one.) SQLite
and PostgreSQL, asyncio and trio."""

from __future__ import annotations

from typing import Any

import pytest

import durable
from durable._types import MAX_JSON_DEPTH

from .helpers import running_worker
from .pg import pg_url, postgres_server
from .waiting import client, clock, store_url

__all__ = ["client", "clock", "pg_url", "postgres_server", "store_url"]

pytestmark = pytest.mark.anyio


def nested(depth: int, leaf: Any = "x") -> Any:
    """``depth`` arrays, one in another, around ``leaf`` (``nested(1) == ["x"]``)."""
    value: Any = leaf
    for _ in range(depth):
        value = [value]
    return value


async def test_a_value_as_deep_as_allowed_is_journaled_everywhere_and_read_back(
        client: durable.Client, registry: durable.Registry) -> None:
    deep = nested(MAX_JSON_DEPTH)

    @durable.activity("t.echo", registry=registry)
    async def echo(ctx: durable.ActivityContext, value: Any) -> Any:
        return value

    @durable.workflow("t.deep", registry=registry)
    async def flow(ctx: durable.WorkflowContext, value: Any) -> Any:
        stepped = await ctx.step(echo, value)
        await ctx.set_records({("t", "deep"): stepped})
        record = await ctx.get_record("t", "deep")
        payload = await ctx.wait_for("go")
        return [stepped == value, record == value, payload == value]

    await client.start("t.deep", deep, id="deep")
    assert await client.signal("deep", "go", deep)
    async with running_worker(client, registry):
        done = await client.wait("deep", timeout=20)
    assert done.state is durable.RunState.COMPLETED, done.error
    assert done.result == [True, True, True]
    assert done.args == [deep]
    journal = await client.journal("deep")
    assert [e.data["result"] for e in journal
            if e.kind is durable.EntryKind.STEP_COMPLETED and e.name == "t.echo"] == [deep]


async def test_a_value_a_level_deeper_is_refused_and_nothing_is_written(
        client: durable.Client, registry: durable.Registry) -> None:
    @durable.workflow("t.noop", registry=registry)
    async def noop(ctx: durable.WorkflowContext, value: Any) -> None:
        return None

    too_deep = nested(MAX_JSON_DEPTH + 1)
    with pytest.raises(durable.NotJsonError, match=f"nested at most {MAX_JSON_DEPTH} deep"):
        await client.start("t.noop", too_deep, id="too-deep")
    assert await client.list() == []
    await client.start("t.noop", "x", id="ok", delay=3600)
    with pytest.raises(durable.NotJsonError, match=f"nested at most {MAX_JSON_DEPTH} deep"):
        await client.signal("ok", "go", too_deep)
    assert await client.store.list_signals("ok") == []
