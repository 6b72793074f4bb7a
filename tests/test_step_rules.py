"""What a step may be: its identity, its result, its threads, what an accepted step returns.

Each test is a failure once seen on the real code: unkeyed concurrent steps swapping their
results, a non-JSON result retried (the side effect repeated), a thread that outlived its
step's timeout, an accepted step handing the workflow ``None``, and a completion of an
``on_doubt="fail"`` step left uncommitted while the workflow went on.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from typing import Any

import anyio
import pytest

import durable
from durable import EntryKind, RunState
from durable._types import Fence, JournalWrite

from .helpers import kinds, poll, running_worker

pytestmark = pytest.mark.anyio


async def test_unkeyed_steps_started_concurrently_are_refused(
        client: durable.Client, registry: durable.Registry) -> None:
    deleted: list[str] = []

    both_started = anyio.Event()

    @durable.activity("db.delete", registry=registry)
    async def delete(ctx: durable.ActivityContext, name: str) -> str:
        deleted.append(name)
        if len(deleted) == 2:
            both_started.set()  # only if the engine let the second unkeyed step start
        await both_started.wait()  # in flight until then: the calls overlap for certain
        return f"{name} deleted"

    @durable.workflow("both", registry=registry)
    async def both(ctx: durable.WorkflowContext) -> list[str]:
        results: list[str] = []

        async def one(name: str) -> None:
            results.append(await delete(ctx, name))

        async with anyio.create_task_group() as tg:
            for name in ("db-1", "db-2"):
                tg.start_soon(one, name)
        return results

    async with running_worker(client, registry):
        await client.start("both", id="u")
        done = await client.wait("u")
    assert done.state is RunState.FAILED
    assert done.error is not None and "key=" in done.error
    assert "db.delete" in done.error
    assert len(deleted) == 1  # the second unkeyed call never ran


async def test_keyed_steps_in_a_task_group_keep_their_own_results(
        client: durable.Client, registry: durable.Registry) -> None:
    started: list[str] = []
    both_started = anyio.Event()

    @durable.activity("db.delete", registry=registry)
    async def delete(ctx: durable.ActivityContext, name: str) -> str:
        started.append(name)
        if len(started) == 2:
            both_started.set()
        await both_started.wait()  # both keyed steps are in flight at once
        return f"{name} deleted"

    @durable.workflow("both", registry=registry)
    async def both(ctx: durable.WorkflowContext) -> dict[str, str]:
        results: dict[str, str] = {}

        async def one(name: str) -> None:
            results[name] = await ctx.step(delete, name, key=name)

        async with anyio.create_task_group() as tg:
            for name in ("db-1", "db-2"):
                tg.start_soon(one, name)
        results["after"] = await ctx.now() and "ok"  # an unkeyed value after the group
        return results

    async with running_worker(client, registry):
        await client.start("both", id="k")
        done = await client.wait("k")
    assert done.state is RunState.COMPLETED, done.error
    assert done.result == {"db-1": "db-1 deleted", "db-2": "db-2 deleted", "after": "ok"}


async def test_a_result_that_cannot_be_journaled_fails_the_step_without_a_retry(
        client: durable.Client, registry: durable.Registry) -> None:
    posts: list[int] = []

    @durable.activity("repo.create", registry=registry, on_doubt="fail")
    async def create(ctx: durable.ActivityContext) -> Any:
        posts.append(ctx.try_number)
        return {"created_at": dt.datetime(2026, 1, 1, tzinfo=dt.UTC)}

    @durable.workflow("creates", registry=registry)
    async def creates(ctx: durable.WorkflowContext) -> None:
        await create(ctx)

    async with running_worker(client, registry):
        await client.start("creates", id="j")
        done = await client.wait("j")
    assert posts == [1]  # the side effect ran once
    assert done.state is RunState.FAILED
    assert done.error is not None and "datetime" in done.error and "repo.create" in done.error
    journal = await client.journal("j")
    assert "step_retrying" not in kinds(journal)
    [failed] = [e for e in journal if e.kind is EntryKind.STEP_FAILED]
    assert failed.data["error_type"] == "NotJsonError"


@pytest.mark.parametrize("on_doubt", ["retry", "fail"])
async def test_every_attempt_sees_a_step_result_as_the_journal_holds_it(
        client: durable.Client, registry: durable.Registry, on_doubt: str) -> None:
    """JSON keeps only string keys and lists: an activity's ``{1: "deleted"}`` is
    journaled as ``{"1": "deleted"}``. The attempt that ran the step was handed the
    activity's own object, and every later attempt (after a durable wait, a crash, a
    shutdown) the journaled one, so the same deterministic code decided differently:
    here ``"1" in deleted`` was False, then True, and the resumed run failed as not
    deterministic. The workflow gets the journaled value in every attempt; so does a step
    its lookup completes."""
    seen: list[Any] = []

    @durable.activity("db.delete_all", registry=registry, on_doubt=on_doubt)  # type: ignore[arg-type]
    async def delete_all(ctx: durable.ActivityContext) -> Any:
        return {"deleted": {1: "db-1", None: "db-?"}, "pair": (1, 2)}

    @durable.activity("db.note", registry=registry)
    async def note(ctx: durable.ActivityContext, gone: bool) -> bool:
        return gone

    @durable.workflow("deletes", registry=registry)
    async def deletes(ctx: durable.WorkflowContext) -> Any:
        done = await delete_all(ctx)
        seen.append(done)
        await note(ctx, "1" in done["deleted"])
        await ctx.sleep(0.01)  # a durable wait: the next attempt replays the journal
        return done

    async with running_worker(client, registry, durable_wait_threshold=0):
        await client.start("deletes", id="keys")
        finished = await client.wait("keys")
    assert finished.state is RunState.COMPLETED, finished.error
    journaled = {"deleted": {"1": "db-1", "null": "db-?"}, "pair": [1, 2]}
    assert seen == [journaled, journaled]
    assert finished.result == journaled


async def test_a_step_its_lookup_completes_is_seen_as_the_journal_holds_it(
        client: durable.Client, registry: durable.Registry) -> None:
    """The same for a step in doubt whose lookup finds it done: the workflow gets the
    lookup's answer as journaled (``{"3": ...}``), as any later attempt would read it."""
    seen: list[Any] = []

    @durable.activity("repo.create", registry=registry, on_doubt="fail")
    async def create(ctx: durable.ActivityContext, name: str) -> Any:
        raise AssertionError("in doubt and found: never run again")

    @create.lookup
    async def find_repo(ctx: durable.ActivityContext, name: str) -> Any:
        return {3: name, "tags": ("a",)}

    @durable.workflow("promote", registry=registry)
    async def promote(ctx: durable.WorkflowContext, name: str) -> Any:
        seen.append(await create(ctx, name))
        return seen[-1]

    await client.start("promote", "repo", id="found")
    await _in_doubt_run(client, "found", "repo.create", ["repo"])
    async with running_worker(client, registry):
        found = await client.wait("found")
    assert found.state is RunState.COMPLETED, found.error
    assert seen == [{"3": "repo", "tags": ["a"]}] == [found.result]


