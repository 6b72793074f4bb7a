"""The worker's HTTP connection pool: sized by the worker, per host, and waits said out loud.

httpx's default transport allows 100 connections in all, and httpcore assigns queued
requests to connections with scans over every connection and every queued request on each
request and each response (quadratic at a thousand): 1,000 concurrent requests through one
default transport sent nothing for 7.5 s, then at most 100 at a time.

:class:`WorkerTransport` keeps, for each origin (scheme, host, port), a limit of
``connections_per_host`` requests in flight (the worker's ``concurrency`` by default: one
request per attempt at a time) spread over small httpcore pools (*shards*) of at most
:data:`SHARD_SIZE` connections each, so each pool's scans stay short. A request picks the
shard with the fewest requests in flight; when the host's limit is reached it waits for a
slot, and that wait is logged (``http_pool_wait``: how long, which host) because it counts
against the step's timeout, also when that timeout (or a stop) ends the wait, and the
step's timeout error says how much of it was a wait. The wait is bounded by the request's
``pool`` timeout (:class:`httpx.PoolTimeout`), as httpx's own pool does.

Connections to an IP address are opened with one non-blocking socket
(:class:`_DirectBackend`) instead of anyio's ``connect_tcp`` (happy eyeballs: a task group
and a task per address): 95 ms instead of 237 ms for 1,000 loopback connects. Host names,
local addresses and socket options keep httpcore's own connect.

A connection closed while bytes written to it are not yet acknowledged by the peer (a
request aborted by a cancel, a step's timeout or a lost lease while it was still on its way:
the network stalled, the service not reading) is closed with a reset, which discards them
(``durable/_sockets.py``). A plain close leaves them to the kernel, which goes on
sending them, and the request would reach the service complete, seconds or minutes after
the attempt that sent it was gone. Linux only (``SIOCOUTQ``); elsewhere a plain close.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import socket
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextvars import ContextVar
from typing import Any

import anyio
import anyio.abc
import httpcore
import httpx

from ._logging import get_logger, redact
from ._sockets import reset_if_unacknowledged

_AnyIOStream: Any
try:  # httpcore's wrapper of an anyio stream (reads, writes, TLS upgrade, extra info)
    from httpcore._backends.anyio import AnyIOStream as _AnyIOStream
    from httpcore._utils import is_socket_readable
except ImportError:  # pragma: no cover - a future httpcore: its own connects only
    _AnyIOStream = None

SHARD_SIZE = 8
"""Connections per httpcore pool: small enough that its per-request scans stay cheap (each
request and each response walks the pool's connections two or three times, and its idle
ones once per idle connection). 8 rather than 32: 4 to 8 % less CPU to put 1,000 concurrent
requests on the wire (docs/benchmarks.md, target 1); the pick among a host's pools is
one ``min`` over a list of ints."""

MIN_HTTP_CONNECTIONS = 100
"""The worker's default per host is its concurrency, but never below httpx's default pool
(100 connections in all), so a small worker whose runs send requests concurrently (keyed
steps in a task group) waits no more than it did before."""

LOG_EXTENSION = "durable.log"
"""Request extension carrying the attempt's bound logger (for the pool-wait warning)."""

FENCE_EXTENSION = "durable.fence"
"""Request extension: ``check()``, which raises (:class:`durable.LeaseLostError`) unless the
attempt still holds its lease. :class:`FencedTransport` has httpcore call it as the very
last thing before the request's headers are written (httpcore's ``trace`` extension,
``*.send_request_headers.started``, after any trace of the caller's). ``ctx.http``'s own
check runs before the interceptors, the pool and the connect: a process that stalled
after it (SIGSTOP, a paused VM, an event loop blocked), once the request was past its last
await, resumed past its lease's deadline and wrote the request before the event loop
delivered the deadline's cancel."""

HEADERS_FENCE: ContextVar[Callable[[], None] | None] = ContextVar("durable_headers_fence",
                                                                 default=None)
"""The :data:`FENCE_EXTENSION` check of the request whose headers are being written (set by
the trace callback at ``send_request_headers.started``, cleared when they are written): the
worker's network streams call it once more right before the headers' bytes go to the
socket, so what remains of the window is one ``send`` call, not httpcore's serialization of
the request and anyio's write path (docs/design.md, *A request's lease is checked again
where it leaves*)."""

