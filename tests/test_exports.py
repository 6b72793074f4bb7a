"""The public surface is explicit: everything in __all__ exists, nothing private leaks."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest

import durable
import durable.store
import durable.testing

pytestmark = pytest.mark.anyio


PUBLIC = [
    "FENCING_HEADER", "FENCING_SCOPE_HEADER", "IDEMPOTENCY_HEADER", "NOT_DONE",
    "Activity", "ActivityContext", "ActivityError", "Approval", "ApprovalRejected",
    "AttemptCancelled", "Client", "Clock",
    "ConfigError", "Counters", "DurableError", "EntryKind", "FakeClock", "Interceptor",
    "InvalidStateError", "JournalEntry", "LeaseLostError", "NonDeterminismError",
    "NonRetryableError", "NotJsonError", "NotSentError", "PausedWorkflow", "PrunedRun",
    "RecoveryReport",
    "RedactingFilter", "Registry", "ResultUnknownError", "RetryPolicy", "Run",
    "RunConflictError", "RunNotFoundError", "RunPrunedError", "RunState", "Schedule",
    "ScheduleSpec", "SchemaVersionError", "SignalTimeout", "StaleRecordError", "StartedRun",
    "StepInDoubtError", "StepState",
    "Store", "StoreError", "StoreUnavailableError", "UnknownWorkflowError", "WallClock",
    "Worker", "Workflow", "WorkflowContext", "abort_process_group", "activity",
    "approval_gate",
    "configure_logging",
    "default_registry", "process_group", "schedule", "store_from_url", "workflow",
]
"""Exactly what users need: declaring, starting, running and inspecting workflows, the
errors, the headers a fenced service reads, the store to connect to, and the kill of an
activity's subprocesses that drops what they still had on its way."""

STORE_PUBLIC = ["SCHEMA_VERSION", "Cursor", "Fence", "JournalWrite", "NewRun", "Record",
                "Renewal", "Signal", "SignalSent", "Store", "store_from_url"]
"""The storage boundary: the abstract store and the types that cross it."""

INTERNALS = ["Attempt", "StepView", "render_timeline", "Fence", "JournalWrite", "NewRun",
             "Renewal", "Record", "History", "Lease"]


def test_all_names_exist_and_are_public() -> None:
    for name in durable.__all__:
        assert hasattr(durable, name), name
    public = {n for n in dir(durable) if not n.startswith("_")}
    modules = {"console", "interceptors", "otel", "prometheus", "store", "testing", "worker"}
    assert public - modules - set(durable.__all__) == set()


def test_the_public_surface_is_exactly_what_users_need() -> None:
    assert sorted(durable.__all__) == sorted(PUBLIC)
    for name in INTERNALS:
        assert not hasattr(durable, name), f"durable.{name} is an internal"


def test_the_store_boundary_is_public_in_durable_store() -> None:
    assert sorted(durable.store.__all__) == sorted(STORE_PUBLIC)
    public = {n for n in dir(durable.store) if not n.startswith("_")}
    assert public - set(STORE_PUBLIC) == set()  # no submodule or helper leaks
    from durable import _types
    from durable.store import _base

    for name in ("Fence", "JournalWrite", "NewRun", "Record", "Renewal", "Signal", "SignalSent"):
        assert getattr(durable.store, name) is getattr(_types, name), name  # the engine's own
    assert durable.store.Store is durable.Store is _base.Store
    assert durable.store.store_from_url is durable.store_from_url


CAPABILITIES = ["pushes_changes", "change_watcher", "change_token", "wait_for_work",
                "wait_for_finished", "notify_finished", "cancels_requested", "next_due_in"]


def test_optional_store_capabilities_have_a_default_and_are_never_probed() -> None:
    """A store that implements only the abstract methods has every optional capability (its
    default), so the engine calls them, never ``getattr(store, ...)`` / ``hasattr``."""
    for name in CAPABILITIES:
        assert hasattr(durable.store.Store, name), name
        assert name not in durable.store.Store.__abstractmethods__, name
    probe = re.compile(r"\b(?:getattr|hasattr)\(\s*[\w.]*store\b")
    package = Path(durable.__file__).parent
    probing = [f"{path.relative_to(package)}:{number}"
               for path in sorted(package.rglob("*.py"))
               for number, line in enumerate(path.read_text().splitlines(), 1)
               if probe.search(line)]
    assert probing == []


def test_logging_surface() -> None:
    assert issubclass(durable.RedactingFilter, logging.Filter)


def test_control_flow_signals_are_base_exceptions() -> None:
    assert not issubclass(durable.AttemptCancelled, Exception)
    assert issubclass(durable.LeaseLostError, durable.AttemptCancelled)
    assert issubclass(durable.UnknownWorkflowError, durable.DurableError)
    # a workflow catches a wait's timeout as an ordinary error (durable waiting)
    assert issubclass(durable.SignalTimeout, durable.DurableError)


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
