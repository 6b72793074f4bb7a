"""An asyncio event loop in a thread of its own, for a store whose driver needs asyncio
(psycopg's async API) when the caller runs on trio.

The store's code runs unchanged on that loop. A call from the caller's loop is started
there and awaited here; the outcome (a value or an exception) comes back as it was.

Cancellation crosses the threads as it would within one loop: a caller cancelled before
its call starts sends nothing; a caller cancelled while the call runs cancels it through an
anyio cancel scope on the store's loop (so the store's own shielded sections hold, as they
do for a caller on asyncio), and waits for it to end before its own cancel goes on. So when
a caller's cancelled await raises, its call is over: nothing of it runs after. A call that
had already ended when the cancel reached the store's loop (its answer on its way back)
returns its outcome, as an awaited call that returned does on asyncio; the caller's cancel
is raised at its next checkpoint.

The caller's context variables stay on its side: each call starts in an empty context
(the caller's says which event loop runs it, through sniffio: anyio on the store's loop
would take itself for trio).

The store's loop hands things back to the caller's loop with :meth:`LoopThread.to_caller`
(trio's ``run_sync_soon``: in order, without blocking the store's loop), and the caller
hands sync work to the store's loop with :meth:`LoopThread.soon`. Each way, what is handed
over before the other loop wakes crosses with one wake-up (``_Mailbox``): calls made at
once (a worker's concurrent runs) cost one thread hand-off each way, not one each.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio
from anyio.lowlevel import checkpoint_if_cancelled

from .._errors import StoreError

T = TypeVar("T")


class _Call:
    """One call's state, shared by the two threads (each field written by one of them)."""

    __slots__ = ("cancelled", "ended_first", "error", "finished", "scope", "value")

    def __init__(self, finished: anyio.Event) -> None:
        self.finished = finished  # the caller's
        self.scope: anyio.CancelScope | None = None  # the store loop's
        self.cancelled = False
        self.value: Any = None
        self.error: BaseException | None = None
        self.ended_first = False  # the store loop's: the call ended before any cancel came

    def cancel(self) -> None:
        """On the store's loop: cancel the call (before it starts, or while it runs)."""
        self.cancelled = True
        if self.scope is not None:
            self.scope.cancel()


class _Mailbox:
    """Callables handed to another thread's loop, run there in the order posted: one wake-up
    of that loop (a write to its wake-up socket, a thread woken) for as many as are posted
    before it runs them, so calls made at once cross together. The callables are the
    bridge's own and do not raise."""

    def __init__(self, wake: Callable[[Callable[[], None]], object]) -> None:
        self._wake = wake
        self._lock = threading.Lock()
        self._queue: list[tuple[Callable[..., object], tuple[Any, ...]]] = []
        self._posted = False

    def post(self, fn: Callable[..., object], *args: Any) -> None:
        with self._lock:
            self._queue.append((fn, args))
            if self._posted:
                return  # the wake-up on its way runs this one too
            self._posted = True
        try:
            self._wake(self._run)
        except BaseException:
            with self._lock:
                self._posted = False
            raise

    def _run(self) -> None:
        with self._lock:
            batch, self._queue = self._queue, []
            self._posted = False
        for fn, args in batch:
            fn(*args)


class LoopThread:
    """An asyncio loop in a daemon thread, serving calls from the trio loop that made it."""

    def __init__(self, name: str) -> None:
        import trio  # anyio's other loop; the caller runs on it

        self._token = trio.lowlevel.current_trio_token()
        self._run_finished: type[BaseException] = trio.RunFinishedError
        self.loop = asyncio.new_event_loop()
        self._tasks: set[asyncio.Task[None]] = set()  # the loop keeps only weak references
        self._calls: set[_Call] = set()  # started by the caller, not yet finished (its loop's)
        self._stopped = False
        self._to_loop = _Mailbox(self._wake_loop)
        self._to_caller = _Mailbox(self._token.run_sync_soon)
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()  # returns once the thread runs: its ident is known

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
            self.loop.run_until_complete(asyncio.sleep(0))  # calls queued before the stop
            tasks = asyncio.all_tasks(self.loop)  # a call left when the store was closed
            for task in tasks:
                task.cancel()
            if tasks:
                self.loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
        finally:
            self.loop.close()

    def _wake_loop(self, run: Callable[[], None]) -> None:
        self.loop.call_soon_threadsafe(run, context=contextvars.Context())  # (see above)

    def here(self) -> bool:
        """Whether the caller is the store's loop itself (a store method calling another)."""
        return threading.get_ident() == self._thread.ident

    async def call(self, fn: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
        """``await fn(*args, **kwargs)`` on the store's loop."""
        if self.here():
            return await fn(*args, **kwargs)
        await checkpoint_if_cancelled()  # a cancelled caller sends nothing
        call = _Call(anyio.Event())

        async def run() -> None:
            try:
                with anyio.CancelScope() as scope:
                    call.scope = scope
                    if call.cancelled:
                        scope.cancel()
                    call.value = await fn(*args, **kwargs)
            finally:
                call.ended_first = not call.cancelled

        def ended(task: asyncio.Task[None]) -> None:
            self._tasks.discard(task)
            if task.cancelled():  # the loop stopped under it (the store was closed)
                call.error = StoreError("the store was closed during the call")
            else:
                call.error = task.exception()  # raised on the caller's loop
            self.to_caller(call.finished.set)

        def start() -> None:
            task = self.loop.create_task(run())
            self._tasks.add(task)
            task.add_done_callback(ended)

        if self._stopped:
            raise StoreError("the store is not open")
        self._calls.add(call)
        try:
            try:
                self._to_loop.post(start)
            except RuntimeError as exc:  # the loop is closed
                raise StoreError("the store is not open") from exc
            try:
                await call.finished.wait()
            except BaseException as exc:  # the caller was cancelled: so is the call, and it
                # ends first
                self.soon(call.cancel)
                with anyio.CancelScope(shield=True):
                    await call.finished.wait()
                if not (call.ended_first and isinstance(exc, anyio.get_cancelled_exc_class())):
                    raise
                # It ended before the cancel reached it (its answer was on its way): its
                # outcome stands, as a call's on asyncio that returned before a cancel came
                # (a claim, a consumed signal are not lost); the cancel is raised at the
                # caller's next checkpoint.
        finally:
            self._calls.discard(call)
        if call.error is not None:
            raise call.error
        return call.value  # type: ignore[no-any-return]

    def to_caller(self, fn: Callable[..., object], *args: Any) -> None:
        """Run ``fn(*args)`` on the caller's loop, soon, in the order asked (from the store's
        loop: it does not wait)."""
        try:
            self._to_caller.post(fn, *args)
        except self._run_finished:  # the caller's loop has ended: nobody to tell
            pass

    def soon(self, fn: Callable[..., object], *args: Any) -> None:
        """Run ``fn(*args)`` on the store's loop, soon (from the caller's: it does not wait)."""
        try:
            self._to_loop.post(fn, *args)
        except RuntimeError:  # the loop is closed
            pass

    async def stop(self) -> None:
        """Stop the store's loop (its calls left are cancelled) and wait for its thread."""
        if self._stopped:
            return
        self._stopped = True
        self.soon(self.loop.stop)
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(self._thread.join)
        for call in list(self._calls):  # a call that raced the close and never started
            if not call.finished.is_set():
                call.error = StoreError("the store was closed during the call")
                call.finished.set()
