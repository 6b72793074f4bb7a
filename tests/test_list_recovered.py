"""``Client.list`` recovers the runs whose lease expired as it reads them (running back to
queued). A page filtered by state is still full and exact: a run that recovery moved out of
the asked state is left out and the read goes on past it, so a caller paging until a page is
shorter than ``limit`` (the documented way; the console's pager, by its JSON API on a
loopback socket) sees every run. On SQLite
and PostgreSQL, asyncio and trio, with a fake clock expiring the leases."""

from __future__ import annotations

import pytest

from durable import Client
from durable._clock import FakeClock
from durable._types import NewRun, RunState
from durable.store import Store
from tests.pg import pg_url, postgres_server
from tests.test_console_http import console
from tests.test_store_console import store
from tests.test_store_contract import clock, store_url

__all__ = ["clock", "pg_url", "postgres_server", "store", "store_url"]

pytestmark = pytest.mark.anyio


async def running_and_expired(store: Store, clock: FakeClock) -> None:
    """r0..r7, newest last: r0, r1 queued; r2, r3 running under a live lease; r4..r7
    running under one that has expired (their worker died)."""
    for i in range(8):
        await store.create_run(NewRun(f"r{i}", "wf", [], None, clock.now()))
        clock.advance(1.0)
    for i in range(4, 8):
        assert await store.claim("dead", 30.0, 1, run_id=f"r{i}")
    clock.advance(20.0)
    for i in (2, 3):
        assert await store.claim("alive", 300.0, 1, run_id=f"r{i}")
    clock.advance(11.0)  # past the dead worker's lease, within the live one's


async def pages(client: Client, size: int, state: str | None) -> list[tuple[str, str]]:
    seen: list[tuple[str, str]] = []
    cursor = None
    while True:
        page = await client.list(state=state, limit=size, before=cursor)
        seen += [(r.id, r.state.value) for r in page]
        if len(page) < size:
            return seen
        cursor = (page[-1].created_at, page[-1].id)


@pytest.mark.parametrize("size", [1, 2, 3, 100])
async def test_pages_of_a_state_are_full_when_recovery_moves_runs_out_of_it(
        store: Store, clock: FakeClock, size: int) -> None:
    """The newest running runs' leases expired: the read recovers them (queued), and the
    page goes on to the running runs after them (before: a page of 2 read r7, r6, both
    recovered and dropped, so the first page was empty and r3, r2 were never listed)."""
    await running_and_expired(store, clock)
    client = Client(store)
    assert await pages(client, size, "running") == [("r3", "running"), ("r2", "running")]
    assert [r.id for r in await client.list(state="running", limit=2)] == ["r3", "r2"]
    # the recovered runs are queued now, and listed as such
    assert await pages(client, size, "queued") == [
        (f"r{i}", "queued") for i in (7, 6, 5, 4, 1, 0)]
    assert await pages(client, size, None) == [
        (f"r{i}", "running" if i in (2, 3) else "queued") for i in range(7, -1, -1)]


async def test_a_page_of_the_other_state_shows_recovered_runs_in_their_new_state(
        store: Store, clock: FakeClock) -> None:
    """Without a state filter nothing is left out: a recovered run is listed, queued."""
    await running_and_expired(store, clock)
    page = await Client(store).list(limit=3)
    assert [(r.id, r.state) for r in page] == [
        ("r7", RunState.QUEUED), ("r6", RunState.QUEUED), ("r5", RunState.QUEUED)]


async def test_the_console_s_pager_reaches_every_running_run(
        store: Store, clock: FakeClock) -> None:
    """The console asks for one run more than its page to know whether there is a next
    page (before: that read was all expired runs, dropped, so the first page of running
    runs was empty and had no next)."""
    await running_and_expired(store, clock)
    seen: list[str] = []
    params = {"state": "running", "limit": "1"}
    async with console(Client(store)) as http:
        while True:
            body = (await http.get("/api/runs", params=params)).json()
            seen += [r["id"] for r in body["runs"]]
            if body["next"] is None:
                break
            params["before"] = body["next"]
    assert seen == ["r3", "r2"]
