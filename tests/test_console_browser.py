"""The real console in a real browser: ``python -m durable console`` (on asyncio and on trio)
and a worker (``python -m durable.worker``), both subprocesses over one SQLite file, driven by
Debian's chromium.

The steps of tests/consoleflows.py wait for files, so each test decides when a step ends.
With ``DURABLE_SCREENSHOTS=DIR`` the tests also save the screenshots the docs show.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .browser import free_port, serving_process
from .conftest import subprocess_env
from .consoleflows import SECRET
from .helpers import python_process

pytest_plugins = ["tests.browser"]

WAIT = 20_000  # ms: the bound of every wait in the browser (generous for a loaded machine)
TOKEN = "console-e2e-admin-token-93ab7"


class Env:
    """One database, a worker and a console on it."""

    def __init__(self, tmp: Path, url: str, console: str) -> None:
        self.tmp = tmp
        self.db = url
        self.console = console
        self.gates = tmp / "gates"
        self.gates.mkdir(exist_ok=True)

    def durable(self, *args: str) -> str:
        done = subprocess.run([sys.executable, "-m", "durable", *args, "--db", self.db],
                              env=subprocess_env(), capture_output=True, text=True,
                              timeout=60, check=False)
        assert done.returncode == 0, done.stderr
        return done.stdout

    def start(self, workflow: str, *args: str, run_id: str, extra: tuple[str, ...] = ()) -> None:
        self.durable("start", workflow, *args, "--id", run_id, "--import", "tests.consoleflows",
                     *extra)

    def open_gate(self, name: str) -> None:
        (self.gates / name).touch()


@pytest.fixture(params=["asyncio", "trio"])
def env(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Env]:
    backend = str(request.param)
    db = f"sqlite:///{tmp_path / 'durable.db'}"
    subprocess.run([sys.executable, "-m", "durable", "migrate", "--db", db],
                   env=subprocess_env(), check=True, capture_output=True, timeout=60)
    port = free_port()
    environ = subprocess_env() | {"DURABLE_CONSOLE_TOKEN": TOKEN}
    console = [sys.executable, "-m", "durable", "console", "--db", db,
               "--bind", f"127.0.0.1:{port}", "--backend", backend]
    worker = ["-m", "durable.worker", "--db", db, "--import",
              "tests.consoleflows", "--poll", "0.05", "--lease", "10",
              "--console-url", f"http://127.0.0.1:{port}"]
    with serving_process(console, port, tmp_path / "console.log", env=environ), \
            python_process(worker, tmp_path / "worker.log"):
        yield Env(tmp_path, db, f"http://127.0.0.1:{port}")


def shoot(page: Any, name: str) -> None:
    folder = os.environ.get("DURABLE_SCREENSHOTS")
    if folder:
        page.screenshot(path=str(Path(folder) / name), full_page=True)


def submit(page: Any, form: Any, token: str, then: str) -> None:
    """Fill ``form``'s admin token field with ``token``, send the form, and wait for the
    page's answer (``then``: a selector, such as the refusal or the flash message)."""
    form.locator("input[name=token]").fill(token)
    form.locator("button").click()
    page.wait_for_selector(then, timeout=WAIT)


def test_run_page_shows_the_journal_and_step_anchors_scroll_and_highlight(
        env: Env, page: Any) -> None:
    env.start("console.many", "40", run_id="many-1")
    page.goto(f"{env.console}/runs/many-1")
    page.wait_for_selector("#step-40.state-completed", timeout=WAIT)
    page.goto(f"{env.console}/runs/many-1#step-31")
    target = page.locator("#step-31")
    page.wait_for_function(
        "() => document.getElementById('step-31').classList.contains('highlight')",
                           timeout=WAIT)
    assert "step 31 of 40" in target.inner_text()
    box = page.evaluate("(() => { const r = document.getElementById('step-31')"
                        ".getBoundingClientRect(); return [r.top, r.bottom, innerHeight]; })()")
    assert 0 <= box[0] < box[2], box  # scrolled into view
    assert page.locator(".highlight").count() == 1
    journal = page.locator("details.journal")
    assert "run_completed" in (journal.text_content() or "")


