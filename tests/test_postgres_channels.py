"""Each schema's NOTIFY channels (schema 12): a schema's starts, cancels and ends are sent on
``durable_work:<schema>`` and ``durable_done:<schema>`` (or the md5 of a name too long for a
channel), so a listener hears its own schema only. Before, every schema of a server shared
``durable_work`` and ``durable_done``, and each listener read and dropped all the others'
traffic (on this shared machine, other sessions' tests were seen on them)."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from typing import Any

import anyio
import pytest
from psycopg import sql

import durable
from durable import RunState
from durable.store._postgres import CHANNEL, CHANNEL_BYTES, DONE_CHANNEL, channel_name

from .pg import connect_sync, pg_url, postgres_server, split_url
from .test_postgres_carried import flows
from .test_wake import opened, worker_on

__all__ = ["pg_url", "postgres_server"]  # fixtures

pytestmark = pytest.mark.anyio

LONG = 60.0  # the waits' poll: only a NOTIFY makes them return within BOUND
BOUND = 20.0
SENTINEL = "sentinel"


@pytest.fixture(params=["short", "longest"])
def named_url(request: pytest.FixtureRequest, postgres_server: str) -> Iterator[str]:
    """A store URL with a schema of its own: a short name, or the longest a schema can
    have (63 bytes), whose channel names would not fit and are hashed."""
    schema = f"durable_test_{uuid.uuid4().hex[:12]}"
    if request.param == "longest":
        schema = schema.ljust(63, "x")
    yield f"{postgres_server}?schema={schema}"
    with connect_sync(postgres_server + "?schema=public") as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


def listen(conn: Any, *channels: str) -> None:
    for channel in channels:
        conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))


def heard_until_sentinel(conn: Any, url: str, channel: str) -> list[tuple[str, str]]:
    """What ``conn`` heard, up to a sentinel sent now on ``channel``: a listener is told of
    notifications in commit order, so whatever was sent before the sentinel came first."""
    with connect_sync(url) as other:
        other.execute("SELECT pg_notify(%s, %s)", (channel, SENTINEL))
    heard = []
    for notify in conn.notifies(timeout=BOUND):
        if (notify.channel, notify.payload) == (channel, SENTINEL):
            return heard
        heard.append((notify.channel, notify.payload))
    raise AssertionError(f"the sentinel never came; heard {heard}")


def test_channel_names_fit_and_stay_apart() -> None:
    short = "durable_test_abc"
    assert channel_name(CHANNEL, short) == "durable_work:durable_test_abc"
    assert channel_name(DONE_CHANNEL, short) == "durable_done:durable_test_abc"
    longest = "s" * 63
    hashed = channel_name(CHANNEL, longest)
    assert len(hashed.encode()) <= CHANNEL_BYTES
    assert hashed != channel_name(CHANNEL, "s" * 62) != channel_name(DONE_CHANNEL, longest)
    edge = "e" * (CHANNEL_BYTES - len("durable_work:"))  # fits exactly: kept readable
    assert channel_name(CHANNEL, edge) == f"durable_work:{edge}"
    assert channel_name(CHANNEL, edge + "e").startswith("durable_work:")
    assert len(channel_name(CHANNEL, edge + "e")) == len("durable_work:") + 32


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_postgres_a_schema_s_starts_cancels_and_ends_are_sent_on_its_own_channels(
        named_url: str, pg_url: str, registry: durable.Registry) -> None:
    """A start, a cancel, a key freed and a run's end in one schema are heard on that schema's
    channels, as the store names them, and on no other: not on the channels the schemas
    of a server shared before, nor on another schema's. (With a short name and with the
    longest, whose channel names are hashed by the trigger and the store alike.)"""
    flows(registry)
    schema = split_url(named_url)[1]
    work, done = channel_name(CHANNEL, schema), channel_name(DONE_CHANNEL, schema)
    other = split_url(pg_url)[1]
    elsewhere = [CHANNEL, DONE_CHANNEL,
                 channel_name(CHANNEL, other), channel_name(DONE_CHANNEL, other)]
    async with opened(named_url) as store, opened(pg_url):  # the other schema exists too
        client = durable.Client(store, registry=registry)
        with connect_sync(named_url) as mine, connect_sync(named_url) as theirs:
            listen(mine, work, done)
            listen(theirs, *elsewhere)
            ran = await client.start("carried.echo", 1, id="ran", key="k")
            cancelled = await client.start("carried.echo", 2, id="cancelled", delay=3600)
            await client.cancel(cancelled.id)
            async with worker_on(store, registry):
                with anyio.fail_after(BOUND):
                    assert (await client.wait(ran.id, timeout=BOUND)).state is \
                        RunState.COMPLETED
            heard = heard_until_sentinel(mine, named_url, work)
            assert heard_until_sentinel(theirs, named_url, channel_name(CHANNEL, other)) == []
    assert {channel for channel, _ in heard} == {work, done}
    payloads = [payload for _, payload in heard]
    assert any(p.startswith(f"{schema} ") and '"id":"ran"' in p and '"queued"' in p
               for p in payloads)  # the start, carrying its row (schema 11)
    # the keyed run's end frees its key: news to workers (migration 012's other trigger)
    assert any(channel == work and re.fullmatch(f"{schema} [0-9]+", p) for channel, p in heard)
    ends = {p for channel, p in heard if channel == done}
    assert any('"id":"cancelled"' in p for p in ends)
    assert any('"id":"ran"' in p and '"completed"' in p for p in ends)


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_postgres_waits_on_a_store_object_of_their_own_are_woken_on_the_schema_s_channels(
        named_url: str, registry: durable.Registry) -> None:
    """A worker and a wait on another store object (as in another process), with a poll
    longer than the bound: the worker is woken by the start's NOTIFY and carries the run,
    the wait by its end's, on the channels the store listens to, for a short name and for
    one whose channels are hashed."""
    flows(registry)
    async with opened(named_url) as mine, opened(named_url) as theirs:
        client = durable.Client(theirs, registry=registry)
        with anyio.fail_after(BOUND):
            assert await mine.wait_for_work(LONG) is None  # subscribes, returns at once
            run = await client.start("carried.echo", "x", id="carried", start_within=60)
            # the run as created, every column (a start_within the carried row lacked
            # would let a late first attempt run: tests/test_start_within.py)
            assert await mine.wait_for_work(LONG) == (run,) and run.start_within == 60
            await theirs.wait_for_finished("none", LONG)  # subscribes, returns at once
            await durable.Client(mine, registry=registry).cancel(run.id)
            await theirs.wait_for_finished(run.id, LONG)
