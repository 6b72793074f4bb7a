"""Typed user code: mypy --strict passes on it (tests/test_typing.py), and it runs.

Every form of declaring and calling an activity or a workflow, with the types a type checker
infers pinned by ``assert_type``. The declarations with arguments go into a registry of their
own (``REG``); the bare ``@durable.activity``/``@durable.workflow`` ones cannot name one, so
they are in the decorators' default registry (under names no other test uses).
"""

from __future__ import annotations

from typing import assert_type

import durable

REG = durable.Registry()


@durable.activity
async def shout(ctx: durable.ActivityContext, text: str) -> str:
    return text.upper()


@durable.activity("typed.count", registry=REG, timeout=5.0)
async def count(ctx: durable.ActivityContext, text: str, times: int = 1) -> int:
    return len(text) * times


@durable.activity(registry=REG, on_doubt="fail")
async def record(ctx: durable.ActivityContext, name: str, values: list[int]) -> dict[str, int]:
    return {name: sum(values)}


@record.lookup
async def find_record(ctx: durable.ActivityContext, name: str,
                      values: list[int]) -> dict[str, int] | None:
    return None


@durable.workflow("typed.total", registry=REG)
async def total(ctx: durable.WorkflowContext, text: str, times: int) -> int:
    first = await ctx.step(count, text, times)                 # typed arguments and result
    assert_type(first, int)
    second = await count(ctx, text, times=times)               # keyword: journaled by position
    assert_type(second, int)
    keyed = await ctx.step(count, text, key="again")           # keyed: the result is typed
    assert_type(keyed, int)
    bound = await ctx.step(count.bind(text, 0), key="bound")   # keyed, arguments checked too
    assert_type(bound, int)
    summed = await record(ctx, "total", [first, second, keyed, bound])
    assert_type(summed, dict[str, int])
    return summed["total"]


@durable.workflow(registry=REG)
async def nothing(ctx: durable.WorkflowContext) -> None:
    return None


@durable.workflow
async def typed_bare(ctx: durable.WorkflowContext, text: str) -> str:
    return await shout(ctx, text)


async def enqueue(client: durable.Client) -> list[durable.Run]:
    return [
        await client.start(total, "abc", 2),                   # checked against total's params
        await client.start(total, text="abc", times=2),
        await client.start(nothing),
        await client.start(typed_bare, "x"),
        await client.start(total, "abc", 2, id="t-1", key="k"),  # options: arguments unchecked
        await client.start(total.bind("abc", 2), id="t-3", key="k"),  # bound: checked
        await client.start("typed.total", "abc", 2, id="t-2"),   # by name: no code needed
        await client.start("typed.total", "abc", 2),
    ]


def worker(store: durable.Store) -> durable.Worker:
    return durable.Worker(store, registry=durable.Registry(), workflows=[total, nothing])


async def plain_call() -> str:
    result = await shout(durable.ActivityContext.standalone(), "hi")
    assert_type(result, str)
    return result
