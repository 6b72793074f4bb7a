"""The console says what the CLI says of a run's state, and its live view keeps up with it,
over real HTTP (Hypercorn on a loopback socket, the real SQLite store, an in-process worker;
asyncio and trio).

A run's actions come with its live fragment, keyed by what they offer, so the page swaps
them only when the run's state changes them (tests/test_console_browser.py checks the swap
in chromium); durable waits are shown as ``show`` shows them (sleeping, waiting, received),
and the runs list says what ``list`` says of a waiting run; the state counts count what the
filters select, or say they cannot.
"""

from __future__ import annotations

import re

import httpx
import pytest

import durable
from durable._approval import send_decision
from durable._report import list_note
from durable._shapes import show_json

from .helpers import poll, running_worker
from .test_console_http import TOKEN, _csrf, console

pytestmark = pytest.mark.anyio


@pytest.fixture
def waiting_registry(registry: durable.Registry) -> durable.Registry:
    @durable.activity("t.plan", registry=registry)
    async def plan(ctx: durable.ActivityContext, what: str) -> dict[str, object]:
        return {"title": f"This run will delete {what}:",
                "items": [{"action": "delete", "kind": "database", "id": what}]}

    @durable.activity("t.note", registry=registry)
    async def note(ctx: durable.ActivityContext, what: str) -> str:
        return what

    @durable.workflow("t.waits", registry=registry)
    async def waits(ctx: durable.WorkflowContext) -> object:
        return await ctx.wait_for("go")

    @durable.workflow("t.naps", registry=registry)
    async def naps(ctx: durable.WorkflowContext) -> str:
        await ctx.step(note, "before")
        await ctx.sleep(3600)
        return "woke"

    @durable.workflow("t.times_out", registry=registry)
    async def times_out(ctx: durable.WorkflowContext) -> str:
        try:
            await ctx.wait_for("go", timeout=0.05)
        except durable.SignalTimeout:
            return "no answer"
        return "answered"

    @durable.workflow("t.approved", registry=registry)
    async def approved(ctx: durable.WorkflowContext, what: str) -> str:
        await durable.approval_gate(ctx, plan, what)
        return str(await ctx.step(note, f"deleted {what}"))

    return registry


async def _released(client: durable.Client, run_id: str) -> None:
    """The run has ended its attempt to wait without a lease (queued, attempt 1)."""
    async def ready() -> bool:
        run = await client.get(run_id)
        return run.state is durable.RunState.QUEUED and run.attempt >= 1
    await poll(ready, timeout=20)


def _actions(fragment: str) -> tuple[str, str]:
    """The key and the forms of the actions a live fragment carries."""
    found = re.search(r'<template data-update="actions" data-key="([^"]+)">(.*?)</template>',
                      fragment, re.S)
    assert found, "the live fragment carries the run's actions"
    return found.group(1), found.group(2)


async def test_the_live_fragment_carries_the_actions_the_run_s_state_allows(
        client: durable.Client, waiting_registry: durable.Registry) -> None:
    async with running_worker(client, waiting_registry), \
            console(client, token=TOKEN) as http:
        await client.start("t.waits", id="w-1")
        await _released(client, "w-1")
        page = (await http.get("/runs/w-1")).text
        csrf = _csrf(page)
        shown = re.search(r'<div id="actions" data-key="([^"]+)">', page)
        assert shown, "the page's actions are keyed as the fragment's"
        live = (await http.get("/runs/w-1/live")).text
        key, forms = _actions(live)
        assert key == shown.group(1)  # unchanged: the page keeps what the operator typed
        assert 'action="/runs/w-1/cancel"' in forms and 'action="/runs/w-1/signal"' in forms
        assert f'name="csrf" value="{csrf}"' in forms
        again, _ = _actions((await http.get("/runs/w-1/live")).text)
        assert again == key  # a fresh signal id per render is not a change of state
        await client.signal("w-1", "go", {"ok": True})
        await client.wait("w-1", timeout=20)
        live = (await http.get("/runs/w-1/live")).text
        assert live and (await http.get("/runs/w-1/live")).headers["X-Durable-Final"] == "1"
        done_key, forms = _actions(live)
        assert done_key != key
        assert "/cancel" not in forms and "/signal" not in forms and "/pause" not in forms


