"""Signals: ``ctx.wait_for`` receives what ``Client.signal`` and ``python -m durable signal``
send, each signal once and in order, kept until waited for; a waiting run holds no lease;
timeouts raise ``durable.SignalTimeout``; a signal id makes a send idempotent
(docs/design.md, "Durable waiting"). SQLite and PostgreSQL, asyncio and trio."""

from __future__ import annotations

import html
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

import durable
import durable.testing
from durable import RunState
from durable._clock import FakeClock
from durable._report import render_timeline
from durable._types import NEVER, EntryKind, Fence, JournalWrite, NewRun
from durable.store import Store, store_from_url

from . import waitflows
from .conftest import ROOT, subprocess_env
from .helpers import kinds, poll, python_process, running_worker
from .pg import pg_url, postgres_server
from .test_console_http import console
from .waiting import client, clock, store_url

__all__ = ["client", "clock", "pg_url", "postgres_server", "store_url"]

pytestmark = pytest.mark.anyio


def declare(registry: durable.Registry) -> list[str]:
    ran: list[str] = []

    @durable.activity("s.mark", registry=registry)
    async def mark(ctx: durable.ActivityContext, name: str) -> str:
        ran.append(name)
        return name

    @durable.workflow("s.one", registry=registry)
    async def one(ctx: durable.WorkflowContext) -> Any:
        await mark(ctx, "asked")
        answer = await ctx.wait_for("approve")
        await mark(ctx, "answered")
        return answer

    @durable.workflow("s.three", registry=registry)
    async def three(ctx: durable.WorkflowContext) -> list[Any]:
        return [await ctx.wait_for("n") for _ in range(3)]

    @durable.workflow("s.twice", registry=registry)
    async def twice(ctx: durable.WorkflowContext) -> list[Any]:
        first = await ctx.wait_for("go")
        try:
            second = await ctx.wait_for("go", timeout=30)
        except durable.SignalTimeout as exc:
            second = f"timeout: {exc.name} after {exc.timeout:g} s"
        await mark(ctx, "after")
        return [first, second]

    @durable.workflow("s.timeout", registry=registry)
    async def timeout(ctx: durable.WorkflowContext, seconds: float) -> str:
        try:
            await ctx.wait_for("never", timeout=seconds)
        except durable.SignalTimeout:
            await mark(ctx, "timed out")
        await ctx.sleep(3600)  # released again: the re-execution must time out the same way
        return "done"

    @durable.workflow("s.strict", registry=registry)
    async def strict(ctx: durable.WorkflowContext) -> Any:
        await mark(ctx, "asked")
        return await ctx.wait_for("approve", timeout=10)

    return ran


async def waiting(client: durable.Client, run_id: str, name: str,
                  attempt: int = 1) -> durable.Run:
    """The run once its attempt ``attempt`` released it to wait for the signal ``name``."""
    async def check() -> durable.Run | None:
        run = await client.store.get_run(run_id)
        return run if (run and run.state is RunState.QUEUED and run.waiting_for == name
                       and run.attempt == attempt) else None

    found: durable.Run = await poll(check, timeout=15)
    return found


async def test_a_signal_during_the_wait_wakes_a_run_that_holds_no_lease(
        client: durable.Client, registry: durable.Registry) -> None:
    ran = declare(registry)
    async with running_worker(client, registry) as worker:
        await client.start("s.one", id="gate")
        run = await waiting(client, "gate", "approve")
        # released: no lease, no worker, no slot; due only when the signal comes
        assert run.worker is None and run.lease_expires_at is None and run.run_at == NEVER
        await poll(lambda: worker.active == {})  # its task ends just after the release
        assert await client.signal("gate", "approve", {"by": "alice"},
                                   origin={"via": "test"}) is True
        done = await client.wait("gate", timeout=15)  # no clock moved: due at once
    assert done.state is RunState.COMPLETED and done.result == {"by": "alice"}
    assert ran == ["asked", "answered"]
    journal = await client.store.journal("gate")
    [sent] = [e for e in journal if e.kind is EntryKind.SIGNAL_SENT]
    assert sent.data["origin"] == {"via": "test"} and "payload" not in sent.data
    [received] = [e for e in journal if e.kind is EntryKind.SIGNAL_RECEIVED]
    assert received.data["payload"] == {"by": "alice"} and received.data["seq"] == sent.data["seq"]


