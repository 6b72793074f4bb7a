"""The console over real HTTP: a Hypercorn server on a loopback socket, in the test's own
event loop (asyncio and trio), the real SQLite store and an in-process worker.

The browser tests (tests/test_console_browser.py) drive the same pages in chromium; these
check what the server answers: pages, the JSON API's shapes, filters and cursors, the
token and CSRF guards on every action, and that no secret ever leaves.
"""

from __future__ import annotations

import re
import socket
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import httpx
import pytest

import durable
from durable._hosts import foreign_name, rebindable
from durable._shapes import run_json, show_json
from durable._types import EntryKind, Fence, RunState
from durable.console import bind_socket, create_app, serve

from .helpers import poll, running_worker

pytestmark = pytest.mark.anyio

TOKEN = "console-admin-token-5f1d2c"
SECRET = "sk-live-7b3e9a1c44d0"


def flows(registry: durable.Registry, gate: anyio.Event) -> None:
    @durable.activity("t.echo", registry=registry)
    async def echo(ctx: durable.ActivityContext, value: str) -> str:
        ctx.annotate(f"echoed {value}")
        return value

    @durable.activity("t.leaky", retry=durable.RetryPolicy(max_tries=1), registry=registry)
    async def leaky(ctx: durable.ActivityContext) -> None:
        raise RuntimeError(f"upstream said 401 to Authorization: Bearer {SECRET}")

    @durable.activity("t.noisy", registry=registry)
    async def noisy(ctx: durable.ActivityContext) -> str:
        # a careless summary: whether or not the journal keeps it, no page may show it
        ctx.annotate(f"authenticated with Authorization: Bearer {SECRET}")
        return "ok"

    @durable.activity("t.wait", registry=registry)
    async def wait(ctx: durable.ActivityContext) -> str:
        await gate.wait()
        return "opened"

    @durable.workflow("t.ok", registry=registry)
    async def ok(ctx: durable.WorkflowContext, name: str) -> str:
        await ctx.step(echo, name)
        await ctx.set_records({("slots", name): {"state": "vacant"}}, summary="vacated")
        return await ctx.step(echo, f"bye {name}")

    @durable.workflow("t.fail", registry=registry)
    async def fail(ctx: durable.WorkflowContext) -> None:
        await ctx.step(echo, "first")
        await ctx.step(noisy)
        await ctx.step(leaky)

    @durable.workflow("t.gated", registry=registry)
    async def gated(ctx: durable.WorkflowContext) -> str:
        await ctx.step(echo, "before")
        return str(await ctx.step(wait))


@asynccontextmanager
async def console(client: durable.Client, token: str | None = None, *,
                  bind: str = "127.0.0.1", console_url: str | None = None,
                  allow_hosts: tuple[str, ...] = ()) -> AsyncIterator[httpx.AsyncClient]:
    sock = bind_socket(bind, 0)
    with sock:
        app = create_app(client, token=token, console_url=console_url,
                         allow_hosts=allow_hosts)
        async with anyio.create_task_group() as tg:
            url = await tg.start(serve, app, sock)
            async with httpx.AsyncClient(base_url=url, timeout=10) as http:
                await poll(lambda: _up(http), timeout=10)
                yield http
            tg.cancel_scope.cancel()


async def _up(http: httpx.AsyncClient) -> bool:
    try:
        return (await http.get("/healthz")).status_code == 200
    except httpx.TransportError:
        return False


@pytest.fixture
def gate() -> anyio.Event:
    return anyio.Event()


@pytest.fixture
def flow_registry(registry: durable.Registry, gate: anyio.Event) -> durable.Registry:
    flows(registry, gate)
    return registry


async def finished(client: durable.Client, run_id: str) -> durable.Run:
    return await client.wait(run_id, timeout=20)


