"""The browser test rig: Debian's chromium driven by Playwright (sync API), and servers for it.

Use it from a test module with ``pytest_plugins = ["tests.browser"]``; the ``browser``
(module) and ``page`` (one fresh context per test) fixtures are then available. Browser tests
are plain sync tests: Playwright's sync API cannot run inside an event loop, so the server
under test runs elsewhere, either in a background thread (:func:`serving_asgi`, on asyncio or
trio) or as a real subprocess (:func:`serving_process`).

Without chromium or Playwright the browser tests are skipped with the reason, unless ``CI`` or
``DURABLE_REQUIRE_BROWSER=1`` is set: then they fail, so CI cannot pass by skipping them.

PYTEST_DONT_REWRITE: a test module imports the helpers below before pytest loads this module
as its plugin; without this marker pytest warns (an error here) that it cannot rewrite it.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.from_thread
import anyio.lowlevel
import pytest

from .conftest import ROOT, subprocess_env

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def _browser_required() -> bool:
    return bool(os.environ.get("CI")) or os.environ.get("DURABLE_REQUIRE_BROWSER") == "1"


def _unavailable(reason: str) -> None:
    if _browser_required():
        pytest.fail(f"browser tests required (CI or DURABLE_REQUIRE_BROWSER=1): {reason}",
                    pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Headless Debian chromium through Playwright, one per test module.

    Not one per session: Playwright's sync API keeps an asyncio loop on the main thread while
    it runs, and the anyio tests of the next module could not start theirs ("Cannot run the
    event loop while another loop is running")."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as exc:
        _unavailable(f"Playwright for Python is not installed ({exc})")
    if not os.access(CHROMIUM, os.X_OK):
        _unavailable(f"{CHROMIUM} is missing (apt-get install chromium)")
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    """A page in a fresh browser context (no cookies, storage or init scripts shared)."""
    context = browser.new_context()
    try:
        yield context.new_page()
    finally:
        context.close()


def free_port() -> int:
    """A loopback port free right now (another process could take it before it is bound)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for_port(port: int, *, timeout: float = 20.0,
                  alive: Callable[[], str | None] = lambda: None) -> None:
    """Poll until 127.0.0.1:``port`` accepts a connection; fail after ``timeout`` seconds, or
    at once when ``alive()`` returns a reason (the server died)."""
    deadline = time.monotonic() + timeout
    while True:
        dead = alive()
        if dead is not None:
            raise RuntimeError(dead)
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1.0):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"nothing listening on 127.0.0.1:{port} "
                                   f"after {timeout:g} s") from None
            time.sleep(0.05)


class ServedApp:
    """An ASGI app served on loopback by :func:`serving_asgi`."""

    def __init__(self, port: int, backend: str) -> None:
        self.port = port
        self.backend = backend
        self.token: anyio.lowlevel.EventLoopToken | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def call(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn()`` in the server's event loop thread and return its result (to set an
        anyio Event that an endpoint awaits, for instance)."""
        assert self.token is not None, "the server is not running"
        return anyio.from_thread.run_sync(fn, token=self.token)


@contextmanager
def serving_asgi(app: Any, *, backend: str = "asyncio",
                 startup_timeout: float = 20.0) -> Iterator[ServedApp]:
    """Serve ``app`` with Hypercorn on a free loopback port, in a background thread running an
    anyio event loop on ``backend`` ("asyncio" or "trio"), for the block.

    The socket is bound here (no port race) and handed to Hypercorn; startup is awaited by
    polling the port (bounded); at exit Hypercorn is told to shut down and the thread joined.
    """
    from hypercorn.config import Config

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    served = ServedApp(int(sock.getsockname()[1]), backend)
    config = Config()
    config.bind = [f"fd://{sock.detach()}"]  # Hypercorn owns (and closes) the socket now
    config.graceful_timeout = 1.0  # a request held open by a test does not delay shutdown
    config.accesslog = None
    config.errorlog = None
    stop: list[anyio.Event] = []
    failure: list[BaseException] = []

    async def main() -> None:
        if backend == "trio":
            from hypercorn.trio import serve
        else:
            from hypercorn.asyncio import serve  # type: ignore[assignment]
        stop.append(anyio.Event())
        served.token = anyio.lowlevel.current_token()
        await serve(app, config, shutdown_trigger=stop[0].wait)

    def run() -> None:
        try:
            anyio.run(main, backend=backend)
        except BaseException as exc:  # reported to the test by wait_for_port / at exit
            failure.append(exc)

    thread = threading.Thread(target=run, name=f"asgi-{backend}-{served.port}", daemon=True)
    thread.start()
    try:
        wait_for_port(served.port, timeout=startup_timeout,
                      alive=lambda: f"the server thread died: {failure[0]!r}" if failure
                      else ("the server thread exited" if not thread.is_alive() else None))
        yield served
    finally:
        if served.token is not None and thread.is_alive():
            try:
                served.call(stop[0].set)
            except RuntimeError:  # the loop has already ended
                pass
        thread.join(timeout=15)
        if thread.is_alive():
            raise RuntimeError("the ASGI server thread did not stop within 15 s")
    if failure:
        raise RuntimeError("the ASGI server failed") from failure[0]


@contextmanager
def serving_process(argv: Sequence[str], port: int, log: Path, *,
                    env: Mapping[str, str] | None = None,
                    startup_timeout: float = 30.0) -> Iterator[subprocess.Popen[bytes]]:
    """Start ``argv`` (a server that will listen on 127.0.0.1:``port``) in a session of its
    own, output appended to ``log``; wait (bounded) until the port accepts connections. At exit
    the process group gets SIGTERM, then SIGKILL if it is still there after 10 s.

    For example ``serving_process([sys.executable, "-m", "durable", "console", "--db", url,
    "--bind", f"127.0.0.1:{port}"], port, tmp_path / "console.log")``.
    """
    with open(log, "ab") as out:
        proc = subprocess.Popen(list(argv), cwd=ROOT,
                                env=dict(env) if env is not None else subprocess_env(),
                                start_new_session=True, stdin=subprocess.DEVNULL,
                                stdout=out, stderr=subprocess.STDOUT)

    def alive() -> str | None:
        if proc.poll() is None:
            return None
        tail = log.read_text(errors="replace")[-2000:]
        return f"{argv[:4]} exited with {proc.returncode} before listening:\n{tail}"

    try:
        wait_for_port(port, timeout=startup_timeout, alive=alive)
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        try:  # whatever the server left in its group (children) goes too
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
