"""What the console's actions take, over real HTTP (Hypercorn on a loopback socket, the real
SQLite store; asyncio and trio): input it cannot use is refused in one line (400) with
nothing done, and nothing it accepts can break a later read of the run.

Found from outside: a signal payload nested 500 deep was accepted, journaled, and from then
on ``GET /api/runs/ID`` answered 500 for good (redacting it recursed past Python's limit);
one nested 100,000 deep, or a form payload 5,000 deep, was a 500 on the POST itself; an
unknown field in an action's JSON (``{"from-step": 3}``, a typo) was ignored, so the run was
replayed from its first step; a body of any size was read into memory before it was
refused; and the 500s were logged nowhere.
"""

from __future__ import annotations

import logging
import sqlite3
from typing import Any

import anyio
import pytest

import durable
from durable._types import MAX_JSON_DEPTH
from durable.console._app import BODY_MAX

from .helpers import poll, running_worker
from .test_console_http import TOKEN, _csrf, console

pytestmark = pytest.mark.anyio

BEARER = {"Authorization": f"Bearer {TOKEN}"}


def nested(depth: int) -> Any:
    """A JSON value of ``depth`` arrays, one in another (``nested(1) == []``)."""
    value: Any = []
    for _ in range(depth - 1):
        value = [value]
    return value