async def test_signals_sent_before_the_wait_are_kept_and_delivered_in_order_once(
        client: durable.Client, registry: durable.Registry) -> None:
    declare(registry)
    await client.start("s.three", id="three")
    for n in (1, 2, 3, 4):
        assert await client.signal("three", "n", n)
    await client.signal("three", "other", "ignored")
    async with running_worker(client, registry):
        done = await client.wait("three", timeout=15)
    assert done.result == [1, 2, 3]
    assert kinds(await client.store.journal("three")).count("signal_received") == 3
    assert [s.payload for s in await client.store.list_signals("three")] == [
        1, 2, 3, 4, "ignored"]


async def test_one_signal_id_twice_is_one_signal(
        client: durable.Client, registry: durable.Registry, clock: FakeClock) -> None:
    ran = declare(registry)
    async with running_worker(client, registry):
        await client.start("s.twice", id="twice")
        await waiting(client, "twice", "go")
        assert await client.signal("twice", "go", "first", id="click-1") is True
        assert await client.signal("twice", "go", "first", id="click-1") is False
        run = await waiting(client, "twice", "go", attempt=2)  # the second wait: nothing
        assert run.run_at == pytest.approx(clock.now() + 30, abs=0.01)
        clock.advance(30)
        done = await client.wait("twice", timeout=15)
    assert done.result == ["first", "timeout: go after 30 s"] and ran == ["after"]
    assert [s.signal_id for s in await client.store.list_signals("twice")] == ["click-1"]
    assert kinds(await client.store.journal("twice")).count("signal_sent") == 1


async def test_a_signal_id_reused_for_another_name_or_payload_is_refused(
        client: durable.Client, registry: durable.Registry) -> None:
    """A signal id names one signal, as a run id names one run: sent again with the same
    name and payload it is the same signal (nothing new, False); with another name or
    payload it is refused in one line naming the id and both, and nothing is written
    (before: it said "already recorded" and dropped the new payload). Payloads compare as
    JSON: ``true`` is not ``1``, an object's key order does not matter."""
    declare(registry)
    await client.start("s.one", id="one", delay=3600)
    assert await client.signal("one", "approve", {"a": 1, "ok": True}, id="A") is True
    assert await client.signal("one", "approve", {"ok": True, "a": 1}, id="A") is False
    journal = await client.store.journal("one")
    for name, payload in (("approve", {"a": 1, "ok": 1}), ("approve", {"a": 2, "ok": True}),
                          ("reject", {"a": 1, "ok": True}), ("approve", None)):
        with pytest.raises(durable.RunConflictError) as refused:
            await client.signal("one", name, payload, id="A")
        said = str(refused.value)
        assert "\n" not in said and "signal id 'A' of run one was already used for signal " \
            "'approve' with payload {\"a\":1,\"ok\":true} (asked for: " \
            f"{name!r} with {json.dumps(payload, separators=(',', ':'))})" in said, said
    assert [(s.signal_id, s.payload) for s in await client.store.list_signals("one")] == [
        ("A", {"a": 1, "ok": True})]
    assert await client.store.journal("one") == journal  # nothing written
    long = {"pad": "x" * 1000}  # a payload is cut in the message, never in the journal
    with pytest.raises(durable.RunConflictError) as refused:
        await client.signal("one", "approve", long, id="A")
    assert len(str(refused.value)) < 500 and "xxx..." in str(refused.value)


async def test_a_signal_sent_while_no_worker_runs_is_received_after_a_restart(
        client: durable.Client, registry: durable.Registry) -> None:
    ran = declare(registry)
    async with running_worker(client, registry):
        await client.start("s.one", id="gate")
        await waiting(client, "gate", "approve")
    assert await client.signal("gate", "approve", "yes")
    run = await client.store.get_run("gate")
    assert run is not None and run.state is RunState.QUEUED and run.run_at < NEVER
    async with running_worker(client, registry):
        done = await client.wait("gate", timeout=15)
    assert done.result == "yes" and ran == ["asked", "answered"]