WAIT_EXTENSION = "durable.pool_wait"
"""Request extension: ``told(waited, host, limit, outcome)``, called when a wait for a slot
ends (``outcome``: ``connection``, ``pool timeout``, ``cancelled``), so that the step's
timeout message can say what part of it was a wait."""

_log = get_logger("durable.http")


class _Host:
    """The pools and the in-flight limit of one origin."""

    def __init__(self, limit: int, make: Any) -> None:
        self.limit = limit
        self.slots = anyio.Semaphore(limit)
        count = max(1, -(-limit // SHARD_SIZE))
        size = -(-limit // count)
        self.shards: list[httpx.AsyncHTTPTransport] = [make(size) for _ in range(count)]
        self.in_flight = [0] * count
        self.waits = 0


class _Released(httpx.AsyncByteStream):
    """A response body that gives its slot back when it is closed (once)."""

    def __init__(self, stream: httpx.AsyncByteStream, host: _Host, shard: int) -> None:
        self._stream = stream
        self._host: _Host | None = host
        self._shard = shard

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for part in self._stream:
            yield part

    def _release(self) -> None:
        host, self._host = self._host, None
        if host is not None:
            host.in_flight[self._shard] -= 1
            host.slots.release()

    async def aclose(self) -> None:
        try:
            await self._stream.aclose()
        finally:
            self._release()


class _Resetting(httpcore.AsyncNetworkStream):
    """A stream of httpcore's own connect (or a TLS stream over one of ours) that closes
    as :func:`reset_if_unacknowledged` says."""

    def __init__(self, stream: httpcore.AsyncNetworkStream, sock: socket.socket | None
                 ) -> None:
        self._stream, self._sock = stream, sock

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return await self._stream.read(max_bytes, timeout)

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        fence = HEADERS_FENCE.get()
        if fence is not None:  # a request's headers: the lease checked as they leave
            fence()
        await self._stream.write(buffer, timeout)

    async def aclose(self) -> None:
        reset_if_unacknowledged(self._sock)
        await self._stream.aclose()

    async def start_tls(self, ssl_context: ssl.SSLContext, server_hostname: str | None = None,
                        timeout: float | None = None) -> httpcore.AsyncNetworkStream:
        tls = await self._stream.start_tls(ssl_context, server_hostname, timeout)
        return _Resetting(tls, self._sock)

    def get_extra_info(self, info: str) -> Any:
        return self._stream.get_extra_info(info)


if _AnyIOStream is not None:
    class _Direct(_AnyIOStream):  # type: ignore[misc]
        """httpcore's stream over a socket of ours, answering "is this idle connection
        readable" (closed by the server) from that socket. httpcore asks it of every idle
        connection of a pool at each request and each response; anyio's answer rebuilt the
        stream's whole table of socket attributes (with a ``getpeername``) each time."""

        def __init__(self, stream: anyio.abc.SocketStream, sock: socket.socket) -> None:
            super().__init__(stream)
            self._sock = sock

        async def write(self, buffer: bytes, timeout: float | None = None) -> None:
            fence = HEADERS_FENCE.get()
            if fence is not None and buffer:  # a request's headers: see HEADERS_FENCE
                sent = self._send_now(buffer, fence)
                if sent == len(buffer):
                    return
                buffer = buffer[sent:]
            await super().write(buffer, timeout)

        def _send_now(self, buffer: bytes, fence: Callable[[], None]) -> int:
            """Check the lease, then hand the kernel what it takes at once, with nothing
            in between (a stall after the check, a SIGSTOP or a blocked loop, can no longer
            let the request out past the lease's deadline). Only when no earlier write
            waits in the event loop's buffer (asyncio), so bytes keep their order; the
            rest, or all of it then, goes through the stream's own write."""
            fence()  # LeaseLostError: nothing of the request was sent
            transport = getattr(self._stream, "_transport", None)  # anyio's asyncio stream
            if transport is not None and (transport.get_write_buffer_size()
                                          or transport.is_closing()):
                return 0
            try:
                return self._sock.send(buffer)
            except OSError:  # would block, or broken: the stream's write says which
                return 0

        def get_extra_info(self, info: str) -> Any:
            if info == "is_readable":
                return is_socket_readable(self._sock)  # closed: fileno -1, "readable"
            if info == "socket":
                return self._sock
            return super().get_extra_info(info)

        async def aclose(self) -> None:
            reset_if_unacknowledged(self._sock)
            await super().aclose()

        async def start_tls(self, ssl_context: ssl.SSLContext,
                            server_hostname: str | None = None,
                            timeout: float | None = None) -> httpcore.AsyncNetworkStream:
            tls = await super().start_tls(ssl_context, server_hostname, timeout)
            return _Resetting(tls, self._sock)


class _DirectBackend(httpcore.AsyncNetworkBackend):
    """httpcore's anyio backend, with a direct connect for an IP address."""

    def __init__(self) -> None:
        self._default = httpcore.AnyIOBackend()

    async def connect_tcp(self, host: str, port: int, timeout: float | None = None,
                          local_address: str | None = None,
                          socket_options: Iterable[Any] | None = None,
                          ) -> httpcore.AsyncNetworkStream:
        try:
            family = socket.AF_INET6 if ipaddress.ip_address(host).version == 6 \
                else socket.AF_INET
        except ValueError:
            family = None
        if family is None or local_address or socket_options or _AnyIOStream is None:
            own = await self._default.connect_tcp(host, port, timeout, local_address,
                                                  socket_options)
            return _Resetting(own, own.get_extra_info("socket"))
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            try:
                with anyio.fail_after(timeout):
                    code = sock.connect_ex((host, port))
                    if code in (errno.EINPROGRESS, errno.EAGAIN):
                        await anyio.wait_writable(sock)
                        code = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                    if code:
                        raise OSError(code, os.strerror(code))
                    stream = await anyio.abc.SocketStream.from_socket(sock)
            except TimeoutError as exc:
                raise httpcore.ConnectTimeout(str(exc) or "timed out connecting") from exc
            except OSError as exc:
                raise httpcore.ConnectError(str(exc)) from exc
        except BaseException:
            sock.close()
            raise
        result: httpcore.AsyncNetworkStream = _Direct(stream, sock)
        return result

    async def connect_unix_socket(self, path: str, timeout: float | None = None,
                                  socket_options: Iterable[Any] | None = None,
                                  ) -> httpcore.AsyncNetworkStream:
        return await self._default.connect_unix_socket(path, timeout, socket_options)

    async def sleep(self, seconds: float) -> None:
        await self._default.sleep(seconds)


def _fenced_trace(check: Callable[[], None],
                  inner: Callable[[str, dict[str, Any]], Awaitable[None]] | None
                  ) -> Callable[[str, dict[str, Any]], Awaitable[None]]:
    """httpcore's trace callback: ``inner``'s first (a caller's own trace, which may take
    time), then, right before the request's headers are written, the fence check."""
    async def trace(event: str, info: dict[str, Any]) -> None:
        if inner is not None:
            await inner(event, info)
        if event.endswith(".send_request_headers.started"):  # http11. and http2.
            check()
            HEADERS_FENCE.set(check)  # and again at the socket (the same task's context)
        elif event.endswith((".send_request_headers.complete",
                             ".send_request_headers.failed")):
            HEADERS_FENCE.set(None)
    return trace


class FencedTransport(httpx.AsyncBaseTransport):
    """An attempt's innermost transport (inside any interceptor's): it hands httpcore the
    request's :data:`FENCE_EXTENSION` check as a trace callback, so that the lease is
    checked again right before the request's headers are written, whatever transport is
    underneath (the worker's, or one given to ``Worker(transport=...)`` that passes
    extensions on to httpcore, as httpx's own does)."""

    def __init__(self, inner: httpx.AsyncBaseTransport) -> None:
        self._inner = inner

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        check = request.extensions.get(FENCE_EXTENSION)
        if check is not None:
            request.extensions["trace"] = _fenced_trace(check, request.extensions.get("trace"))
        return await self._inner.handle_async_request(request)

    async def aclose(self) -> None:
        pass  # the inner transport is the worker's (or the attempt's), closed by its owner


class WorkerTransport(httpx.AsyncBaseTransport):
    """An httpx transport whose pools are sized per host; see the module's docstring."""

    def __init__(self, connections_per_host: int, *,
                 verify: ssl.SSLContext | bool = True) -> None:
        if connections_per_host < 1:
            raise ValueError("connections_per_host must be at least 1")
        self.connections_per_host = connections_per_host
        # one SSL context for every pool, made here (building one takes ~30 ms, which the
        # first request would otherwise wait for)
        self._ssl = verify if isinstance(verify, ssl.SSLContext) else \
            httpx.create_ssl_context(verify=verify)
        self._hosts: dict[tuple[bytes, bytes, int | None], _Host] = {}

    def _make(self, size: int) -> httpx.AsyncHTTPTransport:
        transport = httpx.AsyncHTTPTransport(
            verify=self._ssl,
            limits=httpx.Limits(max_connections=size, max_keepalive_connections=size))
        if isinstance(getattr(transport, "_pool", None), httpcore.AsyncConnectionPool):
            # the same pool httpx builds (its defaults: HTTP/1.1, 5 s keep-alive), with
            # the direct connect
            transport._pool = httpcore.AsyncConnectionPool(
                ssl_context=self._ssl, max_connections=size, max_keepalive_connections=size,
                keepalive_expiry=5.0, network_backend=_DirectBackend())
        return transport

    def _host(self, url: httpx.URL) -> _Host:
        key = (url.raw_scheme, url.raw_host, url.port)
        host = self._hosts.get(key)
        if host is None:
            host = self._hosts[key] = _Host(self.connections_per_host, self._make)
        return host

    @property
    def waits(self) -> int:
        """How many requests waited for a slot (all hosts), since the transport was made."""
        return sum(h.waits for h in self._hosts.values())

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        host = self._host(request.url)
        if host.slots.value == 0:
            await self._wait(host, request)
        else:
            host.slots.acquire_nowait()
        in_flight = host.in_flight
        shard = in_flight.index(min(in_flight))  # the first with the fewest in flight
        host.in_flight[shard] += 1
        try:
            response = await host.shards[shard].handle_async_request(request)
        except BaseException:
            host.in_flight[shard] -= 1
            host.slots.release()
            raise
        assert isinstance(response.stream, httpx.AsyncByteStream)
        return httpx.Response(status_code=response.status_code, headers=response.headers,
                              stream=_Released(response.stream, host, shard),
                              extensions=response.extensions)

    async def _wait(self, host: _Host, request: httpx.Request) -> None:
        host.waits += 1
        timeout = (request.extensions.get("timeout") or {}).get("pool")
        started = anyio.current_time()
        outcome = "cancelled"  # the step's timeout (or a stop) ended the wait
        try:
            with anyio.move_on_after(float("inf") if timeout is None else timeout) as scope:
                await host.slots.acquire()
            outcome = "pool timeout" if scope.cancelled_caught else "connection"
        finally:
            waited = anyio.current_time() - started
            target = redact(f"{request.url.scheme}://{request.url.netloc.decode()}")
            told = request.extensions.get(WAIT_EXTENSION)
            if told is not None:
                told(waited, target, host.limit, outcome)
            log = request.extensions.get(LOG_EXTENSION) or _log
            if outcome == "connection":
                log.warning("http_pool_wait", host=target, waited=round(waited, 3),
                            limit=host.limit,
                            note="the wait counts against the step's timeout; raise the "
                                 "worker's http_connections to avoid it")
            else:
                log.warning("http_pool_wait", host=target, waited=round(waited, 3),
                            limit=host.limit, outcome=outcome,
                            note="never sent: no connection was free")
        if outcome == "pool timeout":
            raise httpx.PoolTimeout(
                f"waited {waited:.1f} s for a connection to {target}: all "
                f"{host.limit} connections per host were in use (Worker http_connections)",
                request=request)

    async def aclose(self) -> None:
        hosts, self._hosts = list(self._hosts.values()), {}
        for host in hosts:
            for shard in host.shards:
                await shard.aclose()
