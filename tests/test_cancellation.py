"""Timeouts, cancels and lost leases cancel for real: into the in-flight HTTP request.

The promise-race incident: a timeout that only stopped *waiting* let the abandoned task go on
deleting and force-pushing. Here the server must see the connection close, and no code after
the cancelled await, nor any later step, may run.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

import activities.git
import durable
from durable import RunState
from durable._attempt import Attempt
from durable._clock import FakeClock
from durable._interceptors import Chain
from durable._pool import WorkerTransport
from durable._types import JSON, EntryKind, Fence, Renewal
from durable.store._sqlite import SqliteStore

from .githttp import commit, git, git_http_server
from .helpers import kinds, poll, running_worker, tcp_queues
from .httpserver import Rule, loopback_server

pytestmark = pytest.mark.anyio


async def test_activity_timeout_aborts_the_request_in_flight(
        client: durable.Client, registry: durable.Registry) -> None:
    after: list[str] = []
    async with loopback_server() as server:
        server.on("/push", Rule(hang=True))

        @durable.activity(registry=registry, timeout=0.3, retry=durable.RetryPolicy(max_tries=1))
        async def force_push(ctx: durable.ActivityContext) -> None:
            await ctx.http.post(f"{server.url}/push")
            after.append("code after the request ran")

        @durable.activity(registry=registry)
        async def mark_vacant(ctx: durable.ActivityContext) -> None:
            after.append("next step ran")

        @durable.workflow("reset", registry=registry)
        async def reset(ctx: durable.WorkflowContext) -> None:
            await force_push(ctx)
            await mark_vacant(ctx)

        async with running_worker(client, registry):
            await client.start("reset", id="t1")
            done = await client.wait("t1")
            [seen] = server.seen("/push")
            await server.wait_for(lambda: seen.disconnected_at is not None)
    assert after == []
    assert done.state is RunState.FAILED
    assert done.error is not None and "timed out after 0.3 s" in done.error
    assert seen.disconnected_at is not None
    # the 0.3 s run from the try's start, before the request was sent: on a loaded machine
    # the connect and send take part of it, so the server holds the request a little less
    assert 0.15 <= seen.disconnected_at - seen.arrived < 2.0
    journal = await client.journal("t1")
    assert [e.name for e in journal if e.kind.value == "step_started"] == [force_push.name]


async def test_operator_cancel_reaches_the_request_in_flight(
        client: durable.Client, registry: durable.Registry) -> None:
    after: list[str] = []
    async with loopback_server() as server:
        server.on("/delete", Rule(hang=True))

        @durable.activity(registry=registry)
        async def delete_volume(ctx: durable.ActivityContext) -> None:
            await ctx.http.delete(f"{server.url}/delete")
            after.append("after")

        @durable.workflow("teardown", registry=registry)
        async def teardown(ctx: durable.WorkflowContext) -> None:
            try:
                await delete_volume(ctx)
            except Exception:  # a user's broad except must not swallow the cancel
                after.append("except ran")
            after.append("workflow went on")

        async with running_worker(client, registry, lease=3.0):
            await client.start("teardown", id="c1")
            await server.wait_for(lambda: len(server.seen("/delete")) == 1)
            await client.cancel("c1")
            done = await client.wait("c1")
            [seen] = server.seen("/delete")
            await server.wait_for(lambda: seen.disconnected_at is not None)
    assert done.state is RunState.CANCELLED
    assert after == []
    journal = await client.journal("c1")
    assert "run_cancel_requested" in kinds(journal)
    assert kinds(journal)[-2:] == ["step_in_doubt", "run_cancelled"]


async def test_workflow_deadline_cancels_the_run(client: durable.Client,
                                                 registry: durable.Registry) -> None:
    async with loopback_server() as server:
        server.on("/slow", Rule(hang=True))

        @durable.activity(registry=registry)
        async def slow(ctx: durable.ActivityContext) -> None:
            await ctx.http.get(f"{server.url}/slow")

        @durable.workflow("bounded", registry=registry, timeout=0.3)
        async def bounded(ctx: durable.WorkflowContext) -> None:
            await slow(ctx)

        async with running_worker(client, registry):
            await client.start("bounded", id="w1")
            done = await client.wait("w1")
            [seen] = server.seen("/slow")
            await server.wait_for(lambda: seen.disconnected_at is not None)
    assert done.state is RunState.FAILED
    assert done.error is not None and "workflow timed out after 0.3 s" in done.error


async def test_a_run_s_own_timeout_cancels_it_before_the_workflow_s(
        client: durable.Client, registry: durable.Registry) -> None:
    """``start(timeout=)`` bounds that run, in place of its workflow's timeout: the request
    in flight is aborted when the run's time is up, not the workflow's."""
    async with loopback_server() as server:
        server.on("/slow", Rule(hang=True))

        @durable.activity(registry=registry)
        async def slow(ctx: durable.ActivityContext) -> None:
            await ctx.http.get(f"{server.url}/slow")

        @durable.workflow("patient", registry=registry, timeout=60)
        async def patient(ctx: durable.WorkflowContext) -> None:
            await slow(ctx)

        async with running_worker(client, registry):
            await client.start("patient", id="w2", timeout=0.3)
            done = await client.wait("w2", timeout=10)
            [seen] = server.seen("/slow")
            await server.wait_for(lambda: seen.disconnected_at is not None)
    assert done.state is RunState.FAILED
    assert done.error is not None and "workflow timed out after 0.3 s" in done.error


class RenewalsFail(SqliteStore):
    """A real SQLite store whose lease renewals cannot reach the database (fault injection)."""

    async def renew(self, worker: str, held: Sequence[Fence], lease: float,
                    details: Mapping[str, JSON] | None = None) -> list[Renewal]:
        raise durable.StoreUnavailableError("database unreachable (injected)")


async def test_failed_renewals_cancel_the_attempt_before_the_lease_expires(
        tmp_path: Path, registry: durable.Registry) -> None:
    store = RenewalsFail(str(tmp_path / "l.db"))
    await store.open()
    client = durable.Client(store, registry=registry)
    try:
        async with loopback_server() as server:
            server.on("/push", Rule(hang=True))

            @durable.activity(registry=registry)
            async def push(ctx: durable.ActivityContext) -> None:
                await ctx.http.post(f"{server.url}/push")

            @durable.workflow("pushing", registry=registry)
            async def pushing(ctx: durable.WorkflowContext) -> None:
                await push(ctx)

            async with running_worker(client, registry, lease=0.6):
                await client.start("pushing", id="p1")
                await server.wait_for(lambda: len(server.seen("/push")) == 1)
                run = await store.get_run("p1")
                assert run is not None and run.lease_expires_at is not None
                [seen] = server.seen("/push")
                await server.wait_for(lambda: seen.disconnected_at is not None)
                # the in-flight call was aborted before anyone else could claim the run
                assert seen.disconnected_at is not None
                assert seen.disconnected_at < run.lease_expires_at
                await poll(lambda: client.get("p1"), timeout=5)
                # recovered (its queued moment can be too short to see: an idle worker is
                # woken by the change and claims it again at once)
                recovered = await poll(lambda: _was_recovered(store, "p1"), timeout=5)
                assert recovered
    finally:
        await store.aclose()


async def _was_recovered(store: SqliteStore, run_id: str) -> bool:
    return any(e.kind is EntryKind.RUN_RECOVERED for e in await store.journal(run_id))


async def _state_is(client: durable.Client, run_id: str, state: RunState) -> bool:
    return (await client.get(run_id)).state is state


async def claimed_attempt(client: durable.Client, registry: durable.Registry, workflow: str,
                          run_id: str, lease: float) -> tuple[durable.Run, Attempt]:
    """Start ``workflow`` as ``run_id``, claim it as ``worker-a`` and make its attempt, with
    no worker around it: nothing renews its lease, and the test takes the run over by hand."""
    await client.start(workflow, id=run_id)
    [run] = await client.store.claim("worker-a", lease, 1)
    return run, Attempt(client.store, run, registry, lease=lease,
                        lease_sent_at=anyio.current_time())


async def test_a_superseded_attempt_can_send_and_write_nothing(
        tmp_path: Path, registry: durable.Registry) -> None:
    """Code that outlives its lease (shielded, or in a thread) is refused at every door."""
    url = f"sqlite:///{tmp_path / 's.db'}"
    takeover = anyio.Event()
    outcome: dict[str, str] = {}
    async with (
        durable.Client.connect(url, registry=registry) as client,
        loopback_server() as server,
    ):

        @durable.activity(registry=registry)
        async def stubborn(ctx: durable.ActivityContext) -> None:
            with anyio.CancelScope(shield=True):  # like code in a thread: not interruptible
                await takeover.wait()
                try:
                    await ctx.http.post(f"{server.url}/after-takeover")
                except durable.LeaseLostError:
                    outcome["http"] = "refused"
                try:
                    await ctx.assert_still_mine()
                except durable.LeaseLostError:
                    outcome["assert"] = "refused"

        @durable.workflow("stubborn", registry=registry)
        async def wf(ctx: durable.WorkflowContext) -> None:
            await stubborn(ctx)

        run, attempt = await claimed_attempt(client, registry, "stubborn", "s1", 0.3)
        async with anyio.create_task_group() as tg:
            tg.start_soon(attempt.execute)
            # nobody renews worker-a's lease: wait for it to lapse, then take over
            fences = await poll(lambda: client.store.recover_stale("s1", run.epoch), timeout=5)
            assert fences
            [newer] = await client.store.claim("worker-b", 30, 1)
            assert newer.epoch > run.epoch
            takeover.set()
        assert outcome == {"http": "refused", "assert": "refused"}
        assert server.seen("/after-takeover") == []
        journal = await client.journal("s1")
        late = [e for e in journal if e.epoch == run.epoch and e.seq > max(
            x.seq for x in journal if x.kind.value == "run_recovered")]
        assert late == []
        final = await client.get("s1")
        assert final.state is RunState.RUNNING and final.epoch == newer.epoch


async def test_an_attempt_whose_write_was_refused_sends_nothing_though_its_local_lease_holds(
        tmp_path: Path, registry: durable.Registry) -> None:
    """A refused journal write tells the attempt it lost the run (another worker took it
    over) before its local deadline passes: from then on its requests are refused, also
    from code that outlives the cancel (shielded, or in a thread). The store's clock is
    moved past the lease, the local one is not, so only the loss can refuse the request."""
    clock = FakeClock()
    url = f"sqlite:///{tmp_path / 's.db'}"
    inside, done_a, go = anyio.Event(), anyio.Event(), anyio.Event()
    outcome: dict[str, str] = {}
    async with (
        durable.Client.connect(url, registry=registry, clock=clock) as client,
        loopback_server() as server,
    ):

        @durable.activity(registry=registry, on_doubt="fail")  # its end is written at once
        async def quick(ctx: durable.ActivityContext) -> str:
            await done_a.wait()
            return "a"

        @durable.activity(registry=registry)
        async def stubborn(ctx: durable.ActivityContext) -> None:
            with anyio.CancelScope(shield=True):  # like code in a thread: not interruptible
                inside.set()
                await go.wait()
                try:
                    ctx.check_lease()
                except durable.LeaseLostError:
                    outcome["check"] = "refused"
                try:
                    await ctx.http.post(f"{server.url}/after-the-refusal")
                except durable.LeaseLostError:
                    outcome["http"] = "refused"

        @durable.workflow("two", registry=registry)
        async def wf(ctx: durable.WorkflowContext) -> None:
            async with anyio.create_task_group() as tg:
                tg.start_soon(lambda: ctx.step(stubborn, key="b"))
                await inside.wait()
                await ctx.step(quick, key="a")

        run, attempt = await claimed_attempt(client, registry, "two", "t1", 30)
        async with anyio.create_task_group() as tg:
            tg.start_soon(attempt.execute)
            await poll(lambda: _journaled_step(client.store, "t1", "a"))
            clock.advance(31)  # the database's lease ran out; another worker takes the run
            assert await client.store.recover_stale("t1", run.epoch)
            [newer] = await client.store.claim("worker-b", 30, 1)
            done_a.set()  # step a's completion is refused: the attempt learns it lost
            await poll(lambda: attempt.lease.lost is not None)
            assert anyio.current_time() < attempt.lease.deadline  # locally, it still holds
            go.set()
        assert outcome == {"check": "refused", "http": "refused"}
        assert server.seen("/after-the-refusal") == []
        final = await client.get("t1")
        assert final.state is RunState.RUNNING and final.epoch == newer.epoch


def careful_flow(registry: durable.Registry) -> tuple[anyio.Event, anyio.Event, list[str]]:
    """Workflow ``careful``: its one step, shielded (like code in a thread, it runs on
    whatever cancels), sets ``inside``, waits for ``go``, then asks ``assert_still_mine``
    and puts ``"mine"`` or ``"refused"`` in the outcome list."""
    inside, go = anyio.Event(), anyio.Event()
    outcome: list[str] = []

    @durable.activity(registry=registry)
    async def careful(ctx: durable.ActivityContext) -> None:
        with anyio.CancelScope(shield=True):
            inside.set()
            await go.wait()
            try:
                await ctx.assert_still_mine()
                outcome.append("mine")
            except durable.LeaseLostError:
                outcome.append("refused")

    @durable.workflow("careful", registry=registry)
    async def wf(ctx: durable.WorkflowContext) -> None:
        await careful(ctx)

    return inside, go, outcome


async def test_assert_still_mine_judges_the_lease_by_the_database_s_clock(
        tmp_path: Path, registry: durable.Registry) -> None:
    """Nobody took the run over yet, and locally the lease holds; but in the database it
    ran out (a worker stalled, its renewals late): ``assert_still_mine`` says it is not
    this attempt's any more, before the step acts on it."""
    clock = FakeClock()
    url = f"sqlite:///{tmp_path / 's.db'}"
    inside, go, outcome = careful_flow(registry)
    async with durable.Client.connect(url, registry=registry, clock=clock) as client:
        run, attempt = await claimed_attempt(client, registry, "careful", "c1", 30)
        async with anyio.create_task_group() as tg:
            tg.start_soon(attempt.execute)
            await inside.wait()
            clock.advance(31)  # the database's lease ran out; the local deadline did not
            go.set()
        assert outcome == ["refused"]
        current = await client.store.get_run("c1")  # as stored: a client's read recovers it
        assert current is not None and current.state is RunState.RUNNING
        assert current.epoch == run.epoch  # nobody took it: the refusal was the clock's


