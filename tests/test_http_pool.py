"""The worker's HTTP pool: per-host limits over small pools, and waits logged (and bounded)."""

from __future__ import annotations

import json
import logging
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

import durable
from durable import _worker
from durable._gc import YOUNG_EVERY
from durable._pool import SHARD_SIZE, WorkerTransport
from durable._worker import Worker

from .conftest import ROOT, subprocess_env
from .helpers import poll, python_process, running_worker, tcp_queues
from .httpserver import Rule, loopback_server

pytestmark = pytest.mark.anyio


async def test_requests_beyond_the_limit_wait_and_the_wait_is_logged(
        caplog: pytest.LogCaptureFixture) -> None:
    transport = WorkerTransport(2)
    async with loopback_server() as server, httpx.AsyncClient(transport=transport) as client:
        server.on("/hang", Rule(hang=True, times=2))
        async with anyio.create_task_group() as tg:
            for _ in range(2):
                tg.start_soon(client.get, f"{server.url}/hang")
            await server.wait_for(lambda: len(server.seen("/hang")) == 2)
            with caplog.at_level(logging.WARNING), pytest.raises(httpx.PoolTimeout) as info:
                await client.get(f"{server.url}/ok", timeout=httpx.Timeout(5.0, pool=0.2))
            assert "all 2 connections per host were in use" in str(info.value)
            assert transport.waits == 1
            assert server.seen("/ok") == []  # never sent
            tg.cancel_scope.cancel()
        # the cancelled requests gave their slots back: two go at once again
        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                for _ in range(2):
                    tg.start_soon(client.get, f"{server.url}/ok")
        assert len(server.seen("/ok")) == 2 and transport.waits == 1
    assert "http_pool_wait" in caplog.text and "pool timeout" in caplog.text


async def test_a_wait_that_ends_is_logged_with_its_length(
        caplog: pytest.LogCaptureFixture) -> None:
    transport = WorkerTransport(1)
    async with loopback_server() as server, httpx.AsyncClient(transport=transport) as client:
        with caplog.at_level(logging.WARNING):
            async with anyio.create_task_group() as tg:
                for _ in range(3):
                    tg.start_soon(client.get, f"{server.url}/ok")
        assert len(server.seen("/ok")) == 3
        assert transport.waits == 2
    assert caplog.text.count("http_pool_wait") == 2
    assert "counts against the step's timeout" in caplog.text


async def test_one_host_spreads_over_small_pools_and_hosts_are_apart() -> None:
    transport = WorkerTransport(SHARD_SIZE * 3 + 1)
    async with loopback_server() as a, loopback_server() as b, \
            httpx.AsyncClient(transport=transport) as client:
        await client.get(f"{a.url}/ok")
        await client.get(f"{b.url}/ok")
        hosts = list(transport._hosts.values())
        assert len(hosts) == 2
        assert all(len(h.shards) == 4 and h.limit == SHARD_SIZE * 3 + 1 for h in hosts)
        assert all(sum(h.in_flight) == 0 and h.slots.value == h.limit for h in hosts)
    await transport.aclose()


def test_the_worker_sizes_its_pool_from_its_concurrency(tmp_path: Path) -> None:
    store = durable.store_from_url(f"sqlite:///{tmp_path / 'x.db'}")
    assert Worker(store, concurrency=40).http_connections == 100  # httpx's default, at least
    assert Worker(store, concurrency=1000).http_connections == 1000
    assert Worker(store, concurrency=40, http_connections=7).http_connections == 7
    with pytest.raises(durable.ConfigError):
        Worker(store, http_connections=0)


