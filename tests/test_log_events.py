"""The log events docs/observability.md lists are the ones the code logs, and a worker's
lines are those events, bound to their attempt (and step)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import anyio

import durable
import durable.testing
from durable._logging import FOREIGN
from durable.interceptors import LOOPS

from .helpers import poll, running_worker
from .httpserver import Rule, loopback_server
from .pg import both, pg_url, postgres_server  # noqa: F401  (fixtures)

ROOT = Path(__file__).resolve().parent.parent
LEVELS = {"debug", "info", "warning", "error", "critical", "exception"}
EVENT = re.compile(r"[a-z]+(?:_[a-z]+)+")
HELPERS = {"Repeats", "answered", "_answered", "_failed"}
"""Functions that log an event named by one of their arguments (durable/_logging.py,
durable/_resend.py, the worker's and the client's wrappers of them)."""


def documented() -> set[str]:
    text = (ROOT / "docs" / "observability.md").read_text()
    table = text.split("## Log events", 1)[1].split("\n## ", 1)[0]
    names: set[str] = set()
    for line in table.splitlines():
        if line.startswith("| `"):
            names.update(re.findall(r"`([a-z_]+)`", line.split(" | ")[0]))
    return names


def _literals(node: ast.expr) -> list[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.IfExp):
        return _literals(node.body) + _literals(node.orelse)
    return []


def logged() -> set[str]:
    """The events the code logs: the literal event of each logging call, the events named to
    the helpers that log them, each loop's failure and recovery, other loggers' records."""
    names = {f"{loop}_{end}" for loop in LOOPS for end in ("failed", "recovered")}
    names.update(FOREIGN.values())  # other loggers' records, as the command line renders them
    for path in sorted((ROOT / "durable").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call) or not node.args:
                continue
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if called in LEVELS:
                names.update(n for n in _literals(node.args[0]) if EVENT.fullmatch(n))
            elif called in HELPERS:
                for arg in node.args:
                    for name in _literals(arg):
                        if re.fullmatch(r"[a-z_]+_(failed|outcome_unknown)", name):
                            names.add(name)
                            if called == "Repeats":
                                names.add(name.removesuffix("_failed") + "_recovered")
    return names


def test_every_event_the_code_logs_is_listed_and_every_listed_one_is_logged() -> None:
    code, docs = logged(), documented()
    assert len(code) > 60
    assert code - docs == set(), "logged but not listed in docs/observability.md"
    assert docs - code == set(), "listed in docs/observability.md but never logged"


async def test_a_worker_s_lines_are_listed_events_bound_to_their_attempt(
        both: durable.Client, registry: durable.Registry) -> None:  # noqa: F811
    async with loopback_server() as server:
        server.on("/flaky", Rule(status=503, times=1))
        server.on("/flaky", Rule(status=204))
        server.on("/broken", Rule(status=500))
        server.on("/hang", Rule(hang=True))

        @durable.activity(registry=registry,
                          retry=durable.RetryPolicy(max_tries=2, initial_delay=0))
        async def call(ctx: durable.ActivityContext, path: str) -> int:
            response = await ctx.http.get(f"{server.url}{path}")
            response.raise_for_status()
            return response.status_code

        @durable.workflow("events.calls", registry=registry)
        async def calls(ctx: durable.WorkflowContext, path: str) -> int:
            return int(await call(ctx, path))

        @durable.workflow("events.waits", registry=registry)
        async def waits(ctx: durable.WorkflowContext) -> object:
            await ctx.sleep(0.2)
            return await ctx.wait_for("go", timeout=60)

        with durable.testing.capture_logs() as logs:
            async with running_worker(both, registry, durable_wait_threshold=0.1):
                await both.start("events.calls", "/flaky", id="flaky")
                await both.start("events.calls", "/broken", id="broken")
                await both.start("events.calls", "/hang", id="hang")
                await both.start("events.waits", id="waits")
                await server.wait_for(lambda: server.seen("/hang"))
                await both.cancel("hang")
                async def waits_for_go() -> bool:
                    return (await both.get("waits")).waiting_for == "go"
                await poll(waits_for_go)
                await both.signal("waits", "go", {"v": 1})
                with anyio.fail_after(20):
                    states = {run: (await both.wait(run)).state
                              for run in ("flaky", "broken", "hang", "waits")}
    assert states == {"flaky": durable.RunState.COMPLETED, "broken": durable.RunState.FAILED,
                      "hang": durable.RunState.CANCELLED, "waits": durable.RunState.COMPLETED}
    listed = documented()
    assert {line["event"] for line in logs} - listed == set()
    attempts = [line for line in logs if line["logger"] == "durable.attempt"]
    assert {"step_retrying", "step_failed", "run_cancelled", "run_waiting",
            "signal_received"} <= {line["event"] for line in attempts}
    for line in attempts:
        assert {"workflow_id", "workflow", "attempt", "epoch"} <= line.keys(), line
        if line["event"].startswith("step_") or line["event"] == "signal_received":
            assert "step" in line, line