async def test_run_page_and_api_show_the_journal(client: durable.Client,
                                                 flow_registry: durable.Registry) -> None:
    async with running_worker(client, flow_registry):
        await client.start("t.ok", "slot-1", id="ok-1", key="slot-1")
        await client.start("t.fail", id="fail-1")
        await finished(client, "ok-1")
        await finished(client, "fail-1")
    async with console(client) as http:
        page = await http.get("/runs/ok-1")
        assert page.status_code == 200
        body = page.text
        for n in (1, 2, 3):
            assert f'id="step-{n}"' in body
        assert "t.echo" in body and "echoed slot-1" in body
        assert "Records this run wrote" in body and "vacant" in body
        assert "completed" in body
        api = (await http.get("/api/runs/ok-1")).json()
        run = await client.get("ok-1")
        expected = show_json(run, await client.journal("ok-1"))
        assert api["run"] == run_json(run)
        assert api["journal"] == expected["journal"]
        assert api["steps"] == expected["steps"]
        assert api["records"][0]["namespace"] == "slots" and api["records"][0]["exists"]
        failed = await http.get("/runs/fail-1")
        assert 'class="step state-failed" id="step-3"' in failed.text
        assert "Recovery report" in failed.text
        assert 'href="#step-3"' in failed.text  # the report links to the failed step


async def test_a_running_run_s_page_says_when_its_timeout_runs_out(
        fclient: durable.Client, clock: durable.FakeClock,
        flow_registry: durable.Registry) -> None:
    """A run started with a timeout: its page says when the time runs out, counted from its
    first attempt's claim (not from this attempt's), and no longer once the run ended."""
    from durable._report import utc

    client = fclient
    await client.start("t.ok", "slot-1", id="timed", timeout=600)
    [first] = await client.store.claim("w-1", 30.0, 1, run_id="timed")
    assert await client.store.release(Fence(first.id, first.epoch))  # given back
    clock.advance(5)
    [second] = await client.store.claim("w-2", 30.0, 1, run_id="timed")
    claims = [e.at for e in await client.journal("timed") if e.kind is EntryKind.RUN_CLAIMED]
    assert len(claims) == 2 and claims[1] == claims[0] + 5
    async with console(client) as http:
        page = (await http.get("/runs/timed")).text
        assert "10.0 min from its first attempt, runs out" in page
        assert utc(claims[0] + 600) in page and utc(claims[1] + 600) not in page
        assert await client.store.finish(Fence(second.id, second.epoch), RunState.COMPLETED)
        ended = (await http.get("/runs/timed")).text
        assert "10.0 min from its first attempt<" in ended and "runs out" not in ended


async def test_a_queued_run_s_page_says_by_when_it_must_start(
        fclient: durable.Client, clock: durable.FakeClock,
        flow_registry: durable.Registry) -> None:
    """A run started with ``start_within``: until its first claim its page says by when it
    must be claimed or fail without running; once claimed, only the limit."""
    from durable._report import utc

    client = fclient
    run = await client.start("t.ok", "slot-1", id="limited", start_within=120)
    async with console(client) as http:
        page = (await http.get("/runs/limited")).text
        assert "2.0 min of being due, by" in page and "or it fails without running" in page
        assert utc(run.run_at + 120) in page
        await client.store.claim("w-1", 30.0, 1, run_id="limited")
        claimed = (await http.get("/runs/limited")).text
        assert "2.0 min of being due<" in claimed and "fails without running" not in claimed


async def test_a_paused_workflow_is_shown_on_the_runs_list_and_its_runs_pages(
        fclient: durable.Client, flow_registry: durable.Registry) -> None:
    """``durable pause``: the runs list says which workflows are paused, by whom and how to
    resume (the live fragment and the JSON too), its queued runs carry a *paused* badge, and
    a run's page says its workflow is paused; once resumed, nothing says so."""
    client = fclient
    await client.start("t.ok", "slot-1", id="held")
    await client.start("t.echo", "x", id="free")
    await client.pause("t.ok", origin={"via": "cli", "user": "ops", "host": "bastion"})
    async with console(client) as http:
        runs = (await http.get("/runs")).text
        assert "Paused: no attempt of these workflows starts" in runs
        assert "<b>t.ok</b> paused since" in runs and "ops@bastion (cli)" in runs
        assert "durable resume t.ok" in runs
        [held] = [row for row in runs.split("<tr") if 'data-run-id="held"' in row]
        [free] = [row for row in runs.split("<tr") if 'data-run-id="free"' in row]
        assert 'class="badge paused"' in held and "paused" not in free
        assert "Paused:" in (await http.get("/live/runs")).text
        api = (await http.get("/api/runs")).json()
        assert [p["workflow"] for p in api["paused"]] == ["t.ok"]
        page = (await http.get("/runs/held")).text
        assert "its workflow is paused since" in page
        assert "its workflow is paused" not in (await http.get("/runs/free")).text
        await client.resume("t.ok")
        assert "Paused:" not in (await http.get("/runs")).text
        assert "its workflow is paused" not in (await http.get("/runs/held")).text