def test_an_unknown_run_shows_cannot_confirm_and_stays(env: Env, page: Any) -> None:
    page.goto(f"{env.console}/runs/no-such-run")
    status = page.locator("[data-status]")
    page.wait_for_function("() => window.durableConsole && window.durableConsole.renders >= 2",
                           timeout=WAIT)  # the status has been asked for again and again
    assert status.inner_text().startswith("cannot confirm")
    assert page.url == f"{env.console}/runs/no-such-run"
    assert "completed" not in page.locator("main").inner_text()


def test_a_live_run_updates_as_its_steps_complete(env: Env, page: Any) -> None:
    folder = str(env.gates)
    env.start("console.gated", f'"{folder}"', "3", run_id="gated-1")
    page.goto(f"{env.console}/runs/gated-1")
    page.wait_for_selector("#step-1.state-started", timeout=WAIT)
    page.evaluate("window.__same_page = true")  # gone if the page reloads or navigates
    env.open_gate("step-1")
    page.wait_for_selector("#step-1.state-completed", timeout=WAIT)
    page.wait_for_selector("#step-2.state-started", timeout=WAIT)
    env.open_gate("step-2")
    env.open_gate("step-3")
    page.wait_for_selector(".fields[data-state=completed]", timeout=WAIT)
    assert page.evaluate("window.__same_page") is True
    assert page.locator("#step-3.state-completed").count() == 1


def test_a_running_batch_shows_its_items(env: Env, page: Any) -> None:
    env.start("console.batch", f'"{env.gates}"', "12", run_id="batch-1")
    for i in range(5):
        env.open_gate(f"item-{i}")
    page.goto(f"{env.console}/runs/batch-1")
    page.wait_for_function(
        "() => document.querySelector('.progress-text') && "
        "document.querySelector('.progress-text').innerText.startsWith('5 of 12 done')",
        timeout=WAIT)
    assert "3 in flight" in page.locator(".progress-text").inner_text()
    shoot(page, "console-batch.png")
    page.goto(f"{env.console}/runs")
    page.wait_for_selector("tr[data-run-id=batch-1]", timeout=WAIT)
    shoot(page, "console-runs.png")
    for i in range(5, 12):
        env.open_gate(f"item-{i}")
    page.goto(f"{env.console}/runs/batch-1")
    page.wait_for_selector(".fields[data-state=completed]", timeout=WAIT)
    assert page.locator(".progress-text").inner_text().startswith("12 of 12 done")


def _failed_run(env: Env, page: Any, run_id: str) -> None:
    env.start("console.fails", f'"{env.gates}"', run_id=run_id)
    page.goto(f"{env.console}/runs/{run_id}")
    page.wait_for_selector(".fields[data-state=failed]", timeout=WAIT)
    page.reload()  # a finished run's page: its action forms are rendered


def test_replay_needs_the_token_and_the_csrf_value(env: Env, page: Any) -> None:
    _failed_run(env, page, "fails-1")
    shoot(page, "console-failed.png")
    form = page.locator("form.replay")
    submit(page, form, "not-the-token", "p.refused")
    assert "admin token is missing or wrong" in page.inner_text("p.refused")

    page.goto(f"{env.console}/runs/fails-1")
    page.evaluate("document.querySelector('form.replay input[name=csrf]').remove()")
    submit(page, page.locator("form.replay"), TOKEN, "p.refused")
    assert "CSRF" in page.inner_text("p.refused")
    assert "run_replayed" not in env.durable("show", "fails-1", "--json")

    page.goto(f"{env.console}/runs/fails-1")
    page.locator("form.replay select[name=from_step]").select_option("3")
    submit(page, page.locator("form.replay"), TOKEN, ".flash")
    assert "queued again" in page.inner_text(".flash")
    shown = env.durable("show", "fails-1", "--json")
    assert '"origin"' in shown and '"via": "console"' in shown and '"from_step": 3' in shown


