"""A step key is a string as the rest of the engine takes names: printable, at most 1,000
characters (as run ids and concurrency keys: ``check_printable``). A new step whose key is
not is refused at the call, a ConfigError naming it, before anything is journaled; a key an
existing journal already holds (written before this check) is still read and replayed."""

from __future__ import annotations

from typing import Any

import pytest

import durable
from durable import EntryKind, RunState
from durable._types import Fence, JournalWrite

from .helpers import running_worker
from .test_cli import cli

pytestmark = pytest.mark.anyio


def deleting(registry: durable.Registry, calls: list[str]) -> durable.Activity[..., str]:
    """``volume.delete``, which notes each volume it is called for in ``calls``."""

    @durable.activity("volume.delete", registry=registry)
    async def delete(ctx: durable.ActivityContext, volume: str) -> str:
        calls.append(volume)
        return f"deleted {volume}"

    return delete


@pytest.mark.parametrize(("key", "says"), [
    (("a",), "a step key must be a string, not ('a',)"),
    (b"a", "a step key must be a string, not b'a'"),
    ("a\x1b[31mb", "a step key must not hold control characters ('\\x1b' at 1)"),
    ("line\nbreak", "a step key must not hold control characters ('\\n' at 4)"),
    ("k" * 1001, "a step key must be at most 1000 characters, not 1001"),
])
async def test_a_new_step_key_that_is_not_printable_text_is_refused_at_the_call(
        client: durable.Client, registry: durable.Registry, key: Any, says: str) -> None:
    """Before: the key was turned into text with ``str()`` (``('a',)``) and journaled, and
    one with an escape sequence or a newline reached ``show``'s rows; the step ran."""
    calls: list[str] = []
    delete = deleting(registry, calls)

    @durable.workflow("teardown", registry=registry)
    async def teardown(ctx: durable.WorkflowContext) -> str:
        try:
            await ctx.step(delete, "v1", key=key)
        except durable.ConfigError as exc:
            return str(exc)  # refused at the call: the workflow sees it there
        return "taken"

    await client.start("teardown", id="t")
    async with running_worker(client, registry):
        run = await client.wait("t", timeout=10)
    assert run.state is RunState.COMPLETED and run.result is not None
    assert says in run.result and "\n" not in run.result
    assert calls == []
    assert not [e for e in await client.journal("t") if e.kind.value.startswith("step_")]


async def test_a_journaled_key_of_the_old_rules_is_replayed_and_shown(
        client: durable.Client, registry: durable.Registry, db_url: str) -> None:
    """A run whose journal holds steps keyed ``str(("a",))`` and with an escape sequence
    (journaled before keys were checked) resumes: the same calls find their journaled
    results and are not run again, and ``show`` prints the journal, the escape escaped."""
    calls: list[str] = []
    delete = deleting(registry, calls)

    @durable.workflow("teardown", registry=registry)
    async def teardown(ctx: durable.WorkflowContext) -> list[str]:
        return [await ctx.step(delete, "v1", key=("a",)),  # type: ignore[arg-type]
                await ctx.step(delete, "v2", key="b\x1b[31m")]

    await client.start("teardown", id="old")
    [held] = await client.store.claim("w-old", 30.0, 1, run_id="old")
    writes = []
    for n, (key, volume) in enumerate([("('a',)", "v1"), ("b\x1b[31m", "v2")], start=1):
        writes += [JournalWrite(EntryKind.STEP_STARTED, n, key, "volume.delete", 1,
                                {"args": [volume]}),
                   JournalWrite(EntryKind.STEP_COMPLETED, n, key, "volume.delete", 1,
                                {"result": f"deleted {volume}"})]
    assert await client.store.release(Fence(held.id, held.epoch), writes)
    async with running_worker(client, registry):
        run = await client.wait("old", timeout=10)
    assert run.state is RunState.COMPLETED, run.error
    assert run.result == ["deleted v1", "deleted v2"] and calls == []
    shown = cli("show", "old", db=db_url)
    assert shown.returncode == 0, shown.stderr
    assert "\x1b" not in shown.stdout and "volume.delete" in shown.stdout
