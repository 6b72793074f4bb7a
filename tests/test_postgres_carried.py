"""Runs carried by NOTIFY (schema 11; issue 10, target 6): the ``durable_work`` NOTIFY of a
run created queued carries its row, so a worker on another store object (as in another
process) claims it riding on its first write without reading what is queued; the
``durable_done`` NOTIFY of a run's end carries the run as it ended, so a wait on another
store object returns it without reading it again. Every poll here is 60 s long; the
counts fail if the reads come back."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from psycopg import sql

import durable
import durable.testing
from durable import RunState, _wake
from durable.store import Store
from durable.store._postgres import CHANNEL, DONE_CHANNEL, channel_name

from .helpers import poll
from .pg import connect_sync, pg_url, postgres_server
from .test_claim_wakes import Claims
from .test_wake import opened, worker_on

__all__ = ["pg_url", "postgres_server"]  # fixtures

pytestmark = pytest.mark.anyio

LONG = 60.0
BOUND = 20.0

pg_only = pytest.mark.parametrize(
    "anyio_backend", ["asyncio", "trio"])

BIG = "x" * 9000  # more than a NOTIFY holds (8,000 bytes)
ARGS = {"pi": 3.141592653589793, "tiny": 1e-300, "text": "zürich ✓ \"quoted\"", "n": [1, None]}


def flows(registry: durable.Registry) -> None:
    @durable.activity(registry=registry)
    async def echo(ctx: durable.ActivityContext, value: Any) -> Any:
        return value

    @durable.workflow("carried.echo", registry=registry)
    async def echoed(ctx: durable.WorkflowContext, value: Any) -> Any:
        return await echo(ctx, value)


class Reads:
    """Counts ``get_run`` on a store object."""

    def __init__(self, store: Store) -> None:
        self.count = 0
        real = store.get_run

        async def counted(run_id: str) -> durable.Run | None:
            self.count += 1
            return await real(run_id)

        store.get_run = counted  # type: ignore[method-assign]


@pg_only
async def test_postgres_a_created_run_s_notify_carries_it_as_created(
        pg_url: str, registry: durable.Registry) -> None:
    """What ``wait_for_work`` returns is the run as its start created it, to the last bit of
    its floats; a run whose row does not fit in a NOTIFY is announced without it (the
    worker then reads), and so are a run queued again and runs inserted by one statement."""
    flows(registry)
    async with opened(pg_url) as mine, opened(pg_url) as theirs:
        client = durable.Client(theirs, registry=registry)
        with anyio.fail_after(BOUND):
            assert await mine.wait_for_work(LONG) is None  # subscribes, returns at once
            run = await client.start("carried.echo", ARGS, id="fits")
            assert await mine.wait_for_work(LONG) == (run,)
            assert await mine.get_run(run.id) == run
            await client.start("carried.echo", BIG, id="too-big")
            assert await mine.wait_for_work(LONG) is None
            late = await client.start("carried.echo", 1, id="later", delay=3600)
            assert await mine.wait_for_work(LONG) == (late,)
            await client.cancel(late.id)  # a queued run cancelled: no work, no NOTIFY
            await client.replay(late.id)  # queued again: an update, announced without it
            assert await mine.wait_for_work(LONG) is None
            with connect_sync(pg_url) as raw:  # several runs inserted by one statement
                raw.execute(
                    "INSERT INTO durable_runs (id, workflow, args, state, epoch, attempt, run_at,"
                    " created_at, updated_at) SELECT 'bulk' || g, 'carried.echo', '1', 'queued',"
                    " 0, 0, 0, 0, 0 FROM generate_series(1, 3) AS g")
            assert await mine.wait_for_work(LONG) is None  # one NOTIFY, no run carried


@pg_only
async def test_postgres_a_worker_on_another_store_claims_a_carried_run_without_a_read(
        pg_url: str, registry: durable.Registry) -> None:
    """Starts on another store object, each waited for: every run is claimed riding on its
    first write, with no read of what is queued and no plain claim; a run of a workflow
    the worker does not run wakes nothing; a run too big for its NOTIFY is read and
    claimed as before."""
    flows(registry)
    async with opened(pg_url) as theirs, opened(pg_url) as mine:
        claims = Claims(theirs)
        client = durable.Client(mine, registry=registry)
        async with worker_on(theirs, registry):
            with anyio.fail_after(BOUND):
                for i in range(2):  # the listener's first subscription
                    await client.wait((await client.start("carried.echo", i, id=f"w{i}")).id,
                                      poll=LONG)
                before, rides, reads = claims.started, claims.rides, claims.reads
                empty = claims.empty
                await client.start("carried.other", id="not-mine")
                for i in range(10):
                    run = await client.start("carried.echo", ARGS, id=f"c{i}")
                    done = await client.wait(run.id, poll=LONG)
                    assert done.state is RunState.COMPLETED and done.result == ARGS
                assert (claims.started - before, claims.rides - rides,
                        claims.reads - reads) == (10, 10, 0), claims.empty
                big = await client.start("carried.echo", BIG, id="big")
                assert (await client.wait(big.id, poll=LONG)).result == BIG
                assert claims.rides - rides == 10  # the big one: read, then claimed
                assert claims.started - before == 11 and claims.empty == empty


@pg_only
async def test_postgres_a_wait_on_another_store_takes_the_run_its_end_carried(
        pg_url: str, registry: durable.Registry) -> None:
    """A wait on another store object reads the run once (before it ends) and returns the
    run its end's NOTIFY carried, equal to what a read finds; a result too big for the
    NOTIFY is read after the signal."""
    flows(registry)
    async with opened(pg_url) as theirs, opened(pg_url) as mine:
        client = durable.Client(mine, registry=registry)
        reads = Reads(mine)
        async with worker_on(theirs, registry):
            with anyio.fail_after(BOUND):
                await mine.wait_for_finished("none", LONG)  # subscribes, returns at once
                for i, value in enumerate([ARGS, "two", None]):
                    run = await client.start("carried.echo", value, id=f"r{i}")
                    before = reads.count
                    done = await client.wait(run.id, poll=LONG)
                    assert reads.count - before == 1
                    assert done.state is RunState.COMPLETED and done.result == value
                    assert done == await theirs.get_run(run.id)
                big = await client.start("carried.echo", BIG, id="big")
                before = reads.count
                assert (await client.wait(big.id, poll=LONG)).result == BIG
                assert reads.count - before == 2
    hub = _wake.hub(mine)
    assert hub.waited == {} and hub.told_runs == {}


@pg_only
async def test_postgres_a_carried_end_older_than_the_wait_s_read_is_not_taken(
        pg_url: str, registry: durable.Registry) -> None:
    """A NOTIFY is delivered when its listener reads it: one of a run's earlier end,
    pending while nobody waited, reaches a wait that began after the run was replayed. The
    wait read the run queued again, later than that end, so it reads again instead of
    returning the old end, and returns at the run's new end."""
    flows(registry)
    async with opened(pg_url) as mine, opened(pg_url) as theirs:
        waiter = durable.Client(mine, registry=registry)
        operator = durable.Client(theirs, registry=registry)
        reads = Reads(mine)
        with anyio.fail_after(BOUND):
            await mine.wait_for_finished("none", LONG)  # subscribes, returns at once
            run = await operator.start("carried.echo", 2, id="replayed", delay=3600)
            ended = await operator.cancel(run.id)  # its NOTIFY waits, unread, on ``mine``
            queued = await operator.replay(run.id)
            assert queued.state is RunState.QUEUED and queued.updated_at > ended.updated_at
            result: list[durable.Run] = []

            async def wait() -> None:
                result.append(await waiter.wait(run.id, poll=LONG))

            async with anyio.create_task_group() as tg:
                before = reads.count
                tg.start_soon(wait)
                # the first read, the old end's NOTIFY, and a read again after it
                await poll(lambda: reads.count - before >= 2)
                assert not result
                again = await operator.cancel(run.id)
        assert result == [again] and again.updated_at > ended.updated_at


