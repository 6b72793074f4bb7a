"""The front of every API request: ledger, faults, auth, fencing (pure ASGI)."""

from __future__ import annotations

import hmac
import json
import re
import traceback
from typing import Any

import anyio
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .state import (
    FENCING_HEADER,
    FENCING_SCOPE_HEADER,
    IDEMPOTENCY_HEADER,
    STALE_FENCE,
    Fault,
    ServiceState,
    now,
)

_RESOURCES = [
    (re.compile(r"^/api/v1/applications/([^/]+)"), "app:{0}"),
    (re.compile(r"^/api/v1/databases/([^/]+)"), "db:{0}"),
    (re.compile(r"^/2\.0/repositories/([^/]+)/([^/]+)"), "repo:{0}/{1}"),
    (re.compile(r"^/v1/text-to-speech/([^/]+)"), "tts:{0}"),
    (re.compile(r"^/hooks/([^/]+)"), "hook:{0}"),
]


def _resource_of(path: str, idempotency_key: str | None) -> str | None:
    for pattern, template in _RESOURCES:
        match = pattern.match(path)
        if match:
            resource = template.format(*match.groups())
            if resource.startswith("tts:") and idempotency_key:
                resource += f":{idempotency_key}"
            return resource
    return None


class Front:
    """Pure ASGI middleware: ledger, faults, auth and fencing for every API request."""

    def __init__(self, app: ASGIApp, state: ServiceState) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"].startswith("/_admin"):
            await self.app(scope, receive, send)
            return
        await _Exchange(self, scope, receive, send).run()