async def test_a_run_page_pauses_and_resumes_its_workflow_with_the_token(
        client: durable.Client, flow_registry: durable.Registry) -> None:
    """The run page's *pause workflow* form (the token and the CSRF value, as every action)
    pauses the run's workflow, saying who; the page then offers *resume*, which ends it. The
    JSON API does the same with the bearer token."""
    await client.start("t.ok", "slot-8", id="ok-8", delay=3600)
    async with console(client, token=TOKEN) as http:
        page = (await http.get("/runs/ok-8")).text
        assert 'action="/runs/ok-8/pause"' in page and "pause workflow t.ok" in page
        csrf = _csrf(page)
        refused = await http.post("/runs/ok-8/pause", data={"csrf": csrf, "token": "wrong"})
        assert refused.status_code == 403 and await client.paused() == []
        done = await http.post("/runs/ok-8/pause", data={"csrf": csrf, "token": TOKEN},
                               headers={"Origin": str(http.base_url).rstrip("/")})
        assert done.status_code == 303
        [pause] = await client.paused()
        assert pause.workflow == "t.ok" and pause.origin is not None
        assert pause.origin["via"] == "console"
        after = (await http.get(done.headers["location"])).text
        assert "t.ok paused since" in after and 'action="/runs/ok-8/resume"' in after
        resumed = await http.post("/runs/ok-8/resume", data={"csrf": _csrf(after),
                                                              "token": TOKEN},
                                  headers={"Origin": str(http.base_url).rstrip("/")})
        assert resumed.status_code == 303 and await client.paused() == []
        assert "t.ok resumed" in (await http.get(resumed.headers["location"])).text
        api = await http.post("/api/runs/ok-8/pause", headers={"Authorization": f"Bearer {TOKEN}"})
        assert api.status_code == 200 and "t.ok paused since" in api.json()["message"]
        assert [p.workflow for p in await client.paused()] == ["t.ok"]


async def test_live_fragment_is_final_only_when_the_run_ended(
        client: durable.Client, flow_registry: durable.Registry, gate: anyio.Event) -> None:
    async with running_worker(client, flow_registry), console(client) as http:
        await client.start("t.gated", id="gated-1")
        await poll(lambda: _has(http, "/runs/gated-1/live", "t.wait"))
        live = await http.get("/runs/gated-1/live")
        assert "X-Durable-Final" not in live.headers
        assert 'data-poll="/runs/gated-1/live"' in (await http.get("/runs/gated-1")).text
        gate.set()
        await finished(client, "gated-1")
        live = await http.get("/runs/gated-1/live")
        assert live.headers["X-Durable-Final"] == "1"
        assert "opened" in live.text


async def _has(http: httpx.AsyncClient, path: str, needle: str) -> bool:
    return needle in (await http.get(path)).text