def test_the_http_benchmark_runs_and_prints_its_three_columns(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench_http.py"), "--runs", "20",
         "--hold", "0.2", "--json"],
        cwd=tmp_path, env=subprocess_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    for column in ("worker_pool", "httpx_default"):
        row = report[column]
        assert row["completed"] == 20 and row["requests"] == 20
        assert row["peak_in_flight"] == 20  # the server held them until all 20 came
        assert row["first_ms"] is not None and row["last_ms"] >= row["first_ms"]
        assert row["pool_waits_logged"] == 0
    floor = report["no_engine"]  # the transport alone: every request sent, none completed
    assert (floor["requests"], floor["peak_in_flight"]) == (20, 20)
    assert floor["last_ms"] >= floor["first_ms"] > 0 and floor["cpu_to_last_ms"] > 0
    assert "completed" not in floor
    assert floor["gc_young_threshold"] >= YOUNG_EVERY  # under the worker's GC policy
    assert isinstance(report["targets_met"], bool)
    assert set(report["targets"]) == {"all_in_flight", "first_within_100_ms",
                                      "last_within_1_s"}
    assert report["targets"]["all_in_flight"] is True
    assert len(report["worker_pool_repeats"]) == 1 and len(report["load_before"]) == 3
    text = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench_http.py"), "--runs", "5",
         "--hold", "0.2", "--repeat", "2", "--backend", "trio", "--no-gc-policy"], cwd=tmp_path,
        env=subprocess_env(), capture_output=True, text=True, timeout=120)
    assert text.returncode == 0, text.stderr
    for label in ("requests in flight at peak", "first request after the claim (ms)",
                  "last request after the claim (ms)", "worker pool", "httpx default",
                  "all 5 in flight at once", "first within 100 ms", "last within 1000 ms",
                  "trio, GC policy off; load average", "worker pool, 2 measurements",
                  "min / median / max", "all three targets met", "no engine",
                  "CPU, claim to the first request (ms)",
                  "full GCs, claim to the last request"):
        assert label in text.stdout
    bad = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_http.py"),
                          "--runs", "0"], cwd=tmp_path, env=subprocess_env(),
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr


async def test_direct_connects_refused_and_by_name() -> None:
    """An IP address gets the pool's direct connect; its refusal is httpx's ConnectError
    with the system's words. A host name keeps httpcore's own connect."""
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        closed_port = probe.getsockname()[1]
    transport = WorkerTransport(4)
    async with loopback_server() as server, httpx.AsyncClient(transport=transport) as client:
        with pytest.raises(httpx.ConnectError, match="Connection refused"):
            await client.get(f"http://127.0.0.1:{closed_port}/x")
        response = await client.get(f"http://localhost:{server.port}/ok")
        assert response.status_code == 200
        assert (await client.get(f"{server.url}/ok")).json() == {"ok": True}
        assert len(server.seen("/ok")) == 2
        host = transport._hosts[(b"http", b"127.0.0.1", server.port)]
        assert sum(host.in_flight) == 0 and host.slots.value == 4


