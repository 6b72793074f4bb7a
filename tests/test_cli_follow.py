"""``python -m durable show ID --follow``: a running run, followed live until it ends.

The run is executed by a real worker (in the test's process, so the test opens each step's
gate with an event) on a real SQLite file; the CLI is a real subprocess whose output the test
reads as it comes, each wait bounded. Piped, the output is plain lines (no carriage return,
no colour); on a pseudo-terminal a batch run's progress bar is redrawn in place.
"""

from __future__ import annotations

import io
import os
import re
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import anyio.abc
import pytest

import durable
from durable import RunState
from durable._follow import Follower
from durable.store._sqlite import SqliteStore

from .conftest import ROOT, subprocess_env
from .helpers import poll, running_worker
from .test_cli import assert_one_line_error, cli

pytestmark = pytest.mark.anyio
WAIT = 20.0
"""Bound on every wait for the CLI's output (it polls every 0.5 s)."""


class Output:
    """A stream's bytes as they arrive, read by a background task."""

    def __init__(self) -> None:
        self.text = ""
        self._changed = anyio.Event()

    def feed(self, data: bytes) -> None:
        self.text += data.decode(errors="replace")
        self._changed.set()
        self._changed = anyio.Event()

    async def until(self, predicate: Callable[[str], bool] | str, *,
                    after: int = 0) -> int:
        """Wait until the text (from ``after`` on) holds ``predicate``; where it ends."""
        test = (lambda t: predicate in t) if isinstance(predicate, str) else predicate
        with anyio.fail_after(WAIT):
            while not test(self.text[after:]):
                await self._changed.wait()
        return len(self.text)


@asynccontextmanager
async def following(db_url: str, run_id: str, *options: str, tty: bool = False,
                    env: dict[str, str] | None = None,
                    ) -> AsyncIterator[tuple[anyio.abc.Process, Output, Output]]:
    """``python -m durable show RUN --follow``, its stdout a pipe or a pseudo-terminal."""
    out, err = Output(), Output()
    environment = {**subprocess_env(), **(env or {})}
    environment.pop("NO_COLOR", None)
    environment.pop("FORCE_COLOR", None)
    command = [sys.executable, "-m", "durable", "show", run_id, "--follow", "--db", db_url,
               *options]
    master = slave = -1
    if tty:
        master, slave = os.openpty()
        environment.update(TERM="xterm", COLUMNS="100")
    try:
        proc = await anyio.open_process(
            command, cwd=ROOT, env=environment, start_new_session=True,
            stdin=subprocess.DEVNULL, stdout=slave if tty else subprocess.PIPE,
            stderr=subprocess.PIPE)
    finally:
        if tty:
            os.close(slave)
    try:
        async with proc, anyio.create_task_group() as tg:
            if tty:
                tg.start_soon(_read_pty, master, out)
            else:
                assert proc.stdout is not None
                tg.start_soon(_read_stream, proc.stdout, out)
            assert proc.stderr is not None
            tg.start_soon(_read_stream, proc.stderr, err)
            try:
                yield proc, out, err
            finally:
                if proc.returncode is None:
                    os.killpg(proc.pid, signal.SIGKILL)
                with anyio.fail_after(10):
                    await proc.wait()
                tg.cancel_scope.cancel()
    finally:
        if tty:
            os.close(master)


async def _read_stream(stream: anyio.abc.ByteReceiveStream, into: Output) -> None:
    async for data in stream:
        into.feed(data)


async def _read_pty(fd: int, into: Output) -> None:
    while True:
        await anyio.wait_readable(fd)
        try:
            data = os.read(fd, 65536)
        except OSError:  # EIO: the terminal's last writer has gone
            return
        if not data:
            return
        into.feed(data)


async def _exit_code(proc: anyio.abc.Process) -> int:
    with anyio.fail_after(WAIT):
        return await proc.wait()