async def test_runs_list_filters_counts_and_cursor(client: durable.Client,
                                                   flow_registry: durable.Registry) -> None:
    for i in range(7):
        await client.start("t.ok", f"s{i}", id=f"ok-{i:02d}", key=f"s{i % 2}", delay=3600)
    await client.start("t.fail", id="other-1", delay=3600)
    await client.cancel("ok-03")
    async with console(client) as http:
        everything = (await http.get("/api/runs")).json()
        assert [r["id"] for r in everything["runs"]][:2] == ["other-1", "ok-06"]
        assert everything["counts"]["queued"] == 7 and everything["counts"]["cancelled"] == 1
        seen: list[str] = []
        cursor = None
        while True:
            params = {"limit": "3", "workflow": "t.ok"}
            if cursor:
                params["before"] = cursor
            page = (await http.get("/api/runs", params=params)).json()
            seen += [r["id"] for r in page["runs"]]
            cursor = page["next"]
            if cursor is None:
                break
        assert seen == [f"ok-{i:02d}" for i in reversed(range(7))]
        keyed = (await http.get("/api/runs", params={"key": "s1"})).json()
        assert sorted(r["id"] for r in keyed["runs"]) == ["ok-01", "ok-03", "ok-05"]
        cancelled = (await http.get("/api/runs", params={"state": "cancelled"})).json()
        assert [r["id"] for r in cancelled["runs"]] == ["ok-03"]
        prefix = (await http.get("/api/runs", params={"q": "oth"})).json()
        assert [r["id"] for r in prefix["runs"]] == ["other-1"]
        future = (await http.get("/api/runs", params={"since": "2999-01-01T00:00Z"})).json()
        assert future["runs"] == []
        html = (await http.get("/runs", params={"limit": "3"})).text
        assert 'rel="next"' in html and "ok-05" in html and "ok-04" not in html
        older = re.search(r'rel="next" href="([^"]+)"', html)
        assert older
        second = (await http.get(older.group(1).replace("&amp;", "&"))).text
        assert 'data-run-id="ok-04"' in second and 'data-run-id="ok-05"' not in second
        live = re.search(r'data-poll="([^"]+)"', second)
        assert live  # the second page refreshes itself in place, not into the first page
        refreshed = (await http.get(live.group(1).replace("&amp;", "&"))).text
        assert 'data-run-id="ok-04"' in refreshed and 'data-run-id="ok-05"' not in refreshed
        assert 'class="delayed"' in html and "data-countdown" in html
        bad = await http.get("/runs", params={"since": "yesterday-ish"})
        assert bad.status_code == 400 and "not a time" in bad.text
        bad = await http.get("/api/runs", params={"state": "exploded"})
        assert bad.status_code == 400 and bad.json()["error"].startswith("unknown state")


async def test_status_by_key_is_unknown_when_nothing_is_found(
        client: durable.Client, flow_registry: durable.Registry) -> None:
    async with running_worker(client, flow_registry):
        await client.start("t.ok", "slot-3", id="ok-3", key="slot-3")
        await finished(client, "ok-3")
    async with console(client) as http:
        known = (await http.get("/api/status", params={"workflow": "t.ok", "key": "slot-3"}))
        assert known.json()["status"] == "completed"
        assert known.json()["run_id"] == "ok-3"
        for params in ({"workflow": "t.ok", "key": "slot-404"}, {"id": "nope"}):
            answer = (await http.get("/api/status", params=params)).json()
            assert answer["status"] == "unknown" and answer["reason"]
        missing = await http.get("/runs/nope")
        assert missing.status_code == 404
        assert "cannot confirm" in missing.text and "completed" not in missing.text
        assert (await http.get("/api/status")).status_code == 400
        api = await http.get("/api/runs/nope")
        assert api.status_code == 404 and api.json()["status"] == "unknown"


async def test_read_only_console_refuses_actions_and_says_so(
        client: durable.Client, flow_registry: durable.Registry) -> None:
    await client.start("t.ok", "slot-5", id="ok-5", delay=3600)
    async with console(client) as http:
        page = await http.get("/runs/ok-5")
        assert "read-only" in page.text and "<form class=\"action" not in page.text
        csrf = http.cookies.get("durable_csrf")
        refused = await http.post("/runs/ok-5/cancel", data={"csrf": csrf, "token": "x"})
        assert refused.status_code == 403 and "read-only" in refused.text
        api = await http.post("/api/runs/ok-5/cancel", headers={"Authorization": "Bearer x"})
        assert api.status_code == 403
    assert (await client.get("ok-5")).state is durable.RunState.QUEUED


def _csrf(page: str) -> str:
    match = re.search(r'name="csrf" value="([^"]+)"', page)
    assert match, "the form carries the CSRF value"
    return match.group(1)