async def test_a_timeout_is_journaled_and_raised_again_on_re_execution(
        client: durable.Client, registry: durable.Registry, clock: FakeClock) -> None:
    ran = declare(registry)
    async with running_worker(client, registry):
        await client.start("s.timeout", 60.0, id="t")
        run = await waiting(client, "t", "never")
        assert run.run_at == pytest.approx(clock.now() + 60, abs=0.01)
        clock.advance(60)
        await poll(lambda: _sleeping(client, "t"), timeout=15)
        await client.signal("t", "never", "too late")  # after the timeout fired: not received
        clock.advance(3600)
        done = await client.wait("t", timeout=15)
    assert done.result == "done" and ran == ["timed out"]
    journal = kinds(await client.store.journal("t"))
    assert journal.count("signal_timeout") == 1 and "signal_received" not in journal


async def test_a_signal_recorded_after_the_deadline_is_not_received_by_a_late_attempt(
        client: durable.Client, registry: durable.Registry, clock: FakeClock) -> None:
    """No worker ran when the wait's deadline passed (all stopped, or all busy): a signal
    recorded after it, before a worker came back, did not come in time. The attempt that
    claims the run late times the wait out, as one on time would have (an approval sent
    after an approval gate's timeout does not approve a plan the run has given up on); the
    signal stays, for a later wait of that name. Before, the late attempt received it."""
    ran = declare(registry)
    async with running_worker(client, registry):
        await client.start("s.timeout", 60.0, id="t")
        await waiting(client, "t", "never")
    clock.advance(61)  # past the deadline with no worker running
    assert await client.signal("t", "never", "too late")
    async with running_worker(client, registry):
        await poll(lambda: _sleeping(client, "t"), timeout=15)
    assert ran == ["timed out"]
    entries = await client.store.journal("t")
    journal = kinds(entries)
    assert journal.count("signal_timeout") == 1 and "signal_received" not in journal
    assert [s.payload for s in await client.store.list_signals("t")] == ["too late"]


async def test_a_signal_recorded_at_the_deadline_is_received_by_a_late_attempt(
        client: durable.Client, registry: durable.Registry, clock: FakeClock) -> None:
    """The deadline itself is in time: a signal recorded at the moment the wait's timeout
    ends is received, by an attempt however late."""
    ran = declare(registry)
    async with running_worker(client, registry):
        await client.start("s.timeout", 60.0, id="t")
        await waiting(client, "t", "never")
    clock.advance(60)
    assert await client.signal("t", "never", "just in time")
    clock.advance(5)
    async with running_worker(client, registry):
        await poll(lambda: _sleeping(client, "t"), timeout=15)
    assert ran == []
    journal = kinds(await client.store.journal("t"))
    assert journal.count("signal_received") == 1 and "signal_timeout" not in journal


async def test_an_approval_after_the_gate_ran_out_is_refused_and_nothing_is_sent(
        client: durable.Client, registry: durable.Registry, clock: FakeClock) -> None:
    """An approval gate with a timeout, its deadline passed while no worker ran: the
    approval would not be received (it came late), so approve refuses, naming the deadline,
    and sends nothing, rather than saying the plan was approved; the run then gives up on
    its plan without acting. A reject still cancels it at once."""
    from durable._approval import send_decision

    acted: list[str] = []

    @durable.activity("s.plan", registry=registry)
    async def plan(ctx: durable.ActivityContext) -> dict[str, str]:
        return {"title": "delete db-1"}

    @durable.workflow("s.gated", registry=registry)
    async def gated(ctx: durable.WorkflowContext) -> str:
        await durable.approval_gate(ctx, plan, timeout=60)
        acted.append("deleted")
        return "deleted"

    async with running_worker(client, registry):
        for run_id in ("late", "rejected"):
            await client.start("s.gated", id=run_id)
            await waiting(client, run_id, "approve")
    clock.advance(61)
    with pytest.raises(durable.InvalidStateError,
                       match=r"late: its wait for a decision ran out at 2023-11-14 22:14:20"
                             r"\.000 UTC; an approval would not reach it .*nothing was sent"):
        await send_decision(client, "late", "approve", {"note": "ok"})
    assert await client.store.list_signals("late") == []
    # show and the console say so, and show offers no approve (the reject is left)
    late = await client.get("late")
    shown = render_timeline(late, await client.store.journal("late"), width=300,
                            now=clock.now())
    assert ("approval  ran out at 2023-11-14 22:14:20.000 UTC: an approval would not reach "
            "it;") in shown, shown
    assert "durable approve" not in shown and "durable reject late" in shown
    async with console(client) as http:
        page = html.unescape((await http.get("/runs/late")).text)
    assert "The wait for a decision ran out" in page and "Waiting for approval" not in page
    assert await send_decision(client, "rejected", "reject", {"reason": "no"})
    assert (await client.get("rejected")).state is RunState.CANCELLED
    async with running_worker(client, registry):
        done = await client.wait("late", timeout=15)
    assert done.state is RunState.FAILED and acted == []
    assert done.error is not None and "no decision on the plan within 60 s" in done.error


