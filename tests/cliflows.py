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