async def _journaled_step(store: Any, run_id: str, key: str) -> bool:
    return any(e.kind is EntryKind.STEP_STARTED and e.step_key == key
               for e in await store.journal(run_id))


async def test_lease_lost_inside_a_task_group_stops_the_attempt_not_the_worker(
        client: durable.Client, registry: durable.Registry) -> None:
    @durable.activity(registry=registry)
    async def superseded(ctx: durable.ActivityContext, i: int) -> None:
        if i == 1:  # e.g. a service answered "stale fencing token"
            raise durable.LeaseLostError("a newer attempt holds this resource")
        await anyio.sleep_forever()

    @durable.workflow("fanout", registry=registry)
    async def fanout(ctx: durable.WorkflowContext) -> None:
        async with anyio.create_task_group() as tg:
            for i in range(3):
                tg.start_soon(lambda i=i: ctx.step(superseded, i, key=f"i-{i}"))

    @durable.workflow("after", registry=registry)
    async def after(ctx: durable.WorkflowContext) -> str:
        return "still working"

    counters = durable.Counters()
    async with running_worker(client, registry, lease=5.0, interceptors=[counters]):
        await client.start("fanout", id="f")
        await poll(lambda: counters.claimed == counters.attempts_ended == 1)
        await client.start("after", id="a")
        assert (await client.wait("a")).result == "still working"
    journal = await client.journal("f")
    assert kinds(journal)[-1] == "step_started"  # the lost attempt wrote nothing more
    assert (await client.get("f")).state is RunState.RUNNING  # until its lease lapses