async def _sleeping(client: durable.Client, run_id: str) -> bool:
    run = await client.store.get_run(run_id)
    return (run is not None and run.state is RunState.QUEUED and run.waiting_for is None
            and run.attempt == 2)


async def test_signals_to_finished_or_unknown_runs_are_refused(
        client: durable.Client, registry: durable.Registry, clock: FakeClock) -> None:
    declare(registry)
    async with running_worker(client, registry):
        await client.start("s.one", id="gate")
        await waiting(client, "gate", "approve")
        await client.cancel("gate")
    run = await client.get("gate")
    assert run.state is RunState.CANCELLED and run.error == "cancelled while waiting"
    with pytest.raises(durable.InvalidStateError, match="already cancelled"):
        await client.signal("gate", "approve")
    with pytest.raises(durable.RunNotFoundError):
        await client.signal("nope", "approve")
    with pytest.raises(durable.ConfigError):
        await client.signal("gate", "", None)
    assert await client.store.list_signals("gate") == []


async def test_a_signal_between_the_look_and_the_release_makes_the_run_due(
        store_url: str, clock: FakeClock) -> None:
    """The attempt looked (no signal, count 0), then a signal came, then it released the run
    to wait: the release must see the new count and leave the run due, not asleep forever."""
    store = store_from_url(store_url, clock=clock)
    await store.open()
    try:
        await store.create_run(NewRun("r", "wf", [], None, clock.now()))
        [run] = await store.claim("w", 30.0, 1)
        seen, found = await store.next_signal("r", "go", 0)
        assert (seen, found) == (0, None)
        sent = await store.send_signal("r", "go", "payload", None, None)
        assert sent.state is RunState.RUNNING and sent.seq is not None
        assert await store.release(Fence("r", run.epoch), [JournalWrite(EntryKind.RUN_WAITING)],
                                   run_at=NEVER, waiting_for="go", seen_signals=seen)
        after = await store.get_run("r")
        assert after is not None and after.state is RunState.QUEUED
        assert after.run_at == clock.now() and after.waiting_for == "go"
        # and a wait released with the count it saw stays asleep until the signal
        await store.create_run(NewRun("q", "wf", [], None, clock.now()))
        [other] = await store.claim("w", 30.0, 1, run_id="q")
        assert await store.release(Fence("q", other.epoch), run_at=NEVER, waiting_for="go",
                                   seen_signals=0)
        assert (await _run(store, "q")).run_at == NEVER
        assert (await store.send_signal("q", "go", 1, "a", {"via": "x"})).seq is not None
        assert (await _run(store, "q")).run_at == clock.now()
    finally:
        await store.aclose()


async def _run(store: Store, run_id: str) -> durable.Run:
    run = await store.get_run(run_id)
    assert run is not None
    return run


# -- the command line and a real worker process ---------------------------------------------
def cli(db_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "durable", *args, "--db", db_url],
                          cwd=ROOT, env=subprocess_env(), capture_output=True, text=True,
                          timeout=60)