def test_cancel_needs_the_token(env: Env, page: Any) -> None:
    env.start("console.many", "3", run_id="later-1", extra=("--delay", "3600"))
    page.goto(f"{env.console}/runs/later-1")
    page.wait_for_selector(".delayed-start [data-countdown]", timeout=WAIT)
    assert re.search(r"Starts in (59 min|1 h)", page.inner_text(".delayed-start"))
    form = page.locator("form.cancel")
    submit(page, form, "wrong", "p.refused")
    assert '"state": "queued"' in env.durable("show", "later-1", "--json")
    page.goto(f"{env.console}/runs/later-1")
    submit(page, page.locator("form.cancel"), TOKEN, ".flash")
    assert "cancelled before it started" in page.inner_text(".flash")
    page.wait_for_selector(".fields[data-state=cancelled]", timeout=WAIT)


def test_a_plan_is_approved_with_the_token_and_the_page_says_who(env: Env, page: Any) -> None:
    env.start("console.approved", '"db-42"', run_id="gate-1")
    page.goto(f"{env.console}/runs/gate-1")
    page.wait_for_selector("section.approval[data-decision=waiting]", timeout=WAIT)
    page.reload()  # the action forms are rendered with the page
    assert "This run will delete db-42:" in page.inner_text("section.approval")
    shoot(page, "console-approval.png")
    form = page.locator("form.approve")
    submit(page, form, "wrong", "p.refused")
    assert "admin token is missing or wrong" in page.inner_text("p.refused")
    assert '"signal_sent"' not in env.durable("show", "gate-1", "--json")

    page.goto(f"{env.console}/runs/gate-1")
    page.locator("form.approve input[name=note]").fill("checked the ids")
    submit(page, page.locator("form.approve"), TOKEN, ".flash")
    assert "plan approved" in page.inner_text(".flash")
    page.wait_for_selector(".fields[data-state=completed]", timeout=WAIT)
    decision = page.inner_text("section.approval .decision")
    assert "approved by 127.0.0.1 (console)" in decision and "checked the ids" in decision


def test_pages_hold_no_secret(env: Env, page: Any) -> None:
    _failed_run(env, page, "fails-2")
    contents = []
    for path in ("/runs", "/runs/fails-2", "/status?id=fails-2", "/api/runs/fails-2",
                 "/api/runs", "/runs/fails-2#step-2"):
        page.goto(f"{env.console}{path}")
        page.wait_for_load_state("load")
        contents.append(page.content())
    page.goto(f"{env.console}/runs/fails-2")
    submit(page, page.locator("form.replay"), TOKEN, ".flash")
    contents.append(page.content())
    cookies = page.context.cookies()
    for content in contents:
        assert TOKEN not in content
        assert SECRET not in content
    assert all(TOKEN not in c["value"] for c in cookies)
    assert "[redacted]" in contents[1]


