"""A failure raised out of a task group says what failed, not that a task group failed.

Steps started concurrently (keyed, in a task group, as the README asks) fail through
the group: anyio raises an ``ExceptionGroup`` around the step's error. The run's error,
its journal entry and its recovery report said only ``ExceptionGroup: unhandled errors in
a TaskGroup (1 sub-exception)``, which names neither the error nor the step.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest

import durable
from durable import EntryKind, RunState

from .helpers import running_worker

pytestmark = pytest.mark.anyio


async def _failed_entry(client: durable.Client, run_id: str) -> dict[str, Any]:
    [entry] = [e for e in await client.journal(run_id) if e.kind is EntryKind.RUN_FAILED]
    return entry.data


async def test_a_group_of_one_error_fails_the_run_with_that_error(
        client: durable.Client, registry: durable.Registry) -> None:
    """One step of the group failed: the run fails with that step's error, its type
    and its step number, as it would have outside a group; a key used twice in a group
    is that ConfigError."""

    @durable.activity("db.delete", registry=registry,
                      retry=durable.RetryPolicy(max_tries=1))
    async def delete(ctx: durable.ActivityContext, name: str) -> str:
        if name == "db-2":
            raise PermissionError(f"{name}: 403 Forbidden")
        return name

    @durable.workflow("deletes", registry=registry)
    async def deletes(ctx: durable.WorkflowContext, names: list[str]) -> None:
        async with anyio.create_task_group() as tg:
            for name in names:
                tg.start_soon(lambda n=name: ctx.step(delete, n, key=n))

    async with running_worker(client, registry):
        await client.start("deletes", ["db-1", "db-2"], id="one")
        await client.start("deletes", ["db-1", "db-1"], id="twice")
        one, twice = await client.wait("one"), await client.wait("twice")
    # the steps' numbers follow the order the tasks started in (trio's is random)
    [number] = {e.step for e in await client.journal("one") if e.step_key == "db-2"}
    assert one.state is RunState.FAILED
    assert one.error is not None and one.error.startswith(
        f"step {number} (db.delete) failed after 1 try: PermissionError: db-2: 403 Forbidden")
    data = await _failed_entry(client, "one")
    assert (data["error_type"], data["step"]) == ("ActivityError", number)
    report = await client.report("one")
    assert report.error == one.error
    assert twice.error == "ConfigError: step key 'db-1' is used twice in run twice"
    assert (await _failed_entry(client, "twice"))["error_type"] == "ConfigError"


async def test_a_group_of_several_errors_names_each(
        client: durable.Client, registry: durable.Registry) -> None:
    both = anyio.Event()
    started: list[str] = []

    @durable.activity("db.delete", registry=registry,
                      retry=durable.RetryPolicy(max_tries=1))
    async def delete(ctx: durable.ActivityContext, name: str) -> str:
        started.append(name)
        if len(started) == 2:
            both.set()
        await both.wait()  # both in flight: each fails, neither is cancelled by the other
        raise PermissionError(f"{name}: 403 Forbidden")

    @durable.workflow("deletes", registry=registry)
    async def deletes(ctx: durable.WorkflowContext) -> None:
        async with anyio.create_task_group() as tg:
            for name in ("db-1", "db-2"):
                tg.start_soon(lambda n=name: ctx.step(delete, n, key=n))

    async with running_worker(client, registry):
        await client.start("deletes", id="both")
        done = await client.wait("both")
    assert done.state is RunState.FAILED
    assert done.error is not None
    assert done.error.startswith("ExceptionGroup: 2 errors: ")
    for name in ("db-1", "db-2"):
        [number] = {e.step for e in await client.journal("both") if e.step_key == name}
        assert (f"step {number} (db.delete) failed after 1 try: PermissionError: {name}: "
                "403 Forbidden") in done.error
    assert (await _failed_entry(client, "both"))["error_type"] == "ExceptionGroup"


async def test_an_activity_failing_through_its_own_task_group_names_the_error(
        client: durable.Client, registry: durable.Registry) -> None:
    """An activity's own task group: the step's error is the error inside, and a
    NonRetryableError inside is not retried."""
    tries: list[int] = []

    @durable.activity("volumes.delete", registry=registry,
                      retry=durable.RetryPolicy(max_tries=3, initial_delay=0))
    async def delete_volumes(ctx: durable.ActivityContext) -> None:
        tries.append(ctx.try_number)

        async def one(volume: str) -> None:
            raise durable.NonRetryableError(f"volume {volume} is attached")

        async with anyio.create_task_group() as tg:
            tg.start_soon(one, "vol-9")

    @durable.workflow("volumes", registry=registry)
    async def volumes(ctx: durable.WorkflowContext) -> None:
        await delete_volumes(ctx)

    async with running_worker(client, registry):
        await client.start("volumes", id="vols")
        done = await client.wait("vols")
    assert done.state is RunState.FAILED
    assert done.error == ("step 1 (volumes.delete) failed after 1 try: NonRetryableError: "
                          "volume vol-9 is attached")
    assert tries == [1]
    [failed] = [e for e in await client.journal("vols") if e.kind is EntryKind.STEP_FAILED]
    assert failed.data["error_type"] == "NonRetryableError"
