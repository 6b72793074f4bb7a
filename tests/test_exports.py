"""The public surface is explicit: everything in __all__ exists, nothing private leaks."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

import durable
import durable.testing

pytestmark = pytest.mark.anyio


def test_all_names_exist_and_are_public() -> None:
    for name in durable.__all__:
        assert hasattr(durable, name), name
    public = {n for n in dir(durable) if not n.startswith("_")}
    modules = {"console", "interceptors", "otel", "prometheus", "store", "testing", "worker"}
    assert public - modules - set(durable.__all__) == set()


def test_logging_surface() -> None:
    assert issubclass(durable.RedactingFilter, logging.Filter)


def test_control_flow_signals_are_base_exceptions() -> None:
    assert not issubclass(durable.AttemptCancelled, Exception)
    assert issubclass(durable.LeaseLostError, durable.AttemptCancelled)
    assert issubclass(durable.UnknownWorkflowError, durable.DurableError)


async def test_testing_helpers_run_a_workflow(tmp_path: Path) -> None:
    reg = durable.Registry()

    @durable.activity(registry=reg)
    async def hello(ctx: durable.ActivityContext, name: str) -> str:
        return f"hello {name}"

    @durable.workflow("greet", registry=reg)
    async def greet(ctx: durable.WorkflowContext, name: str) -> str:
        return str(await hello(ctx, name))

    with durable.testing.capture_logs() as logs:
        async with durable.testing.sqlite_client(tmp_path, registry=reg) as client:
            async with durable.testing.running_worker(client):
                run = await client.start("greet", "you")
                done = await client.wait(run.id)
    assert done.result == "hello you"
    events = [e["event"] for e in logs]
    assert "run_claimed" in events and "run_completed" in events
    completed = next(e for e in logs if e["event"] == "run_completed")
    assert completed["workflow_id"] == run.id and completed["attempt"] == 1