def test_a_signal_sent_from_the_form_reaches_the_waiting_run(env: Env, page: Any) -> None:
    env.start("console.waits", run_id="waits-1")
    page.goto(f"{env.console}/runs/waits-1")
    page.wait_for_function("() => (document.querySelector('.delayed-start') || {})"
                           ".innerText?.includes(\"for signal 'go'\")", timeout=WAIT)
    page.reload()  # the action forms are rendered with the page: the name is prefilled now
    form = page.locator("form.signal")
    assert form.locator("input[name=name]").input_value() == "go"
    assert form.locator("input[name=signal_id]").input_value().startswith("console-")
    shoot(page, "console-signal.png")
    form.locator("textarea[name=payload]").fill("{'not': json}")
    submit(page, form, TOKEN, "p.refused")
    assert page.inner_text("p.refused").startswith("the payload is not JSON (")
    assert '"signal_sent"' not in env.durable("show", "waits-1", "--json")

    page.goto(f"{env.console}/runs/waits-1")
    form = page.locator("form.signal")
    form.locator("textarea[name=payload]").fill(f'{{"ok": true, "auth": "token={SECRET}"}}')
    submit(page, form, TOKEN, ".flash")
    assert "signal 'go' sent (id console-" in page.inner_text(".flash")
    page.wait_for_selector(".fields[data-state=completed]", timeout=WAIT)
    row = page.locator("section.signals tr.signal")
    page.wait_for_function("() => document.querySelector('section.signals .signal-status')"
                           ".innerText.startsWith('received by')", timeout=WAIT)
    assert "127.0.0.1 (console)" in row.inner_text()
    assert SECRET not in page.content() and "[redacted]" in row.inner_text()
    shown = env.durable("show", "waits-1", "--json")
    assert '"via": "console"' in shown and '"ok": true' in shown


def test_a_run_whose_id_holds_url_characters_opens_from_the_list_and_stays_live(
        env: Env, page: Any) -> None:
    """Its link and its live view's URL carry the id encoded (tests/test_console_ids.py):
    left as it was, ``?`` and ``#`` cut the id short, and the page polled another run's
    URL (404) until it said it had lost contact."""
    run_id = "run with spaces?&#"
    env.start("console.many", "3", run_id=run_id, extra=("--delay", "3600"))
    page.goto(f"{env.console}/runs")
    page.locator("td.id a", has_text=run_id).click()
    page.wait_for_selector(".fields[data-state=queued]", timeout=WAIT)
    assert page.inner_text("h1 small") == run_id
    page.wait_for_function("() => durableConsole.pollers.some("
                           "(p) => p.name === 'run' && p.successes >= 3)", timeout=WAIT)
    run = page.evaluate("(() => { const p = durableConsole.pollers.find("
                        "(q) => q.name === 'run'); return [p.failures, p.url]; })()")
    assert run == [0, "/runs/run%20with%20spaces%3F%26%23/live"]
    assert page.locator("#banner").is_hidden()
    assert page.url == f"{env.console}/runs/run%20with%20spaces%3F%26%23"


def test_the_actions_follow_the_run_s_state_and_keep_what_is_typed(env: Env, page: Any) -> None:
    """The forms come with the live fragment but are swapped only when what they offer
    changes: a half-typed payload survives the polls; the failure brings the replay form and
    takes cancel and signal away, without a reload."""
    env.start("console.fails_later", f'"{env.gates}"', run_id="later-fail-1")
    page.goto(f"{env.console}/runs/later-fail-1")
    page.wait_for_selector(".fields[data-state=running]", timeout=WAIT)
    page.evaluate("window.__same_page = true")
    payload = page.locator("form.signal textarea[name=payload]")
    payload.fill('{"typed": "half"}')
    seen = page.evaluate("durableConsole.renders")
    page.wait_for_function(f"() => durableConsole.renders >= {seen + 3}", timeout=WAIT)
    assert payload.input_value() == '{"typed": "half"}'
    env.open_gate("fail")
    page.wait_for_selector("form.replay", timeout=WAIT)
    assert page.locator("form.cancel, form.signal, form.pause").count() == 0
    assert page.evaluate("window.__same_page") is True


def test_a_run_page_opened_before_the_run_exists_becomes_its_page(env: Env, page: Any) -> None:
    page.goto(f"{env.console}/runs/late-1")
    page.wait_for_function("() => durableConsole.renders >= 1", timeout=WAIT)
    assert page.inner_text("[data-status]").startswith("cannot confirm")
    env.start("console.many", "2", run_id="late-1")
    page.wait_for_selector(".fields[data-state=completed]", timeout=WAIT)
    assert "No run with id" not in page.inner_text("main")
    assert page.url == f"{env.console}/runs/late-1"