@pg_only
async def test_postgres_workers_of_a_fleet_try_a_carried_run_once_each(
        pg_url: str, registry: durable.Registry) -> None:
    """Two workers on store objects of their own (as on two hosts), starts on a third:
    each start's NOTIFY wakes both, each tries the carried run once riding on its first
    write, one wins; the other drops its attempt and claims nothing more (the run went to
    another worker, and nothing else is known to be queued): no read, no plain claim, and
    nothing said above debug level."""
    flows(registry)
    async with opened(pg_url) as one, opened(pg_url) as two, opened(pg_url) as mine:
        counted = [Claims(one), Claims(two)]
        client = durable.Client(mine, registry=registry)
        with durable.testing.capture_logs() as logs, anyio.fail_after(BOUND):
            async with worker_on(one, registry), worker_on(two, registry):
                for i in range(2):  # the listeners' first subscriptions
                    await client.wait((await client.start("carried.echo", i, id=f"w{i}")).id,
                                      poll=LONG)
                # no claim half counted: one that lost sent before, returned after
                await poll(lambda: all(c.returned == c.started for c in counted))
                before = [(c.started, c.rides, c.reads, c.empty) for c in counted]
                for i in range(20):
                    run = await client.start("carried.echo", i, id=f"f{i}")
                    assert (await client.wait(run.id, poll=LONG)).result == i
        made = [(c.started - s, c.rides - r, c.reads - d, c.empty - e)
                for c, (s, r, d, e) in zip(counted, before, strict=True)]
    assert all(started == rides and reads == 0 for started, rides, reads, _ in made), made
    assert sum(rides - lost for _, rides, _, lost in made) == 20, made  # one win per run
    assert sum(lost for *_, lost in made) > 0, made  # and races lost
    # said at debug level only: a fleet's losers would log a line per worker per run
    dropped = [e for e in logs if e["event"] == "attempt_dropped"]
    assert len(dropped) >= sum(lost for *_, lost in made), made
    assert not [e for e in logs if e["event"] == "attempt_stopping"
                and e["reason"] != "shutdown"], dropped