async def test_cli_signal_reaches_a_run_across_a_worker_sigkill(
        db_url: str, tmp_path: Path, anyio_backend: str) -> None:
    log = tmp_path / "log"
    async with durable.Client.connect(db_url) as client:
        await client.start(waitflows.approval, str(log), id="gate")
        args = ["-m", "durable.worker", "--db", db_url, "--import", "tests.waitflows",
                "--poll", "0.05", "--log-level", "warning", "--backend", anyio_backend]
        with python_process(args, tmp_path / "w1.log") as proc:
            await waiting(client, "gate", "approve")
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        sent = await anyio.to_thread.run_sync(
            lambda: cli(db_url, "signal", "gate", "approve", '"ship it"', "--id", "c1"))
        assert sent.returncode == 0, sent.stderr
        assert "signal 'approve' recorded" in sent.stdout
        again = await anyio.to_thread.run_sync(
            lambda: cli(db_url, "signal", "gate", "approve", '"ship it"', "--id", "c1"))
        assert again.returncode == 0 and "already recorded" in again.stdout
        with python_process(args, tmp_path / "w2.log"):
            done = await client.wait("gate", timeout=30)
        journal = await client.store.journal("gate")
    assert done.state is RunState.COMPLETED and done.result == "ship it"
    assert log.read_text().splitlines() == ["asked", "got-ship it"]
    [sent_entry] = [e for e in journal if e.kind is EntryKind.SIGNAL_SENT]
    assert sent_entry.data["origin"]["via"] == "cli"


async def test_cli_signal_mistakes_are_one_line_and_write_nothing(
        db_url: str, tmp_path: Path) -> None:
    async with durable.Client.connect(db_url) as client:
        await client.start(waitflows.approval, str(tmp_path / "log"), id="gate")
        await client.cancel("gate")
    cases = {
        ("signal", "gate", "approve", "{not json"): "is not JSON",
        ("signal", "missing", "approve"): "no run with id 'missing'",
        ("signal", "gate", "approve", "true"): "already cancelled",
    }
    for args, message in cases.items():
        result = await anyio.to_thread.run_sync(lambda a=args: cli(db_url, *a))
        assert result.returncode == 2, result
        assert result.stderr.count("\n") == 1 and message in result.stderr, result.stderr
        assert "Traceback" not in result.stderr
    async with durable.Client.connect(db_url) as client:
        assert await client.store.list_signals("gate") == []
        assert "signal_sent" not in kinds(await client.store.journal("gate"))
    shown = await anyio.to_thread.run_sync(lambda: cli(db_url, "show", "gate", "--json"))
    assert json.loads(shown.stdout)["run"]["waiting_for"] is None


async def test_cli_signal_id_reused_for_another_payload_is_one_line_and_writes_nothing(
        db_url: str) -> None:
    async with durable.Client.connect(db_url) as client:
        await client.start("s.one", id="w3", delay=3600)
    sent = cli(db_url, "signal", "w3", "other", '"x"', "--id", "A")
    assert sent.returncode == 0 and "signal 'other' recorded" in sent.stdout, sent.stderr
    again = cli(db_url, "signal", "w3", "other", '"x"', "--id", "A")  # a re-send
    assert again.returncode == 0 and "already recorded" in again.stdout, again.stderr
    for args in (("other", '"y"'), ("another", '"x"')):
        refused = cli(db_url, "signal", "w3", *args, "--id", "A")
        assert refused.returncode == 2 and refused.stdout == "", refused
        assert refused.stderr.count("\n") == 1 and "Traceback" not in refused.stderr
        assert "signal id 'A' of run w3 was already used for signal 'other' with payload " \
            f"\"x\" (asked for: {args[0]!r} with {args[1]}); nothing was written" \
            in refused.stderr, refused.stderr
    secret = cli(db_url, "signal", "w3", "other",
                 json.dumps({"auth": "Bearer sk-live-0123456789abcdef"}), "--id", "A")
    assert secret.returncode == 2 and "0123456789abcdef" not in secret.stderr
    async with durable.Client.connect(db_url) as client:
        assert [(s.name, s.payload) for s in await client.store.list_signals("w3")] == [
            ("other", "x")]
        assert kinds(await client.store.journal("w3")).count("signal_sent") == 1


