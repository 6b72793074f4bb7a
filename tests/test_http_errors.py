"""A connection error through ``ctx.http`` names the host it failed to reach, and nothing else
changes: the exception keeps its type, retries count it as before, secrets stay out."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import anyio
import anyio.abc
import httpx
import pytest

import durable
import durable.testing
from activities._http import ApiTransport
from activities.errors import ServiceUnreachableError
from durable import RunState

pytestmark = pytest.mark.anyio

SECRET_PASSWORD = "hunter2-secret"
SECRET_TOKEN = "tok-abc123-secret"


@pytest.fixture
def closed_port() -> int:
    """A loopback port nobody listens on (bound, then closed)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = int(sock.getsockname()[1])
    sock.close()
    return port


async def test_the_journaled_error_names_host_port_and_request(tmp_path: Path,
                                                               closed_port: int) -> None:
    registry = durable.Registry()
    # credentials in the URL come from configuration, not from arguments (never journaled)
    url = (f"http://user:{SECRET_PASSWORD}@127.0.0.1:{closed_port}/api/v1/things"
           f"?token={SECRET_TOKEN}")
    seen: list[tuple[type[BaseException], str]] = []

    @durable.activity("http.get", registry=registry,
                      retry=durable.RetryPolicy(max_tries=2, initial_delay=0, jitter=0))
    async def get(ctx: durable.ActivityContext) -> None:
        try:
            await ctx.http.get(url)
        except httpx.ConnectError as exc:  # user code still catches what it caught before
            seen.append((type(exc), str(exc)))
            raise

    @durable.workflow("http.flow", registry=registry)
    async def flow(ctx: durable.WorkflowContext) -> None:
        await get(ctx)

    async with durable.testing.sqlite_client(tmp_path, registry=registry) as client:
        async with durable.testing.running_worker(client):
            await client.start("http.flow", id="h")
            run = await client.wait("h")
        journal = await client.journal("h")
    assert run.state is RunState.FAILED
    # then the driver's own words (asyncio: "All connection attempts failed")
    expected = (f"ConnectError: cannot connect to 127.0.0.1:{closed_port} (GET "
                f"http://127.0.0.1:{closed_port}/api/v1/things?...): ")
    errors = [e.data for e in journal if e.kind.value in ("step_retrying", "step_failed")]
    assert len(errors) == 2  # retried once, as before
    assert all(str(d["error"]).startswith(expected) for d in errors), errors
    assert {d["error_type"] for d in errors} == {"ConnectError"}
    assert run.error is not None and expected in run.error
    assert [t for t, _ in seen] == [httpx.ConnectError, httpx.ConnectError]
    assert all(f"cannot connect to 127.0.0.1:{closed_port}" in text for _, text in seen)
    everything = json.dumps([e.data for e in journal]) + (run.error or "")
    assert SECRET_PASSWORD not in everything and SECRET_TOKEN not in everything
    assert all(SECRET_PASSWORD not in t and SECRET_TOKEN not in t for _, t in seen)


async def test_outside_a_workflow_and_through_the_operations_transport(
        closed_port: int) -> None:
    ctx = durable.ActivityContext.standalone()
    async with ctx.http:
        with pytest.raises(httpx.ConnectError, match=(
                rf"^cannot connect to 127\.0\.0\.1:{closed_port} \(POST "
                rf"http://127\.0\.0\.1:{closed_port}/x\): ")):
            await ctx.http.post(f"http://127.0.0.1:{closed_port}/x")
        # the operations' clients still classify it as unreachable, now with the host
        api = ApiTransport(ctx.http, f"http://127.0.0.1:{closed_port}", token=SECRET_TOKEN)
        with pytest.raises(ServiceUnreachableError) as caught:
            await api.request("GET", "/api/v1/databases")
    text = str(caught.value)
    assert text.startswith(f"GET http://127.0.0.1:{closed_port}/api/v1/databases: no answer: "
                           "ConnectError: cannot connect: "), text
    assert text.count("/api/v1/databases") == 1, text  # the request, said once
    assert SECRET_TOKEN not in str(caught.value)


async def test_a_transport_error_that_quotes_the_service_is_redacted_when_raised() -> None:
    """A protocol error quotes what the service sent (h11: ``illegal header line: ...``):
    the error ``ctx.http`` raises is redacted already, so workflow code that keeps or logs
    its text in its own way holds no credential."""
    async def answer(stream: anyio.abc.SocketStream) -> None:
        async with stream:
            await stream.receive()
            await stream.send(f"HTTP/1.1 200 OK\r\nX-Upstream token={SECRET_TOKEN}\r\n"
                              "\r\n".encode())

    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, answer)
        ctx = durable.ActivityContext.standalone()
        async with ctx.http:
            with pytest.raises(httpx.RemoteProtocolError) as caught:
                await ctx.http.get(f"http://127.0.0.1:{port}/x")
        tg.cancel_scope.cancel()
    text = str(caught.value)
    assert text.startswith(f"GET http://127.0.0.1:{port}/x: illegal header line"), text
    assert SECRET_TOKEN not in text and "token=[redacted]" in text, text
