"""A store write known not to have been sent is tried again within the lease (issue 8 #8).

A ``NotSentError`` (no pooled connection within the pool timeout, SQLite busy past its wait)
means nothing was written, so the attempt tries the same write again while it holds its
lease, instead of abandoning the run and leaving a completed non-idempotent step in doubt.
Any other store error leaves the outcome unknown: the attempt stops there.

The store here is the real SQLite store with its first writes failing as ``NotSentError``
before they reach the database: producing that condition for real (a pool starved at the
exact write, or a lock held past a 30 s busy wait) cannot be timed deterministically.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import anyio
import pytest

import durable
from durable import EntryKind, RunState
from durable._types import Fence, JournalWrite, NewRun
from durable.store._sqlite import SqliteStore

from .helpers import running_worker

pytestmark = pytest.mark.anyio


class FlakyStore(SqliteStore):
    """The first ``fail`` appends and finishes raise ``error`` without touching the file.
    Its runs are claimed by the plain claim statement, so the first write that can fail is
    the step's ``step_started`` (a claim riding on that write, and its lost answer:
    tests/test_claim_rides.py, tests/test_postgres_faults.py)."""

    claims_ride_on_writes = False

    def __init__(self, path: str, error: type[durable.StoreError], fail: int) -> None:
        super().__init__(path)
        self.error, self.fail, self.refused = error, fail, 0

    def _maybe_fail(self) -> None:
        if self.refused < self.fail:
            self.refused += 1
            raise self.error("no connection could be had within the pool timeout")

    async def append(self, fence: Fence, entries: Sequence[JournalWrite]) -> bool:
        self._maybe_fail()
        return await super().append(fence, entries)

    async def finish(self, fence: Fence, state: RunState, **kw: object) -> bool:
        self._maybe_fail()
        return await super().finish(fence, state, **kw)  # type: ignore[arg-type]


def workflow_once(registry: durable.Registry, calls: list[int]) -> None:
    @durable.activity("ns.create", registry=registry, on_doubt="fail")
    async def create(ctx: durable.ActivityContext) -> str:
        calls.append(ctx.try_number)
        return "created"

    @durable.workflow("ns.flow", registry=registry)
    async def flow(ctx: durable.WorkflowContext) -> str:
        return str(await create(ctx))


async def run_on(store: FlakyStore) -> tuple[durable.Run, list[int], list[str]]:
    """Start one run with a worker on ``store``; return it once the worker is done with it:
    finished, or (the attempt stopped) no longer held by the worker."""
    registry = durable.Registry()
    calls: list[int] = []
    workflow_once(registry, calls)
    await store.open()
    try:
        client = durable.Client(store, registry=registry)
        # a lease long enough that a loaded machine cannot let it lapse during the retries
        async with running_worker(client, registry, lease=15) as worker:
            await client.start("ns.flow", id="r1")
            with anyio.fail_after(20):  # a bounded poll
                while True:
                    # whether the worker is done with it, seen before the run is read: an
                    # attempt that ends between a read and this check would leave the read
                    # stale (a finished run read as running)
                    done = store.refused >= store.fail and not worker.active
                    run = await client.get("r1")
                    if run.state.finished or done:
                        break
                    await anyio.sleep(0.02)
        kinds = [e.kind.value for e in await store.journal("r1")]
    finally:
        await store.aclose()
    return run, calls, kinds


async def test_a_write_that_was_not_sent_is_tried_again_within_the_lease(
        tmp_path: Path) -> None:
    store = FlakyStore(str(tmp_path / "d.db"), durable.NotSentError, fail=4)
    run, calls, kinds = await run_on(store)
    assert store.refused == 4
    assert run.state is RunState.COMPLETED and run.attempt == 1, run
    assert calls == [1]  # the non-idempotent step ran once, and is not in doubt
    assert kinds.count(EntryKind.STEP_COMPLETED.value) == 1
    assert EntryKind.STEP_IN_DOUBT.value not in kinds
    assert EntryKind.RUN_RECOVERED.value not in kinds


async def test_a_write_whose_outcome_is_unknown_stops_the_attempt(tmp_path: Path) -> None:
    store = FlakyStore(str(tmp_path / "d.db"), durable.StoreUnavailableError, fail=1)
    run, calls, kinds = await run_on(store)
    assert run.state is RunState.RUNNING  # left to recovery, on its lease
    assert calls == []  # its step_started write failed: the step never ran
    assert EntryKind.STEP_STARTED.value not in kinds


class UnsentStartStore(SqliteStore):
    """Its first ``create_run`` raises :class:`durable.NotSentError` without touching the
    file (as a pool starved at that write would), and counts every call."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.creates = 0

    async def create_run(self, new: NewRun) -> tuple[durable.Run, bool]:
        self.creates += 1
        if self.creates == 1:
            raise durable.NotSentError("no connection could be had within the pool timeout")
        return await super().create_run(new)


async def test_a_client_write_that_was_not_sent_is_not_sent_again_but_said(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A lost answer is read back or sent again (``answered``); a write known not to have
    been sent is neither: the caller gets :class:`durable.NotSentError` (nothing happened,
    it may start the run again), and no outcome-unknown warning is logged."""
    store = UnsentStartStore(str(tmp_path / "d.db"))
    registry = durable.Registry()
    workflow_once(registry, [])
    await store.open()
    try:
        client = durable.Client(store, registry=registry)
        with caplog.at_level("WARNING", logger="durable"), \
                pytest.raises(durable.NotSentError):
            await client.start("ns.flow", id="r1")
        assert store.creates == 1  # not sent again
        assert await store.get_run("r1") is None
        assert "start_outcome_unknown" not in caplog.text
    finally:
        await store.aclose()