async def test_actions_need_the_token_and_the_csrf_value(
        client: durable.Client, flow_registry: durable.Registry) -> None:
    await client.start("t.ok", "slot-6", id="ok-6", delay=3600)
    async with console(client, token=TOKEN) as http:
        page = (await http.get("/runs/ok-6")).text
        csrf = _csrf(page)
        attempts = [
            ({"csrf": csrf}, {}),                             # no token
            ({"csrf": csrf, "token": "wrong"}, {}),           # wrong token
            ({"token": TOKEN}, {}),                           # no CSRF value
            ({"csrf": "forged", "token": TOKEN}, {}),         # another CSRF value
            ({"csrf": csrf, "token": TOKEN}, {"Origin": "http://evil.example"}),
        ]
        for data, headers in attempts:
            refused = await http.post("/runs/ok-6/cancel", data=data, headers=headers)
            assert refused.status_code == 403, (data, headers)
            assert (await client.get("ok-6")).state is durable.RunState.QUEUED
        # the CSRF cookie alone (another tab's cookie, no form value) is not enough either
        no_cookie = httpx.AsyncClient(base_url=str(http.base_url))
        async with no_cookie:
            refused = await no_cookie.post("/runs/ok-6/cancel",
                                           data={"csrf": csrf, "token": TOKEN})
            assert refused.status_code == 403
        done = await http.post("/runs/ok-6/cancel", data={"csrf": csrf, "token": TOKEN},
                               headers={"Origin": str(http.base_url).rstrip("/"),
                                        "User-Agent": "pytest-operator"})
        assert done.status_code == 303
        assert (await client.get("ok-6")).state is durable.RunState.CANCELLED
        entry = [e for e in await client.journal("ok-6") if e.kind.value == "run_cancelled"][-1]
        assert entry.data["origin"]["via"] == "console"
        assert entry.data["origin"]["remote"] == "127.0.0.1"
        assert entry.data["origin"]["user_agent"] == "pytest-operator"
        after = (await http.get(done.headers["location"])).text
        assert "cancelled before it started" in after


async def test_a_form_post_from_an_opaque_or_another_site_s_page_is_refused(
        client: durable.Client, flow_registry: durable.Registry) -> None:
    """A browser's form post carries its page's Origin; a sandboxed page or a privacy
    setting sends ``Origin: null``, and some send only a Referer. Neither is taken for the
    console's own page: with no Origin the Referer must name the console, and ``null`` with
    no Referer is refused, whatever token and CSRF value the form holds."""
    await client.start("t.ok", "slot-7", id="ok-7", delay=3600)
    async with console(client, token=TOKEN) as http:
        csrf = _csrf((await http.get("/runs/ok-7")).text)
        form = {"csrf": csrf, "token": TOKEN}
        own = str(http.base_url).rstrip("/")
        for headers in ({"Origin": "null"},
                        {"Referer": "http://evil.example/page"},
                        {"Origin": "null", "Referer": "http://evil.example/page"}):
            refused = await http.post("/runs/ok-7/cancel", data=form, headers=headers)
            assert refused.status_code == 403, headers
            assert "another site" in refused.text
            assert (await client.get("ok-7")).state is durable.RunState.QUEUED
        done = await http.post("/runs/ok-7/cancel", data=form,
                               headers={"Origin": "null", "Referer": f"{own}/runs/ok-7"})
        assert done.status_code == 303
    assert (await client.get("ok-7")).state is durable.RunState.CANCELLED


async def test_replay_from_the_console_and_the_api(
        client: durable.Client, flow_registry: durable.Registry) -> None:
    async with running_worker(client, flow_registry):
        await client.start("t.fail", id="fail-2")
        await finished(client, "fail-2")
    async with console(client, token=TOKEN) as http:
        page = (await http.get("/runs/fail-2")).text
        assert 'action="/runs/fail-2/replay"' in page
        refused = await http.post("/api/runs/fail-2/replay", json={"from_step": 1})
        assert refused.status_code == 403
        replayed = await http.post("/api/runs/fail-2/replay", json={"from_step": 1},
                                   headers={"Authorization": f"Bearer {TOKEN}"})
        assert replayed.status_code == 200, replayed.text
        assert replayed.json()["run"]["state"] == "queued"
        entry = [e for e in await client.journal("fail-2") if e.kind.value == "run_replayed"][-1]
        assert entry.data["from_step"] == 1 and entry.data["origin"]["via"] == "console"
        again = await http.post("/api/runs/fail-2/replay",
                                headers={"Authorization": f"Bearer {TOKEN}"})
        assert again.status_code == 409  # queued now: only failed or cancelled runs replay
        bad = await http.post("/api/runs/fail-2/explode",
                              headers={"Authorization": f"Bearer {TOKEN}"})
        assert bad.status_code == 404


