"""What a start keeps is what every line can show. Times the calendar shows: a span over
100 years, or a moment past 9999-12-31, is refused where it is given (a start's ``delay``,
``run_at``, ``timeout``, ``start_within``; a durable sleep; a wait's timeout), in one line,
with nothing written; before, a finite ``1e300`` was stored, and every later line that
showed the run's time failed (``OverflowError``, ``year 11533 is out of range``). And ids
and keys without control characters, at most 1,000 characters. Real SQLite, asyncio and
trio."""

from __future__ import annotations

import pytest

import durable

from .helpers import running_worker

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize(("given", "said"), [
    ({"delay": 1e300}, "delay must be at most 100 years (3155760000 s), not 1e+300"),
    ({"timeout": 4e9}, "timeout must be at most 100 years"),
    ({"start_within": 4e9}, "start_within must be at most 100 years"),
    ({"run_at": 1e300}, "run_at must be before 9999-12-31T23:59:59Z, not 1e+300"),
    ({"run_at": 253402300799.0}, "run_at must be before 9999-12-31T23:59:59Z"),
])
async def test_a_start_past_the_calendar_is_refused(
        client: durable.Client, registry: durable.Registry, given: dict[str, float],
        said: str) -> None:
    @durable.workflow("t.noop", registry=registry)
    async def noop(ctx: durable.WorkflowContext) -> None:
        return None

    with pytest.raises(durable.ConfigError, match="^" + said.replace("(", r"\(")
                       .replace(")", r"\)").replace("+", r"\+")):
        await client.start("t.noop", id="far", **given)  # type: ignore[arg-type]
    assert await client.list() == []


@pytest.mark.parametrize(("call", "said"), [
    ("sleep", "ctx.sleep: expected at most 100 years of seconds, not 1e+300"),
    ("sleep_until", "ctx.sleep_until: expected a time before 9999-12-31, not 1e+300"),
    ("wait_for", "ctx.wait_for timeout: expected at most 100 years of seconds, not 1e+300"),
])
async def test_a_durable_wait_past_the_calendar_fails_the_run_in_one_line(
        client: durable.Client, registry: durable.Registry, call: str, said: str) -> None:
    @durable.workflow("t.far", registry=registry)
    async def far(ctx: durable.WorkflowContext) -> None:
        if call == "sleep":
            await ctx.sleep(1e300)
        elif call == "sleep_until":
            await ctx.sleep_until(1e300)
        else:
            await ctx.wait_for("go", timeout=1e300)

    async with running_worker(client, registry):
        await client.start("t.far", id="far")
        done = await client.wait("far", timeout=20)
    assert done.state is durable.RunState.FAILED
    assert done.error == f"ConfigError: {said}"


@pytest.mark.parametrize(("given", "said"), [
    ({"id": "a\nb"}, "a run id must not hold control characters"),
    ({"id": "x" * 1001}, "a run id must be at most 1000 characters, not 1001"),
    ({"key": "k\x1b[31m"}, "a concurrency key must not hold control characters"),
    ({"key": "k" * 1001}, "a concurrency key must be at most 1000 characters"),
])
async def test_an_id_or_key_no_line_can_show_is_refused(
        client: durable.Client, registry: durable.Registry, given: dict[str, str],
        said: str) -> None:
    """Ids and keys are printed on every line about a run (``list``, ``show``, logs): a
    newline split ``list``'s rows, an escape sequence reached the terminal, a
    100,000-character id was printed whole. Refused, nothing written."""
    @durable.workflow("t.noop", registry=registry)
    async def noop(ctx: durable.WorkflowContext) -> None:
        return None

    with pytest.raises(durable.ConfigError, match="^" + said):
        await client.start("t.noop", **given)  # type: ignore[arg-type]
    assert await client.list() == []
    await client.start("t.noop", id="ünï ok", key="slot 1")  # printable: any script


@pytest.mark.parametrize(("first", "again"), [([1], [True]), ([True], [1]), ([1], [1.0]),
                                              ([{"a": 0}], [{"a": False}])])
async def test_an_id_reused_with_arguments_python_calls_equal_is_a_conflict(
        client: durable.Client, registry: durable.Registry, first: list[object],
        again: list[object]) -> None:
    """``1 == True == 1.0`` in Python, not in the journal: a start again under the same id
    with ``true`` where the run has ``1`` is another start, refused (before, it was taken
    for the same run, and the caller's arguments were silently not the run's)."""
    @durable.workflow("t.take", registry=registry)
    async def take(ctx: durable.WorkflowContext, value: object) -> None:
        return None

    await client.start("t.take", *first, id="same-id", delay=3600)
    with pytest.raises(durable.RunConflictError, match=r"^run id 'same-id' already belongs"):
        await client.start("t.take", *again, id="same-id", delay=3600)
    assert (await client.start("t.take", *first, id="same-id", delay=3600)).args == first
