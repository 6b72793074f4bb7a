"""``python -m durable console``: serve the console over a database until Ctrl-C."""

from __future__ import annotations

import argparse
import os
import re
import socket
import sys
from pathlib import Path

import anyio

from .._client import Client
from .._errors import ConfigError

# Nothing here imports Starlette or Hypercorn: the CLI builds its parser from this module
# on an install without the console extra.
TOKEN_ENV = "DURABLE_CONSOLE_TOKEN"
DEFAULT_BIND = "127.0.0.1:8080"


def parse_bind(value: str, option: str = "--console",
               example: str = DEFAULT_BIND) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6; ``:PORT`` means 127.0.0.1) or ConfigError."""
    host, sep, port_text = value.rpartition(":")
    if not sep or not port_text.isdigit() or int(port_text) > 65535:
        raise ConfigError(f"{option} {value!r} is not HOST:PORT (e.g. {example})")
    host = host.strip("[]") or "127.0.0.1"
    return host, int(port_text)


def read_token(token_file: str | None) -> str | None:
    """The admin token: ``--token-file`` (first line), else ``$DURABLE_CONSOLE_TOKEN``, else
    None (read-only). Never taken from the command line, where ``ps`` would show it."""
    if token_file:
        path = Path(token_file)
        try:
            token = path.read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise ConfigError(f"cannot read --token-file {token_file}: "
                              f"{exc.strerror or exc}") from exc
        if not token:
            raise ConfigError(f"--token-file {token_file} is empty")
        return token
    token = os.environ.get(TOKEN_ENV, "").strip()
    return token or None


def add_options(parser: argparse.ArgumentParser, *, worker: bool) -> None:
    if worker:
        parser.add_argument(
            "--console", metavar="HOST:PORT",
            help="also serve the operator console here (127.0.0.1:8080 for this machine "
                 "only); --console-url then defaults to it (default: no console)")
    else:
        parser.add_argument("--bind", metavar="HOST:PORT", default=DEFAULT_BIND,
                            help="where to serve (0.0.0.0:PORT serves every interface: put "
                                 "it behind TLS)")
    parser.add_argument(
        "--token-file", metavar="FILE",
        help="file holding the admin token that every action needs (default: "
             f"${TOKEN_ENV}; without either the console is read-only)")
    parser.add_argument(
        "--allow-host", dest="allow_hosts", action="append", default=[], metavar="NAME",
        help="a host name the console answers besides addresses, localhost and the host of "
             "--console-url (a request naming another is refused: DNS rebinding); "
             "repeatable; '*' answers any name")


_HOST_NAME = re.compile(r"(?:[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?\.?)+")


def allowed_hosts(values: list[str]) -> list[str]:
    """The ``--allow-host`` names (lowercase), or ConfigError for one that is not a host
    name (a port, a scheme, a path) or ``*``."""
    names = []
    for value in values:
        name = value.strip()
        if name != "*" and (len(name) > 253 or not _HOST_NAME.fullmatch(name)):
            raise ConfigError(f"--allow-host {value!r} is not a host name: give the name "
                              "alone (console.example.org), or '*' for any name")
        names.append(name.lower())
    return names


async def serve_client(client: Client, sock: socket.socket, token: str | None,
                       allow_hosts: list[str] | None = None) -> None:
    """Serve the console over ``client`` on the bound ``sock`` until cancelled, announcing
    its URL on stderr."""
    from . import create_app, serve, url_of

    url = url_of(sock)
    app = create_app(client, token=token, console_url=client.console_url or url,
                     allow_hosts=allow_hosts or ())
    async with anyio.create_task_group() as tg:
        await tg.start(serve, app, sock)
        mode = "read-only" if token is None else "actions need the admin token"
        print(f"durable: console at {url}/runs ({mode})", file=sys.stderr, flush=True)
        await anyio.sleep_forever()


def check_installed() -> None:
    try:
        import hypercorn  # noqa: F401
        import starlette  # noqa: F401
    except ImportError as exc:
        raise ConfigError(
            f"the console needs the console extra ({exc.name} is not installed): "
            "pip install 'durable-fenced[console]' (from a checkout: pip install -e "
            "'.[console]')") from exc