class RenewRightAfterFinish(SqliteStore):
    """A real store that lets the worker renew between a run's finish and its cleanup."""

    worker: durable.Worker | None = None

    async def finish(self, fence: Fence, state: RunState, **kwargs: object) -> bool:
        ok = await super().finish(fence, state, **kwargs)  # type: ignore[arg-type]
        if self.worker is not None:
            await self.worker.renew_now()
        return ok


async def test_a_finished_run_is_not_reported_as_a_lost_lease(
        tmp_path: Path, registry: durable.Registry) -> None:
    import durable.testing

    @durable.workflow("quick", registry=registry)
    async def quick(ctx: durable.WorkflowContext) -> str:
        return "done"

    store = RenewRightAfterFinish(str(tmp_path / "f.db"))
    await store.open()
    client = durable.Client(store, registry=registry)
    try:
        with durable.testing.capture_logs() as logs:
            async with running_worker(client, registry) as worker:
                store.worker = worker
                await client.start("quick", id="q")
                assert (await client.wait("q")).result == "done"
    finally:
        await store.aclose()
    events = [e["event"] for e in logs]
    assert "run_completed" in events
    assert "lease_lost" not in events and "attempt_stopping" not in events


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="Linux: /proc/net/tcp")
async def test_a_cancelled_request_still_on_its_way_never_reaches_the_service_later(
        client: durable.Client, registry: durable.Registry) -> None:
    """A request the service has not taken in yet (it reads nothing: its receive window is
    shut) lies whole in the worker's kernel when the operator cancels the run. The cancel
    aborts the call, and the connection is closed with a reset, which drops those bytes.
    Before, a plain close left them to the kernel, which went on sending them: once the
    service read again, it got the complete request (a DELETE, after its run was cancelled)
    and the end of the stream after it, as from any request."""
    body = b"x" * 65536
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1)  # the kernel's least
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    listener.setblocking(False)
    service = listener.getsockname()
    url = f"http://127.0.0.1:{service[1]}/volumes/v1"
    entered = anyio.Event()

    @durable.activity(registry=registry)
    async def delete_volume(ctx: durable.ActivityContext) -> None:
        entered.set()
        await ctx.http.request("DELETE", url, content=body)

    @durable.workflow("teardown", registry=registry)
    async def teardown(ctx: durable.WorkflowContext) -> None:
        await delete_volume(ctx)

    received = bytearray()
    with listener:
        async with running_worker(client, registry):
            await client.start("teardown", id="t-reset")
            await entered.wait()
            await anyio.wait_readable(listener)
            conn, peer = listener.accept()
            with conn:
                conn.setblocking(False)

                def whole_request_sent() -> int:
                    """The request's length once the service holds the headers and part of
                    the body and the worker's kernel the rest (all of it on its way), else
                    0."""
                    queues = tcp_queues(peer, service)
                    try:
                        head = conn.recv(65536, socket.MSG_PEEK)
                    except BlockingIOError:  # nothing arrived yet
                        return 0
                    if queues is None or b"\r\n\r\n" not in head:
                        return 0
                    total = head.index(b"\r\n\r\n") + 4 + len(body)
                    return total if queues[0] > 0 and queues[0] + len(head) == total else 0

                total = await poll(whole_request_sent)
                await client.cancel("t-reset")
                run = await client.wait("t-reset", timeout=10)
                assert run.state is RunState.CANCELLED
                try:  # reset: the worker's kernel holds nothing more of it to send
                    await poll(lambda: tcp_queues(peer, service) is None, timeout=5)
                except TimeoutError:
                    pytest.fail(f"the worker's kernel still holds {tcp_queues(peer, service)} "
                                "bytes (unacknowledged, received) of the cancelled request, and "
                                "goes on sending them as the service reads")
                ended = "open"
                with anyio.fail_after(10):
                    while ended == "open":
                        await anyio.wait_readable(conn)
                        try:
                            data = conn.recv(65536)
                        except ConnectionResetError:
                            ended = "reset"
                        else:
                            received += data
                            ended = "open" if data else "end of stream"
    assert (ended, len(received) < total) == ("reset", True), (ended, len(received), total)


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="Linux: /proc/net/tcp")
async def test_a_cancelled_force_push_still_on_its_way_never_lands(
        client: durable.Client, registry: durable.Registry, tmp_path: Path) -> None:
    """The promise-race incident's force push, over git's smart HTTP protocol: the remote
    takes the push request's head and reads no more (its receive window shut), so the rest
    lies in the pushing side's kernel when the operator cancels the run. The cancel kills
    git's process group; its connection is reset first (:func:`durable.abort_process_group`),
    which drops those bytes. Before, SIGKILL closed it like any close, the kernel went on
    sending, and once the remote read again it got the whole push and moved the branch,
    after the run was cancelled."""
    with git_http_server(tmp_path / "remote") as remote:
        url = remote.repository("slot.git")
        work = tmp_path / "work"
        before = commit(work, {"README": "template\n"}, "template")
        git("push", "--quiet", url, "HEAD:refs/heads/main", cwd=work)
        assert remote.outcomes == ["complete"]  # the rig: a push lands
        # more than the remote takes in
        after = commit(work, {"data": os.urandom(65536)}, "slot content")
        remote.hold_pushes = True

        @durable.activity(registry=registry)
        async def force_push(ctx: durable.ActivityContext) -> None:
            await activities.git.force_push_with_lease(work, url, "main", expected_sha=before,
                                                       src=after)

        @durable.workflow("reset", registry=registry)
        async def reset(ctx: durable.WorkflowContext) -> None:
            await force_push(ctx)

        async with running_worker(client, registry):
            await client.start("reset", id="r-push")
            await poll(lambda: remote.held)
            [held] = remote.held
            server = remote.listener.getsockname()

            def whole_push_sent() -> bool:
                """The pushing side's kernel holds part of the body (unacknowledged) and
                the remote's the rest (received, unread): git has written it all."""
                sending = tcp_queues(held.peer, server)
                receiving = tcp_queues(server, held.peer)
                return (sending is not None and receiving is not None and sending[0] > 0
                        and sending[0] + receiving[1] == held.length)

            await poll(whole_push_sent)
            await client.cancel("r-push")
            run = await client.wait("r-push", timeout=10)
            assert run.state is RunState.CANCELLED
            try:
                await poll(lambda: tcp_queues(held.peer, server) is None, timeout=5)
            except TimeoutError:
                pytest.fail("the killed git's connection still holds "
                            f"{tcp_queues(held.peer, server)} bytes (unacknowledged, "
                            "received) of the cancelled push, and "
                            "its kernel goes on sending them as the remote reads")
            remote.release.set()
            await poll(lambda: len(remote.outcomes) == 2, timeout=10)
    assert remote.outcomes[1] == "reset"
    assert git("rev-parse", "main", cwd=tmp_path / "remote" / "slot.git") == before