async def test_no_secret_on_any_page_or_in_the_api(
        client: durable.Client, flow_registry: durable.Registry) -> None:
    async with running_worker(client, flow_registry):
        await client.start("t.fail", id="fail-3")
        await finished(client, "fail-3")
    journaled = [e.data.get("summary") for e in await client.journal("fail-3") if e.step == 2]
    assert "authenticated with Authorization: [redacted]" in journaled  # redacted at annotate
    async with console(client, token=TOKEN) as http:
        bodies = []
        for path in ("/runs", "/runs/fail-3", "/runs/fail-3/live", "/api/runs",
                     "/api/runs/fail-3", "/api/runs/fail-3/journal", "/status",
                     "/api/status?id=fail-3"):
            response = await http.get(path)
            assert response.status_code == 200, path
            bodies.append(response.text)
            assert "frame-ancestors 'none'" in response.headers["content-security-policy"]
        refused = await http.post("/api/runs/fail-3/cancel",
                                  headers={"Authorization": "Bearer " + TOKEN[:-1]})
        bodies.append(refused.text)
        for body in bodies:
            assert TOKEN not in body
            assert SECRET not in body, body[max(body.find(SECRET) - 200, 0):body.find(SECRET) + 40]
        assert "upstream said 401 to Authorization: [redacted]" in bodies[1]
        assert "authenticated with Authorization: [redacted]" in bodies[1]


async def test_an_in_doubt_step_says_what_to_check_and_replay_resolves_it(
        client: durable.Client, flow_registry: durable.Registry) -> None:
    async with running_worker(client, flow_registry), console(client, token=TOKEN) as http:
        await client.start("t.gated", id="gated-2")
        await poll(lambda: _has(http, "/runs/gated-2/live", 'id="step-2"'))
        cancelled = await http.post("/api/runs/gated-2/cancel",
                                    headers={"Authorization": f"Bearer {TOKEN}"})
        assert cancelled.status_code == 200, cancelled.text
        await finished(client, "gated-2")
        page = (await http.get("/runs/gated-2")).text
        assert 'class="step state-in_doubt" id="step-2"' in page
        assert "idempotency key <code>gated-2/2</code>" in page  # what to look for, and where
        assert 'name="in_doubt" value="rerun"' in page and 'name="in_doubt" value="accept"' in page
        api = (await http.get("/api/runs/gated-2")).json()
        assert [s["number"] for s in api["report"]["in_doubt"]] == [2]
        replayed = await http.post("/runs/gated-2/replay",
                                   data={"csrf": _csrf(page), "token": TOKEN,
                                         "in_doubt": "rerun", "from_step": ""})
        assert replayed.status_code == 303, replayed.text
        entry = [e for e in await client.journal("gated-2") if e.kind.value == "run_replayed"][-1]
        assert entry.data["in_doubt"] == "rerun" and entry.data["origin"]["via"] == "console"


def _outward_address() -> str | None:
    """An IPv4 address of this machine that is not loopback (``ip -4 addr``), or None."""
    try:
        shown = subprocess.run(["ip", "-4", "-o", "addr", "show"], capture_output=True,
                               text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    for line in shown.splitlines():
        address = line.split()[3].split("/")[0]
        if not address.startswith("127."):
            return address
    return None


async def test_a_request_that_names_another_host_on_loopback_is_refused(
        client: durable.Client, flow_registry: durable.Registry) -> None:
    """DNS rebinding: a site the operator visits has its name resolve to 127.0.0.1, and its
    scripts would read the console as their own site's pages. Their requests name that
    site in ``Host``: refused (403, one line saying why and where to open the console),
    every page, the API and the actions alike. Addresses, ``localhost`` and the host of
    ``console_url`` are served. Before, every page was served to any name."""
    async with running_worker(client, flow_registry):
        await finished(client, (await client.start("t.ok", "slot-1", id="ok-1")).id)
    async with console(client, token=TOKEN,
                       console_url="http://durable.internal:8080") as http:
        port = http.base_url.port
        rebound = {"Host": f"rebind.example:{port}"}
        for method, path in (("GET", "/runs"), ("GET", "/runs/ok-1"), ("GET", "/api/runs"),
                             ("GET", "/api/runs/ok-1/journal"), ("GET", "/static/console.css"),
                             ("POST", "/api/runs/ok-1/replay")):
            refused = await http.request(method, path, headers={
                **rebound, "Authorization": f"Bearer {TOKEN}"})
            assert refused.status_code == 403, (path, refused.status_code, refused.text)
            assert "rebind.example" in refused.text and "DNS rebinding" in refused.text
            assert f"http://127.0.0.1:{port}/runs" in refused.text
            assert "ok-1" not in refused.text and "slot-1" not in refused.text
        assert (await client.get("ok-1")).attempt == 1  # the replay was not sent
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", "LOCALHOST", "127.1.2.3",
                     "[::1]", "0.0.0.0", "durable.internal:8080", "app.localhost",
                     f"localhost.:{port}", "DURABLE.Internal:8080"):
            page = await http.get("/runs/ok-1", headers={"Host": host})
            assert page.status_code == 200 and "slot-1" in page.text, (host, page.text)


