"""Declarations are typed: mypy sees a wrong argument or a misused result in a user's code.

mypy (the test extra) checks tests/typing_example.py and the operations (workflows/,
activities/), which must pass, and a module of deliberate mistakes, each of which it must
report on its line (the ``# E:`` comment gives what the message says). The example also
runs: its calls by keyword are journaled by position, and a worker given its workflows
explicitly runs them.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import anyio
import pytest
from mypy import api

import durable
import durable.testing

from . import typing_example as example
from .conftest import subprocess_env

ROOT = Path(__file__).resolve().parent.parent

MISTAKES = '''
from __future__ import annotations

import durable
from tests.typing_example import count, nothing, record, shout, total


@durable.activity  # E: Argument 1 to "activity" has incompatible type "Callable[[str], Coroutine[Any, Any, str]]"; expected "Callable[[ActivityContext], Awaitable[str]]"
async def no_context(text: str) -> str:
    return text


@durable.workflow("mistakes.flow")
async def flow(ctx: durable.WorkflowContext, text: str) -> str:
    await ctx.step(count, 3)  # E: No overload variant of "step" of "WorkflowContext" matches argument types "Activity[[str, int], int]", "int"
    await count(ctx)  # E: Missing positional argument "text" in call to "__call__" of "Activity"
    await count(ctx, "a", 1, 2)  # E: Too many arguments for "__call__" of "Activity"
    await count(ctx, "a", tries=2)  # E: Unexpected keyword argument "tries" for "__call__" of "Activity"; did you mean "times"?
    n: str = await ctx.step(count, "a")  # E: No overload variant of "step" of "WorkflowContext" matches argument types "Activity[[str, int], int]", "str"
    keyed = await ctx.step(record, "a", [1], key="k")
    keyed.upper()  # E: "dict[str, int]" has no attribute "upper"
    await ctx.step(count.bind("a", "b"), key="k")  # E: Argument 2 to "bind" of "Activity" has incompatible type "str"; expected "int"
    (await ctx.step(count.bind("a"), key="k")).upper()  # E: "int" has no attribute "upper"
    await ctx.step(count.bind("a"), "b")  # E: No overload variant of "step" of "WorkflowContext" matches argument types "BoundActivity[int]", "str"
    await shout(ctx, b"bytes")  # E: Argument 2 to "__call__" of "Activity" has incompatible type "bytes"; expected "str"
    return await ctx.step(count, text)  # E: No overload variant of "step" of "WorkflowContext"


@record.lookup  # E: Argument 1 to "lookup" of "Activity" has incompatible type "Callable[[ActivityContext, int], Coroutine[Any, Any, None]]"; expected "Callable[[ActivityContext, str, list[int]], Awaitable[None]]"
async def wrong_lookup(ctx: durable.ActivityContext, name: int) -> None:
    return None


async def enqueue(client: durable.Client, store: durable.Store) -> None:
    await client.start(total, "abc")  # E: No overload variant of "start" of "Client" matches argument types "Workflow[[str, int], int]", "str"
    await client.start(total, "abc", "2")  # E: No overload variant of "start" of "Client" matches argument types
    await client.start(nothing, 1)  # E: No overload variant of "start" of "Client" matches argument types
    await client.start("typed.total", text="abc")  # E: No overload variant of "start" of "Client" matches argument types
    await client.start(total.bind("abc"), id="x", key="k")  # E: Missing positional argument "times" in call to "bind" of "Workflow"
    await client.start(total.bind("abc", 2), "more")  # E: No overload variant of "start" of "Client" matches argument types "BoundWorkflow[int]", "str"
    run: int = await client.start(total, "abc", 2)  # E: Incompatible types in assignment (expression has type "StartedRun", variable has type "int")
    durable.Worker(store, workflows=[total, count])  # E: List item 1 has incompatible type "Activity[[str, int], int]"
'''  # noqa: E501


def _expected(source: str) -> dict[int, str]:
    return {number: line.split("# E: ", 1)[1]
            for number, line in enumerate(source.splitlines(), 1) if "# E: " in line}


def _errors(report: str, path: Path) -> dict[int, list[str]]:
    """mypy's errors in the file at ``path``, by line (notes left out)."""
    found: dict[int, list[str]] = {}
    for line in report.splitlines():
        m = re.match(r"(.+?):(\d+): error: (.*)", line)
        if m and Path(m[1]).resolve() == path.resolve():
            found.setdefault(int(m[2]), []).append(m[3])
    return found


