#!/usr/bin/env python3
"""The console screenshots in docs/, taken from the real operations.

    python scripts/console_screenshots.py [--out docs/console]

Starts the fake PaaS / git host / TTS / notifier (``scripts/fake_services.py``), a worker
subprocess (``python -m durable.worker --import workflows``) and the console (``python -m
durable console``, with an admin token, so the action forms show), both on ``demo.db`` in a
temporary folder (their working directory, so the console's header reads
``sqlite:///demo.db``). Then it runs, as the demo does:

- a reset that succeeds, a teardown where deleting the repository is refused (403), a promote
  refused because the target exists, a reset cancelled before it starts and one that waits
  an hour: finished, failed, cancelled and queued runs;
- an audio batch of 12 items, 3 at a time, whose TTS service answers 5 calls and then holds
  every call it gets (a ``hang`` fault): 5 of 12 done, 3 in flight, while it is shot.

and saves, with Debian's chromium (1280 wide, full page): ``failed.png`` (the teardown: its
failed step and recovery report), ``batch.png`` (the batch's progress bar) and ``runs.png``
(the runs list). Exits 1 with one line when something did not happen as expected; leaves no
process behind.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import anyio  # noqa: E402

import durable  # noqa: E402
from workflows.audio import item_states  # noqa: E402
from workflows.records import Slot, seed_slot  # noqa: E402

try:
    from scripts._fakes.harness import FakeServices, running_fake_services
except ImportError as exc:  # starlette and uvicorn come with the demo extras
    sys.exit(f"console_screenshots: the fake services need the demo extras ({exc}); "
             "run: pip install -e '.[demo]'")

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
DB = "sqlite:///demo.db"  # relative to the subprocesses' working directory: the temp folder
VOICE_PATH = "/v1/text-to-speech/narrator"
ITEMS, CONCURRENCY, ANSWERED = 12, 3, 5
WAIT = 30.0  # seconds: the bound of every wait
VIEWPORT_WIDTH, VIEWPORT_HEIGHT = 1280, 800
T = TypeVar("T")


class ShotFailure(Exception):
    """Something did not happen as expected."""


def poll(predicate: Callable[[], T | None], what: str, timeout: float = WAIT) -> T:
    """Poll ``predicate`` (state in another process) until it answers, for ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise ShotFailure(f"{what}: not after {timeout:g} s")
        time.sleep(0.05)


def first_line(text: str) -> str:
    return (text.strip().splitlines() or [""])[0]