async def test_a_result_is_encoded_once_on_its_way_to_the_journal(
        client: durable.Client, registry: durable.Registry,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A step's non-scalar result is checked by encoding its completion entry, and the
    store writes that text: the result is encoded once, not once to check it and again to
    store it. A result that cannot be journaled is still named (the test above)."""
    result = {"items": [1, 2, 3], "name": "x"}
    seen: list[object] = []
    real = durable._types._ENCODERS

    class Counting:  # every encoding of a journal value goes through its thread's encoder
        markers = real.markers

        @staticmethod
        def encode(value: object, level: int) -> Any:
            if value is result or (isinstance(value, dict) and value.get("result") is result):
                seen.append(value)
            assert real.encode is not None
            return real.encode(value, level)

    monkeypatch.setattr(durable._types, "_ENCODERS", Counting())

    @durable.activity("lists", registry=registry, on_doubt="fail")
    async def lists(ctx: durable.ActivityContext) -> dict[str, Any]:
        return result

    @durable.workflow("listing", registry=registry)
    async def listing(ctx: durable.WorkflowContext) -> None:
        await lists(ctx)

    async with running_worker(client, registry):
        await client.start("listing", id="once")
        done = await client.wait("once")
    assert done.state is RunState.COMPLETED, done.error
    [completed] = [e for e in await client.journal("once")
                   if e.kind is EntryKind.STEP_COMPLETED]
    assert completed.data["result"] == result
    assert len(seen) == 1


async def test_to_thread_work_is_abandoned_at_the_step_timeout(
        client: durable.Client, registry: durable.Registry) -> None:
    release = threading.Event()
    after: list[str] = []

    def blocking() -> str:
        release.wait(10)  # blocking work a cancel cannot interrupt
        return "thread done"

    @durable.activity("slow", registry=registry, timeout=0.3,
                      retry=durable.RetryPolicy(max_tries=1))
    async def slow(ctx: durable.ActivityContext) -> str:
        value = await ctx.to_thread(blocking)
        after.append("code after the thread ran")
        return str(value)

    @durable.workflow("threads", registry=registry)
    async def threads(ctx: durable.WorkflowContext) -> str:
        return str(await slow(ctx))

    try:
        async with running_worker(client, registry):
            started = time.monotonic()
            await client.start("threads", id="th")
            done = await client.wait("th")
            took = time.monotonic() - started
    finally:
        release.set()
    assert done.state is RunState.FAILED
    assert done.error is not None and "timed out after 0.3 s" in done.error
    assert took < 1.0
    assert after == []


async def _in_doubt_run(client: durable.Client, run_id: str, name: str,
                        args: list[Any]) -> None:
    """A run whose first step was started by a worker that then died."""
    [run] = await client.store.claim("dead-worker", 0.3, 1, run_id=run_id)
    assert await client.store.append(Fence(run.id, run.epoch), [JournalWrite(
        EntryKind.STEP_STARTED, 1, "1", name, 1, {"args": args})])
    assert await poll(lambda: client.store.recover_stale(run_id, run.epoch), timeout=5)


async def test_an_accepted_step_takes_its_result_from_the_activity_lookup(
        client: durable.Client, registry: durable.Registry) -> None:
    creates: list[str] = []
    looked_up: list[tuple[str, int]] = []
    unknown_then = {"answer": "unknown"}

    @durable.activity("repo.create", registry=registry, on_doubt="fail")
    async def create(ctx: durable.ActivityContext, name: str) -> dict[str, Any]:
        creates.append(name)
        return {"id": 1, "name": name}

    @create.lookup
    async def find_repo(ctx: durable.ActivityContext, name: str) -> Any:
        looked_up.append((name, ctx.step))
        if unknown_then["answer"] == "unknown":
            raise RuntimeError("the git host is unreachable")  # unknown: stays in doubt
        return {"id": 7, "name": name}

    @durable.workflow("promote", registry=registry)
    async def promote(ctx: durable.WorkflowContext, name: str) -> int:
        repo = await create(ctx, name)
        return int(repo["id"])

    await client.start("promote", "starter", id="a")
    await _in_doubt_run(client, "a", "repo.create", ["starter"])
    async with running_worker(client, registry):
        failed = await client.wait("a")
        assert failed.state is RunState.FAILED  # the lookup could not tell: in doubt
        assert failed.error is not None and "outcome is unknown" in failed.error
        unknown_then["answer"] = "found"
        await client.replay("a", in_doubt="accept")
        done = await client.wait("a")
    assert done.state is RunState.COMPLETED, done.error
    assert done.result == 7  # the looked-up repository, not None
    assert creates == []
    assert looked_up == [("starter", 1), ("starter", 1)]
    [completed] = [e for e in await client.journal("a")
                   if e.kind is EntryKind.STEP_COMPLETED and e.step == 1]
    assert completed.data["result"] == {"id": 7, "name": "starter"}
    assert completed.data["accepted"] is True


async def test_a_step_in_doubt_is_resolved_by_its_lookup(
        client: durable.Client, registry: durable.Registry) -> None:
    creates: list[str] = []
    existing: dict[str, dict[str, Any]] = {"found": {"id": 3}}

    @durable.activity("repo.create", registry=registry, on_doubt="fail")
    async def create(ctx: durable.ActivityContext, name: str) -> dict[str, Any]:
        creates.append(name)
        return {"id": 9}

    @create.lookup
    async def find_repo(ctx: durable.ActivityContext, name: str) -> Any:
        return existing.get(name, durable.NOT_DONE)

    @durable.workflow("promote", registry=registry)
    async def promote(ctx: durable.WorkflowContext, name: str) -> int:
        return int((await create(ctx, name))["id"])

    for run_id, name in (("f", "found"), ("n", "absent")):
        await client.start("promote", name, id=run_id)
        await _in_doubt_run(client, run_id, "repo.create", [name])
    async with running_worker(client, registry):
        found, absent = await client.wait("f"), await client.wait("n")
    assert found.state is RunState.COMPLETED and found.result == 3  # it had happened
    assert absent.state is RunState.COMPLETED and absent.result == 9  # it had not: ran
    assert creates == ["absent"]


async def test_an_accepted_step_without_a_lookup_never_reads_as_none(
        client: durable.Client, registry: durable.Registry) -> None:
    @durable.activity("repo.create", registry=registry, on_doubt="fail")
    async def create(ctx: durable.ActivityContext, name: str) -> dict[str, Any]:
        return {"id": 1}

    @durable.activity("repo.push", registry=registry)
    async def push(ctx: durable.ActivityContext, repo: Any) -> None:
        pushed.append(repo)

    @durable.workflow("promote", registry=registry)
    async def promote(ctx: durable.WorkflowContext, name: str, use: str) -> Any:
        repo = await create(ctx, name)
        if use == "index":
            return repo["id"]
        if use == "argument":
            await push(ctx, repo)
        return repo  # "result"

    pushed: list[Any] = []
    for use in ("index", "argument", "result"):
        await client.start("promote", "starter", use, id=use)
        await _in_doubt_run(client, use, "repo.create", ["starter"])
    async with running_worker(client, registry):
        for use in ("index", "argument", "result"):
            assert (await client.wait(use)).state is RunState.FAILED
            await client.replay(use, in_doubt="accept")
            done = await client.wait(use)
            assert done.state is RunState.FAILED
            assert done.error is not None
            assert "ResultUnknownError" in done.error
            assert "step 1 (repo.create)" in done.error and "lookup" in done.error
    assert pushed == []


async def test_an_on_doubt_fail_completion_is_committed_before_the_workflow_goes_on(
        client: durable.Client, registry: durable.Registry) -> None:
    """If it were deferred, a worker killed right after the step would leave it in doubt."""
    seen: dict[str, list[str]] = {}

    @durable.activity("once", registry=registry, on_doubt="fail")
    async def once(ctx: durable.ActivityContext) -> str:
        return "pushed"

    @durable.activity("again", registry=registry, on_doubt="retry")
    async def again(ctx: durable.ActivityContext) -> str:
        return "noted"

    @durable.workflow("order", registry=registry)
    async def order(ctx: durable.WorkflowContext) -> None:
        for act in (once, again):
            await act(ctx)
            # what a worker killed at this instant would leave behind
            journal = await client.store.journal(ctx.workflow_id)
            seen[act.name] = [e.name or "" for e in journal
                              if e.kind is EntryKind.STEP_COMPLETED]

    async with running_worker(client, registry):
        await client.start("order", id="o")
        assert (await client.wait("o")).state is RunState.COMPLETED
    assert seen["once"] == ["once"]


async def test_a_step_whose_tries_ran_out_is_not_run_again_though_its_lookup_says_not_done(
        client: durable.Client, registry: durable.Registry) -> None:
    """The lookup settles the doubt (the step did not take effect), but not the budget:
    the worker died in each of its ``max_tries`` tries, so running it again could kill the
    next worker too. The run fails, saying so, and the activity never runs."""
    creates: list[str] = []

    @durable.activity("repo.create", registry=registry, retry=durable.RetryPolicy(max_tries=1))
    async def create(ctx: durable.ActivityContext, name: str) -> int:
        creates.append(name)
        return 1

    @create.lookup
    async def find_repo(ctx: durable.ActivityContext, name: str) -> Any:
        return durable.NOT_DONE

    @durable.workflow("promote", registry=registry)
    async def promote(ctx: durable.WorkflowContext, name: str) -> int:
        return await create(ctx, name)

    await client.start("promote", "starter", id="p")
    await _in_doubt_run(client, "p", "repo.create", ["starter"])
    async with running_worker(client, registry):
        run = await client.wait("p", timeout=10)
    assert run.state is RunState.FAILED
    assert run.error is not None and "max_tries=1" in run.error, run.error
    assert creates == []


async def test_an_accepted_step_whose_lookup_finds_it_not_done_is_neither_counted_nor_run(
        client: durable.Client, registry: durable.Registry) -> None:
    """An operator accepted the step as done, but its lookup finds it did not take effect:
    the run fails saying so (replay with --rerun-in-doubt to run it); the step is neither
    completed with a made-up result nor run."""
    creates: list[str] = []
    answer = {"lookup": "unreachable"}

    @durable.activity("repo.create", registry=registry, on_doubt="fail")
    async def create(ctx: durable.ActivityContext, name: str) -> int:
        creates.append(name)
        return 1

    @create.lookup
    async def find_repo(ctx: durable.ActivityContext, name: str) -> Any:
        if answer["lookup"] == "unreachable":
            raise RuntimeError("the git host is unreachable")  # stays in doubt
        return durable.NOT_DONE

    @durable.workflow("promote", registry=registry)
    async def promote(ctx: durable.WorkflowContext, name: str) -> int:
        return await create(ctx, name)

    await client.start("promote", "starter", id="a")
    await _in_doubt_run(client, "a", "repo.create", ["starter"])
    async with running_worker(client, registry):
        assert (await client.wait("a", timeout=10)).state is RunState.FAILED
        answer["lookup"] = "not done"
        await client.replay("a", in_doubt="accept")
        run = await client.wait("a", timeout=10)
    assert run.state is RunState.FAILED
    assert run.error is not None and "did not take effect" in run.error, run.error
    assert "--rerun-in-doubt" in run.error
    assert creates == []
    assert not [e for e in await client.journal("a")
                if e.kind is EntryKind.STEP_COMPLETED and e.step == 1]


async def test_a_step_key_used_twice_fails_the_run_instead_of_reusing_a_result(
        client: durable.Client, registry: durable.Registry) -> None:
    """Two calls with one key would be one step: the second would get the first's
    journaled result without running. The second call fails the run, naming the key."""
    calls: list[str] = []

    @durable.activity("volume.delete", registry=registry)
    async def delete(ctx: durable.ActivityContext, volume: str) -> str:
        calls.append(volume)
        return f"deleted {volume}"

    @durable.workflow("teardown", registry=registry)
    async def teardown(ctx: durable.WorkflowContext) -> list[str]:
        return [await ctx.step(delete, volume, key="volume") for volume in ("v1", "v2")]

    await client.start("teardown", id="t")
    async with running_worker(client, registry):
        run = await client.wait("t", timeout=10)
    assert run.state is RunState.FAILED, run.result
    assert run.error is not None and "'volume' is used twice" in run.error, run.error
    assert calls == ["v1"]


class _Busy(Exception):
    """A 429 whose Retry-After asks for an hour."""

    retry_after = 3600.0


async def test_a_retry_after_longer_than_max_delay_waits_only_max_delay(
        client: durable.Client, registry: durable.Registry) -> None:
    """``RetryPolicy.max_delay`` bounds every delay, the one a server asks for too."""
    tries: list[int] = []

    @durable.activity("notify", registry=registry,
                      retry=durable.RetryPolicy(max_tries=2, max_delay=0.05))
    async def notify(ctx: durable.ActivityContext) -> str:
        tries.append(ctx.try_number)
        if ctx.try_number == 1:
            raise _Busy("429 Too Many Requests")
        return "sent"

    @durable.workflow("notice", registry=registry)
    async def notice(ctx: durable.WorkflowContext) -> str:
        return await notify(ctx)

    await client.start("notice", id="n")
    async with running_worker(client, registry):
        journal = await poll(lambda: _retrying(client, "n"))
        assert journal.data["retry_in"] <= 0.05, journal.data
        run = await client.wait("n", timeout=10)
    assert (run.state, run.result, tries) == (RunState.COMPLETED, "sent", [1, 2])


async def _retrying(client: durable.Client, run_id: str) -> Any:
    entries = [e for e in await client.journal(run_id) if e.kind is EntryKind.STEP_RETRYING]
    return entries[0] if entries else None


async def test_a_long_retry_delay_beside_a_step_in_flight_stays_in_the_attempt(
        client: durable.Client, registry: durable.Registry) -> None:
    """A retry delay long enough to release the run is waited in the attempt while another
    step is in flight: releasing would cut that step off (in doubt, or run twice)."""
    started, finish = anyio.Event(), anyio.Event()
    ran: list[str] = []

    @durable.activity("t.slow", registry=registry, on_doubt="fail")
    async def slow(ctx: durable.ActivityContext) -> str:
        ran.append("slow")
        started.set()
        await finish.wait()
        return "slow"

    @durable.activity("t.flaky", registry=registry,
                      retry=durable.RetryPolicy(max_tries=2, initial_delay=0.3, jitter=0))
    async def flaky(ctx: durable.ActivityContext) -> str:
        ran.append(f"flaky {ctx.try_number}")
        if ctx.try_number == 1:
            raise RuntimeError("503")
        return "flaky"

    @durable.workflow("t.retry_beside", registry=registry)
    async def beside(ctx: durable.WorkflowContext) -> list[str]:
        out: list[str] = []

        async def item() -> None:
            out.append(await ctx.step(slow, key="slow"))

        async with anyio.create_task_group() as tg:
            tg.start_soon(item)
            await started.wait()
            out.append(await ctx.step(flaky, key="flaky"))  # its delay is above the threshold
        return out

    async with running_worker(client, registry, durable_wait_threshold=0.2):
        await client.start("t.retry_beside", id="rb")
        await poll(lambda: _retrying(client, "rb"))
        finish.set()
        done = await client.wait("rb", timeout=10)
    assert done.state is RunState.COMPLETED, done.error
    assert sorted(done.result) == ["flaky", "slow"]
    assert sorted(ran) == ["flaky 1", "flaky 2", "slow"]
    journal = kinds(await client.store.journal("rb"))
    assert "run_waiting" not in journal and journal.count("run_claimed") == 1


async def test_a_failing_step_runs_exactly_max_tries_times_then_fails_the_run(
        client: durable.Client, registry: durable.Registry) -> None:
    tries: list[int] = []

    @durable.activity("t.down", registry=registry,
                      retry=durable.RetryPolicy(max_tries=3, initial_delay=0, jitter=0))
    async def down(ctx: durable.ActivityContext) -> None:
        tries.append(ctx.try_number)
        raise RuntimeError("503 Service Unavailable")

    @durable.workflow("t.always_down", registry=registry)
    async def always_down(ctx: durable.WorkflowContext) -> None:
        await down(ctx)

    await client.start("t.always_down", id="d")
    async with running_worker(client, registry):
        run = await client.wait("d", timeout=10)
    assert run.state is RunState.FAILED
    assert run.error is not None and "failed after 3 tries" in run.error, run.error
    assert tries == [1, 2, 3]


@pytest.mark.parametrize("key", ["2", ""])
async def test_a_numeric_or_empty_step_key_is_refused_before_the_step_runs(
        client: durable.Client, registry: durable.Registry, key: str) -> None:
    """Unkeyed steps are keys "1", "2", ... (the n-th unkeyed call): a step keyed "2" would
    be taken for the second unkeyed call (its journaled outcome reused for it, its arguments
    compared as an unkeyed step's). The key is refused and the step never runs."""
    calls: list[str] = []

    @durable.activity("volume.delete", registry=registry)
    async def delete(ctx: durable.ActivityContext, volume: str) -> str:
        calls.append(volume)
        return f"deleted {volume}"

    @durable.workflow("teardown", registry=registry)
    async def teardown(ctx: durable.WorkflowContext) -> str:
        deleted: str = await ctx.step(delete, "v1", key=key)
        return deleted

    await client.start("teardown", id="t")
    async with running_worker(client, registry):
        run = await client.wait("t", timeout=10)
    assert run.state is RunState.FAILED, run.result
    assert run.error is not None and "a step key must be a non-numeric string" in run.error
    assert calls == []


async def test_a_step_of_something_other_than_an_activity_fails_the_run_naming_it(
        client: durable.Client, registry: durable.Registry) -> None:
    """``ctx.step(fn)`` of a plain async function (not declared an activity) failed the
    run with ``AttributeError: 'function' object has no attribute 'fn'``."""
    ran: list[str] = []

    async def delete(ctx: durable.ActivityContext, name: str) -> None:
        ran.append(name)

    @durable.workflow("plain", registry=registry)
    async def plain(ctx: durable.WorkflowContext) -> None:
        await ctx.step(delete, "db-1")  # type: ignore[call-overload]

    async with running_worker(client, registry):
        await client.start("plain", id="plain")
        done = await client.wait("plain")
    assert done.state is RunState.FAILED
    assert done.error is not None and done.error.startswith(
        "ConfigError: ctx.step takes an activity (declared with @durable.activity, or "
        "act.bind(...)), not <function ")
    assert "delete" in done.error
    assert ran == [] and "step_started" not in kinds(await client.journal("plain"))