@pytest.fixture(scope="module")
def mypy_report(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    folder = tmp_path_factory.mktemp("typing")
    mistakes = folder / "mistakes.py"
    mistakes.write_text(MISTAKES)
    out, err, _status = api.run([
        "--strict", "--no-incremental", "--config-file", str(ROOT / "pyproject.toml"),
        "--show-absolute-path", "--no-error-summary", "--hide-error-context",
        "--no-color-output", "--cache-dir", str(folder / "cache"),
        str(ROOT / "tests" / "typing_example.py"), str(mistakes),
        str(ROOT / "workflows"), str(ROOT / "activities"),
    ])
    assert not err, err
    return out, mistakes


def test_the_typed_example_passes_mypy(mypy_report: tuple[str, Path]) -> None:
    out, _ = mypy_report
    assert _errors(out, ROOT / "tests" / "typing_example.py") == {}, out


def test_the_operations_pass_mypy(mypy_report: tuple[str, Path]) -> None:
    """workflows/ and activities/, the project's own user code, type-check against the
    typed declarations (a list of activities of one signature is annotated as such)."""
    out, mistakes = mypy_report
    elsewhere = [line for line in out.splitlines()
                 if ": error: " in line and not line.startswith(str(mistakes))]
    assert elsewhere == [], out


def test_every_mistake_is_reported_on_its_line(mypy_report: tuple[str, Path]) -> None:
    out, mistakes = mypy_report
    errors = _errors(out, mistakes)
    expected = _expected(MISTAKES)
    for number, text in expected.items():
        assert any(text in e for e in errors.get(number, [])), \
            f"line {number}: expected {text!r}, mypy said {errors.get(number)}\n{out}"
    assert set(errors) == set(expected), out


@pytest.mark.anyio
async def test_the_example_runs_with_explicit_workflows(tmp_path: Path) -> None:
    """A worker whose registry is empty runs the workflows it was given, and only those;
    arguments given by keyword (``count(ctx, text, times=times)``, ``client.start(total,
    text=..., times=...)``) are journaled by position."""
    async with durable.testing.sqlite_client(tmp_path, registry=durable.Registry()) as client:
        runs = await example.enqueue(client)
        assert runs[1].args == ["abc", 2]
        explicit = [example.total, example.nothing]
        async with durable.testing.running_worker(client, registry=durable.Registry(),
                                                  workflows=explicit) as worker:
            assert sorted(worker.registry.workflows) == ["nothing", "typed.total"]
            done = [await client.wait(r.id, timeout=30) for r in runs
                    if r.workflow != "typed_bare"]
        assert {r.state for r in done} == {durable.RunState.COMPLETED}
        assert done[0].result == 6 + 6 + 3 + 0
        steps = [e for e in await client.journal(runs[0].id)
                 if e.kind is durable.EntryKind.STEP_STARTED]
        assert [(e.step_key, e.data["args"]) for e in steps[:4]] == [
            ("1", ["abc", 2]), ("2", ["abc", 2]), ("again", ["abc"]), ("bound", ["abc", 0])]
        bound = next(r for r in runs if r.id == "t-3")
        assert (bound.workflow, bound.args, bound.key) == ("typed.total", ["abc", 2], "k")
        bare = next(r for r in runs if r.workflow == "typed_bare")
        assert (await client.get(bare.id)).state is durable.RunState.QUEUED  # no one knows it


@pytest.mark.anyio
async def test_a_worker_runs_explicit_workflows_besides_its_registry(
        tmp_path: Path, registry: durable.Registry) -> None:
    """The registry's workflows (even one declared after the worker was made) and the
    explicit ones both run; the explicit ones are not added to the registry."""
    other = durable.Registry()

    @durable.workflow("explicit.one", registry=other)
    async def one(ctx: durable.WorkflowContext) -> str:
        return "one"

    async with durable.testing.sqlite_client(tmp_path, registry=registry) as client:
        async with durable.testing.running_worker(client, workflows=[one]) as worker:
            @durable.workflow("registered.later", registry=registry)
            async def later(ctx: durable.WorkflowContext) -> str:
                return "later"

            worker.wake()
            first = await client.start(one)
            second = await client.start("registered.later")
            assert (await client.wait(first.id, timeout=30)).result == "one"
            assert (await client.wait(second.id, timeout=30)).result == "later"
        assert "explicit.one" not in registry.workflows


def test_explicit_workflows_are_checked() -> None:
    reg = durable.Registry()

    @durable.workflow("clash", registry=reg)
    async def mine(ctx: durable.WorkflowContext) -> None: ...

    other = durable.Registry()

    @durable.workflow("clash", registry=other)
    async def theirs(ctx: durable.WorkflowContext) -> None: ...

    store = durable.store_from_url("sqlite:///unused.db")  # never opened
    with pytest.raises(durable.ConfigError, match="two workflows are named 'clash'"):
        durable.Worker(store, registry=reg, workflows=[theirs])
    with pytest.raises(durable.ConfigError, match=r"must be durable\.Workflow objects"):
        durable.Worker(store, registry=reg, workflows=[example.count])  # type: ignore[list-item]
    assert durable.Worker(store, registry=reg, workflows=[mine]).registry.workflow("clash") \
        is mine


def test_keyword_only_parameters_are_refused() -> None:
    """The journal keeps arguments as a list: a keyword-only parameter has no position. One
    without a default is refused when declared; one with a default may not be given."""
    reg = durable.Registry()

    async def required(ctx: durable.WorkflowContext, a: int, *, b: int) -> None: ...

    with pytest.raises(durable.ConfigError, match=r"keyword-only arguments without defaults "
                                                  r"\(b\)"):
        durable.workflow("required", registry=reg)(required)

    @durable.workflow("kwonly", registry=reg)
    async def kwonly(ctx: durable.WorkflowContext, a: int, *, b: int = 0) -> None: ...

    with pytest.raises(durable.ConfigError, match=r"keyword-only arguments \(b\)"):
        durable._registry.positional(kwonly.fn, (1,), {"b": 2}, "workflow kwonly")
    with pytest.raises(TypeError, match="workflow kwonly: missing a required argument: 'a'"):
        durable._registry.positional(kwonly.fn, (), {"b": 2}, "workflow kwonly")


@pytest.mark.anyio
async def test_a_start_with_arguments_the_workflow_cannot_take_raises_and_writes_nothing(
        tmp_path: Path) -> None:
    """``start`` (and ``bind``) with the Workflow object check its arguments as a call
    would, by position too: a TypeError naming the workflow, and no run queued to fail at
    its first attempt. By name (no code imported) they cannot be checked."""
    reg = durable.Registry()

    @durable.workflow("two", registry=reg)
    async def two(ctx: durable.WorkflowContext, a: int, b: int = 0) -> None: ...

    async with durable.Client.connect(f"sqlite:///{tmp_path / 'd.db'}", registry=reg) as client:
        with pytest.raises(TypeError, match="workflow two: missing a required argument: 'a'"):
            await client.start(two)  # type: ignore[call-arg]
        with pytest.raises(TypeError, match="workflow two: too many positional arguments"):
            await client.start(two, 1, 2, 3)  # type: ignore[call-arg]
        with pytest.raises(TypeError, match="workflow two: too many positional arguments"):
            two.bind(1, 2, 3)  # type: ignore[call-arg]
        with pytest.raises(TypeError, match="workflow two: missing a required argument"):
            durable.schedule("nightly", two, cron="0 3 * * *", registry=reg)
        assert reg.schedules == {}
        assert await client.list() == []
        assert (await client.start(two, 1)).args == [1]  # a default need not be given
        assert (await client.start(two.bind(1, 2), id="bound")).args == [1, 2]


ENQUEUE = """
import sys, anyio, durable

async def main(url):
    async with durable.Client.connect(url) as client:
        run = await client.start("slot.teardown", "slot-7", id="teardown-slot-7", key="slot-7")
    print(run.state.value)
    print(",".join(sorted(m for m in sys.modules
                          if m.split(".")[0] in ("workflows", "activities", "tests"))))

anyio.run(main, sys.argv[1])
"""


@pytest.mark.anyio
async def test_starting_by_name_needs_no_workflow_code(tmp_path: Path) -> None:
    """A process that only enqueues (``Client.start("slot.teardown", ...)``) imports nothing
    of workflows/ or activities/, and queues the same run the Workflow object would."""
    url = f"sqlite:///{tmp_path / 'durable.db'}"
    with anyio.fail_after(60):
        done = await anyio.run_process([sys.executable, "-c", ENQUEUE, url], check=False,
                                       env=subprocess_env(), cwd=tmp_path)
    assert done.returncode == 0, done.stderr.decode()
    state, imported = done.stdout.decode().splitlines()
    assert (state, imported) == ("queued", "")
    from workflows import slots

    async with durable.Client.connect(url) as client:
        again = await client.start(slots.teardown, "slot-7", id="teardown-slot-7", key="slot-7")
        assert (again.workflow, again.args, again.key) == ("slot.teardown", ["slot-7"], "slot-7")
        assert len(await client.list()) == 1  # the same run: idempotent by id, no conflict


@pytest.mark.anyio
async def test_bound_arguments_are_positional_and_not_given_twice(tmp_path: Path) -> None:
    assert example.count.bind("a", times=3).args == ("a", 3)
    assert example.total.bind(times=2, text="x").args == ("x", 2)
    async with durable.testing.sqlite_client(tmp_path) as client:
        with pytest.raises(durable.ConfigError, match="has its arguments bound already"):
            await client.start(example.total.bind("x", 2), "y")  # type: ignore[call-overload]
        with pytest.raises(durable.ConfigError, match="takes its arguments by position"):
            await client.start("typed.total", text="x")  # type: ignore[call-overload]
        assert await client.list() == []  # nothing written


@pytest.mark.anyio
async def test_a_start_by_keyword_is_the_start_by_position(tmp_path: Path) -> None:
    """Keyword arguments become the positions a call by position gives (no default filled
    in that a later argument does not need), so the two starts are one idempotent run."""
    reg = durable.Registry()

    @durable.workflow("defaults", registry=reg)
    async def defaults(ctx: durable.WorkflowContext, a: str, b: int = 1, c: int = 2) -> None:
        return None

    async with durable.testing.sqlite_client(tmp_path, registry=reg) as client:
        first = await client.start(defaults, "x", id="d1")
        again = await client.start(defaults.bind(a="x"), id="d1")
        assert (first.args, again.args) == (["x"], ["x"])
        skipped = await client.start(defaults.bind("y", c=5), id="d2")
        assert skipped.args == ["y", 1, 5]
        assert len(await client.list()) == 2


@pytest.mark.anyio
async def test_a_bound_step_takes_no_more_arguments(tmp_path: Path) -> None:
    reg = durable.Registry()

    @durable.workflow("twice", registry=reg)
    async def twice(ctx: durable.WorkflowContext) -> int:
        return await ctx.step(example.count.bind("a"), "b")  # type: ignore[call-overload]

    async with durable.testing.sqlite_client(tmp_path, registry=reg) as client:
        async with durable.testing.running_worker(client):
            run = await client.wait((await client.start(twice)).id, timeout=30)
        assert run.state is durable.RunState.FAILED
        assert "typed.count has its arguments bound already" in str(run.error)
        assert not [e for e in await client.journal(run.id)
                    if e.kind is durable.EntryKind.STEP_STARTED]