class Stage:
    """The temp folder, the fake services, and the worker and console processes on it."""

    def __init__(self, services: FakeServices, tmp: Path) -> None:
        self.services = services
        self.tmp = tmp
        self.client_url = f"sqlite:///{tmp / 'demo.db'}"  # the same file, from here
        self.token = secrets.token_urlsafe(24)
        self.console_url = ""
        self.procs: list[subprocess.Popen[bytes]] = []

    def env(self) -> dict[str, str]:
        env = self.services.worker_env(self.tmp)
        env.pop("DURABLE_CONSOLE_TOKEN", None)
        return env

    def spawn(self, name: str, args: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        with (self.tmp / f"{name}.log").open("ab") as log:
            proc = subprocess.Popen([sys.executable, *args], cwd=self.tmp, env=env,
                                    start_new_session=True, stdin=subprocess.DEVNULL,
                                    stdout=log, stderr=subprocess.STDOUT)
        self.procs.append(proc)
        return proc

    def log(self, name: str) -> str:
        path = self.tmp / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def last_words(self) -> str:
        """The worker's last log line, if it logged anything (it logs errors only)."""
        lines = self.log("worker").strip().splitlines()
        return f" (the worker's log ends: {lines[-1][:200]})" if lines else ""

    def start_console(self) -> None:
        env = self.env() | {"DURABLE_CONSOLE_TOKEN": self.token}  # the token stays off argv
        proc = self.spawn("console", ["-m", "durable", "console", "--db", DB,
                                      "--bind", "127.0.0.1:0"], env)

        def announced() -> str | None:
            if proc.poll() is not None:
                raise ShotFailure(f"the console exited with {proc.returncode}: "
                                  + " | ".join(self.log("console").strip().splitlines()[-2:]))
            found = re.search(r"console at (http://\S+)/runs", self.log("console"))
            return found.group(1) if found else None

        self.console_url = poll(announced, "the console announcing its URL")

    def start_worker(self) -> None:
        self.spawn("worker", ["-m", "durable.worker", "--db", DB, "--import", "workflows",
                              "--poll", "0.05", "--lease", "10", "--grace", "1",
                              "--log-level", "error", "--console-url", self.console_url],
                   self.env())

    def stop(self) -> None:
        """SIGTERM every process group, then SIGKILL what is left (git children too)."""
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)

    # -- the operations (each one anyio.run: Playwright's sync API wants no running loop) ----
    def seed(self) -> None:
        slots = [f"slot-{n}" for n in (1, 3, 4, 5, 6)]
        for name in slots:
            self.services.seed(
                applications=[{"uuid": f"app-{name}", "name": name,
                               "envs": [{"key": "DATABASE_URL", "value": "postgres://x"}],
                               "volumes": [{"uuid": f"vol-{name}", "name": "uploads",
                                            "mount_path": "/data"}]}],
                databases=[{"uuid": f"db-{name}"}],
                repositories=[{"workspace": "slots", "slug": name,
                               "files": {"README.md": f"{name}: a user's work\n"}}])
        self.services.seed(repositories=[
            {"workspace": "templates", "slug": "starter", "files": {"README.md": "# starter\n"}},
            {"workspace": "acme", "slug": "shop", "files": {"README.md": "someone else's\n"}}])

        async def go() -> None:
            async with durable.Client.connect(self.client_url) as client:  # creates demo.db
                for name in slots:
                    await seed_slot(client, Slot(
                        name, app=f"app-{name}", project=f"proj-{name}",
                        database=f"db-{name}", repository=f"slots/{name}",
                        template="templates/starter"))

        anyio.run(go)

    def finished_runs(self) -> None:
        async def go() -> None:
            async with durable.Client.connect(self.client_url) as client:
                await self.expect(client, "slot.reset", "slot-1", durable.RunState.COMPLETED)
                self.services.add_fault(
                    "/2.0/repositories/slots/slot-3", method="DELETE", status=403,
                    body={"type": "error",
                          "error": {"message": "missing scope repository:delete"}})
                await self.expect(client, "slot.teardown", "slot-3", durable.RunState.FAILED)
                self.services.clear_faults()
                await self.expect(client, "slot.promote", "slot-4", durable.RunState.FAILED,
                                  "acme/shop")
                await client.start("slot.reset", "slot-6", id="reset-slot-6", key="slot-6",
                                   delay=600)
                run = await client.cancel("reset-slot-6")
                if run.state is not durable.RunState.CANCELLED:
                    raise ShotFailure(f"reset-slot-6 is {run.state.value} after its cancel")
                await client.start("slot.reset", "slot-5", id="reset-slot-5", key="slot-5",
                                   delay=3600)

        anyio.run(go)

    async def expect(self, client: durable.Client, workflow: str, slot: str,
                     state: durable.RunState, *args: str) -> None:
        run_id = f"{workflow.split('.')[1]}-{slot}"
        await client.start(workflow, slot, *args, id=run_id, key=slot)
        try:
            run = await client.wait(run_id, timeout=WAIT)
        except TimeoutError:
            raise ShotFailure(f"{run_id} did not end within {WAIT:g} s") from None
        if run.state is not state:
            raise ShotFailure(f"{run_id} ended {run.state.value}, not {state.value}: "
                              f"{first_line(run.error or '')}")

    def held_batch(self) -> None:
        """Start the batch; return once ANSWERED items are done and CONCURRENCY are held."""
        # first matching fault wins: ANSWERED calls pass (a short latency), then all hang
        self.services.add_fault(VOICE_PATH, method="POST", latency=0.05, times=ANSWERED)
        self.services.add_fault(VOICE_PATH, method="POST", hang=True)
        texts = [f"Chapter {i + 1}." for i in range(ITEMS)]

        async def go() -> None:
            async with durable.Client.connect(self.client_url) as client:
                await client.start("audio.batch", "job-42", "narrator", texts, CONCURRENCY,
                                   id="audio-job-42", key="job-42")
                want = {"done": ANSWERED, "running": CONCURRENCY,
                        "pending": ITEMS - ANSWERED - CONCURRENCY}
                states: dict[str, int] = {}
                with anyio.move_on_after(WAIT):
                    while True:
                        journal = await client.journal("audio-job-42")
                        counts = list(item_states(journal, ITEMS).values())
                        states = {s: counts.count(s) for s in set(counts)}
                        held = [e for e in self.services.ledger(path=VOICE_PATH)
                                if e["ended_at"] is None]
                        if states == want and len(held) == CONCURRENCY:
                            return
                        await anyio.sleep(0.05)
                raise ShotFailure(f"the batch's items are {states} after {WAIT:g} s, "
                                  f"not {want}")

        anyio.run(go)