class _Exchange:
    """One API request from arrival to the end of its response (or of its connection)."""

    def __init__(self, front: Front, scope: Scope, receive: Receive, send: Send) -> None:
        self.app, self.state = front.app, front.state
        self.scope, self.receive, self.send = scope, receive, send
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        self.headers = headers
        self.method: str = scope["method"]
        self.path: str = scope["path"]
        key = headers.get(IDEMPOTENCY_HEADER)
        self.entry = self.state.record(
            self.method, self.path, query=scope.get("query_string", b"").decode("latin-1"),
            resource=_resource_of(self.path, key), idempotency_key=key,
            fencing_scope=headers.get(FENCING_SCOPE_HEADER))
        scope["fake.entry"] = self.entry
        self.body: bytes | None = b""
        self.gone = anyio.Event()  # the connection is closed (by either side)
        self.finished = False  # our side is done: later disconnects are not the client's

    async def run(self) -> None:
        try:
            if await self._read_body():
                async with anyio.create_task_group() as tg:
                    tg.start_soon(self._watch_disconnect)
                    await self._serve()
                    tg.cancel_scope.cancel()
        finally:
            if self.entry["ended_at"] is None:
                self.entry["ended_at"] = now()

    async def _read_body(self) -> bool:
        chunks = []
        while True:
            message = await self.receive()
            if message["type"] == "http.disconnect":
                self._client_left()
                return False
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                self.body = b"".join(chunks)
                return True

    def _client_left(self) -> None:
        if not self.finished:
            self.entry["disconnected"] = True
            self.entry["disconnected_at"] = now()
        self.gone.set()

    async def _watch_disconnect(self) -> None:
        while (await self.receive())["type"] != "http.disconnect":
            pass
        self._client_left()

    async def _serve(self) -> None:
        fault = self.state.take_fault(self.method, self.path, "before")
        if fault is not None and await self._apply(fault, None):
            return
        if not self._authorized():
            await self._reply_json(401, _error_body(self.path, "Unauthenticated."))
            return
        if not await self._fence():
            return
        after = [f for f in self.state.faults if f.matches(self.method, self.path, "after")]
        captured: list[Message] | None = [] if after else None
        self.entry["handled"] = True
        try:
            await self.app(self.scope, self._replay_receive, self._forward(captured))
        except Exception:
            traceback.print_exc()
            if self.entry["status"] is not None:
                raise
            captured = None
            await self._reply_json(500, _error_body(self.path, "Internal Server Error"))
            return
        if captured is not None:
            fault = self.state.take_fault(self.method, self.path, "after")
            if fault is None or not await self._apply(fault, captured):
                for message in captured:
                    await self._send(message)

    def _authorized(self) -> bool:
        scheme, _, value = self.headers.get("authorization", "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(
            value.strip().encode(), self.state.token.encode()
        )

    async def _fence(self) -> bool:
        """Refuse a superseded attempt: a token lower than the highest seen in its scope.

        Tokens are compared only where they are related: within the request's fencing
        scope (``Durable-Fencing-Scope``: the run's concurrency key, or the run), whatever
        resource it touches, so unrelated runs sharing a resource (a hook, a template
        repository) never fence each other. A token that names no scope is compared per
        resource, the conservative reading for a client that does not say.
        """
        raw = self.headers.get(FENCING_HEADER)
        if raw is None:
            return True
        token = self.state.parse_token(raw)
        if token is None:
            await self._reply_json(400, {"error": "invalid fencing token"})
            return False
        self.entry["fencing_token"] = token
        scope = self.entry["fencing_scope"]
        if scope is not None and not scope.strip():
            await self._reply_json(400, {"error": "empty fencing scope"})
            return False
        if not self.state.fence(token, scope, self.entry["resource"]):
            self.entry["refused"] = True
            await self._reply_json(409, STALE_FENCE)
            return False
        return True

    async def _apply(self, fault: Fault, captured: list[Message] | None) -> bool:
        """Apply a fault; False means "carry on as normal" (a pure latency fault)."""
        self.entry["faults"].append(fault.id)
        if fault.latency:
            await anyio.sleep(fault.latency)
        if fault.hang:
            await self._wait_gone_or_released()
            if not self.gone.is_set():
                await self._drop()
        elif fault.drop:
            await self._drop()
        elif fault.status is not None:
            headers = {"retry-after": fault.retry_after} if fault.retry_after else {}
            body = fault.body if fault.body is not None else {"message": "injected fault"}
            await self._reply_json(fault.status, body, headers)
        else:
            return False
        return True

    async def _wait_gone_or_released(self) -> None:
        release = self.state.release_event()
        async with anyio.create_task_group() as tg:

            async def wait(event: anyio.Event) -> None:
                await event.wait()
                tg.cancel_scope.cancel()

            tg.start_soon(wait, self.gone)
            tg.start_soon(wait, release)

    async def _drop(self) -> None:
        """Close the connection without (the rest of) a response."""
        transport = self.scope.get("fake.transport")
        if transport is None:
            raise RuntimeError("drop faults need uvicorn's h11 protocol")
        self.finished = True
        self.entry["dropped"] = True
        transport.abort()
        with anyio.move_on_after(2):
            await self.gone.wait()

    async def _replay_receive(self) -> Message:
        if self.body is not None:
            body, self.body = self.body, None
            return {"type": "http.request", "body": body, "more_body": False}
        await self.gone.wait()
        return {"type": "http.disconnect"}

    def _forward(self, captured: list[Message] | None) -> Send:
        async def send(message: Message) -> None:
            if captured is not None:
                captured.append(message)
            else:
                await self._send(message)

        return send

    async def _send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.entry["status"] = message["status"]
        elif message["type"] == "http.response.body" and not message.get("more_body", False):
            # Record the end before the last byte leaves: a client that reads the
            # ledger right after its response must find this entry complete.
            self.finished = True
            self.entry["ended_at"] = now()
        await self.send(message)

    async def _reply_json(
        self, status: int, body: Any, headers: dict[str, str] | None = None
    ) -> None:
        data = json.dumps(body).encode()
        raw_headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(data)).encode()),
        ]
        raw_headers += [(k.encode(), v.encode()) for k, v in (headers or {}).items()]
        await self._send({"type": "http.response.start", "status": status, "headers": raw_headers})
        await self._send({"type": "http.response.body", "body": data, "more_body": False})


def _error_body(path: str, message: str) -> Any:
    if path.startswith("/2.0/"):
        return {"type": "error", "error": {"message": message}}
    if path.startswith("/v1/"):
        return {"detail": {"status": "error", "message": message}}
    if path.startswith("/hooks/"):
        return {"error": message}
    return {"message": message}
