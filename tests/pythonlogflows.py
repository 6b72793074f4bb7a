"""A workflow module for the command line's log tests: its activity warns, and leaves an
asyncio task that failed, both quoting a token (``PYTHON_LOG_TOKEN``)."""

from __future__ import annotations

import asyncio
import gc
import os
import warnings

import durable


@durable.activity("pythonlog.noisy")
async def noisy(ctx: durable.ActivityContext) -> str:
    token = os.environ["PYTHON_LOG_TOKEN"]
    warnings.warn(f"the v1 API is deprecated (called with api_key={token})", stacklevel=1)

    async def background() -> None:
        raise RuntimeError(f"the hook refused Authorization: Bearer {token}")

    task = asyncio.get_running_loop().create_task(background())
    await asyncio.wait([task])
    del task  # never retrieved: asyncio logs it when the task is collected
    gc.collect()
    return "done"


@durable.workflow("pythonlog.noisy")
async def noisy_workflow(ctx: durable.WorkflowContext) -> str:
    return str(await noisy(ctx))
