"""Serving the console with Hypercorn, on asyncio or trio (whichever loop is running)."""

from __future__ import annotations

import errno
import socket

import anyio
import sniffio
from anyio.abc import TaskStatus
from hypercorn.config import Config
from starlette.types import ASGIApp

from .._errors import ConfigError
from .._logging import get_logger
from ._command import parse_bind as parse_bind


def bind_socket(host: str, port: int) -> socket.socket:
    """The listening socket, bound here so that a taken port is one clear line."""
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.create_server((host, port), family=family, backlog=128)
    except OSError as exc:
        why = ("the port is in use" if exc.errno == errno.EADDRINUSE
               else exc.strerror or str(exc))
        raise ConfigError(f"cannot serve the console on {host}:{port}: {why}") from exc
    sock.setblocking(False)
    return sock


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}"


async def serve(app: ASGIApp, sock: socket.socket, *,
                task_status: TaskStatus[str] = anyio.TASK_STATUS_IGNORED) -> None:
    """Serve ``app`` on the bound ``sock`` until cancelled; started with the console's URL.

    Hypercorn is stopped by its shutdown trigger, never by cancelling its tasks from outside
    (on asyncio that leaves errors behind): the server runs shielded, and cancelling this
    task sets the trigger and waits, bounded, for open connections to close.
    """
    url = url_of(sock)
    config = Config()
    # Hypercorn takes the descriptor over and closes it when it stops
    config.bind = [f"fd://{sock.detach()}"]
    config.accesslog = None
    config.errorlog = None
    config.graceful_timeout = 1.0
    if sniffio.current_async_library() == "trio":
        from hypercorn.trio import serve as hypercorn_serve
    else:
        from hypercorn.asyncio import serve as hypercorn_serve  # type: ignore[assignment]
    stop, stopped = anyio.Event(), anyio.Event()
    server_scope = anyio.CancelScope(shield=True)

    async def run_server() -> None:
        try:
            with server_scope:
                await hypercorn_serve(app, config,  # type: ignore[arg-type]
                                      shutdown_trigger=stop.wait)
        finally:
            stopped.set()

    # the socket already listens: connections wait in its backlog until Hypercorn accepts
    async with anyio.create_task_group() as tg:
        tg.start_soon(run_server)
        get_logger("durable.console").info("console_started", url=url)
        task_status.started(url)
        try:
            await anyio.sleep_forever()
        finally:
            stop.set()
            with anyio.CancelScope(shield=True), anyio.move_on_after(
                    config.graceful_timeout + 2):
                await stopped.wait()
            server_scope.cancel()  # still running past its graceful timeout: cut it off
