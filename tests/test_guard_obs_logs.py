"""Every log record of an attempt names its run, attempt and epoch, and a step's records
name the step too, whatever was bound after them; a logger bound twice keeps both."""

from __future__ import annotations

import logging
from typing import Any

import pytest

import durable
import durable.testing
from durable import RunState
from durable._logging import RedactingFilter, Repeats, get_logger

from .helpers import running_worker

pytestmark = pytest.mark.anyio

SECRET = "s3cr3t-t0ken-value"
RUN_FIELDS = ("workflow_id", "workflow", "attempt", "epoch")


async def test_every_record_of_an_attempt_carries_run_attempt_epoch_and_its_step(
        client: durable.Client, registry: durable.Registry) -> None:
    tries = 0

    @durable.activity(registry=registry, retry=durable.RetryPolicy(max_tries=2, initial_delay=0))
    async def flaky(ctx: durable.ActivityContext) -> str:
        nonlocal tries
        tries += 1
        if tries == 1:
            raise RuntimeError("first try fails")
        return "ok"

    @durable.workflow("logged", registry=registry)
    async def flow(ctx: durable.WorkflowContext) -> str:
        return str(await flaky(ctx))

    with durable.testing.capture_logs() as entries:
        async with running_worker(client, registry):
            await client.start("logged", id="lg")
            assert (await client.wait("lg")).state is RunState.COMPLETED
    run = await client.get("lg")
    mine = [e for e in entries if e["logger"] == "durable.attempt"]
    said = {e["event"] for e in mine}
    assert {"step_started", "step_retrying", "step_completed", "run_completed"} <= said
    for entry in mine:
        assert {k: entry.get(k) for k in RUN_FIELDS} == {
            "workflow_id": "lg", "workflow": "logged", "attempt": run.attempt,
            "epoch": run.epoch}, entry
        if entry["event"].startswith("step_"):
            assert entry["step"] == 1 and entry["activity"] == flaky.name, entry


def test_a_logger_bound_twice_keeps_the_fields_of_both_binds() -> None:
    attempt = get_logger("durable.attempt", workflow_id="r1", attempt=2, epoch=7)
    step = attempt.bind(step=3).bind(activity="charge")
    with durable.testing.capture_logs() as entries:
        step.info("step_completed", took=0.5)
        attempt.info("run_completed")
    said: list[dict[str, Any]] = [{k: v for k, v in e.items() if k not in ("timestamp",)}
                                  for e in entries]
    assert said == [
        {"event": "step_completed", "log_level": "info", "logger": "durable.attempt",
         "workflow_id": "r1", "attempt": 2, "epoch": 7, "step": 3, "activity": "charge",
         "took": 0.5},
        {"event": "run_completed", "log_level": "info", "logger": "durable.attempt",
         "workflow_id": "r1", "attempt": 2, "epoch": 7},
    ]


def test_a_new_streak_logs_each_error_at_once_whatever_the_last_streak_said() -> None:
    """The once-a-minute rule holds within a streak: after a recovery, an error the last
    streak logged seconds ago is logged again as soon as it comes back."""
    now = [1000.0]
    repeats = Repeats(get_logger("durable.worker"), "claim_failed", clock=lambda: now[0])
    with durable.testing.capture_logs() as entries:
        repeats.failed("connection refused")
        now[0] += 5
        repeats.succeeded()
        now[0] += 5
        repeats.failed("timed out")  # a new streak: logged as it begins
        now[0] += 5
        repeats.failed("connection refused")  # new to this streak: logged at once
    said = [(e["event"], e.get("error"), e.get("failures")) for e in entries]
    assert said == [("claim_failed", "connection refused", 1),
                    ("claim_recovered", None, 1),
                    ("claim_failed", "timed out", 1),
                    ("claim_failed", "connection refused", 2)]


def _filtered(**attributes: Any) -> logging.LogRecord:
    record = logging.makeLogRecord({"name": "app.billing", "levelno": logging.ERROR,
                                    "levelname": "ERROR", "msg": "charge failed",
                                    **attributes})
    assert RedactingFilter().filter(record)
    return record


def test_the_redacting_filter_redacts_an_extra_s_text_a_stack_and_a_formatted_traceback(
        ) -> None:
    """An application's own records through a handler with the filter: text in an
    ``extra`` (its key naming no credential), a stack (``stack_info=True``) and a traceback
    another handler already formatted (``exc_text``) are redacted like the message."""
    record = _filtered(note=f"retry with Authorization: Bearer {SECRET}",
                       details={"url": f"https://u:{SECRET}@api.example/x"},
                       stack_info=f'  File "x.py", line 3\n    call(token={SECRET})',
                       exc_text=f"Traceback ...\nRuntimeError: password={SECRET}")
    note, details = vars(record)["note"], vars(record)["details"]
    rendered = [note, repr(details), record.stack_info, record.exc_text]
    assert all(SECRET not in text for text in rendered), rendered
    assert note == "retry with Authorization: [redacted]"
    assert record.exc_text == "Traceback ...\nRuntimeError: password=[redacted]"