# -- notifications that arrive together ---------------------------------------------------------
def notify_together(url: str, channel: str, payloads: list[str]) -> None:
    """Send ``payloads`` on ``channel`` from one transaction: the server delivers them at
    its commit, together, so a listener reads them in one read."""
    with connect_sync(url) as raw:
        raw.execute("SELECT " + ", ".join("pg_notify(%s, %s)" for _ in payloads),
                    [value for payload in payloads for value in (channel, payload)])


@pg_only
async def test_postgres_a_wait_for_a_run_whose_end_came_behind_another_in_one_read_returns(
        pg_url: str) -> None:
    """Two runs' ``durable_done`` NOTIFYs read together (one commit sent both): a wait for
    the second returns at once. (It waited out its poll: the read stopped at the first run's
    and the rest of what it had read was dropped with it.)"""
    async with opened(pg_url) as mine:
        schema = pg_url.rpartition("=")[2]
        with anyio.fail_after(BOUND):
            await mine.wait_for_finished("none", LONG)  # subscribes, returns at once
            notify_together(pg_url, channel_name(DONE_CHANNEL, schema),
                            [f"{schema} a", f"{schema} b"])
            await mine.wait_for_finished("b", LONG)
            await mine.wait_for_finished("a", LONG)  # kept: it came before


@pg_only
async def test_postgres_runs_created_together_are_all_carried_by_one_wake_up(
        pg_url: str, registry: durable.Registry) -> None:
    """The ``durable_work`` NOTIFYs of two runs sent together: both are carried (by one
    return when one read took both, the usual case). (It carried the first; the second was
    dropped with the rest of that read, and waited for the worker's poll.)"""
    flows(registry)
    async with opened(pg_url) as mine, opened(pg_url) as theirs:
        client = durable.Client(theirs, registry=registry)
        work = channel_name(CHANNEL, pg_url.rpartition("=")[2])  # this schema's only
        with anyio.fail_after(BOUND), connect_sync(pg_url) as spy:
            spy.execute(sql.SQL("LISTEN {}").format(sql.Identifier(work)))
            runs = [await client.start("carried.echo", i, id=f"t{i}") for i in range(2)]
            payloads: list[str] = []  # what the starts sent, to send it again
            for notify in spy.notifies(timeout=10):
                payloads.append(notify.payload)
                if len(payloads) == 2:
                    break
            assert len(payloads) == 2
            assert await mine.wait_for_work(LONG) is None  # subscribes, returns at once
            notify_together(pg_url, work, payloads)
            carried = list(await mine.wait_for_work(LONG) or ())
            if len(carried) < 2:  # the second came after the first read: kept for the next
                carried += await mine.wait_for_work(5) or ()
            assert carried == runs
