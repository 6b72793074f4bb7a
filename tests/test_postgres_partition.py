"""A worker cut off from PostgreSQL by the network: the worker runs on another host of the
test's own (a network namespace, tests/netns.py) and reaches the server through a
forwarder on this side of a veth link, which the test cuts: packets dropped, nothing
refused, as when the server's host dies or the network between them fails."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from psycopg.conninfo import conninfo_to_dict

import durable
from durable._types import RunState
from durable.store import store_from_url
from durable.store._postgres import DEAD_PEER
from tests import crashflows
from tests.helpers import poll, python_process, running_worker
from tests.netns import other_host
from tests.pg import pg_url, postgres_server
from tests.pgproxy import losing_proxy

__all__ = ["pg_url", "postgres_server"]

URL = "postgresql://postgres@db.example:5432/app"
"""Never connected to: the settings are read off the store's connection string."""

DEFAULTS = {name: str(value) for name, value in DEAD_PEER.items()}
"""The settings as a connection string spells them."""


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.anyio
async def test_a_worker_cut_off_from_postgresql_stops_when_told_and_its_run_resumes(
        pg_url: str, tmp_path: Path) -> None:
    """The worker holds a run in a step; the link is cut. Its lease lapses locally (the
    attempt is abandoned) and the claim it sent meanwhile gets no answer; on SIGTERM it
    stops: the claim fails as a connection lost within about 10 s (the store's TCP
    settings, DEAD_PEER in durable/store/_postgres.py), its read-back of what the claim
    may have taken is bounded too, and it exits 0. Once the link is back, another worker
    resumes the run. Before, the claim waited for the kernel's retransmissions (~15
    minutes) and the worker did not exit: still running 120 s after SIGTERM."""
    with other_host(pytest.skip) as host:
        async with losing_proxy(pg_url, host=host.address) as proxy:
            store = store_from_url(pg_url)
            await store.open()
            try:
                client = durable.Client(store)
                log, gate, err = tmp_path / "log", tmp_path / "gate", tmp_path / "worker.out"
                await client.start(crashflows.crash_retry, str(log), str(gate), id="cut-off")
                with python_process(
                        ["-m", "durable.worker", "--db", proxy.url(pg_url),
                         "--import", "tests.crashflows", "--lease", "2", "--grace", "1"],
                        err, prefix=host.exec) as worker:
                    try:
                        await poll(lambda: log.exists() and "hold" in log.read_text(),
                                   timeout=30)
                        host.cut()
                        # its lease lapsed locally; the claim loop (0.5 s polls, woken by
                        # the attempt's end) has a claim in flight since
                        await poll(lambda: "attempt_abandoned" in err.read_text(), timeout=30)
                        worker.send_signal(signal.SIGTERM)
                        await poll(lambda: worker.poll() is not None, timeout=45)
                    finally:
                        host.heal()
                said = err.read_text()
                assert worker.returncode == 0, said[-3000:]
                assert "claim_failed" in said and "cannot reach PostgreSQL" in said, said[-3000:]
                gate.touch()
                async with running_worker(client, durable.default_registry, lease=2.0):
                    run = await client.wait("cut-off", timeout=30)
                assert (run.state, run.result) == (RunState.COMPLETED, "three"), run
                assert log.read_text().split() == ["one", "two", "hold", "hold", "three"]
            finally:
                await store.aclose()


def test_every_connection_gives_up_on_a_silent_server_unless_the_url_says_otherwise() -> None:
    """The TCP settings that bound a cut (above) are on every connection the store opens,
    and a URL's own settings win (a site may want a longer ``tcp_user_timeout``)."""
    default = conninfo_to_dict(store_from_url(URL)._conninfo)  # type: ignore[attr-defined]
    assert {k: default[k] for k in DEFAULTS} == DEFAULTS
    own = conninfo_to_dict(store_from_url(  # type: ignore[attr-defined]
        f"{URL}?tcp_user_timeout=30000&keepalives=0")._conninfo)
    assert (own["tcp_user_timeout"], own["keepalives"], own["keepalives_idle"]) == (
        "30000", "0", "5")


@pytest.mark.anyio
async def test_the_listening_connection_gives_up_on_a_silent_server_too(pg_url: str) -> None:
    """The LISTEN connection, which waits in silence for notifications, takes the same
    settings (it had keepalives of its own, failing within about a minute)."""
    store = store_from_url(pg_url)
    await store.open()
    try:
        await store.wait_for_work(5)  # the first call subscribes and returns at once
        listener = store._listener  # type: ignore[attr-defined]
        settings = conninfo_to_dict(listener.info.dsn)
        assert {k: settings[k] for k in DEFAULTS} == DEFAULTS
    finally:
        await store.aclose()