async def test_list_show_and_json_say_what_a_run_waits_for(
        db_url: str, registry: durable.Registry, clock: FakeClock) -> None:
    declare(registry)
    async with durable.Client.connect(db_url, clock=clock, registry=registry) as client:
        async with running_worker(client, registry):
            await client.start("s.one", id="gate")
            run = await waiting(client, "gate", "approve")
        text = render_timeline(run, await client.store.journal("gate"))
    assert "waiting   for signal 'approve', no timeout" in text
    assert re.search(r"durable\.wait_for +waiting +for signal 'approve', no timeout", text)
    assert "attempt ended to wait without a lease: waiting for signal 'approve'" in text
    listed = await anyio.to_thread.run_sync(lambda: cli(db_url, "list"))
    assert "waiting for signal 'approve', no timeout" in listed.stdout, listed
    shown = json.loads((await anyio.to_thread.run_sync(
        lambda: cli(db_url, "show", "gate", "--json"))).stdout)
    assert shown["run"]["waiting_for"] == "approve"
    [row] = [r for r in shown["steps"] if r.get("activity") == "durable.wait_for"]
    assert row["state"] == "waiting" and row["signal"] == "approve" and row["until"] is None
    assert shown["report"]["state"] == "queued" and shown["report"]["in_doubt"] == []
    async with durable.Client.connect(db_url, clock=clock, registry=registry) as client:
        await client.signal("gate", "approve", {"by": "bob"})
        async with running_worker(client, registry):
            done = await client.wait("gate", timeout=15)
        step = render_timeline(done, await client.store.journal("gate"), step=2)
    assert re.search(r"try -  received .*\n    payload  \{\"by\": \"bob\"\}\n"
                     r"    summary  signal 'approve' received \(seq 1\)", step), step


async def test_the_console_says_what_a_run_waits_for(
        db_url: str, registry: durable.Registry, clock: FakeClock) -> None:
    pytest.importorskip("starlette")
    from .test_console_http import console

    declare(registry)
    async with durable.Client.connect(db_url, clock=clock, registry=registry) as client:
        async with running_worker(client, registry):
            await client.start("s.one", id="gate")
            await waiting(client, "gate", "approve")
        async with console(client) as http:
            page = (await http.get("/runs/gate")).text
    assert "Waiting for signal &#x27;approve&#x27;, no timeout; it holds no lease" in page \
        or "Waiting for signal 'approve', no timeout; it holds no lease" in page
    assert "Starts" not in page


async def test_pruning_a_finished_run_deletes_its_signals(
        client: durable.Client, registry: durable.Registry, clock: FakeClock) -> None:
    from durable._retention import prune

    declare(registry)
    # both signals before a worker runs: sent while one ran, the second could find the run
    # completed by the first (refused, as a signal to a finished run is)
    await client.start("s.one", id="gate")
    await client.signal("gate", "approve", "yes")
    await client.signal("gate", "approve", "unused")  # never waited for
    async with running_worker(client, registry):
        assert (await client.wait("gate", timeout=15)).state is RunState.COMPLETED
    assert len(await client.store.list_signals("gate")) == 2
    clock.advance(3600)
    await prune(client.store, 60.0, (RunState.COMPLETED,))
    assert await client.store.get_run("gate") is None
    assert await client.store.list_signals("gate") == []


async def test_a_signal_from_another_process_wakes_an_idle_worker_without_a_poll(
        store_url: str, clock: FakeClock, registry: durable.Registry) -> None:
    """The worker polls every 30 s; the signal, sent through another store (as another
    process would: no in-process wake-up), reaches it by the store's change signal (SQLite
    data_version, PostgreSQL NOTIFY from the update trigger) within seconds."""
    declare(registry)
    async with durable.Client.connect(store_url, clock=clock, registry=registry) as worker_side, \
            durable.Client.connect(store_url, clock=clock, registry=registry) as sender:
        async with running_worker(worker_side, registry, poll_interval=30.0) as worker:
            await sender.start("s.one", id="gate")
            await waiting(sender, "gate", "approve")
            await poll(lambda: worker.active == {})  # idle: nothing held, waiting for work
            assert await sender.signal("gate", "approve", "go")
            done = await sender.wait("gate", timeout=10)
    assert done.state is RunState.COMPLETED and done.result == "go"


async def test_a_waiting_run_keeps_its_concurrency_key(
        client: durable.Client, registry: durable.Registry) -> None:
    ran = declare(registry)
    async with running_worker(client, registry):
        await client.start("s.one", id="first", key="slot-1")
        await waiting(client, "first", "approve")
        await client.start("s.three", id="second", key="slot-1")
        # the key is taken while the first waits: no claim can take the second
        assert await client.store.claim("another-worker", 30.0, 10) == []
        second = await client.store.get_run("second")
        assert second is not None and second.attempt == 0
        await client.signal("first", "approve", "ok")
        assert (await client.wait("first", timeout=15)).state is RunState.COMPLETED
        for n in (1, 2, 3):
            await client.signal("second", "n", n)
        assert (await client.wait("second", timeout=15)).result == [1, 2, 3]
    assert ran == ["asked", "answered"]


