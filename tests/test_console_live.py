"""The console's live-update mechanics in a real browser (durable/console/static/console.js).

A small Starlette app serves the console's static files, pages that follow the console's
front-end contract, fragment endpoints and status endpoints whose behaviour each test
controls (answer, fail with 500, or hold the request until released). Debian's chromium runs
the page. Every wait is bounded.
"""

from __future__ import annotations

import datetime as dt
import re
from collections import Counter
from collections.abc import Iterator
from typing import Any

import anyio
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from .browser import ServedApp, serving_asgi
from .conftest import ROOT

pytest_plugins = ["tests.browser"]  # the browser and page fixtures

STATIC = ROOT / "durable" / "console" / "static"
WAIT = 15_000  # ms: the bound of every wait in the browser (generous for a loaded machine)


class Site:
    """The test app and its controls. The test thread sets modes; the server's loop reads
    them. A held request waits on an anyio Event that :meth:`release` sets in the loop."""

    def __init__(self) -> None:
        self.pages: dict[str, str] = {}
        self.modes: dict[str, str] = {}  # name -> "ok" | "fail" | "hang"; default "ok"
        self.statuses: dict[str, dict[str, Any]] = {}
        self.final_after: dict[str, int] = {}  # fragment name -> request count that is final
        self.countdown_at = 0.0  # epoch seconds the "cd" fragment counts down to
        self.counts: Counter[str] = Counter()
        self.held: list[anyio.Event] = []
        self.served: ServedApp | None = None
        self.app = Starlette(routes=[
            Route("/page/{name}", self.page),
            Route("/frag/{name}", self.fragment),
            Route("/status/{name}", self.status),
            Mount("/static", StaticFiles(directory=STATIC)),
        ])

    @property
    def url(self) -> str:
        assert self.served is not None
        return self.served.url

    def set_mode(self, name: str, mode: str) -> None:
        self.modes[name] = mode
        if mode != "hang":
            self.release()

    def release(self) -> None:
        """Let every held request answer (they answer a browser that gave up on them)."""
        def set_all() -> None:
            for event in self.held:
                event.set()
            self.held.clear()
        assert self.served is not None
        self.served.call(set_all)

    async def _misbehave(self, name: str) -> Response | None:
        mode = self.modes.get(name, "ok")
        if mode == "hang":
            event = anyio.Event()
            self.held.append(event)
            await event.wait()
            return Response("released", status_code=503)
        if mode == "fail":
            return Response("boom", status_code=500)
        return None

    async def page(self, request: Request) -> Response:
        return HTMLResponse(self.pages[request.path_params["name"]])

    async def fragment(self, request: Request) -> Response:
        name = request.path_params["name"]
        self.counts[name] += 1
        n = self.counts[name]
        bad = await self._misbehave(name)
        if bad is not None:
            return bad
        headers = {}
        if name in self.final_after and n >= self.final_after[name]:
            headers["X-Durable-Final"] = "1"
        return HTMLResponse(render_fragment(name, n, self.countdown_at), headers=headers)

    async def status(self, request: Request) -> Response:
        name = request.path_params["name"]
        self.counts[name] += 1
        bad = await self._misbehave(name)
        if bad is not None:
            return bad
        return JSONResponse(self.statuses[name])


def render_fragment(name: str, n: int, countdown_at: float) -> str:
    if name == "cd":
        return "".join(f'<p>wave {i}: <span class="cd" data-countdown="{countdown_at}">'
                       f"…</span></p>" for i in range(3)) + f'<p class="n">render {n}</p>'
    if name == "steps":
        return "".join(f'<div class="step" id="step-{i}" data-state="completed" '
                       f'style="height: 140px">step {i} (render {n})</div>'
                       for i in range(1, 31))
    return f'<p class="n">{name} render {n}</p>'


