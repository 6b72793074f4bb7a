"""Text from services reaches people escaped, never raw: a step's summary and error that a
real loopback server sent, holding a terminal escape, C1 and DEL controls and Unicode
bidirectional controls (a "Trojan Source" reversal: bytes that say one thing displayed as
another), as ``show`` (its header, timeline and ``--step``) and ``list`` print them in a
subprocess, and as the console's pages show them over HTTP. ``--json`` and the console's
API stay JSON: the text comes back exactly as journaled."""

from __future__ import annotations

import json
import re
from pathlib import Path

import anyio
import pytest

import durable
from durable import RunState

from .helpers import durable_output, running_worker
from .httpserver import Rule, loopback_server
from .test_console_http import console

pytestmark = pytest.mark.anyio

SUMMARY = "deleted \u202egnihton\u202c volume \u2066vol-1\u2069"
ERROR = "kept \x1b[31mred\x1b[0m \u202eatad\u202c \u200fx\u200e\u061c \x9b2J\x7f end"
NOTE = "volume \u2067vol-1\u2069 \x1b]0;title\x07 kept"
RAW = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


async def test_a_services_controls_and_bidi_text_are_shown_escaped(tmp_path: Path) -> None:
    db_url = f"sqlite:///{tmp_path / 'text.db'}"
    registry = durable.Registry()
    async with loopback_server() as server:
        server.on("/delete", Rule(body={"said": SUMMARY, "note": NOTE}))
        server.on("/check", Rule(body={"said": ERROR}))

        @durable.activity("vol.delete", registry=registry)
        async def delete(ctx: durable.ActivityContext) -> str:
            answer = (await ctx.http.post(f"{server.url}/delete")).json()
            ctx.annotate(answer["said"])
            return str(answer["note"])

        @durable.activity("vol.check", registry=registry, retry=durable.RetryPolicy(max_tries=1))
        async def check(ctx: durable.ActivityContext) -> None:
            raise RuntimeError((await ctx.http.get(f"{server.url}/check")).json()["said"])

        @durable.workflow("vol", registry=registry)
        async def vol(ctx: durable.WorkflowContext) -> None:
            note = await delete(ctx)
            try:
                await check(ctx)
            except durable.ActivityError:  # the run's own error: the header shows it
                raise RuntimeError(f"gave up: {note}") from None

        async with durable.Client.connect(db_url, registry=registry) as client:
            async with running_worker(client, registry):
                await client.start("vol", id="t-1", key="vol-\u202e1")  # ids refuse only Cc
                failed = await client.wait("t-1")
            assert failed.state is RunState.FAILED and NOTE in (failed.error or "")

            shown = await anyio.to_thread.run_sync(lambda: durable_output(db_url, "show", "t-1"))
            step = await anyio.to_thread.run_sync(
                lambda: durable_output(db_url, "show", "t-1", "--step", "2"))
            listed = await anyio.to_thread.run_sync(lambda: durable_output(db_url, "list"))
            for out in (shown, step, listed):
                assert not RAW.search(out), RAW.search(out)
            escaped = ("kept \\u001b[31mred\\u001b[0m \\u202eatad\\u202c \\u200fx\\u200e\\u061c "
                       "\\u009b2J\\u007f end")
            assert "key vol-\\u202e1" in shown and "vol-\\u202e1" in listed
            header = next(line for line in shown.splitlines() if line.startswith("error"))
            assert "gave up: volume \\u2067vol-1\\u2069 \\u001b]0;title\\u0007 kept" in header

            row = next(line for line in shown.splitlines() if "error: " in line)
            assert "kept \\u001b[31mred\\u001b[0m \\u202eatad\\u202c" in row, row  # 100 wide
            summary = next(line for line in shown.splitlines() if " vol.delete " in line)
            assert "deleted \\u202egnihton\\u202c volume \\u2066vol-" in summary, summary
            assert escaped in step
            assert "RuntimeError: gave up: volume \\u2067vol-1\\u2069" in listed, listed
            whole = json.loads(await anyio.to_thread.run_sync(
                lambda: durable_output(db_url, "show", "t-1", "--json")))
            assert whole["run"]["error"] == failed.error  # --json: the JSON encoder's escaping
            assert [s.get("error") for s in whole["steps"] if s.get("error")] == [
                f"RuntimeError: {ERROR}"]

            async with console(client) as http:
                page = (await http.get("/runs/t-1")).text
                runs = (await http.get("/runs")).text
                api = (await http.get("/api/runs/t-1")).json()
            for html in (page, runs):
                assert not RAW.search(html), RAW.search(html)
            assert "\\u202eatad\\u202c" in page and "\\u001b[31mred" in page
            assert "deleted \\u202egnihton\\u202c" in page
            assert "\\u2067vol-1\\u2069" in runs  # the runs list's error note
            assert api["run"]["error"] == failed.error
