"""Interceptors: each hook wraps the engine's own call, in order, on asyncio and trio."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import anyio
import httpx
import pytest

import durable
import durable.testing
from durable import EntryKind, FakeClock, RunState
from durable._interceptors import Chain
from durable._types import Fence
from durable.interceptors import (
    AttemptInfo,
    ClaimInfo,
    RenewInfo,
    RequestInfo,
    StartInfo,
    StepInfo,
    WriteInfo,
)

from .helpers import died_in_step_one, given_away, poll, running_worker
from .httpserver import Rule, loopback_server

pytestmark = pytest.mark.anyio


class Recorder(durable.Interceptor):
    """Records every hook call as (name, phase, detail), shared between recorders."""

    def __init__(self, name: str, calls: list[tuple[str, ...]]) -> None:
        self.name = name
        self.calls = calls

    async def intercept_claim(self, info: ClaimInfo,
                              call_next: Callable[[], Awaitable[list[durable.Run]]]
                              ) -> list[durable.Run]:
        runs = await call_next()
        if runs:
            self.calls.append((self.name, "claim", info.worker_id, str(len(runs))))
        return runs

    async def intercept_attempt(self, info: AttemptInfo,
                                call_next: Callable[[], Awaitable[str]]) -> str:
        self.calls.append((self.name, "attempt>", info.run.id, str(info.run.attempt)))
        outcome = await call_next()
        self.calls.append((self.name, "attempt<", outcome))
        return outcome

    async def intercept_step(self, info: StepInfo,
                             call_next: Callable[[], Awaitable[Any]]) -> Any:
        self.calls.append((self.name, "step>", info.activity, str(info.step), info.step_key,
                           str(info.try_number)))
        try:
            result = await call_next()
        except Exception as exc:
            self.calls.append((self.name, "step!", type(exc).__name__))
            raise
        self.calls.append((self.name, "step<", repr(result)))
        return result

    async def intercept_request(
        self, info: RequestInfo, request: httpx.Request,
        call_next: Callable[[httpx.Request], Awaitable[httpx.Response]],
    ) -> httpx.Response:
        request.headers[f"x-seen-by-{self.name}"] = str(info.step)
        response = await call_next(request)
        self.calls.append((self.name, "request", request.method, str(response.status_code)))
        return response

    async def intercept_write(self, info: WriteInfo,
                              call_next: Callable[[], Awaitable[bool]]) -> bool:
        ok = await call_next()
        self.calls.append((self.name, "write", info.kind, str(info.entries), str(ok)))
        return ok


async def test_hooks_wrap_claim_attempt_step_write_and_request_in_order(
        client: durable.Client, registry: durable.Registry) -> None:
    calls: list[tuple[str, ...]] = []
    outer, inner = Recorder("outer", calls), Recorder("inner", calls)
    async with loopback_server() as server:
        server.on("/ping", Rule(status=200))

        @durable.activity(registry=registry, on_doubt="fail")
        async def ping(ctx: durable.ActivityContext) -> int:
            return (await ctx.http.get(f"{server.url}/ping")).status_code

        @durable.workflow("pinger", registry=registry)
        async def pinger(ctx: durable.WorkflowContext) -> int:
            return int(await ping(ctx))

        async with running_worker(client, registry, interceptors=[outer, inner]) as worker:
            await client.start("pinger", id="p")
            assert (await client.wait("p")).result == 200
        [seen] = server.seen("/ping")
    assert seen.headers["x-seen-by-outer"] == seen.headers["x-seen-by-inner"] == "1"
    w = worker.worker_id
    assert calls == [
        ("inner", "claim", w, "1"), ("outer", "claim", w, "1"),
        ("outer", "attempt>", "p", "1"), ("inner", "attempt>", "p", "1"),
        ("inner", "write", "append", "1", "True"), ("outer", "write", "append", "1", "True"),
        ("outer", "step>", ping.name, "1", "1", "1"), ("inner", "step>", ping.name, "1", "1", "1"),
        ("inner", "request", "GET", "200"), ("outer", "request", "GET", "200"),
        ("inner", "step<", "200"), ("outer", "step<", "200"),
        ("inner", "write", "append", "1", "True"), ("outer", "write", "append", "1", "True"),
        ("inner", "write", "finish", "1", "True"), ("outer", "write", "finish", "1", "True"),
        ("inner", "attempt<", "completed"), ("outer", "attempt<", "completed"),
    ]


async def test_step_hook_sees_each_try_and_the_error(client: durable.Client,
                                                     registry: durable.Registry) -> None:
    calls: list[tuple[str, ...]] = []
    tries = 0

    @durable.activity(registry=registry, retry=durable.RetryPolicy(max_tries=2, initial_delay=0))
    async def flaky(ctx: durable.ActivityContext) -> str:
        nonlocal tries
        tries += 1
        if tries == 1:
            raise RuntimeError("first try fails")
        return "ok"

    @durable.workflow("flaky", registry=registry)
    async def flow(ctx: durable.WorkflowContext) -> str:
        return str(await flaky(ctx))

    async with running_worker(client, registry, interceptors=[Recorder("r", calls)]):
        await client.start("flaky", id="f")
        assert (await client.wait("f")).state is RunState.COMPLETED
    steps = [c[1:] for c in calls if c[1].startswith("step")]
    assert steps == [("step>", flaky.name, "1", "1", "1"), ("step!", "RuntimeError"),
                     ("step>", flaky.name, "1", "1", "2"), ("step<", "'ok'")]


async def test_counters_count_claims_attempts_tries_and_requests(
        client: durable.Client, registry: durable.Registry) -> None:
    async with loopback_server() as server:
        server.on("/x", Rule(status=204))

        @durable.activity(registry=registry)
        async def touch(ctx: durable.ActivityContext) -> None:
            await ctx.http.post(f"{server.url}/x")

        @durable.workflow("toucher", registry=registry)
        async def toucher(ctx: durable.WorkflowContext) -> None:
            await touch(ctx)
            await touch(ctx)

        counters = durable.Counters()
        async with running_worker(client, registry, interceptors=[counters],
                                  heartbeat_interval=0.02):
            for i in range(3):
                await client.start("toucher", id=f"t{i}")
            for i in range(3):
                await client.wait(f"t{i}")
            await poll(lambda: counters.attempts_ended == 3)
    assert counters.claimed == 3 and counters.claims >= 1
    assert counters.attempts == {"completed": 3}
    assert counters.tries == 6 and counters.requests == 6 == len(server.seen("/x"))
    assert counters.writes >= 3  # the finishes, at least (idempotent steps ride along)
    assert counters.leases_lost == counters.recovered == counters.in_doubt == 0


class Events(durable.Interceptor):
    def __init__(self) -> None:
        self.lost: list[tuple[str, str]] = []
        self.recovered: list[tuple[list[Fence], str]] = []
        self.in_doubt: list[StepInfo] = []
        self.renewals: list[int] = []

    async def intercept_renew(self, info: RenewInfo,
                              call_next: Callable[[], Awaitable[list[Any]]]) -> list[Any]:
        held = await call_next()
        self.renewals.append(len(held))
        return held

    def on_lease_lost(self, info: AttemptInfo, reason: str) -> None:
        self.lost.append((info.run.id, reason))

    def on_recovered(self, fences: Sequence[Fence], by: str) -> None:
        self.recovered.append((list(fences), by))

    def on_step_in_doubt(self, info: StepInfo) -> None:
        self.in_doubt.append(info)


async def test_events_recovery_step_in_doubt_and_lost_lease(
        fclient: durable.Client, registry: durable.Registry, clock: FakeClock) -> None:
    gate = anyio.Event()
    entered = anyio.Event()

    @durable.activity(registry=registry)
    async def wipe(ctx: durable.ActivityContext) -> str:
        return "wiped"

    @durable.activity(registry=registry)
    async def hold(ctx: durable.ActivityContext) -> None:
        entered.set()
        await gate.wait()

    @durable.workflow("wiper", registry=registry)
    async def wiper(ctx: durable.WorkflowContext) -> str:
        return str(await wipe(ctx))

    @durable.workflow("holder", registry=registry)
    async def holder(ctx: durable.WorkflowContext) -> None:
        await hold(ctx)

    run = await died_in_step_one(fclient, "wiper", "w", wipe.name)
    clock.advance(31.0)  # its lease expires on the store's clock
    events = Events()
    async with running_worker(fclient, registry, interceptors=[events], lease=30.0,
                              heartbeat_interval=20.0, sweep_interval=0.02) as worker:
        await poll(lambda: events.recovered)  # by the sweep (a client's read would too)
        assert (await fclient.wait("w")).result == "wiped"
        assert events.recovered == [([Fence("w", run.epoch)], "sweep")]
        [doubt] = events.in_doubt
        assert (doubt.run.id, doubt.step, doubt.activity, doubt.try_number) == (
            "w", 1, wipe.name, 1)
        # a held run whose lease the store gave away: the next renewal does not hold it
        await fclient.start("holder", id="h")
        await entered.wait()
        [held] = [a for a in worker.active.values() if a.run.id == "h"]
        await worker.renew_now()
        assert events.renewals[-1] == 1 and events.lost == []
        clock.advance(31.0)
        await poll(lambda: given_away(fclient.store, "h", held.fence.epoch))
        await worker.renew_now()
        assert events.lost == [("h", "lease lost (the renewal did not hold)")]
        assert held.lost
        gate.set()


async def test_start_headers_are_kept_with_the_run_for_the_attempt(
        client: durable.Client, registry: durable.Registry) -> None:
    class Stamp(durable.Interceptor):
        def on_start(self, info: StartInfo) -> None:
            info.headers["traceparent"] = f"00-{'ab' * 16}-{'cd' * 8}-01"

    seen: list[dict[str, str]] = []

    class Read(durable.Interceptor):
        async def intercept_attempt(self, info: AttemptInfo,
                                    call_next: Callable[[], Awaitable[str]]) -> str:
            seen.append(dict(await info.headers()))
            return await call_next()

    @durable.workflow("stamped", registry=registry)
    async def stamped(ctx: durable.WorkflowContext) -> None:
        return None

    stamping = durable.Client(client.store, registry=registry, interceptors=[Stamp()])
    await stamping.start("stamped", id="s1")
    await client.start("stamped", id="s2")  # no interceptor: no headers
    async with running_worker(client, registry, interceptors=[Read()]):
        await client.wait("s1")
        await client.wait("s2")
    created = (await client.journal("s1"))[0]
    assert created.kind is EntryKind.RUN_CREATED
    assert created.data["headers"] == {"traceparent": f"00-{'ab' * 16}-{'cd' * 8}-01"}
    assert "headers" not in (await client.journal("s2"))[0].data
    assert sorted(seen, key=len) == [{}, {"traceparent": f"00-{'ab' * 16}-{'cd' * 8}-01"}]


async def test_a_failing_event_hook_is_logged_and_the_run_goes_on(
        client: durable.Client, registry: durable.Registry) -> None:
    class Broken(durable.Interceptor):
        def on_start(self, info: StartInfo) -> None:
            raise RuntimeError("broken hook")

    @durable.workflow("plain", registry=registry)
    async def plain(ctx: durable.WorkflowContext) -> str:
        return "fine"

    broken = durable.Client(client.store, registry=registry, interceptors=[Broken()])
    with durable.testing.capture_logs() as logs:
        await broken.start("plain", id="b")
    [failed] = [e for e in logs if e["event"] == "interceptor_failed"]
    assert "broken hook" in failed["error"]
    async with running_worker(client, registry):
        assert (await client.wait("b")).result == "fine"


def test_no_interceptors_means_no_chain_and_a_non_interceptor_is_refused() -> None:
    assert Chain.of([]) is None and Chain.of(None) is None
    chain = Chain.of([durable.Counters(), durable.Interceptor()])
    assert chain is not None
    assert len(chain.claim) == 1 and len(chain.step) == 1  # the base class adds no hop
    assert chain.start == ()  # nobody overrides on_start: the client calls nothing
    with pytest.raises(durable.ConfigError, match="not an interceptor"):
        Chain.of([object()])


async def test_a_lease_lost_inside_the_attempt_is_told_once(
        client: durable.Client, registry: durable.Registry) -> None:
    @durable.activity(registry=registry)
    async def superseded(ctx: durable.ActivityContext) -> None:
        raise durable.LeaseLostError("a newer attempt holds this resource")

    @durable.workflow("superseded", registry=registry)
    async def flow(ctx: durable.WorkflowContext) -> None:
        await superseded(ctx)

    events, counters = Events(), durable.Counters()
    async with running_worker(client, registry, interceptors=[events, counters]):
        await client.start("superseded", id="x")
        await poll(lambda: counters.attempts_ended == 1)
    assert counters.attempts == {"abandoned": 1} and counters.leases_lost == 1
    assert events.lost == [("x", "a newer attempt holds this resource")]


async def test_a_step_hook_keeps_the_activity_s_timeout_and_its_call_in_flight_is_aborted(
        client: durable.Client, registry: durable.Registry) -> None:
    """With a step interceptor the try runs through the hook, under the activity's timeout
    all the same: the request in flight is aborted when it passes, and no code after it
    runs."""
    after: list[str] = []
    async with loopback_server() as server:
        server.on("/push", Rule(hang=True))

        @durable.activity(registry=registry, timeout=0.3, retry=durable.RetryPolicy(max_tries=1))
        async def force_push(ctx: durable.ActivityContext) -> None:
            await ctx.http.post(f"{server.url}/push")
            after.append("code after the request ran")

        @durable.workflow("pushing", registry=registry)
        async def pushing(ctx: durable.WorkflowContext) -> None:
            await force_push(ctx)

        calls: list[tuple[str, ...]] = []
        async with running_worker(client, registry, interceptors=[Recorder("r", calls)]):
            await client.start("pushing", id="t")
            done = await client.wait("t", timeout=10)
            [seen] = server.seen("/push")
            await server.wait_for(lambda: seen.disconnected_at is not None)
    assert after == []
    assert done.state is RunState.FAILED
    assert done.error is not None and "timed out after 0.3 s" in done.error
    assert ("r", "step!", "TimeoutError") in calls  # the hook saw the try time out
