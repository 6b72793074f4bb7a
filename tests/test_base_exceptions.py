"""A BaseException that workflow or activity code raises (a ``SystemExit`` from a library's
``sys.exit()``, an application's own ``class Abort(BaseException)``) fails its run; it does
not stop the worker, whose other runs go on.

It escaped the attempt (which caught ``Exception`` only) and the worker's task group, and
ended the worker: every other run it held was cut off with no outcome journaled (their
steps in flight then in doubt, and an ``on_doubt="fail"`` one failing a run that had done
nothing wrong), and the same run crashed the next worker that claimed it. Cancellations
and ``KeyboardInterrupt`` (Ctrl-C, on trio raised wherever the code is) still go through.
"""

from __future__ import annotations

import anyio
import pytest

import durable
from durable import EntryKind, RunState

from .helpers import running_worker

pytestmark = pytest.mark.anyio


class Abort(BaseException):
    """An application's way out of every ``except Exception``."""


@pytest.mark.parametrize(("raised", "says"), [
    (Abort("stop everything"), "Abort: stop everything"),
    (SystemExit(2), "SystemExit: 2"),
])
async def test_a_base_exception_fails_its_run_and_the_worker_goes_on(
        client: durable.Client, registry: durable.Registry, raised: BaseException,
        says: str, anyio_backend: str) -> None:
    other_started = anyio.Event()
    go_on = anyio.Event()

    @durable.activity("db.delete", registry=registry, on_doubt="fail")
    async def delete(ctx: durable.ActivityContext, name: str) -> str:
        if name == "db-1":
            await other_started.wait()  # the other run's step is in flight meanwhile
            raise raised
        other_started.set()
        await go_on.wait()
        return name

    @durable.workflow("delete", registry=registry)
    async def delete_flow(ctx: durable.WorkflowContext, name: str) -> str:
        return await delete(ctx, name)

    @durable.workflow("leaves", registry=registry)
    async def leaves(ctx: durable.WorkflowContext) -> None:
        raise raised  # from workflow code itself

    @durable.workflow("grouped", registry=registry)
    async def grouped(ctx: durable.WorkflowContext) -> None:
        async def child() -> None:
            raise raised

        async with anyio.create_task_group() as tg:  # from a task of the workflow's
            tg.start_soon(child)

    async with running_worker(client, registry):
        await client.start("delete", "db-1", id="raises")
        await client.start("delete", "db-2", id="bystander")
        await client.start("leaves", id="leaves")
        failed = await client.wait("raises")
        left = await client.wait("leaves")
        # (asyncio lets a SystemExit out of any task but the attempt's own through the
        # event loop itself, past every frame: only an application's own reaches here)
        if isinstance(raised, Abort) or anyio_backend == "trio":
            await client.start("grouped", id="grouped")
            in_group = await client.wait("grouped")
            assert in_group.state is RunState.FAILED and in_group.error == says
        go_on.set()
        bystander = await client.wait("bystander")
    assert failed.state is RunState.FAILED and failed.error == says
    assert left.state is RunState.FAILED and left.error == says
    assert bystander.state is RunState.COMPLETED and bystander.result == "db-2"
    kinds = [e.kind for e in await client.journal("raises")]
    assert kinds[-2:] == [EntryKind.STEP_IN_DOUBT, EntryKind.RUN_FAILED]  # it may have