def html(content: str, *, timeout_ms: int = 800, threshold: int = 2) -> str:
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>test</title>
<link rel="stylesheet" href="/static/console.css"></head>
<body data-poll-timeout="{timeout_ms}" data-fail-threshold="{threshold}">
<div id="banner" role="alert" hidden></div>
<header><h1>durable</h1><span id="freshness"></span></header>
<main>{content}</main>
<script src="/static/console.js"></script>
</body></html>"""


def fragment_poller(name: str, interval_ms: int, inner: str = "") -> str:
    return (f'<section data-poll="/frag/{name}" data-poll-interval="{interval_ms}" '
            f'data-poll-name="{name}">{inner}</section>')


def status_poller(name: str, interval_ms: int) -> str:
    return (f'<span id="st-{name}" data-status="/status/{name}" '
            f'data-poll-interval="{interval_ms}" data-poll-name="{name}"></span>')


@pytest.fixture
def site(request: pytest.FixtureRequest) -> Iterator[Site]:
    """The test app served on loopback (asyncio, or the backend a test parametrizes)."""
    s = Site()
    with serving_asgi(s.app, backend=getattr(request, "param", "asyncio")) as served:
        s.served = served
        try:
            yield s
        finally:
            s.modes.clear()
            s.release()


def poller(page: Any, name: str) -> dict[str, Any]:
    state: dict[str, Any] = page.evaluate(
        """name => { const p = durableConsole.pollers.find(q => q.name === name);
                     return {failures: p.failures, successes: p.successes,
                             stopped: p.stopped}; }""", name)
    return state


def wait_poller(page: Any, name: str, condition: str, timeout: int = WAIT) -> None:
    """Wait until ``condition`` (JS over p, the poller named ``name``) holds."""
    page.wait_for_function(
        f"""name => {{ const p = (window.durableConsole || {{pollers: []}}).pollers
                         .find(q => q.name === name);
                      return p !== undefined && ({condition}); }}""",
        arg=name, timeout=timeout)


def failing(page: Any) -> list[str]:
    names: list[str] = page.evaluate("durableConsole.failing()")
    return sorted(names)


def test_hung_status_shows_banner_beside_a_healthy_poller_and_clears_on_recovery(
        page: Any, site: Site) -> None:
    from playwright.sync_api import expect

    site.statuses["job"] = {"status": "running", "run_id": "r1", "workflow": "w", "key": "k",
                            "reason": None}
    site.pages["p"] = html(fragment_poller("healthy", 200) + status_poller("job", 200))
    page.goto(site.url + "/page/p")
    banner, freshness, job = page.locator("#banner"), page.locator("#freshness"), \
        page.locator("#st-job")
    expect(job).to_have_text("running", timeout=WAIT)
    expect(freshness).to_contain_text("live · updated", timeout=WAIT)
    expect(banner).to_be_hidden()

    before = site.counts["job"]
    site.set_mode("job", "hang")
    # Two timed-out requests (800 ms each, plus one backoff) reach the threshold of 2.
    expect(banner).to_be_visible(timeout=WAIT)
    expect(banner).to_contain_text("Lost contact")
    assert failing(page) == ["job"]
    assert site.counts["job"] >= before + 2, "the hung request was never given up"
    expect(job).to_contain_text("cannot confirm")
    expect(job).to_contain_text("no answer since")
    expect(job).to_have_attribute("data-state", "unknown")
    expect(freshness).to_contain_text("stale since")

    # The healthy poller keeps succeeding; its successes do not clear the banner.
    seen = poller(page, "healthy")["successes"]
    wait_poller(page, "healthy", f"p.successes >= {seen + 6}")
    assert poller(page, "healthy")["failures"] == 0
    expect(banner).to_be_visible()
    expect(freshness).to_contain_text("stale since")
    assert failing(page) == ["job"]
    assert site.held, "the status request is not being held"

    site.set_mode("job", "ok")
    expect(banner).to_be_hidden(timeout=WAIT)
    expect(job).to_have_text("running")
    expect(freshness).to_contain_text("live · updated")
    assert failing(page) == []


def test_banner_stays_at_every_failure_count_past_the_threshold(
        page: Any, site: Site) -> None:
    from playwright.sync_api import expect

    site.pages["p"] = html(fragment_poller("flaky", 100), threshold=2)
    page.goto(site.url + "/page/p")
    wait_poller(page, "flaky", "p.successes >= 1")
    banner = page.locator("#banner")
    expect(banner).to_be_hidden()

    site.set_mode("flaky", "fail")
    wait_poller(page, "flaky", "p.failures >= 1")
    assert poller(page, "flaky")["failures"] == 1
    expect(banner).to_be_hidden()  # below the threshold
    for n in (2, 3, 4, 5):  # an == threshold would show it at 2 and drop it at 3
        wait_poller(page, "flaky", f"p.failures >= {n}")
        assert poller(page, "flaky")["failures"] == n
        assert banner.is_visible(), f"banner hidden at {n} consecutive failures"
        assert failing(page) == ["flaky"]
    expect(banner).to_contain_text("1 live view is not updating")
    expect(page.locator("section[data-poll]")).to_have_class(re.compile(r"\bstale\b"))

    site.set_mode("flaky", "ok")
    expect(banner).to_be_hidden(timeout=WAIT)
    expect(page.locator("section[data-poll]")).not_to_have_class(re.compile(r"\bstale\b"))


def test_banner_stays_until_the_last_failing_poller_recovers(page: Any, site: Site) -> None:
    from playwright.sync_api import expect

    site.pages["p"] = html(fragment_poller("a", 150) + fragment_poller("b", 150)
                           + fragment_poller("healthy", 150))
    page.goto(site.url + "/page/p")
    for name in ("a", "b"):
        wait_poller(page, name, "p.successes >= 1")
    banner = page.locator("#banner")

    site.set_mode("a", "fail")
    site.set_mode("b", "fail")
    page.wait_for_function("durableConsole.failing().length === 2", timeout=WAIT)
    expect(banner).to_be_visible()
    expect(banner).to_contain_text("2 live views are not updating")

    site.set_mode("a", "ok")
    wait_poller(page, "a", "p.failures === 0")
    seen = poller(page, "a")["successes"]
    wait_poller(page, "a", f"p.successes >= {seen + 3}")  # a is healthy again, for a while
    expect(banner).to_be_visible()
    expect(banner).to_contain_text("1 live view is not updating")
    assert failing(page) == ["b"]
    expect(page.locator("#freshness")).to_contain_text("stale since")

    site.set_mode("b", "ok")
    expect(banner).to_be_hidden(timeout=WAIT)
    assert failing(page) == []


COUNT_INTERVALS = """
window.__intervals = [];
const realSetInterval = window.setInterval;
window.setInterval = function (fn, ms, ...rest) {
  window.__intervals.push(ms);
  return realSetInterval.call(this, fn, ms, ...rest);
};
"""


def countdown_seconds(text: str) -> int:
    m = re.fullmatch(r"in (?:(\d+) min )?(\d+) s", text)
    assert m, f"not a countdown in minutes and seconds: {text!r}"
    return int(m.group(1) or 0) * 60 + int(m.group(2))


def test_one_ticker_after_a_hundred_rerenders(page: Any, site: Site) -> None:
    from playwright.sync_api import expect

    t0 = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
    page.clock.install(time=t0)  # a fake clock that flows, paused below to step it
    page.add_init_script(COUNT_INTERVALS)  # wraps setInterval before the page's script runs
    site.countdown_at = t0.timestamp() + 245
    site.pages["p"] = html(fragment_poller("cd", 60_000))
    page.goto(site.url + "/page/p")
    wait_poller(page, "cd", "p.successes >= 1")
    assert page.evaluate("window.__intervals") == [1000]

    rendered = page.evaluate("""async () => {
        const start = durableConsole.renders;
        while (durableConsole.renders < start + 100) await durableConsole.refresh("cd");
        return durableConsole.renders - start; }""")
    assert rendered == 100
    assert site.counts["cd"] >= 101
    expect(page.locator("p.n")).to_have_text(re.compile(r"render \d+"))
    assert page.evaluate("window.__intervals") == [1000], "a re-render created an interval"

    # Step the clock a second at a time: every countdown (all new elements) drops by one.
    page.clock.pause_at(t0 + dt.timedelta(seconds=30))
    cds = page.locator("span.cd")
    assert cds.count() == 3
    first = countdown_seconds(cds.first.inner_text())
    assert 200 < first < 245
    for step in range(1, 6):
        page.clock.fast_forward(1000)
        texts = cds.all_inner_texts()
        assert [countdown_seconds(t) for t in texts] == [first - step] * 3, texts
    page.clock.fast_forward(first * 1000)
    expect(cds.first).to_have_text("due now")
    assert page.evaluate("window.__intervals") == [1000]


def test_countdown_and_ago_formats(page: Any, site: Site) -> None:
    from playwright.sync_api import expect

    t0 = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
    page.clock.set_fixed_time(t0)
    now = t0.timestamp()
    cases = {"h": (3725, "in 1 h 02 min"), "m": (245, "in 4 min 05 s"), "s": (12, "in 12 s"),
             "due": (-5, "due now"), "d": (2 * 86400 + 3 * 3600 + 60, "in 2 d 03 h")}
    agos = {"a1": (3, "3 s ago"), "a2": (125, "2 min ago"), "a3": (7200, "2 h ago")}
    site.pages["p"] = html(
        "".join(f'<span id="{k}" data-countdown="{now + v}">x</span>'
                for k, (v, _) in cases.items())
        + "".join(f'<span id="{k}" data-ago="{now - v}">x</span>'
                  for k, (v, _) in agos.items()))
    page.goto(site.url + "/page/p")
    for k, (_, text) in {**cases, **agos}.items():
        expect(page.locator(f"#{k}")).to_have_text(text)
    # no poller on the page: it does not claim to be live
    expect(page.locator("#freshness")).to_have_text(re.compile(r"^updated \d\d:\d\d:\d\d$"))


def test_unknown_or_unanswered_status_shows_cannot_confirm_and_the_page_stays(
        page: Any, site: Site) -> None:
    from playwright.sync_api import expect

    site.statuses["lost"] = {"status": "unknown", "run_id": None, "workflow": "slot.reset",
                             "key": "slot-9", "reason": "no run with this key"}
    site.statuses["odd"] = {"status": "exploded", "run_id": "r2"}
    site.modes["broken"] = "fail"
    site.pages["p"] = html(status_poller("lost", 150) + status_poller("odd", 150)
                           + status_poller("broken", 150))
    navigations: list[str] = []
    page.on("framenavigated",
            lambda frame: navigations.append(frame.url) if frame == page.main_frame else None)
    page.goto(site.url + "/page/p")
    url = page.url
    page.evaluate("window.__stayed = 42")

    lost, odd, broken = (page.locator(f"#st-{n}") for n in ("lost", "odd", "broken"))
    expect(lost).to_contain_text("cannot confirm", timeout=WAIT)
    expect(lost).to_have_attribute("data-state", "unknown")
    expect(lost).to_have_attribute("title", "no run with this key")
    expect(odd).to_contain_text("cannot confirm", timeout=WAIT)
    expect(broken).to_contain_text("cannot confirm", timeout=WAIT)
    expect(broken).to_contain_text("no answer since")

    # unknown is not final: it is asked again, and still never reads as success.
    wait_poller(page, "lost", "p.successes >= 4")
    wait_poller(page, "broken", "p.failures >= 3")
    assert not poller(page, "lost")["stopped"]
    for el in (lost, odd, broken):
        expect(el).to_contain_text("cannot confirm")
        expect(el).not_to_contain_text("completed")
    assert page.url == url
    assert page.evaluate("window.__stayed") == 42
    assert navigations == [url]


def test_step_anchor_is_scrolled_to_and_highlighted_across_rerenders(
        page: Any, site: Site) -> None:
    from playwright.sync_api import expect

    site.pages["p"] = html(fragment_poller("steps", 60_000, render_fragment("steps", 0, 0)))
    page.set_viewport_size({"width": 1000, "height": 600})
    page.goto(site.url + "/page/p#step-15")
    wait_poller(page, "steps", "p.successes >= 1")
    highlighted = re.compile(r"\bhighlight\b")
    target = page.locator("#step-15")
    expect(target).to_have_class(highlighted)
    expect(target).to_be_in_viewport()
    expect(page.locator("#step-1")).not_to_be_in_viewport()
    expect(page.locator(".highlight")).to_have_count(1)

    page.evaluate("document.getElementById('step-15').dataset.old = 'yes'")
    page.evaluate("durableConsole.refresh('steps')")
    expect(target).not_to_have_attribute("data-old", "yes")  # a new element, re-rendered
    expect(target).to_have_class(highlighted)
    expect(page.locator(".highlight")).to_have_count(1)

    page.evaluate("location.hash = '#step-3'")
    expect(page.locator("#step-3")).to_have_class(highlighted)
    expect(page.locator("#step-3")).to_be_in_viewport()
    expect(target).not_to_have_class(highlighted)
    expect(page.locator(".highlight")).to_have_count(1)


@pytest.mark.parametrize("site", ["asyncio", "trio"], indirect=True)
def test_final_answers_stop_polling_and_paused_pollers_never_poll(page: Any, site: Site) -> None:
    from playwright.sync_api import expect

    site.final_after["fin"] = 3
    site.statuses["done"] = {"status": "completed", "run_id": "r3", "workflow": "w",
                             "key": "k", "reason": None}
    paused = ('<section data-poll="/frag/paused" data-poll-interval="150" '
              'data-poll-name="paused" data-poll-paused="1">rendered final</section>')
    site.pages["p"] = html(fragment_poller("fin", 150) + fragment_poller("healthy", 150)
                           + status_poller("done", 150) + paused)
    page.goto(site.url + "/page/p")
    wait_poller(page, "fin", "p.stopped")
    wait_poller(page, "done", "p.stopped")
    expect(page.locator("section[data-poll-name=fin]")).to_have_text("fin render 3")
    expect(page.locator("#st-done")).to_have_text("completed")
    expect(page.locator("#st-done")).to_have_attribute("data-state", "completed")

    seen = poller(page, "healthy")["successes"]
    wait_poller(page, "healthy", f"p.successes >= {seen + 8}")  # over a second of polling
    assert site.counts["fin"] == 3
    assert site.counts["done"] == 1
    assert site.counts["paused"] == 0  # rendered final by the server: never polled
    expect(page.locator("#freshness")).to_contain_text("live · updated")


def test_status_json_is_rendered_as_text_not_markup(page: Any, site: Site) -> None:
    from playwright.sync_api import expect

    site.statuses["x"] = {"status": "unknown", "reason": "<img src=x onerror=alert(1)>"}
    site.pages["p"] = html(status_poller("x", 150))
    page.goto(site.url + "/page/p")
    expect(page.locator("#st-x")).to_contain_text("cannot confirm", timeout=WAIT)
    expect(page.locator("#st-x img")).to_have_count(0)
    expect(page.locator("#st-x .reason")).to_have_text("<img src=x onerror=alert(1)>")