async def _second_request_after_a_stall(tmp_path: Path, registry: durable.Registry, host: str,
                                       attempts: list[Attempt], **options: Any
                                       ) -> tuple[list[str], dict[str, str]]:
    """One attempt (``options``: its chain, its transport) under a 1 s lease nobody renews
    sends two GETs over one kept-alive HTTP/1.1 connection to a loopback server reached as
    ``host``; the fault under test stalls the second. What the server saw, and what became
    of the second request."""
    url = f"sqlite:///{tmp_path / 'k.db'}"
    seen: list[str] = []

    async def keep_alive(stream: anyio.abc.SocketStream) -> None:  # HTTP/1.1, kept alive
        buffered = b""
        async with stream:
            while True:
                try:
                    buffered += await stream.receive()
                except (anyio.EndOfStream, anyio.BrokenResourceError):
                    return
                while b"\r\n\r\n" in buffered:
                    head, buffered = buffered.split(b"\r\n\r\n", 1)
                    seen.append(head.split(b" ")[1].decode())
                    await stream.send(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")

    outcome: dict[str, str] = {}
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    base = f"http://{host}:{listener.extra(anyio.abc.SocketAttribute.local_port)}"
    async with durable.Client.connect(url, registry=registry) as client, listener, \
            anyio.create_task_group() as serving:
        serving.start_soon(listener.serve, keep_alive)

        @durable.activity(registry=registry)
        async def twice(ctx: durable.ActivityContext) -> None:
            await ctx.http.get(f"{base}/first")  # opens the connection the second one reuses
            try:
                await ctx.http.get(f"{base}/second")
            except durable.LeaseLostError:
                outcome["second"] = "refused"
                raise

        @durable.workflow("twice", registry=registry)
        async def wf(ctx: durable.WorkflowContext) -> None:
            await twice(ctx)

        await client.start("twice", id="k1")
        [run] = await client.store.claim("worker-a", 1.0, 1)
        attempts.append(Attempt(client.store, run, registry, lease=1.0,
                                lease_sent_at=anyio.current_time(), **options))
        await attempts[0].execute()  # nobody renews: the lease runs out during the stall
        serving.cancel_scope.cancel()
    return seen, outcome


@pytest.mark.parametrize("transport", ["worker", "httpx"])
async def test_a_request_whose_lease_ran_out_after_the_check_is_never_sent(
        tmp_path: Path, registry: durable.Registry, transport: str) -> None:
    """The lease is checked where the request leaves, not only where ``ctx.http`` is called.

    A process that stalls between the two (SIGSTOP, a VM paused, an event loop blocked by
    a synchronous call) past its lease's local deadline, once its request is past its last
    await (a kept-alive connection, locks taken), resumes and writes the request before
    the event loop gets to the deadline's cancel. ``scripts/torture.py --backend postgres
    --seed 1031`` saw it: an attempt frozen 4.5 s sent a request 2.8 s after its
    successor's first (the service's fence refused it). Here a trace callback that httpcore
    awaits right before it writes the request's headers blocks the event loop past the
    deadline: the stall is the fault under test, made with a synchronous sleep as a
    blocking call (or SIGSTOP) would make it. Through the worker's pool (whose sockets check
    once more), and through a transport given to the worker (``httpx``'s own, whose streams
    do not: the trace's check is the last)."""
    attempts: list[Attempt] = []

    async def stall(event: str, info: Any) -> None:  # httpcore's trace extension
        if event == "http11.send_request_headers.started":  # the last await before the write
            time.sleep(attempts[0].lease.deadline - anyio.current_time() + 0.05)  # noqa: ASYNC251

    class Stall(durable.Interceptor):
        async def intercept_request(self, info: Any, request: Any, call_next: Any) -> Any:
            if request.url.path == "/second":
                request.extensions["trace"] = stall
            return await call_next(request)

    given = httpx.AsyncHTTPTransport() if transport == "httpx" else None
    seen, outcome = await _second_request_after_a_stall(
        tmp_path, registry, "127.0.0.1", attempts, chain=Chain.of([Stall()]), transport=given)
    assert seen == ["/first"], seen  # the second request never reached the service
    assert outcome == {"second": "refused"}
    assert attempts[0].lost


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
async def test_a_request_whose_lease_ran_out_while_it_was_serialized_is_never_sent(
        tmp_path: Path, registry: durable.Registry, monkeypatch: pytest.MonkeyPatch,
        host: str) -> None:
    """The last check is at the socket, right before the headers' bytes are handed to the
    kernel, not only where httpcore announces the headers: a stall after that announcement
    (httpcore serializing the request; a SIGSTOP there let ``scripts/torture.py --seed
    3008`` send a frozen attempt's request 2.4 s after its successor's first) ends with
    nothing sent. The stall is a synchronous sleep in h11's ``send`` of the request, past
    the lease's local deadline (patched in: a SIGSTOP cannot be aimed at that point). Through
    the worker's own socket (an IP address) and through httpcore's connect (a host name)."""
    import h11

    attempts: list[Attempt] = []
    real_send = h11.Connection.send

    def stalling_send(self: h11.Connection, event: Any) -> Any:
        if isinstance(event, h11.Request) and event.target == b"/second":
            time.sleep(attempts[0].lease.deadline - anyio.current_time() + 0.05)
        return real_send(self, event)

    monkeypatch.setattr(h11.Connection, "send", stalling_send)
    seen, outcome = await _second_request_after_a_stall(
        tmp_path, registry, host, attempts, transport=WorkerTransport(4))
    assert seen == ["/first"], seen  # the second request never reached the service
    assert outcome == {"second": "refused"}
    assert attempts[0].lost
