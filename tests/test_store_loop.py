"""The PostgreSQL store on trio: an asyncio loop in a thread of its own (durable/store/_loop.py).

psycopg's async driver needs an asyncio loop, so a store opened on trio runs its code on one,
in a thread, and each public method called from trio runs there. The loop thread's own
guarantees are tested here with a trio caller (the only caller it serves: on asyncio the
store runs on the caller's loop, which the last test pins): the outcome comes back as it was,
a cancelled caller sends nothing, a caller cancelled mid-call returns only once the call is
over (the store's shielded work included), and a closed loop refuses calls instead of
leaving them waiting. The store-level tests open the real store on the machine's
PostgreSQL; the whole store contract runs on trio too (tests/test_store_contract.py).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

import anyio
import anyio.lowlevel
import pytest
import sniffio

from durable._errors import StoreError, StoreUnavailableError
from durable._types import NewRun, RunState
from durable.store import store_from_url
from durable.store._loop import LoopThread, _Mailbox

from .pg import pg_url, postgres_server

__all__ = ["pg_url", "postgres_server"]  # fixtures, used by name

pytestmark = pytest.mark.anyio
trio_caller = pytest.mark.parametrize("anyio_backend", ["trio"])  # the loop thread's caller


def loop_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("durable-postgres:")]


@trio_caller
async def test_a_call_runs_on_the_asyncio_loop_of_its_thread_and_its_outcome_comes_back(
) -> None:
    bridge = LoopThread("test-loop")
    try:
        async def where(x: int) -> tuple[str, int, int]:
            await asyncio.sleep(0)
            return sniffio.current_async_library(), threading.get_ident(), x * 2

        library, ident, doubled = await bridge.call(where, 21)
        assert (library, doubled) == ("asyncio", 42)
        assert ident != threading.get_ident()
        with anyio.fail_after(30):  # calls one after another, and many at once, all answered
            assert [await bridge.call(where, n) for n in range(3)] == [
                ("asyncio", ident, 2 * n) for n in range(3)]
            answers: dict[int, int] = {}

            async def one(n: int) -> None:
                answers[n] = (await bridge.call(where, n))[2]

            async with anyio.create_task_group() as tg:
                for n in range(200):
                    tg.start_soon(one, n)
            assert answers == {n: 2 * n for n in range(200)}

        async def refuses() -> None:
            raise StoreUnavailableError("the server went away")

        with pytest.raises(StoreUnavailableError, match="the server went away"):
            await bridge.call(refuses)
    finally:
        await bridge.stop()


def test_callables_posted_before_the_other_loop_wakes_cross_with_one_wake_up() -> None:
    """The mailbox each way: one wake-up for all that queue up before it runs them, all of
    them run, in order, and a post after that wakes the other loop again."""
    wakes: list[Callable[[], None]] = []
    ran: list[str] = []
    box = _Mailbox(wakes.append)  # the other loop: runs what it was woken with, when told
    for name in ("a", "b", "c"):
        box.post(ran.append, name)
    assert len(wakes) == 1 and ran == []
    wakes.pop()()
    assert ran == ["a", "b", "c"]
    box.post(ran.append, "d")
    assert len(wakes) == 1  # woken again
    wakes.pop()()
    assert ran == ["a", "b", "c", "d"]


@trio_caller
async def test_a_caller_already_cancelled_sends_nothing() -> None:
    bridge = LoopThread("test-loop")
    ran: list[str] = []

    async def write() -> None:
        ran.append("sent")  # before any await: it would run if the call were started

    try:
        with anyio.CancelScope() as scope:
            scope.cancel()
            await bridge.call(write)
        assert scope.cancelled_caught
        async def after() -> str:
            return "after"

        assert await bridge.call(after) == "after"  # the loop went on
        assert ran == []
    finally:
        await bridge.stop()


@trio_caller
async def test_a_caller_cancelled_mid_call_returns_only_once_the_call_is_over() -> None:
    """The call is cancelled on the store's loop through an anyio scope: its shielded
    cleanup runs to its end, and the caller's cancelled await raises only after it."""
    bridge = LoopThread("test-loop")
    began = anyio.Event()
    seen: list[str] = []

    async def held() -> None:
        bridge.to_caller(began.set)
        try:
            await asyncio.sleep(10)  # the work in flight (a statement): cut off, not awaited
        except asyncio.CancelledError:
            seen.append("cancelled on the store's loop")
            raise
        finally:
            with anyio.CancelScope(shield=True):  # as the store closes a connection
                await anyio.sleep(0.2)
                seen.append("cleaned up")

    try:
        with anyio.CancelScope() as scope:
            async with anyio.create_task_group() as tg:
                async def cancel_once_begun() -> None:
                    await began.wait()
                    scope.cancel()

                tg.start_soon(cancel_once_begun)
                await bridge.call(held)
                seen.append("the call returned")  # never: it was cancelled
        seen.append("cancelled")
        assert scope.cancelled_caught
        assert seen == ["cancelled on the store's loop", "cleaned up", "cancelled"]
    finally:
        await bridge.stop()


@trio_caller
async def test_a_call_that_ended_before_the_cancel_reached_it_keeps_its_outcome() -> None:
    """The call ends on the store's loop, and the caller is cancelled before its answer is
    taken: the outcome stands (a claim or a consumed signal is not lost), as on asyncio,
    where a call that returned is not undone by a cancel that comes after it; the cancel
    comes at the caller's next checkpoint."""
    bridge = LoopThread("test-loop")
    try:
        with anyio.CancelScope() as scope:
            async def claims_as_the_caller_is_cancelled() -> str:
                bridge.to_caller(scope.cancel)  # handed over before the answer
                return "claimed"

            got = await bridge.call(claims_as_the_caller_is_cancelled)
            assert got == "claimed"
            assert scope.cancel_called
            await anyio.lowlevel.checkpoint()  # the next checkpoint
            got = "went on"  # never: the cancel was raised there
        assert scope.cancelled_caught and got == "claimed"
    finally:
        await bridge.stop()


@trio_caller
async def test_a_call_to_a_stopped_loop_is_refused_and_the_thread_is_gone() -> None:
    bridge = LoopThread("test-loop-stopped")
    await bridge.stop()
    assert "test-loop-stopped" not in [t.name for t in threading.enumerate()]
    with pytest.raises(StoreError, match="not open"):
        await bridge.call(asyncio.sleep, 0)
    assert bridge._to_loop._queue == []  # refused before anything was handed over
    await bridge.stop()  # twice is harmless


async def test_postgres_opened_on_trio_runs_on_a_loop_thread_of_its_own_until_closed(
        pg_url: str, anyio_backend: str) -> None:
    assert loop_threads() == []
    store = store_from_url(pg_url)
    await store.open()
    try:
        expected = [f"durable-postgres:{pg_url.rpartition('=')[2]}"]
        assert loop_threads() == (expected if anyio_backend == "trio" else [])
        run, created = await store.create_run(NewRun("r1", "wf", [1], None, None))
        assert created and run.state is RunState.QUEUED
        got = await store.get_run("r1")
        assert got is not None and got.id == "r1"
        with anyio.fail_after(20):  # a cancel ends the long wait on the store's loop
            with anyio.move_on_after(0.3) as waited:  # the first call subscribes, returns
                while True:
                    await store.wait_for_work(30)
        assert waited.cancelled_caught
    finally:
        await store.aclose()
    assert loop_threads() == []
    with pytest.raises(StoreError, match="not open"):
        await store.get_run("r1")