async def test_a_failed_run_s_fragment_brings_its_replay_form(
        client: durable.Client, registry: durable.Registry) -> None:
    @durable.activity("t.boom", retry=durable.RetryPolicy(max_tries=1), registry=registry)
    async def boom(ctx: durable.ActivityContext) -> None:
        raise RuntimeError("no")

    @durable.workflow("t.fails", registry=registry)
    async def fails(ctx: durable.WorkflowContext) -> None:
        await ctx.wait_for("go")
        await ctx.step(boom)

    async with running_worker(client, registry), console(client, token=TOKEN) as http:
        await client.start("t.fails", id="f-1")
        await _released(client, "f-1")
        _, forms = _actions((await http.get("/runs/f-1/live")).text)
        assert "/replay" not in forms
        await client.signal("f-1", "go")
        await client.wait("f-1", timeout=20)
        _, forms = _actions((await http.get("/runs/f-1/live")).text)
        assert 'action="/runs/f-1/replay"' in forms and "/cancel" not in forms


async def test_a_read_only_console_s_fragment_carries_its_notice(
        client: durable.Client, waiting_registry: durable.Registry) -> None:
    await client.start("t.waits", id="ro-1", delay=3600)
    async with console(client) as http:
        _, forms = _actions((await http.get("/runs/ro-1/live")).text)
        assert "read-only" in forms and "<form" not in forms


def _badges(page: str) -> dict[int, tuple[str, str]]:
    """Each step's state class and badge text on a run's page."""
    return {int(n): (state, label) for state, n, label in re.findall(
        r'<li class="step state-([a-z_]+)" id="step-(\d+)">.*?'
        r'<span class="badge state-[a-z_]+">([^<]*)</span>', page)}


def _show_states(client_show: dict[str, object]) -> dict[int, str]:
    """Each step's state in ``show``'s timeline: its last row's."""
    states: dict[int, str] = {}
    for row in client_show["steps"]:  # type: ignore[attr-defined]
        if "event" not in row:
            states[int(row["step"])] = str(row["state"])
    return states


async def _same_as_show(client: durable.Client, http: httpx.AsyncClient, run_id: str
                        ) -> dict[int, tuple[str, str]]:
    page = (await http.get(f"/runs/{run_id}")).text
    run = await client.get(run_id)
    shown = _show_states(show_json(run, await client.journal(run_id)))
    badges = _badges(page)
    assert {n: s for n, (s, _) in badges.items()} == shown, (badges, shown)
    for _, label in badges.values():
        assert "_" not in label, label  # no enum's name shown to people
    return badges


