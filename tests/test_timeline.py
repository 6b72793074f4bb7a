"""The timeline a person reads: ``python -m durable show`` on real runs.

Every run here is real: a worker executes it against a loopback HTTP server (httpx's
``HTTPStatusError`` message has a newline), or is interrupted and resolved by an operator
with the real ``replay --accept-in-doubt`` command; ``show`` runs as a subprocess, piped
or on a pseudo-terminal.
"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import struct
import subprocess
import sys
import termios
from pathlib import Path
from typing import Any

import anyio
import pytest

import durable
from durable import RunState
from durable._report import render_timeline

from .conftest import ROOT, subprocess_env
from .helpers import poll, running_worker
from .httpserver import Rule, loopback_server

pytestmark = pytest.mark.anyio

ANSI = re.compile(r"\x1b\[[0-9;]*m")
EPOCH_FLOAT = re.compile(r"\b1\d{9}\.\d+")
TIME = r"\d\d:\d\d:\d\d\.\d{3}"
# what a line of the timeline section may be: the column header, a date, a row, an error
TIMELINE_LINE = re.compile(
    rf"time UTC +step +activity +state +try +took +summary"
    rf"|\d{{4}}-\d\d-\d\d"
    rf"|{TIME} {{8}}· \S.*"
    rf"|{TIME} +\d+  \S+ +(completed|retrying|failed|in_doubt|accepted|started) +\d+ .*"
    rf"| {{20}}error: \S.*")


def _env(**extra: str) -> dict[str, str]:
    env = subprocess_env()
    for name in ("NO_COLOR", "FORCE_COLOR", "COLUMNS"):
        env.pop(name, None)
    env.update(extra)
    return env


def show(db_url: str, *args: str, **env: str) -> str:
    """``python -m durable show ...`` with its output piped; must exit 0."""
    proc = subprocess.run([sys.executable, "-m", "durable", "show", *args, "--db", db_url],
                          cwd=ROOT, env=_env(**env), capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def show_on_a_terminal(db_url: str, run_id: str, columns: int, **env: str) -> str:
    """``show`` with its output on a pseudo-terminal ``columns`` wide."""
    parent, child = pty.openpty()
    fcntl.ioctl(child, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    try:
        proc = subprocess.Popen([sys.executable, "-m", "durable", "show", run_id,
                                 "--db", db_url], cwd=ROOT, env=_env(**env), stdout=child,
                                stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    finally:
        os.close(child)
    chunks: list[bytes] = []
    while True:
        try:
            chunk = os.read(parent, 65536)
        except OSError:  # EIO: the terminal's other side closed
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(parent)
    assert proc.wait(timeout=60) == 0, proc.stderr.read() if proc.stderr else ""
    if proc.stderr:
        proc.stderr.close()
    return b"".join(chunks).decode().replace("\r\n", "\n")


def timeline_section(text: str) -> list[str]:
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("time UTC"))
    end = next((i for i in range(start, len(lines)) if not lines[i]), len(lines))
    return lines[start:end]


async def _failed_run(tmp_path: Path) -> tuple[str, str]:
    """A run whose step 2 failed twice on an HTTP 500 (an error message with a newline)."""
    db_url = f"sqlite:///{tmp_path / 'timeline.db'}"
    registry = durable.Registry()
    async with loopback_server() as server:
        server.on("/databases/db-1", Rule(status=500, body={"detail": "boom"}))

        @durable.activity("paas.lookup", registry=registry)
        async def lookup(ctx: durable.ActivityContext, db: str) -> str:
            ctx.annotate(f"database {db}: found " + "and described at length " * 5)
            return db

        @durable.activity("paas.delete_database", registry=registry,
                          retry=durable.RetryPolicy(max_tries=2, initial_delay=0))
        async def delete(ctx: durable.ActivityContext, db: str) -> None:
            response = await ctx.http.delete(f"{server.url}/databases/{db}")
            response.raise_for_status()

        @durable.workflow("timeline.fail", registry=registry)
        async def flow(ctx: durable.WorkflowContext, db: str) -> None:
            await lookup(ctx, db)
            await delete(ctx, db)

        async with durable.Client.connect(db_url, registry=registry) as client:
            async with running_worker(client, registry):
                await client.start("timeline.fail", "db-1", id="tl-1")
                run = await client.wait("tl-1")
    assert run.state is RunState.FAILED
    assert run.error is not None and "\n" in run.error  # httpx's message has a newline
    return db_url, run.id


@pytest.fixture
async def failed_run(tmp_path: Path) -> tuple[str, str]:
    return await _failed_run(tmp_path)


async def test_a_failed_run_reads_one_line_per_entry(failed_run: tuple[str, str]) -> None:
    db_url, run_id = failed_run
    text = await anyio.to_thread.run_sync(lambda: show(db_url, run_id))
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 100
    for line in timeline_section(text):
        assert TIMELINE_LINE.fullmatch(line), f"not a timeline line: {line!r}"
    # the step error is printed once; the header and the report refer to it
    assert text.count("HTTPStatusError: Server error '500") == 1
    assert "error     step 2 (paas.delete_database) failed after 2 tries (error at step 2 " \
           "below)" in text
    assert "  failed: step 2 paas.delete_database after 2 tries, error above" in text
    assert "error: same as try 1" in text
    assert "attempt(s)" not in text and "state     failed    attempt 1 (epoch 1)" in text
    # a long summary is cut with an ellipsis, in its own column, not under an error header
    row = next(line for line in lines if "paas.lookup" in line and "completed" in line)
    assert row.endswith("…") and "database db-1: found" in row


async def test_times_are_utc_and_no_epoch_floats(failed_run: tuple[str, str]) -> None:
    db_url, run_id = failed_run
    text = await anyio.to_thread.run_sync(lambda: show(db_url, run_id))
    assert not EPOCH_FLOAT.search(text), text
    created = next(line for line in text.splitlines() if line.startswith("created"))
    finished = next(line for line in text.splitlines() if line.startswith("finished"))
    assert re.fullmatch(rf"created +\d{{4}}-\d\d-\d\d {TIME} UTC", created)
    assert re.fullmatch(rf"finished +\d{{4}}-\d\d-\d\d {TIME} UTC", finished)
    assert timeline_section(text)[0].startswith("time UTC")


async def test_piped_output_is_plain_and_stable(failed_run: tuple[str, str]) -> None:
    db_url, run_id = failed_run
    first = await anyio.to_thread.run_sync(lambda: show(db_url, run_id))
    # a wide $COLUMNS or FORCE_COLOR does not change piped output; NO_COLOR is honoured
    again = await anyio.to_thread.run_sync(lambda: show(db_url, run_id, COLUMNS="200"))
    assert first == again and "\x1b[" not in first
    forced = await anyio.to_thread.run_sync(
        lambda: show(db_url, run_id, "--color", "always"))
    assert "\x1b[31mfailed" in forced and ANSI.sub("", forced) == first
    by_env = await anyio.to_thread.run_sync(lambda: show(db_url, run_id, FORCE_COLOR="1"))
    assert by_env == forced
    vetoed = await anyio.to_thread.run_sync(
        lambda: show(db_url, run_id, FORCE_COLOR="1", NO_COLOR="1"))
    assert vetoed == first


async def test_on_a_terminal_it_fits_the_width_and_colours_states(
        failed_run: tuple[str, str]) -> None:
    db_url, run_id = failed_run
    text = await anyio.to_thread.run_sync(lambda: show_on_a_terminal(db_url, run_id, 72))
    assert "\x1b[31mfailed" in text and "\x1b[32mcompleted" in text
    plain = ANSI.sub("", text)
    assert max(len(line) for line in plain.splitlines()) <= 72
    assert any(len(line) > 72 for line in
               (await anyio.to_thread.run_sync(lambda: show(db_url, run_id))).splitlines())
    for line in timeline_section(plain):
        assert TIMELINE_LINE.fullmatch(line), f"not a timeline line: {line!r}"
    no_color = await anyio.to_thread.run_sync(
        lambda: show_on_a_terminal(db_url, run_id, 72, NO_COLOR="1"))
    assert "\x1b[" not in no_color and no_color == plain


async def test_step_detail_has_the_full_error(failed_run: tuple[str, str]) -> None:
    db_url, run_id = failed_run
    text = await anyio.to_thread.run_sync(lambda: show(db_url, run_id, "--step", "2"))
    assert "step 2  paas.delete_database  (key 2)" in text
    assert re.search(rf"try 1  retrying  \d{{4}}-\d\d-\d\d {TIME} UTC  took ", text)
    assert re.search(rf"try 2  failed  \d{{4}}-\d\d-\d\d {TIME} UTC  took ", text)
    # the whole message, its second line included, indented under its label
    error = re.search(r"    error    (HTTPStatusError: Server error .*)\n +(For more .*)", text)
    assert error is not None and "/databases/db-1" in error.group(1)
    assert "paas.lookup" not in text


async def test_json_says_try_for_steps_and_attempt_for_runs(
        failed_run: tuple[str, str]) -> None:
    db_url, run_id = failed_run
    data = json.loads(await anyio.to_thread.run_sync(lambda: show(db_url, run_id, "--json")))
    assert data["run"]["attempt"] == 1
    steps = [row for row in data["steps"] if "step" in row]
    assert [(r["step"], r["try"], r["state"]) for r in steps] == [
        (1, 1, "completed"), (2, 1, "retrying"), (2, 2, "failed")]
    assert all("attempt" not in row for row in steps)
    assert "\n" in steps[-1]["error"]  # full text in JSON
    claimed = next(row for row in data["steps"] if row.get("event") == "run_claimed")
    assert claimed["attempt"] == 1
    started = [e for e in data["journal"] if e["kind"] == "step_started"]
    assert [e["try_number"] for e in started] == [1, 1, 2]
    assert all(e["attempt"] is None for e in started)
    assert next(e for e in data["journal"] if e["kind"] == "run_claimed")["attempt"] == 1
    assert data["report"]["failed"][0]["tries"] == 2
    assert data["run"]["error"].startswith(
        "step 2 (paas.delete_database) failed after 2 tries: HTTPStatusError")


async def test_render_fits_any_width_it_is_given(failed_run: tuple[str, str]) -> None:
    db_url, run_id = failed_run
    async with durable.Client.connect(db_url) as client:
        run = await client.get(run_id)
        entries = await client.journal(run_id)
    for width in (40, 60, 100, 160):
        text = render_timeline(run, entries, width=width)
        assert max(len(line) for line in text.splitlines()) <= width
        assert "\x1b[" not in text
    wide = render_timeline(run, entries, width=160)
    assert "database db-1: found and described at length" in wide


async def test_step_logs_carry_try_and_run_logs_attempt(tmp_path: Path) -> None:
    registry = durable.Registry()

    @durable.activity("flaky", registry=registry,
                      retry=durable.RetryPolicy(max_tries=2, initial_delay=0))
    async def flaky(ctx: durable.ActivityContext) -> int:
        if ctx.try_number == 1:
            raise RuntimeError("first try fails")
        return ctx.try_number

    @durable.workflow("logged", registry=registry)
    async def logged(ctx: durable.WorkflowContext) -> int:
        return int(await flaky(ctx))

    with durable.testing.capture_logs() as logs:
        async with durable.testing.sqlite_client(tmp_path, registry=registry) as client:
            async with running_worker(client, registry):
                run = await client.start("logged")
                assert (await client.wait(run.id)).result == 2
    step_logs = [e for e in logs if e["event"].startswith("step_")]
    assert [(e["event"], e["try"]) for e in step_logs] == [
        ("step_started", 1), ("step_retrying", 1), ("step_started", 2), ("step_completed", 2)]
    assert all("try_number" not in e and e["attempt"] == 1 for e in step_logs)


async def test_an_accepted_step_shows_as_accepted_by_operator(tmp_path: Path) -> None:
    """In doubt (interrupted in flight), the run fails (``on_doubt="fail"``); the operator
    runs ``replay --accept-in-doubt``; the timeline says who counted the step as done."""
    db_url = f"sqlite:///{tmp_path / 'doubt.db'}"
    registry = durable.Registry()
    entered = anyio.Event()
    released = anyio.Event()
    pushes: list[int] = []

    @durable.activity("git.push", registry=registry, on_doubt="fail")
    async def push(ctx: durable.ActivityContext, ref: str) -> str:
        pushes.append(ctx.try_number)
        entered.set()
        await released.wait()
        return ref

    @durable.activity("notify", registry=registry)
    async def notify(ctx: durable.ActivityContext, what: str) -> None:
        ctx.annotate(f"sent {what}")

    @durable.workflow("doubt", registry=registry)
    async def doubt(ctx: durable.WorkflowContext) -> str:
        await notify(ctx, "starting")
        await push(ctx, "main")
        await notify(ctx, "pushed")
        return "done"

    async with durable.Client.connect(db_url, registry=registry) as client:
        async with running_worker(client, registry) as worker:
            await client.start("doubt", id="d-1")
            await entered.wait()
            worker.shutdown(grace=0)  # interrupted in flight: the push is in doubt
        queued = await anyio.to_thread.run_sync(lambda: show(db_url, "d-1"))
        row = next(line for line in queued.splitlines() if " git.push " in line)
        assert re.fullmatch(rf"{TIME} +2  git\.push +in_doubt +1 +unknown  "
                            r"interrupted by shutdown", row), row
        async with running_worker(client, registry):
            failed = await client.wait("d-1")
            assert failed.state is RunState.FAILED
            shown = await anyio.to_thread.run_sync(lambda: show(db_url, "d-1"))
            assert "  in doubt: step 2 git.push: check whether it took effect" in shown
            assert "replay: python -m durable replay d-1  [--rerun-in-doubt | " \
                   "--accept-in-doubt]" in shown
            replay = await anyio.run_process(
                [sys.executable, "-m", "durable", "replay", "d-1", "--accept-in-doubt",
                 "--db", db_url], cwd=ROOT, env=_env(), check=False)
            assert replay.returncode == 0, replay.stderr
            done = await poll(lambda: _finished(client, "d-1"))
    assert done.state is RunState.COMPLETED and pushes == [1]  # not pushed again
    text = await anyio.to_thread.run_sync(lambda: show(db_url, "d-1"))
    lines = timeline_section(text)
    accepted = next(line for line in lines if re.search(r"git\.push +accepted", line))
    assert re.fullmatch(rf"{TIME} +2  git\.push +accepted +1 +accepted by operator "
                        r"\(replay --accept-in-doubt\)", accepted), accepted
    assert any("· replay requested; steps in doubt accepted as done" in line for line in lines)
    assert lines.index(accepted) < next(i for i, line in enumerate(lines) if "sent pushed"
                                        in line)
    data = json.loads(await anyio.to_thread.run_sync(lambda: show(db_url, "d-1", "--json")))
    rows = [r for r in data["steps"] if r.get("step") == 2]
    assert [r["state"] for r in rows] == ["in_doubt", "accepted"]
    assert rows[0]["took"] is None and rows[1]["accepted_by"] == "operator"
    [line] = [s for s in data["report"]["completed"] if s["number"] == 2]
    assert line["accepted"] is True


async def _finished(client: durable.Client, run_id: str) -> Any:
    run = await client.get(run_id)
    return run if run.state.finished else None


def test_a_recovery_by_the_liveness_lock_says_the_worker_died() -> None:
    from durable._report import event_phrase

    died = event_phrase({"event": "run_recovered", "at": 1.0,
                          "detail": {"worker": "vm:1:ab", "worker_died": True}})
    assert died.startswith("run recovered: worker vm:1:ab died")
    expired = event_phrase({"event": "run_recovered", "at": 1.0,
                             "detail": {"worker": "vm:1:ab"}})
    assert "the lease of worker vm:1:ab expired" in expired
