"""A real loopback HTTP/1.1 server for engine tests, running on the test's own event loop.

It records every request (method, path, headers) and, for a path set to hang, holds the
request open until the client goes away and records when it did. Works on asyncio and trio
(anyio sockets), so the engine's httpx client talks to it over real TCP.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import attrs
from anyio.abc import SocketStream


@attrs.define
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    arrived: float
    disconnected_at: float | None = None
    answered_at: float | None = None


@attrs.define
class Rule:
    status: int = 200
    body: Any = attrs.Factory(lambda: {"ok": True})
    headers: dict[str, str] = attrs.Factory(dict)
    hang: bool = False
    times: int | None = None
    answer_after: anyio.Event | None = None
    """Hold the answer until this event is set (a request in flight, then answered)."""


class LoopbackServer:
    def __init__(self) -> None:
        self.requests: list[Seen] = []
        self.rules: dict[str, list[Rule]] = {}
        self.port = 0
        self.changed = anyio.Event()
        self.on_arrival: Callable[[Seen], None] | None = None
        """Called as each request arrives, before the next task runs (ordering tests)."""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def on(self, path: str, rule: Rule) -> None:
        self.rules.setdefault(path, []).append(rule)

    def seen(self, path: str | None = None) -> list[Seen]:
        return [r for r in self.requests if path is None or r.path == path]

    async def wait_for(self, predicate: Any, timeout: float = 10.0) -> None:
        """Wait until predicate() holds, woken by each request event (bounded)."""
        with anyio.fail_after(timeout):
            while not predicate():
                await self.changed.wait()

    def _notify(self) -> None:
        self.changed.set()
        self.changed = anyio.Event()

    def _rule(self, path: str) -> Rule:
        rules = self.rules.get(path) or []
        for rule in rules:
            if rule.times is None or rule.times > 0:
                if rule.times is not None:
                    rule.times -= 1
                return rule
        return Rule()

    async def _handle(self, stream: SocketStream) -> None:
        async with stream:
            buffer = b""
            try:
                while b"\r\n\r\n" not in buffer:
                    buffer += await stream.receive()
            except (anyio.EndOfStream, anyio.BrokenResourceError):
                return
            head, _, rest = buffer.partition(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            method, target, _ = lines[0].split(" ", 2)
            path = target.partition("?")[0]
            headers = {}
            for line in lines[1:]:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
            length = int(headers.get("content-length", "0"))
            try:
                while len(rest) < length:
                    rest += await stream.receive()
            except (anyio.EndOfStream, anyio.BrokenResourceError):
                return
            seen = Seen(method, path, headers, rest, time.time())
            self.requests.append(seen)
            if self.on_arrival is not None:
                self.on_arrival(seen)
            self._notify()
            rule = self._rule(path)
            if rule.hang:
                try:
                    while await stream.receive():
                        pass
                except (anyio.EndOfStream, anyio.BrokenResourceError, OSError):
                    pass
                seen.disconnected_at = time.time()
                self._notify()
                return
            body = json.dumps(rule.body).encode()
            extra = "".join(f"{k}: {v}\r\n" for k, v in rule.headers.items())
            response = (
                f"HTTP/1.1 {rule.status} X\r\ncontent-type: application/json\r\n"
                f"content-length: {len(body)}\r\n{extra}connection: close\r\n\r\n"
            ).encode() + body
            if rule.answer_after is not None:
                await rule.answer_after.wait()
            try:
                await stream.send(response)
            except (anyio.BrokenResourceError, OSError):
                pass
            else:
                seen.answered_at = time.time()
                self._notify()


@asynccontextmanager
async def loopback_server() -> AsyncIterator[LoopbackServer]:
    server = LoopbackServer()
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    server.port = listener.extra(anyio.abc.SocketAttribute.local_port)
    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, server._handle)
        try:
            yield server
        finally:
            tg.cancel_scope.cancel()
