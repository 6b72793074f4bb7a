"""Run ids in the console's URLs, over real HTTP (Hypercorn on loopback, the real SQLite
store, asyncio and trio).

A run id is any non-empty string. Every URL the console or the engine builds with one
carries it as one encoded path segment, and the server reads it back from the raw path: an
id with ``?`` or ``#``, one named like a page (``live``) or ending like one (``job/live``,
``x/journal``, ``x/cancel``) reaches its own run, never another's, and never a 404. Each id
beside a run whose id is its first segment (``job``, ``x``, ``a``): a misrouted request
would answer for that other run.
"""

from __future__ import annotations

import html
import re

import httpx
import pytest

import durable
from durable._report import RecoveryReport

from .helpers import running_worker
from .test_console_http import TOKEN, console, finished, flow_registry, gate  # noqa: F401

pytestmark = pytest.mark.anyio

IDS = ["run with spaces?&#", "live", "job/live", "x/journal", "a/b", "100%", "ünï",
       "x/cancel", "q?x=1#y/live"]
DECOYS = ["job", "x", "a", "run with spaces", "q"]
"""Runs whose ids a misread URL of one of IDS would name instead."""


async def _start_all(client: durable.Client) -> dict[str, str]:
    """Every run queued for an hour, each with its own argument; its argument as a page
    shows it, by id."""
    shown = {}
    for i, run_id in enumerate(IDS + DECOYS):
        await client.start("t.ok", f"arg-{i}", id=run_id, delay=3600)
        shown[run_id] = f"&quot;arg-{i}&quot;"
    return shown


def _links(page: str) -> dict[str, str]:
    """The runs list's link of each run, by the run's id."""
    rows = re.findall(r'data-run-id="([^"]*)"><td class="id"><a href="([^"]*)">', page)
    return {html.unescape(run_id): html.unescape(href) for run_id, href in rows}


def _attribute(page: str, pattern: str) -> str:
    match = re.search(pattern, page)
    assert match, pattern
    return html.unescape(match.group(1))


async def test_each_run_s_link_page_live_view_and_api_answer_for_that_run(
        client: durable.Client, flow_registry: durable.Registry) -> None:  # noqa: F811
    shown = await _start_all(client)
    async with console(client) as http:
        runs = await http.get("/runs", params={"limit": "100"})
        links = _links(runs.text)
        assert set(links) == set(IDS + DECOYS)
        assert links["live"] == "/runs/live" and links["job"] == "/runs/job"  # plain: as before
        live_list = _attribute(runs.text, r'<section class="live" data-poll="([^"]*)"')
        listed = await http.get(live_list)
        assert listed.status_code == 200 and set(_links(listed.text)) >= set(IDS[:1])
        for run_id in IDS:
            page = await http.get(links[run_id])
            assert page.status_code == 200, (run_id, links[run_id], page.text[:300])
            assert f"<small>{html.escape(run_id)}</small>" in page.text, run_id
            assert shown[run_id] in page.text, run_id
            poll_url = _attribute(page.text, r'data-poll="([^"]*)" data-poll-interval="1000"')
            fragment = await http.get(poll_url)
            assert fragment.status_code == 200, (run_id, poll_url, fragment.text[:300])
            assert shown[run_id] in fragment.text and "<html" not in fragment.text, run_id
            api = await http.get(f"/api{links[run_id]}")
            assert api.status_code == 200, (run_id, api.text[:300])
            assert api.json()["run"]["id"] == run_id
            journal = await http.get(f"/api{links[run_id]}/journal")
            assert journal.status_code == 200, (run_id, journal.text[:300])
            entries = journal.json()["journal"]
            assert entries and {e["run_id"] for e in entries} == {run_id}
            status = (await http.get("/api/status", params={"id": run_id})).json()
            assert status["run_id"] == run_id and status["link"] == links[run_id]


async def test_a_cancel_posted_to_its_form_s_action_cancels_that_run_only(
        client: durable.Client, flow_registry: durable.Registry) -> None:  # noqa: F811
    await _start_all(client)
    cancelled: set[str] = set()
    async with console(client, token=TOKEN) as http:
        links = _links((await http.get("/runs", params={"limit": "100"})).text)
        for run_id in IDS:
            page = (await http.get(links[run_id])).text
            action = _attribute(page, r'<form class="action cancel" method="post" '
                                      r'action="([^"]*)">')
            assert action == f"{links[run_id]}/cancel"
            csrf = _attribute(page, r'name="csrf" value="([^"]+)"')
            done = await http.post(action, data={"csrf": csrf, "token": TOKEN})
            assert done.status_code == 303, (run_id, done.text[:300])
            cancelled.add(run_id)
            for other in IDS + DECOYS:
                state = (await client.get(other)).state
                assert (state is durable.RunState.CANCELLED) == (other in cancelled), \
                    (run_id, other, state)
            back = done.headers["location"]
            assert back == links[run_id], (run_id, back)
            after = await http.get(back)
            assert f"<small>{html.escape(run_id)}</small>" in after.text
            assert "cancelled before it started" in after.text


async def test_an_id_s_encoded_slash_is_its_own_and_a_slash_typed_by_hand_still_works(
        client: durable.Client, flow_registry: durable.Registry) -> None:  # noqa: F811
    """``%2F`` is part of the id (``job%2Flive`` is the run ``job/live``, not the live view
    of ``job``); a ``/`` typed by hand in an id is read as part of it too, unless the last
    segment is a suffix of the page (``live``; ``journal`` in the API; an action posted)."""
    shown = await _start_all(client)
    async with console(client) as http:
        for path, run_id in (("/runs/job%2Flive", "job/live"), ("/runs/a/b", "a/b"),
                             ("/runs/x/cancel", "x/cancel"), ("/runs/x%2Fjournal", "x/journal")):
            page = await http.get(path)
            assert page.status_code == 200 and shown[run_id] in page.text, path
            assert f"<small>{html.escape(run_id)}</small>" in page.text, path
        fragment = await http.get("/runs/job/live")  # the live view of job
        assert shown["job"] in fragment.text and "<html" not in fragment.text
        api = await http.get("/api/runs/x/journal")  # the journal of x
        assert {e["run_id"] for e in api.json()["journal"]} == {"x"}
        assert (await http.get("/api/runs/a/b")).json()["run"]["id"] == "a/b"


async def test_a_failure_message_s_console_links_open_that_run(
        client: durable.Client, flow_registry: durable.Registry) -> None:  # noqa: F811
    run_id = "fail/live ?#%"
    async with running_worker(client, flow_registry):
        await client.start("t.fail", id=run_id)
        await client.start("t.fail", id="fail")
        await finished(client, run_id)
        await finished(client, "fail")
    async with console(client) as http:
        base = str(http.base_url).rstrip("/")
        run = await client.get(run_id)
        report = RecoveryReport.build(run, await client.journal(run_id), f"{base}/")
        _, _, run_url = report.run_link.partition("  |  ")
        _, _, step_url = report.failed[0].link.partition("  |  ")
        assert step_url == f"{run_url}#step-3"
        for url in (run_url, step_url):
            assert url.startswith(base + "/runs/"), url
            page = await http.get(url)
            assert page.status_code == 200, (url, page.text[:300])
            assert f"<small>{html.escape(run_id)}</small>" in page.text
            assert 'class="step state-failed" id="step-3"' in page.text
        assert httpx.URL(step_url).fragment == "step-3"