def _gated(registry: durable.Registry) -> dict[str, anyio.Event]:
    """Workflows whose steps each wait for the test to open their gate."""
    gates: dict[str, anyio.Event] = {}

    def gate(name: str) -> anyio.Event:
        return gates.setdefault(name, anyio.Event())

    # on_doubt="fail": each completion is committed when it happens (an idempotent step's
    # rides on the next journal write), so the follower sees it at once
    @durable.activity("follow.wait_for", registry=registry, on_doubt="fail",
                      retry=durable.RetryPolicy(max_tries=1))
    async def wait_for(ctx: durable.ActivityContext, name: str) -> str:
        await gate(name).wait()
        if name.startswith("bad"):
            raise RuntimeError(f"{name} broke")
        ctx.annotate(f"{name} done")
        return name

    @durable.workflow("follow.steps", registry=registry)
    async def steps(ctx: durable.WorkflowContext, names: list[str]) -> list[str]:
        return [await wait_for(ctx, name) for name in names]

    @durable.workflow("follow.batch", registry=registry)
    async def batch(ctx: durable.WorkflowContext, names: list[str]) -> int:
        await ctx.items(len(names))
        errors: list[str] = []

        async def one(i: int, name: str) -> None:
            try:
                await ctx.step(wait_for, name, key=f"item-{i}")
            except durable.ActivityError as exc:
                errors.append(str(exc))

        async with anyio.create_task_group() as tg:
            for i, name in enumerate(names):
                tg.start_soon(one, i, name)
        if errors:
            raise RuntimeError("; ".join(errors))
        return len(names)

    for name in ("a", "b", "c", "bad", "never"):
        gate(name)
    return gates


def _row(text: str, step: int, state: str) -> bool:
    """Whether the timeline has a line for ``step`` in ``state``."""
    return re.search(rf"^\S+\s+{step}\s+follow\.wait_for\s+{state}\b", text, re.M) is not None


async def test_follow_prints_each_entry_as_it_is_written_and_exits_when_the_run_ends(
        client: durable.Client, registry: durable.Registry, db_url: str) -> None:
    gates = _gated(registry)
    async with running_worker(client, registry):
        await client.start("follow.steps", ["a", "b"], id="f1")
        async with following(db_url, "f1") as (proc, out, err):
            at = await out.until(lambda t: _row(t, 1, "started"))
            assert "time UTC" in out.text and "run       f1" in out.text
            assert not _row(out.text, 1, "completed") and not _row(out.text, 2, "started")
            gates["a"].set()
            at = await out.until(lambda t: _row(t, 1, "completed") and _row(t, 2, "started"),
                                 after=at)
            assert "a done" in out.text[at - 200:] or "a done" in out.text
            assert proc.returncode is None  # still following: the run has not ended
            gates["b"].set()
            assert await _exit_code(proc) == 0, err.text
            await out.until(lambda t: _row(t, 2, "completed") and "run f1 completed" in t,
                            after=at)
    lines = out.text.splitlines()
    assert lines[-1].startswith("run f1 completed    attempt 1 (epoch 1), finished ")
    assert "· run completed" in out.text
    assert "\r" not in out.text and "\x1b" not in out.text  # piped: plain lines
    assert max(len(line) for line in lines) <= 100
    assert err.text == ""


async def test_a_batch_prints_a_progress_line_per_change_when_piped(
        client: durable.Client, registry: durable.Registry, db_url: str) -> None:
    gates = _gated(registry)
    async with running_worker(client, registry):
        await client.start("follow.batch", ["a", "bad", "c"], id="fb")
        async with following(db_url, "fb") as (proc, out, err):
            at = await out.until("items 0/3 done · 0 failed · 3 in flight · 0 pending")
            gates["a"].set()
            at = await out.until("items 1/3 done · 0 failed · 2 in flight · 0 pending",
                                 after=at)
            gates["bad"].set()
            at = await out.until("items 1/3 done · 1 failed · 1 in flight · 0 pending",
                                 after=at)
            gates["c"].set()
            assert await _exit_code(proc) == 0, err.text
            await out.until("run fb failed", after=at)
    progress = [line.split("· items ", 1)[1] for line in out.text.splitlines()
                if "· items " in line]
    assert progress == ["0/3 done · 0 failed · 3 in flight · 0 pending",
                        "1/3 done · 0 failed · 2 in flight · 0 pending",
                        "1/3 done · 1 failed · 1 in flight · 0 pending",
                        "2/3 done · 1 failed · 0 in flight · 0 pending"]
    assert "\r" not in out.text and "\x1b" not in out.text
    tail = out.text[out.text.index("run fb failed"):]
    assert "python -m durable replay fb" in tail  # what to do next, as show says it
    assert (await client.get("fb")).state is RunState.FAILED


