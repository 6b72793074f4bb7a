"""The browser rig's servers: an ASGI app in a thread (asyncio and trio), a subprocess server."""

from __future__ import annotations

import socket
import sys
import urllib.request
from pathlib import Path

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from .browser import free_port, serving_asgi, serving_process


def refused(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            return False
    except OSError:
        return True


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_serving_asgi_serves_then_stops(backend: str) -> None:
    async def hello(request: Request) -> PlainTextResponse:
        return PlainTextResponse("hello")

    with serving_asgi(Starlette(routes=[Route("/", hello)]), backend=backend) as served:
        with urllib.request.urlopen(served.url + "/", timeout=10) as r:
            assert r.read() == b"hello"
        port = served.port
    assert refused(port)


def test_serving_process_waits_for_the_port_and_leaves_nothing(tmp_path: Path) -> None:
    port = free_port()
    argv = [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"]
    with serving_process(argv, port, tmp_path / "server.log") as proc:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10) as r:
            assert r.status == 200
    assert proc.poll() is not None
    assert refused(port)


def test_serving_process_reports_a_server_that_exits(tmp_path: Path) -> None:
    argv = [sys.executable, "-c", "import sys; print('bad flag'); sys.exit(2)"]
    with pytest.raises(RuntimeError, match=r"exited with 2 before listening:\nbad flag"):
        with serving_process(argv, free_port(), tmp_path / "server.log"):
            pass
