"""A loopback TCP proxy in front of the machine's PostgreSQL that can lose an answer.

The store connects through it (its URL's host and port replaced); it forwards every byte
both ways until it is armed with a marker. The first request of a connection that carries
the marker (a run id in a statement's parameters, say) is forwarded to the server (or,
armed with :meth:`LosingProxy.lose_request`, is not, and the connection is closed), and
the answer to it is not: the proxy closes both sides when the server's first bytes after
it arrive. The server has run the statement to its end by then: an autocommit statement
sent with psycopg's extended protocol (Parse/Bind/Execute/Sync in one write) is answered
in one flush at ReadyForQuery, after its commit. So the client sees its connection lost
after sending, the outcome unknown to it, while the statement has committed: what a
network that fails at the wrong moment does, on the real server.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from urllib.parse import urlsplit, urlunsplit

import anyio
from anyio.abc import SocketStream, TaskGroup

CHUNK = 65536


class LosingProxy:
    def __init__(self, server: str, tg: TaskGroup, host: str = "127.0.0.1") -> None:
        parts = urlsplit(server)
        self.host = host
        """The address it listens on (another network namespace reaches it on a veth's)."""
        self.target = (parts.hostname or "127.0.0.1", parts.port or 5432)
        self._tg = tg
        self.port = 0
        self._marker: bytes | None = None
        self._unsent = False  # the marked request itself is lost, not its answer
        self._times = 0  # marked requests still to lose (lose_request)
        self._then: bytes | None = None  # after the marker, the request whose answer is lost
        self.lost = anyio.Event()
        """Set once an answer was withheld, or a request lost (its connection closed)."""
        self.answers_lost = 0
        self.requests_lost = 0
        self._down = False  # an outage: every connection cut, new ones closed at once
        self.refused = 0
        """Connections closed at once during an outage."""
        self._live: set[anyio.CancelScope] = set()

    def down(self) -> None:
        """Begin an outage: cut every connection through the proxy, and close each new one
        at once (as a server that is down, or a network cut that the kernel reports)."""
        self._down = True
        for scope in self._live:
            scope.cancel()

    def up(self) -> None:
        """End the outage: new connections reach the server again."""
        self._down = False

    def url(self, store_url: str) -> str:
        """``store_url`` with its host and port this proxy's."""
        parts = urlsplit(store_url)
        netloc = parts.netloc.rpartition("@")
        userinfo = netloc[0] + "@" if netloc[1] else ""
        return urlunsplit(parts._replace(netloc=f"{userinfo}{self.host}:{self.port}"))

    def lose_answer_to(self, marker: str) -> None:
        """Withhold the answer to the next request that carries ``marker`` (once)."""
        self._marker, self._unsent, self._then = marker.encode(), False, None

    def lose_answer_to_commit_after(self, marker: str) -> None:
        """Withhold the answer to the ``COMMIT`` of the next transaction whose statements
        carry ``marker`` (once): the server committed it, the client never hears so."""
        self._marker, self._unsent, self._then = marker.encode(), False, b"COMMIT"

    def lose_request(self, marker: str, times: int = 1) -> None:
        """Lose the next ``times`` requests that carry ``marker`` (once each, by default
        one): the server never sees them, and the client's connection is closed once it has
        sent each."""
        self._marker, self._unsent, self._times = marker.encode(), True, times
        self._then = None

    async def serve(self, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        listener = await anyio.create_tcp_listener(local_host=self.host)
        self.port = int(listener.extra(anyio.abc.SocketAttribute.local_port))
        task_status.started()
        async with listener:
            await listener.serve(self._connection, task_group=self._tg)

    async def _connection(self, client: SocketStream) -> None:
        if self._down:
            self.refused += 1
            await client.aclose()
            return
        try:
            server = await anyio.connect_tcp(*self.target)
        except OSError:  # the server is down: so is this connection (as without a proxy)
            await client.aclose()
            return
        cut = anyio.Event()  # this connection's marked request went through

        def lost_up(data: bytes) -> bool:  # a request: lost itself, or its answer next
            if self._marker is None or self._marker not in data:
                return False
            if self._then is not None:  # the marked statement goes; its COMMIT is lost
                self._marker, self._then = self._then, None
                return False
            if self._unsent:
                self._times -= 1
                if self._times <= 0:
                    self._marker = None
                self.requests_lost += 1
                self.lost.set()
                return True
            self._marker = None
            cut.set()
            return False

        def lost_down(data: bytes) -> bool:  # an answer: lost if it is the marked one's
            if cut.is_set():
                self.answers_lost += 1
                self.lost.set()
            return cut.is_set()

        async def pump(source: SocketStream, sink: SocketStream,
                       lost: Callable[[bytes], bool]) -> None:
            try:
                while not lost(data := await source.receive(CHUNK)):
                    await sink.send(data)
            except (anyio.EndOfStream, anyio.BrokenResourceError,
                    anyio.ClosedResourceError):
                pass
            finally:  # either side gone (or a loss): both closed
                tg.cancel_scope.cancel()

        with anyio.CancelScope() as live:  # cut by down()
            self._live.add(live)
            if self._down:  # the outage began while this one connected
                live.cancel()
            try:
                async with client, server, anyio.create_task_group() as tg:
                    tg.start_soon(pump, client, server, lost_up)
                    tg.start_soon(pump, server, client, lost_down)
            finally:
                self._live.discard(live)


@asynccontextmanager
async def losing_proxy(server: str, host: str = "127.0.0.1") -> AsyncIterator[LosingProxy]:
    """A :class:`LosingProxy` to ``server`` (a ``postgresql://`` URL), listening on
    ``host``, for the block."""
    async with anyio.create_task_group() as tg:
        proxy = LosingProxy(server, tg, host)
        await tg.start(proxy.serve)
        try:
            yield proxy
        finally:
            tg.cancel_scope.cancel()
