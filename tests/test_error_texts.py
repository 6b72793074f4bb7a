"""An error's text that no store column can hold (a NUL, bytes that are not UTF-8) still
ends the run, on both stores: it is journaled and logged with those characters replaced."""

from __future__ import annotations

import json

import pytest

import durable
import durable.testing

from .helpers import running_worker
from .pg import both, pg_url, postgres_server  # noqa: F401  (fixtures)

pytestmark = pytest.mark.anyio

# what a service's binary answer quoted in an error brings: a NUL, and bytes that are not
# UTF-8 decoded as Python does for file names and a process's output (surrogateescape)
ANSWER = b"bin\x00ary \xff\xfe answer".decode("utf-8", "surrogateescape")


async def test_an_error_text_with_a_nul_and_bytes_not_utf8_fails_the_run(
        both: durable.Client, registry: durable.Registry) -> None:  # noqa: F811
    @durable.activity(registry=registry, retry=durable.RetryPolicy(max_tries=1))
    async def call(ctx: durable.ActivityContext) -> None:
        raise RuntimeError(f"the service answered {ANSWER}")

    @durable.workflow("binary.answer", registry=registry)
    async def binary_answer(ctx: durable.WorkflowContext) -> None:
        await call(ctx)

    counters = durable.Counters()
    with durable.testing.capture_logs() as logs:
        async with running_worker(both, registry, interceptors=[counters]):
            await both.start("binary.answer", id="b")
            done = await both.wait("b", timeout=10)
    assert done.state is durable.RunState.FAILED
    assert done.error is not None and "bin\ufffdary \ufffd\ufffd answer" in done.error
    assert counters.attempts == {"failed": 1}
    [failed] = [e for e in await both.journal("b") if e.kind == "run_failed"]
    assert "bin\ufffdary \ufffd\ufffd answer" in str(failed.data["error"])
    lines = [json.dumps(line, default=str, ensure_ascii=False) for line in logs]
    assert all(line.encode("utf-8") for line in lines)  # no lone surrogate in a record
    assert not any("\x00" in line for line in lines)
    assert [line["event"] for line in logs if line["event"] == "attempt_crashed"] == []
