"""A workflow module for the CLI tests."""

from __future__ import annotations

import durable


@durable.activity("cli.echo")
async def echo(ctx: durable.ActivityContext, value: object) -> object:
    return value


@durable.workflow("cli.hello")
async def hello(ctx: durable.WorkflowContext, name: str) -> str:
    return str(await echo(ctx, f"hello {name}"))


@durable.workflow("cli.other")
async def other(ctx: durable.WorkflowContext, name: str) -> str:
    return name


@durable.activity("cli.fetch", retry=durable.RetryPolicy(max_tries=1))
async def fetch(ctx: durable.ActivityContext, url: str) -> int:
    return (await ctx.http.get(url)).status_code


@durable.workflow("cli.fan_out")
async def fan_out(ctx: durable.WorkflowContext, url: str, n: int) -> list[int]:
    """``n`` requests to ``url`` at once (keyed steps in a task group)."""
    import anyio

    codes: list[int] = []

    async def one(i: int) -> None:
        codes.append(int(await ctx.step(fetch, url, key=f"get-{i}")))

    async with anyio.create_task_group() as tg:
        for i in range(n):
            tg.start_soon(one, i)
    return codes