async def test_a_batch_on_a_terminal_redraws_its_progress_bar_in_place(
        client: durable.Client, registry: durable.Registry, db_url: str) -> None:
    gates = _gated(registry)
    async with running_worker(client, registry):
        await client.start("follow.batch", ["a", "b"], id="ft")
        async with following(db_url, "ft", tty=True) as (proc, out, err):
            at = await out.until(lambda t: "\ritems [" in _plain(t))
            await out.until(lambda t: "0/2 done" in _plain(t), after=at - 200)
            gates["a"].set()
            at = await out.until(lambda t: "1/2 done · 0 failed · 1 in flight" in _plain(t),
                                 after=at)
            gates["b"].set()
            assert await _exit_code(proc) == 0, err.text
            await out.until(lambda t: "run ft completed" in _plain(t), after=at)
    text = out.text.replace("\r\n", "\n")  # the terminal's line endings
    assert "\ritems [" in _plain(text)  # drawn in place, over the line before
    assert "· items " not in text  # no plain progress lines on a terminal
    bars = re.findall(r"\ritems \[([^\]]*)\] (\d/2 done)", _plain(text))
    assert [done for _, done in bars][-1] == "2/2 done"
    assert {len(bar) for bar, _ in bars} == {24}
    assert "\x1b[" in text  # a terminal gets colour (NO_COLOR unset)
    last = text.rstrip("\n").rsplit("\n", 1)[-1]
    assert _plain(last).startswith("run ft completed")


async def test_ctrl_c_stops_following_with_exit_130_and_no_traceback(
        client: durable.Client, registry: durable.Registry, db_url: str) -> None:
    gates = _gated(registry)
    async with running_worker(client, registry):
        await client.start("follow.steps", ["never"], id="fc")
        async with following(db_url, "fc", tty=True) as (proc, out, err):
            await out.until(lambda t: _row(_plain(t), 1, "started"))
            proc.send_signal(signal.SIGINT)
            assert await _exit_code(proc) == 130
            await err.until("stopped following fc")
        run = await client.get("fc")
        assert run.state is RunState.RUNNING  # Ctrl-C stopped the follower, not the run
        gates["never"].set()
        await client.wait("fc")
    assert "Traceback" not in err.text and "Traceback" not in out.text
    assert len(err.text.strip().splitlines()) == 1


async def test_a_finished_run_is_shown_and_the_follower_exits_at_once(
        client: durable.Client, registry: durable.Registry, db_url: str) -> None:
    gates = _gated(registry)
    gates["a"].set()
    async with running_worker(client, registry):
        await client.start("follow.steps", ["a"], id="fd")
        assert (await client.wait("fd")).state is RunState.COMPLETED
    async with following(db_url, "fd") as (proc, out, err):
        assert await _exit_code(proc) == 0, err.text
        await out.until("run fd completed")
    assert _row(out.text, 1, "completed")


def test_follow_refuses_json_and_step_with_one_line(tmp_path: Any) -> None:
    url = f"sqlite:///{tmp_path / 'f.db'}"
    for extra in (["--json"], ["--step", "1"]):
        result = cli("show", "x", "--follow", *extra, db=url)
        assert result.returncode == 2
        assert_one_line_error(result, "--follow", extra[0], "cannot be combined")
    missing = cli("migrate", db=url)
    assert missing.returncode == 0
    result = cli("show", "nope", "--follow", db=url)
    assert_one_line_error(result, "no run with id 'nope'")
    assert "--follow" in cli("show", "--help").stdout


def _plain(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


class _OutageStore(SqliteStore):
    """Its first journal read after the follower's first raises StoreUnavailableError
    whose text holds the database's password (a driver's message quoting its URL)."""

    failed = False

    async def journal(self, run_id: str, *args: Any, **kw: Any) -> Any:
        if kw.get("after") is not None and not self.failed:
            self.failed = True
            raise durable.StoreUnavailableError(
                f"cannot reach postgresql://app:{PASSWORD}@db.internal/runs")
        return await super().journal(run_id, *args, **kw)


PASSWORD = "pw-9c1e-secret"


async def test_a_store_that_cannot_be_read_is_said_without_its_credentials(
        tmp_path: Any) -> None:
    store = _OutageStore(str(tmp_path / "d.db"))
    registry = durable.Registry()

    @durable.activity("follow.note", registry=registry)
    async def note(ctx: durable.ActivityContext) -> str:
        return "noted"

    @durable.workflow("follow.outage", registry=registry)
    async def outage(ctx: durable.WorkflowContext) -> str:
        return await note(ctx)

    await store.open()
    try:
        client = durable.Client(store, registry=registry)
        await client.start("follow.outage", id="o")
        out = io.StringIO()
        follower = Follower(client, "o", out, width=100, color=False, tty=False, poll=0.01)
        async with anyio.create_task_group() as tg:
            tg.start_soon(follower.run)
            await poll(lambda: store.failed)
            async with running_worker(client, registry):
                await client.wait("o", timeout=10)
            await poll(lambda: "run o completed" in out.getvalue())
    finally:
        await store.aclose()
    text = out.getvalue()
    assert "the store cannot be read" in text and "app:[redacted]@db.internal" in text, text
    assert PASSWORD not in text
