"""The worker's HTTP pool: per-host limits over small pools, and waits logged (and bounded)."""

from __future__ import annotations

import json
import logging
import socket
import subprocess
import sys
from pathlib import Path

import anyio
import httpx
import pytest

from durable._pool import SHARD_SIZE, WorkerTransport
from durable._worker import Worker

from .conftest import ROOT, subprocess_env
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
    import durable

    store = durable.store_from_url(f"sqlite:///{tmp_path / 'x.db'}")
    assert Worker(store, concurrency=40).http_connections == 100  # httpx's default, at least
    assert Worker(store, concurrency=1000).http_connections == 1000
    assert Worker(store, concurrency=40, http_connections=7).http_connections == 7
    with pytest.raises(durable.ConfigError):
        Worker(store, http_connections=0)


def test_the_http_benchmark_runs_and_prints_both_columns(tmp_path: Path) -> None:
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
    assert isinstance(report["targets_met"], bool)
    assert set(report["targets"]) == {"all_in_flight", "first_within_100_ms",
                                      "last_within_1_s"}
    assert report["targets"]["all_in_flight"] is True
    text = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench_http.py"), "--runs", "5",
         "--hold", "0.2"], cwd=tmp_path, env=subprocess_env(), capture_output=True,
        text=True, timeout=120)
    assert text.returncode == 0, text.stderr
    for label in ("requests in flight at peak", "first request after the claim (ms)",
                  "last request after the claim (ms)", "worker pool", "httpx default",
                  "all 5 in flight at once", "first within 100 ms", "last within 1000 ms"):
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