async def test_a_foreign_name_is_refused_on_loopback_reached_through_a_dual_stack_socket(
        client: durable.Client) -> None:
    """A console on a dual-stack IPv6 socket (``::``) that an IPv4 client reaches through
    127.0.0.1 sees the address ``::ffff:127.0.0.1``: loopback too, so a foreign ``Host``
    is refused there as on 127.0.0.1, and said to be (the metrics page, which keeps the
    rule on loopback only, judges its addresses by the same ``loopback``)."""
    try:
        sock = socket.create_server(("::", 0), family=socket.AF_INET6, dualstack_ipv6=True)
    except (OSError, ValueError):
        pytest.skip("this machine has no dual-stack IPv6 socket")
    sock.setblocking(False)
    port = sock.getsockname()[1]
    with sock:
        async with anyio.create_task_group() as tg:
            await tg.start(serve, create_app(client), sock)
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}",
                                         timeout=10) as http:
                local = await http.get("/runs")
                assert local.status_code == 200, local.text
                rebound = await http.get("/runs", headers={"Host": f"rebind.example:{port}"})
                assert rebound.status_code == 403 and "DNS rebinding" in rebound.text
                assert "reached a loopback address" in rebound.text  # seen as loopback
            tg.cancel_scope.cancel()


async def test_a_credential_in_a_run_s_arguments_never_leaves_through_the_api(
        client: durable.Client) -> None:
    """The API's JSON is redacted as a whole, whatever the store holds: a run started with
    a credential among its arguments (kept intact for the workflow) is listed and shown
    with it redacted."""
    await client.start("t.ok", f"Authorization: Bearer {SECRET}", id="leaky-args")
    async with console(client) as http:
        for path in ("/api/runs", "/api/runs/leaky-args", "/api/runs/leaky-args/journal"):
            response = await http.get(path)
            assert response.status_code == 200, path
            assert "leaky-args" in response.text or "journal" in path
            assert SECRET not in response.text, (path, response.text)


async def test_a_console_served_on_another_address_answers_only_the_names_it_was_told(
        client: durable.Client) -> None:
    """Served on every address, the console answers a request that reached an address of
    the machine's network only when it names an address, the host of ``console_url`` or a
    name given in ``allow_hosts``: a site the operator visits can make its name resolve to
    that address as well as to 127.0.0.1 (DNS rebinding). Another name gets 403 and one line
    saying how to name the host. ``*`` answers any name. (Before, any name was answered
    there: the console was taken as exposed on purpose.)"""
    address = _outward_address()
    if address is None:
        pytest.skip("this machine has no address but loopback")
    async with console(client, bind="0.0.0.0", console_url="http://durable.internal:8080",
                       allow_hosts=("Console.Example.org",)) as http:
        port = http.base_url.port
        async with httpx.AsyncClient(base_url=f"http://{address}:{port}", timeout=10) as out:
            for host in (f"{address}:{port}", "console.example.org", "durable.internal:8080",
                         "CONSOLE.example.org.:443"):
                served = await out.get("/runs", headers={"Host": host})
                assert served.status_code == 200, (host, served.text)
            refused = await out.get("/runs", headers={"Host": f"rebind.example:{port}"})
            assert refused.status_code == 403, refused.text
            assert refused.text.count("\n") == 1 and "DNS rebinding" in refused.text
            assert f"open http://{address}:{port}/runs" in refused.text
            assert "--allow-host rebind.example\n" in refused.text
            api = await out.post("/api/runs/x/cancel", headers={"Host": "rebind.example"})
            assert api.status_code == 403
        local = await http.get(f"http://127.0.0.1:{port}/runs",
                               headers={"Host": "rebind.example"})
        assert local.status_code == 403 and "loopback address" in local.text
    async with console(client, bind="0.0.0.0", allow_hosts=("*",)) as http:
        port = http.base_url.port
        async with httpx.AsyncClient(base_url=f"http://{address}:{port}", timeout=10) as out:
            served = await out.get("/runs", headers={"Host": "any.example.org"})
            assert served.status_code == 200, served.text