async def test_durable_waits_are_shown_as_show_shows_them(
        client: durable.Client, waiting_registry: durable.Registry) -> None:
    async with running_worker(client, waiting_registry):
        await client.start("t.waits", id="w-2")
        await client.start("t.naps", id="nap-1")
        await client.start("t.approved", "db-1", id="gate-1")
        await client.start("t.approved", "db-2", id="gate-2")
        await client.start("t.times_out", id="late-1")
        for run_id in ("w-2", "nap-1", "gate-1", "gate-2"):
            await _released(client, run_id)
        await send_decision(client, "gate-2", "reject", {"reason": "not today"},
                            id="t-reject", origin={"via": "test"})
        await client.signal("w-2", "go")
        await client.wait("w-2", timeout=20)
        await client.wait("gate-2", timeout=20)
        await client.wait("late-1", timeout=20)
    async with console(client) as http:
        badges = await _same_as_show(client, http, "late-1")
        assert badges[1] == ("timed_out", "timed out")
        badges = await _same_as_show(client, http, "w-2")
        assert badges[1] == ("received", "received")
        badges = await _same_as_show(client, http, "nap-1")
        assert badges[2] == ("sleeping", "sleeping")
        page = (await http.get("/runs/nap-1")).text
        header = re.search(r'<p class="delayed-start">(.*?)</p>', page, re.S)
        assert header and header.group(1).startswith("Sleeping until "), header
        assert "Waiting sleeping" not in page
        assert re.search(r'id="step-2">.*?<div class="summary">until \d{4}-', page, re.S)
        badges = await _same_as_show(client, http, "gate-1")
        assert badges[2] == ("waiting", "waiting")
        page = (await http.get("/runs/gate-1")).text
        assert "for signal &#x27;approve&#x27;, no timeout" in page
        badges = await _same_as_show(client, http, "gate-2")  # cancelled by the rejection
        assert badges[2] == ("waiting", "waiting")
        assert "the run cancelled meanwhile" in (await http.get("/runs/gate-2")).text


def _rows(page: str) -> dict[str, str]:
    """The detail column of each row of the runs list."""
    return {run_id: re.sub(r"<[^>]+>", "", detail) for run_id, detail in re.findall(
        r'<tr class="run [^"]*" data-run-id="([^"]+)">.*?<td class="detail">(.*?)</td></tr>',
        page, re.S)}


async def test_the_runs_list_says_what_list_says_of_waiting_runs(
        client: durable.Client, waiting_registry: durable.Registry) -> None:
    async with running_worker(client, waiting_registry):
        await client.start("t.waits", id="w-3")
        await client.start("t.naps", id="nap-2")
        for run_id in ("w-3", "nap-2"):
            await _released(client, run_id)
    async with console(client) as http:
        rows = _rows((await http.get("/runs")).text)
        now = await client.store.now()
        for run_id in ("w-3", "nap-2"):
            expected = list_note(await client.get(run_id), now)
            assert expected.startswith("waiting ")
            assert rows[run_id] == expected.replace("'", "&#x27;"), rows
        live = _rows((await http.get("/live/runs")).text)
        assert live == rows


def _chips(page: str) -> dict[str, str]:
    return {name: n for name, n in re.findall(
        r'<a class="count[^"]*" href="[^"]*">([a-z]+) <b>([^<]*)</b></a>', page)}


async def test_the_counts_count_what_the_filters_select_or_say_they_cannot(
        client: durable.Client, waiting_registry: durable.Registry) -> None:
    for i in range(3):
        await client.start("t.waits", id=f"bulk-{i:02d}", delay=3600)
    cut = await client.store.now()
    for i in range(2):
        await client.start("t.waits", id=f"late-{i:02d}", delay=3600)
    await client.cancel("late-01")
    async with console(client) as http:
        assert _chips((await http.get("/runs")).text) == {
            "all": "5", "queued": "4", "running": "0", "completed": "0", "failed": "0",
            "cancelled": "1"}
        since = {"since": repr(cut)}
        api = (await http.get("/api/runs", params=since)).json()
        assert len(api["runs"]) == 2 and api["counts"]["queued"] == 1
        assert api["counts"]["cancelled"] == 1 and sum(api["counts"].values()) == 2
        assert _chips((await http.get("/runs", params=since)).text)["all"] == "2"
        until = (await http.get("/api/runs", params={"until": repr(cut)})).json()
        assert until["counts"]["queued"] == 3 and sum(until["counts"].values()) == 3
        # an id prefix is not counted (it can span every run): the chips say so, no numbers
        page = (await http.get("/runs", params={"q": "bulk-"})).text
        assert _chips(page) == {}
        assert "not counted by id prefix" in page
        assert 'href="/runs?state=failed&amp;q=bulk-"' in page  # still a filter
        api = (await http.get("/api/runs", params={"q": "bulk-"})).json()
        assert api["counts"] is None and len(api["runs"]) == 3
