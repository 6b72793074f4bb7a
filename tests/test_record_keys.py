"""A record is named by two strings, ``(namespace, key)``; anything else is refused at the
call, before anything is written.

A key that was not a string was stored under its text (``("slot", 5)`` as ``slot/5``) but
remembered by its Python value: a record read as ``("slot", "5")`` and written back as
``("slot", 5)`` was not written by compare-and-set on the version read, so a change made by
someone else in between was overwritten (no :class:`durable.StaleRecordError`). A name that
was not a pair failed the run with ``ValueError: not enough values to unpack``.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest

import durable
from durable import RunState

from .helpers import running_worker

pytestmark = pytest.mark.anyio


async def test_a_record_key_that_is_not_a_string_cannot_skip_the_compare_and_set(
        client: durable.Client, registry: durable.Registry) -> None:
    read = anyio.Event()
    changed = anyio.Event()

    @durable.activity("slot.changed", registry=registry)
    async def wait_for_change(ctx: durable.ActivityContext) -> None:
        read.set()
        await changed.wait()

    @durable.workflow("claims", registry=registry)
    async def claims(ctx: durable.WorkflowContext, slot: int) -> None:
        owner = await ctx.get_record("slot", str(slot))
        assert owner is None
        await wait_for_change(ctx)  # meanwhile someone else takes the slot
        await ctx.set_records({("slot", slot): "run claims"})  # type: ignore[dict-item]

    async with running_worker(client, registry):
        await client.start("claims", 5, id="claims")
        with anyio.fail_after(10):
            await read.wait()
        assert await client.store.put_records(None, [("slot", "5", "someone else")])
        changed.set()
        done = await client.wait("claims")
    assert done.state is RunState.FAILED
    assert done.error == ("ConfigError: ctx.set_records: a record is named by two strings "
                          "(namespace, key), not ('slot', 5)")
    record = await client.store.get_record("slot", "5")
    assert record is not None and record.value == "someone else"  # not overwritten


@pytest.mark.parametrize(("call", "says"), [
    ("set_pair", "ctx.set_records: a record is named by two strings (namespace, key), "
                 "not 'slot/5'"),
    ("set_list", "ctx.set_records: records are a mapping of (namespace, key) to a value, "
                 "not [('slot', '5', 1)]"),
    ("get_int", "ctx.get_record: a record is named by two strings (namespace, key), "
                "not ('slot', 5)"),
])
async def test_a_record_name_that_is_not_two_strings_is_refused_at_the_call(
        client: durable.Client, registry: durable.Registry, call: str, says: str) -> None:
    @durable.workflow("records", registry=registry)
    async def records(ctx: durable.WorkflowContext, call: str) -> Any:
        if call == "set_pair":
            await ctx.set_records({"slot/5": 1})  # type: ignore[dict-item]
        elif call == "set_list":
            await ctx.set_records([("slot", "5", 1)])  # type: ignore[arg-type]
        else:
            return await ctx.get_record("slot", 5)  # type: ignore[arg-type]

    async with running_worker(client, registry):
        await client.start("records", call, id="r")
        done = await client.wait("r")
    assert done.state is RunState.FAILED
    assert done.error == f"ConfigError: {says}"
    assert [e.kind.value for e in await client.journal("r")] == [
        "run_created", "run_claimed", "run_failed"]