async def test_payloads_are_journaled_but_never_logged(
        client: durable.Client, registry: durable.Registry) -> None:
    declare(registry)
    secret = "payload-7f3a9c-not-for-logs"
    with durable.testing.capture_logs() as logs:
        async with running_worker(client, registry):
            await client.start("s.one", id="gate")
            await waiting(client, "gate", "approve")
            await client.signal("gate", "approve", {"note": secret}, id="s1")
            await client.wait("gate", timeout=15)
    events = {e["event"] for e in logs}
    assert {"signal_sent", "signal_received", "run_waiting"} <= events
    assert secret not in repr(logs)
    received = [e for e in await client.store.journal("gate")
                if e.kind is EntryKind.SIGNAL_RECEIVED]
    assert received[0].data["payload"] == {"note": secret}



async def test_a_timed_out_wait_is_kept_by_a_replay_and_waited_again_from_its_step(
        client: durable.Client, registry: durable.Registry, clock: FakeClock) -> None:
    ran = declare(registry)
    async with running_worker(client, registry):
        await client.start("s.strict", id="strict")
        await waiting(client, "strict", "approve")
        clock.advance(10)
        failed = await client.wait("strict", timeout=15)
        assert failed.state is RunState.FAILED
        assert "SignalTimeout: no signal 'approve' arrived within 10 s" in (failed.error or "")
        await client.replay("strict")  # the timeout is journaled: the same outcome again
        again = await client.wait("strict", timeout=15)
        assert again.state is RunState.FAILED and "SignalTimeout" in (again.error or "")
        await client.replay("strict", from_step=2)  # the wait's step: it waits afresh
        run = await waiting(client, "strict", "approve", attempt=4)
        assert run.run_at == pytest.approx(clock.now() + 10, abs=0.01)
        await client.signal("strict", "approve", "late but fine")
        done = await client.wait("strict", timeout=15)
    assert done.state is RunState.COMPLETED and done.result == "late but fine"
    assert ran == ["asked"]


async def test_a_signal_recorded_before_the_deadline_is_received_though_the_look_was_late(
        client: durable.Client, registry: durable.Registry, clock: FakeClock) -> None:
    """A wait in the attempt looks for its signal, finds none, then reads the clock: if the
    process stalls between the two (a GC pause, a starved CPU, a short SIGSTOP), a signal
    committed in the stall and a deadline passed in it must not end the wait in a timeout,
    since the signal was recorded in time. The stall is injected at that exact point, on the
    real store (the signal a real send, the deadline passed by the store's clock): a race
    of two processes cannot be timed to a point between two calls otherwise."""
    declare(registry)
    store = client.store
    look = store.next_signal
    stalled: list[float] = []

    async def look_then_stall(run_id: str, name: str, after: int) -> Any:
        found = await look(run_id, name, after)
        if run_id == "late" and not stalled:
            stalled.append(clock.now())
            assert await client.signal("late", "never", "in time", id="in-time")
            clock.advance(5.0)  # past the 1 s deadline while the process stood still
        return found

    store.next_signal = look_then_stall  # type: ignore[method-assign]
    async with running_worker(client, registry):
        await client.start("s.timeout", 1.0, id="late")  # 1 s: the wait stays in the attempt
        # the wait ended, one way or the other: the run sleeps (released) after it
        await poll(lambda: _timer_started(client, "late"), timeout=15)
    entries = await client.store.journal("late")
    [sent] = [e for e in entries if e.kind is EntryKind.SIGNAL_SENT]
    [wait] = [e for e in entries if e.kind is EntryKind.WAIT_STARTED]
    assert sent.at < wait.data["until"]  # recorded before the deadline
    journal = kinds(entries)
    assert "signal_timeout" not in journal and journal.count("signal_received") == 1


async def _timer_started(client: durable.Client, run_id: str) -> bool:
    return "timer_started" in kinds(await client.store.journal(run_id))