def nested_text(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.fixture
def flows(registry: durable.Registry) -> durable.Registry:
    @durable.workflow("t.waits", registry=registry)
    async def waits(ctx: durable.WorkflowContext) -> object:
        return await ctx.wait_for("go")

    @durable.workflow("t.deep", registry=registry)
    async def deep(ctx: durable.WorkflowContext, depth: int) -> object:
        return nested(depth)

    @durable.activity("t.noop", registry=registry)
    async def noop(ctx: durable.ActivityContext) -> str:
        return "ok"

    @durable.workflow("t.fails", registry=registry)
    async def fails(ctx: durable.WorkflowContext) -> None:
        await ctx.step(noop)
        raise RuntimeError("boom")

    return registry


async def _waiting(client: durable.Client, run_id: str) -> None:
    async def ready() -> bool:
        return (await client.get(run_id)).waiting_for == "go"
    await poll(ready, timeout=20)


async def test_a_payload_nested_too_deep_is_refused_and_the_run_stays_readable(
        client: durable.Client, flows: durable.Registry) -> None:
    async with running_worker(client, flows), console(client, token=TOKEN) as http:
        await client.start("t.waits", id="deep-1")
        await _waiting(client, "deep-1")
        page = (await http.get("/runs/deep-1")).text
        for depth, said in [
                (MAX_JSON_DEPTH + 1, f"must be JSON values nested at most {MAX_JSON_DEPTH} deep"),
                (500, f"must be JSON values nested at most {MAX_JSON_DEPTH} deep"),
                (100_000, f"nests deeper than {MAX_JSON_DEPTH} levels; nothing was done")]:
            body = '{"name": "go", "payload": ' + nested_text(depth) + "}"
            refused = await http.post("/api/runs/deep-1/signal", content=body,
                                      headers={**BEARER, "Content-Type": "application/json"})
            assert refused.status_code == 400, (depth, refused.text)
            assert said in refused.json()["error"], (depth, refused.text)
        form = await http.post("/runs/deep-1/signal", data={
            "csrf": _csrf(page), "token": TOKEN, "name": "go", "signal_id": "s-deep",
            "payload": nested_text(5_000)})
        assert form.status_code == 400, form.text
        assert (f"the payload nests deeper than {MAX_JSON_DEPTH} levels; nothing was sent"
                in form.text)
        assert await client.store.list_signals("deep-1") == []  # nothing was sent
        assert (await http.get("/api/runs/deep-1")).status_code == 200
        # as deep as allowed is taken, and read back
        sent = await http.post("/api/runs/deep-1/signal", headers=BEARER,
                               json={"name": "go", "payload": nested(MAX_JSON_DEPTH)})
        assert sent.status_code == 200, sent.text
        done = await client.wait("deep-1", timeout=20)
        assert done.result == nested(MAX_JSON_DEPTH)
        api = await http.get("/api/runs/deep-1")
        assert api.status_code == 200
        assert api.json()["run"]["result"] == nested(MAX_JSON_DEPTH)
        assert (await http.get("/runs/deep-1")).status_code == 200


async def test_a_result_nested_too_deep_fails_the_run_in_one_line(
        client: durable.Client, flows: durable.Registry) -> None:
    """A workflow's result nested past the limit fails its run (it is not journaled to
    break every later read); 2,000 deep, it escaped the encoder as a RecursionError."""
    async with running_worker(client, flows):
        for depth in (MAX_JSON_DEPTH + 1, 2_000):
            await client.start("t.deep", depth, id=f"deep-result-{depth}")
            done = await client.wait(f"deep-result-{depth}", timeout=20)
            assert done.state is durable.RunState.FAILED, depth
            assert done.error == ("NotJsonError: the workflow's result must be JSON values "
                                  f"nested at most {MAX_JSON_DEPTH} deep"), done.error
        await client.start("t.deep", MAX_JSON_DEPTH, id="deep-result-ok")
        assert (await client.wait("deep-result-ok", timeout=20)).result == nested(MAX_JSON_DEPTH)


async def test_an_action_s_unknown_or_mistyped_field_is_refused_and_nothing_is_done(
        client: durable.Client, flows: durable.Registry) -> None:
    async with running_worker(client, flows):
        await client.start("t.fails", id="typo-1")
        await client.wait("typo-1", timeout=20)
    async with console(client, token=TOKEN) as http:
        before = await client.journal("typo-1")
        for body, said in [
                ({"from-step": 2}, "unknown field 'from-step': replay takes from_step, "
                                   "in_doubt; nothing was done"),
                ({"from_step": True}, "from_step is a step number, not true"),
                ({"from_step": "2"}, 'from_step is a step number, not "2"'),
                ({"in_doubt": 1}, "in_doubt is a string, not 1")]:
            refused = await http.post("/api/runs/typo-1/replay", json=body, headers=BEARER)
            assert refused.status_code == 400, (body, refused.text)
            assert refused.json()["error"].startswith(said), refused.text
        refused = await http.post("/api/runs/typo-1/cancel", json={"reason": "x"},
                                  headers=BEARER)
        assert refused.status_code == 400
        assert refused.json()["error"] == ("unknown field 'reason': cancel takes no fields; "
                                           "nothing was done")
        assert await client.journal("typo-1") == before
        assert (await client.get("typo-1")).state is durable.RunState.FAILED
        replayed = await http.post("/api/runs/typo-1/replay", json={"from_step": 1},
                                   headers=BEARER)
        assert replayed.status_code == 200, replayed.text
        assert [e.data.get("from_step") for e in await client.journal("typo-1")
                if e.kind is durable.EntryKind.RUN_REPLAYED] == [1]


async def test_a_body_past_the_limit_is_refused_before_it_is_read_whole(
        client: durable.Client, flows: durable.Registry) -> None:
    await client.start("t.waits", id="big-1", delay=3600)
    async with console(client, token=TOKEN) as http:
        # declared 16 times the limit, and only a little past it sent: the answer comes
        # without the rest (a raw stream: a client's own send would fail on the close)
        url = http.base_url
        async with await anyio.connect_tcp(str(url.host), int(url.port or 80)) as stream:
            await stream.send(
                b"POST /api/runs/big-1/signal HTTP/1.1\r\n"
                + f"Host: {url.host}:{url.port}\r\nAuthorization: Bearer {TOKEN}\r\n"
                  f"Content-Type: application/json\r\n"
                  f"Content-Length: {BODY_MAX * 16}\r\n\r\n".encode()
                + b" " * (BODY_MAX + 65536))
            answer = b""
            with anyio.fail_after(10):
                while b"nothing was done" not in answer:
                    answer += await stream.receive()
        assert answer.startswith(b"HTTP/1.1 400 "), answer[:200]
        assert (f'{{"error":"the request body is larger than {BODY_MAX} bytes; nothing was '
                'done"}').encode() in answer
        big = await http.post("/api/runs/big-1/signal", headers=BEARER,
                              json={"name": "go", "payload": "a" * 70_000})
        assert big.status_code == 400
        assert "the payload is longer than 65536 characters of JSON" in big.json()["error"]
        assert await client.store.list_signals("big-1") == []


async def test_the_console_s_own_failure_is_logged_and_said_in_one_line(
        client: durable.Client, flows: durable.Registry, db_url: str,
        caplog: pytest.LogCaptureFixture) -> None:
    """A journal written before values were bounded can hold one nested past what the
    console can redact: that request fails (500, one line) and is logged with its
    traceback as ``console_failed``; before, nothing was logged at all."""
    await client.start("t.waits", id="old-1", delay=3600)
    path = db_url.removeprefix("sqlite:///")
    with sqlite3.connect(path) as db:  # as an older version could have journaled it
        db.execute("UPDATE durable_runs SET args = ? WHERE id = 'old-1'",
                   ("[" + nested_text(900) + "]",))
    caplog.set_level(logging.ERROR, logger="durable")
    async with console(client, token=TOKEN) as http:
        failed = await http.get("/api/runs/old-1")
    assert failed.status_code == 500
    assert failed.json() == {"error": "the console failed on this request (logged as "
                                      "console_failed); nothing more was done"}
    [logged] = [r for r in caplog.records if getattr(r, "event", "") == "console_failed"]
    assert "RecursionError" in logged.getMessage()
    assert logged.exc_text is not None and logged.exc_text.startswith("Traceback")
