"""Workflows for the metrics tests (imported by a worker subprocess): one completes, one
fails after sending a request that carries a planted secret (``METRICS_TEST_URL``)."""

from __future__ import annotations

import os

import durable


@durable.activity("metrics.echo")
async def echo(ctx: durable.ActivityContext, value: str) -> str:
    return value


@durable.activity("metrics.leak", retry=durable.RetryPolicy(max_tries=2, initial_delay=0))
async def leak(ctx: durable.ActivityContext) -> None:
    url = os.environ["METRICS_TEST_URL"]  # holds the token in its path and its query
    token = os.environ["METRICS_TEST_TOKEN"]
    response = await ctx.http.get(url, headers={"Authorization": f"Bearer {token}"})
    raise RuntimeError(f"the hook answered {response.status_code} for {url} ({token})")


@durable.workflow("metrics.ok")
async def ok(ctx: durable.WorkflowContext, name: str) -> str:
    return str(await echo(ctx, name))


@durable.workflow("metrics.leaky")
async def leaky(ctx: durable.WorkflowContext) -> None:
    await leak(ctx)