def shoot(stage: Stage, out: Path) -> list[Path]:
    try:
        from playwright.sync_api import Error as PlaywrightError
        from playwright.sync_api import sync_playwright
    except ImportError as exc:
        raise ShotFailure(f"Playwright for Python is not installed ({exc})") from None
    if not os.access(CHROMIUM, os.X_OK):
        raise ShotFailure(f"{CHROMIUM} is missing (apt-get install chromium)")
    ms = int(WAIT * 1000)
    base = stage.console_url
    saved: list[Path] = []
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True,
                                         args=CHROMIUM_ARGS)
            try:
                page = browser.new_context(
                    viewport={"width": VIEWPORT_WIDTH, "height": VIEWPORT_HEIGHT}).new_page()

                def save(name: str) -> None:
                    # a render of the live poller has landed and the "ago" ticker has run
                    page.wait_for_function("() => window.durableConsole.renders >= 1 && "
                                           "document.querySelector('#freshness')"
                                           ".textContent.includes('updated')", timeout=ms)
                    path = out / name
                    page.screenshot(path=str(path), full_page=True)
                    saved.append(path)

                # the batch first: its held calls are given up after httpx's 30 s read timeout
                page.goto(f"{base}/runs/audio-job-42")
                page.wait_for_function(
                    "() => { const p = document.querySelector('.progress-text');"
                    f" return p && p.innerText.startsWith('{ANSWERED} of {ITEMS} done')"
                    f" && p.innerText.includes('{CONCURRENCY} in flight'); }}", timeout=ms)
                save("batch.png")

                page.goto(f"{base}/runs")
                page.wait_for_function(
                    "() => document.querySelectorAll('tr.run').length === 6", timeout=ms)
                save("runs.png")

                page.goto(f"{base}/runs/teardown-slot-3")
                page.wait_for_selector("section.report", timeout=ms)
                page.wait_for_selector(".step.state-failed", timeout=ms)
                save("failed.png")
            finally:
                browser.close()
    except PlaywrightError as exc:
        raise ShotFailure(f"chromium: {first_line(str(exc))}") from None
    return saved


@contextlib.contextmanager
def staged() -> Iterator[Stage]:
    with tempfile.TemporaryDirectory(prefix="durable-shots-") as tmp, \
            running_fake_services() as services:
        stage = Stage(services, Path(tmp))
        try:
            yield stage
        finally:
            stage.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "docs" / "console"),
                        help="folder for runs.png, batch.png, failed.png (default: %(default)s)")
    args = parser.parse_args(argv)
    out = Path(args.out)
    if not out.is_dir():
        print(f"console_screenshots: --out {out} is not a folder", file=sys.stderr)
        return 2
    durable.configure_logging(level="error")
    try:
        with staged() as stage:
            try:
                stage.seed()
                stage.start_console()
                stage.start_worker()
                stage.finished_runs()
                stage.held_batch()
                saved = shoot(stage, out)
            except ShotFailure as exc:
                raise ShotFailure(f"{exc}{stage.last_words()}") from None
    except ShotFailure as exc:
        print(f"console_screenshots: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # one line, whatever broke (a service, a process, the store)
        print(f"console_screenshots: {type(exc).__name__}: {first_line(str(exc))}",
              file=sys.stderr)
        return 1
    for path in saved:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