@pytest.mark.parametrize(("local", "host", "named", "anywhere", "refused"), [
    ("192.0.2.7", "evil.example", None, False, False),  # the metrics' rule: loopback only
    ("192.0.2.7", "evil.example", None, True, True),  # the console's: every address
    ("192.0.2.7", "192.0.2.7:8080", None, True, False),
    ("192.0.2.7", "durable.internal", ["x.example", "durable.internal"], True, False),
    ("192.0.2.7", "evil.example", ["x.example", "durable.internal"], True, True),
    ("192.0.2.7", "evil.example", ["*"], True, False),
    ("127.0.0.1", "evil.example", ["*"], True, False),
    ("127.0.0.1", "evil.example", [], False, True),
])
def test_the_names_a_server_answers_on_each_address(
        local: str, host: str, named: list[str] | None, anywhere: bool, refused: bool) -> None:
    assert foreign_name(local, host, named or [], anywhere=anywhere) is refused


@pytest.mark.parametrize(("host", "named", "refused"), [
    ("durable.internal.:8080", "durable.internal", False),  # the absolute form of the name
    ("durable.internal:8080", "durable.internal.", False),
    ("DURABLE.internal:8080", "durable.internal", False),
    ("localhost.:8080", None, False),
    ("127.0.0.1:8080", None, False),
    ("evil.example:8080", "durable.internal", True),
    ("evil.example.:8080", None, True),
    ("durable.internal.evil.example:8080", "durable.internal", True),
])
def test_a_host_the_server_was_named_is_served_in_either_form_and_others_refused(
        host: str, named: str | None, refused: bool) -> None:
    """On loopback a Host header naming another site is refused (DNS rebinding); the name
    the console was given (``--console-url``) is served, with or without the final dot
    that makes a DNS name absolute, as ``localhost`` is."""
    assert foreign_name("127.0.0.1", host, [named] if named else []) is refused


@pytest.mark.parametrize(("name", "can_be_another_site"), [
    ("localhost", False), ("LOCALHOST", False), ("localhost.", False),
    ("app.localhost", False), ("App.Localhost.", False),
    ("127.0.0.1", False), ("[::1]", False), ("0.0.0.0", False),
    ("evil.example", True), ("localhost.evil.example", True), ("evil.example.", True),
])
def test_only_a_dns_name_other_than_localhost_can_name_another_site(
        name: str, can_be_another_site: bool) -> None:
    """``rebindable`` judges a Host header's host as written: in any case, with or without
    the final dot that makes a DNS name absolute, and an IPv6 address in brackets."""
    assert rebindable(name) is can_be_another_site


async def test_a_success_line_is_shown_once_for_the_run_acted_on_and_no_link_can_forge_it(
        client: durable.Client) -> None:
    """What an action did is shown on the run's page it redirects to, once, from a cookie
    the console sets; a link that carries ``?done=...`` shows nothing (before, any link put
    "plan approved" on a failed run's page), and another run's page does not show it."""
    await client.start("t.ok", "x", id="ok-7", delay=3600)
    await client.start("t.ok", "y", id="ok-8", delay=3600)
    async with console(client, token=TOKEN) as http:
        forged = (await http.get(
            "/runs/ok-8?done=ok-8%3A+plan+approved%3B+the+run+re-checks+it+and+acts")).text
        assert "plan approved" not in forged and 'class="flash"' not in forged
        page = (await http.get("/runs/ok-7")).text
        done = await http.post("/runs/ok-7/cancel", data={"csrf": _csrf(page), "token": TOKEN})
        assert done.status_code == 303 and done.headers["location"] == "/runs/ok-7"
        other = (await http.get("/runs/ok-8")).text
        assert 'class="flash"' not in other  # another run's page does not take it
        after = (await http.get("/runs/ok-7")).text
        assert '<div class="flash">ok-7: cancelled before it started</div>' in after
        again = (await http.get("/runs/ok-7")).text
        assert 'class="flash"' not in again  # once