async def test_a_large_claim_sends_its_first_request_before_its_last_attempt_starts(
        client: durable.Client, registry: durable.Registry,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker starts a claim's attempts in waves (SPAWN_WAVE): the first ones journal
    their step and send their request while later ones are still to start. Started all at
    once, every attempt passed each stage (its step_started write, its request) before any
    went on, and the first request left after the last attempt had started."""
    wave = 4  # small waves: the same mechanism as SPAWN_WAVE, with fewer runs to claim
    monkeypatch.setattr(_worker, "SPAWN_WAVE", wave)
    runs = 32 * wave
    store = client.store
    claims: list[int] = []
    started_when_first_arrived: list[int] = []
    async with loopback_server() as server:

        @durable.activity(registry=registry, retry=durable.RetryPolicy(max_tries=1))
        async def fetch(ctx: durable.ActivityContext, url: str) -> int:
            return (await ctx.http.get(url)).status_code

        @durable.workflow("waves.one", registry=registry)
        async def one(ctx: durable.WorkflowContext, url: str) -> int:
            return int(await fetch(ctx, url))

        for i in range(runs):
            await client.start(one, f"{server.url}/ok", id=f"w-{i:04d}")
        worker = Worker(store, registry=registry, concurrency=runs, poll_interval=0.05)
        original = store.claim

        async def claim(*args: Any, **kwargs: Any) -> list[durable.Run]:
            got = await original(*args, **kwargs)
            if got:
                claims.append(len(got))
            return got

        def arrived(seen: Any) -> None:
            if not started_when_first_arrived:
                started_when_first_arrived.append(len(worker.active))

        store.claim = claim  # type: ignore[method-assign]
        server.on_arrival = arrived
        async with anyio.create_task_group() as tg:
            await tg.start(worker.run)

            async def all_completed() -> bool:
                counts = await store.count_runs()
                return counts.get(durable.RunState.COMPLETED, 0) == runs

            await poll(all_completed, timeout=60)
            worker.shutdown(grace=10)
        del store.claim
    assert claims[0] == runs  # one claim took them all
    assert len(server.seen("/ok")) == runs
    print("attempts started when the first request arrived:", started_when_first_arrived)
    assert started_when_first_arrived[0] < runs


async def test_the_worker_command_sizes_the_pool_with_http_connections(
        tmp_path: Path) -> None:
    """``python -m durable.worker --http-connections 2``: three requests at once to one host,
    two in flight, the third waits for a slot and the wait is logged with the limit."""
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    log = tmp_path / "worker.log"
    async with loopback_server() as server, durable.Client.connect(url) as client:
        await anyio.run_process(
            [sys.executable, "-m", "durable", "start", "cli.fan_out",
             json.dumps(f"{server.url}/ok"), "3", "--id", "fan", "--import",
             "tests.cliflows", "--db", url], cwd=ROOT, env=subprocess_env())
        with python_process(["-m", "durable.worker", "--db", url, "--import",
                             "tests.cliflows", "--http-connections", "2", "--concurrency",
                             "1", "--log-format", "json", "--poll", "0.05"], log) as proc:
            done = await client.wait("fan", timeout=60)
            proc.send_signal(signal.SIGTERM)
            with anyio.fail_after(30):
                while proc.poll() is None:  # bounded poll of the worker's exit
                    await anyio.sleep(0.02)
        assert proc.returncode == 0, log.read_text()
    assert done.state is durable.RunState.COMPLETED and done.result == [200, 200, 200]
    assert len(server.seen("/ok")) == 3
    lines = [json.loads(line) for line in log.read_text().splitlines()
             if line.startswith("{")]
    [started] = [e for e in lines if e.get("event") == "worker_started"]
    assert started["http_connections"] == 2
    [wait] = [e for e in lines if e.get("event") == "http_pool_wait"]
    assert wait["limit"] == 2 and wait["workflow_id"] == "fan"


def test_http_connections_must_be_a_whole_number_above_zero(tmp_path: Path) -> None:
    for bad, words in (("0", "must be at least 1, not 0"), ("x", "not a whole number")):
        proc = subprocess.run(
            [sys.executable, "-m", "durable.worker", "--db",
             f"sqlite:///{tmp_path / 'never.db'}", "--import", "tests.cliflows",
             "--http-connections", bad], cwd=ROOT, env=subprocess_env(),
            capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2
        [line] = proc.stderr.splitlines()
        assert "--http-connections" in line and words in line, proc.stderr
    assert not (tmp_path / "never.db").exists()


async def test_a_wait_ended_by_the_callers_timeout_is_logged(
        caplog: pytest.LogCaptureFixture) -> None:
    transport = WorkerTransport(1)
    told: list[tuple[str, int, str]] = []
    async with loopback_server() as server, httpx.AsyncClient(transport=transport) as client:
        server.on("/hang", Rule(hang=True))
        async with anyio.create_task_group() as tg:
            tg.start_soon(client.get, f"{server.url}/hang")
            await server.wait_for(lambda: len(server.seen("/hang")) == 1)
            with caplog.at_level(logging.WARNING), anyio.move_on_after(0.2) as scope:
                await client.get(f"{server.url}/ok", extensions={
                    "durable.pool_wait": lambda w, h, n, o: told.append((h, n, o))})
            assert scope.cancelled_caught
            tg.cancel_scope.cancel()
        assert server.seen("/ok") == []
    assert told == [(server.url, 1, "cancelled")]
    assert "http_pool_wait" in caplog.text and "cancelled" in caplog.text


async def test_a_step_timed_out_waiting_for_a_connection_says_so(
        client: durable.Client, registry: durable.Registry,
        caplog: pytest.LogCaptureFixture) -> None:
    """One connection per host: a step holds it; another step's timeout runs out while it
    waits for it. Its error says how much of the timeout was the wait, and the wait is
    logged with the step."""
    async with loopback_server() as server:
        server.on("/hang", Rule(hang=True))
        holding = anyio.Event()
        server.on_arrival = lambda seen: holding.set() if seen.path == "/hang" else None

        @durable.activity(registry=registry, retry=durable.RetryPolicy(max_tries=1))
        async def hold(ctx: durable.ActivityContext) -> None:
            await ctx.http.get(f"{server.url}/hang")

        @durable.activity(registry=registry, timeout=0.3,
                          retry=durable.RetryPolicy(max_tries=1))
        async def quick(ctx: durable.ActivityContext) -> None:
            await ctx.http.get(f"{server.url}/ok")

        @durable.workflow("pool.starved", registry=registry)
        async def starved(ctx: durable.WorkflowContext) -> None:
            async with anyio.create_task_group() as tg:
                tg.start_soon(lambda: ctx.step(hold, key="hold"))
                await holding.wait()
                await ctx.step(quick, key="quick")

        with caplog.at_level(logging.WARNING):
            async with running_worker(client, registry, http_connections=1):
                await client.start("pool.starved", id="p1")
                done = await client.wait("p1")
    assert done.state is durable.RunState.FAILED
    [failed] = [e for e in await client.journal("p1") if e.kind.value == "step_failed"
                and e.step_key == "quick"]
    assert isinstance(failed.data, dict)
    error = str(failed.data["error"])
    assert error.startswith("timed out after 0.3 s (the call in flight was aborted); ")
    assert f"s of it waiting for a connection to {server.url}, the last request never " \
           "sent: all 1 connections per host were in use (Worker http_connections)" in error
    assert server.seen("/ok") == []
    [wait] = [r.getMessage() for r in caplog.records if "http_pool_wait" in r.getMessage()]
    assert "outcome=cancelled" in wait and "workflow_id=p1" in wait and "step=2" in wait


async def test_an_idle_connection_the_server_closed_is_not_reused() -> None:
    """The direct connect's stream answers httpcore's "is this idle connection readable"
    from its own socket: a keep-alive connection the server has closed since is dropped
    and the next request gets a new one (answered "not readable", it was reused and the
    request failed: "Server disconnected without sending a response")."""
    closed = anyio.Event()
    connections = 0

    async def handle(stream: anyio.abc.SocketStream) -> None:
        nonlocal connections
        connections += 1
        async with stream:
            await stream.receive()
            await stream.send(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        closed.set()  # closed after one response, though the response said keep-alive

    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    transport = WorkerTransport(4)
    async with listener, anyio.create_task_group() as tg, \
            httpx.AsyncClient(transport=transport) as client:
        tg.start_soon(listener.serve, handle)
        assert (await client.get(f"http://127.0.0.1:{port}/a")).text == "ok"
        await closed.wait()  # on loopback the close has reached the client's socket
        assert (await client.get(f"http://127.0.0.1:{port}/b")).text == "ok"
        assert connections == 2
        tg.cancel_scope.cancel()


@pytest.mark.parametrize("name", ["127.0.0.1", "localhost"])
async def test_a_cancelled_request_on_its_way_is_dropped_whatever_the_host_is_named(
        name: str) -> None:
    """The pool's direct connect (an IP address) and httpcore's own (a host name) both
    close a connection whose bytes are not yet acknowledged with a reset: a request lying
    whole in the kernel's send queue when its caller is cancelled never reaches the
    service later (tests/test_cancellation.py shows it for a run's cancel)."""
    if not Path("/proc/net/tcp").exists():
        pytest.skip("Linux: /proc/net/tcp")
    body = b"x" * 65536
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1)  # the kernel's least
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.setblocking(False)
        service = listener.getsockname()
        transport = WorkerTransport(4)
        request = anyio.CancelScope()

        async def delete() -> None:
            with request:
                await client.request("DELETE", f"http://{name}:{service[1]}/volumes/v1",
                                     content=body)

        async with httpx.AsyncClient(transport=transport) as client, \
                anyio.create_task_group() as tg:
            tg.start_soon(delete)
            with anyio.fail_after(10):
                await anyio.wait_readable(listener)
            conn, peer = listener.accept()
            with conn:
                def whole_request_on_its_way() -> bool:
                    queues = tcp_queues(peer, service)
                    try:
                        head = conn.recv(65536, socket.MSG_PEEK | socket.MSG_DONTWAIT)
                    except BlockingIOError:
                        return False
                    if queues is None or b"\r\n\r\n" not in head:
                        return False
                    total = head.index(b"\r\n\r\n") + 4 + len(body)
                    return queues[0] > 0 and queues[0] + len(head) == total

                await poll(whole_request_on_its_way)
                request.cancel()  # the caller's timeout, or a cancel
                await poll(lambda: tcp_queues(peer, service) is None, timeout=5)
