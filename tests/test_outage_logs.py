"""A store outage that lasts is a few log lines, not one per try: a worker's loop logs its
first failure, one line a minute while the same error goes on, and one line when it ends
(``durable._logging.Repeats``); the command line renders the driver's own warnings (psycopg's
pool retrying its connection a few times a second) as its structured lines, each message
once a minute at most, instead of letting them reach stderr as plain text."""

from __future__ import annotations

import io
import json
import logging
import re
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

import durable
import durable.testing
from durable._errors import StoreError
from durable._logging import Repeats, get_logger

from .conftest import ROOT, subprocess_env
from .helpers import poll, stopped_by_sigterm
from .pg import pg_url, postgres_server
from .pgproxy import losing_proxy
from .test_wake import opened, worker_on

__all__ = ["pg_url", "postgres_server"]  # fixtures

BOUND = 30.0

pg_only = pytest.mark.parametrize(
    "anyio_backend", ["asyncio", "trio"])


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def captured() -> Iterator[list[dict[str, Any]]]:
    with durable.testing.capture_logs() as entries:
        yield entries


def test_a_failure_that_goes_on_is_logged_as_it_begins_once_a_minute_and_as_it_ends(
        captured: list[dict[str, Any]]) -> None:
    clock = Clock()
    repeats = Repeats(get_logger("durable.worker", worker="w1"), "claim_failed", clock=clock)
    repeats.succeeded()  # no failure: nothing to end
    for _ in range(100):  # 150 s of the same error, a try every 1.5 s
        repeats.failed(StoreError("cannot reach PostgreSQL at db:5432"))
        clock.now += 1.5
    repeats.failed("the server is read-only")  # another error: at once
    clock.now += 1.5
    repeats.succeeded()
    repeats.succeeded()  # ended once
    repeats.failed("cannot reach PostgreSQL at db:5432")  # a new streak
    said = [(e["event"], e["log_level"], e.get("error"), e.get("failures"),
             e.get("failing_for"), e.get("unlogged")) for e in captured]
    reach = "cannot reach PostgreSQL at db:5432"
    assert said == [
        ("claim_failed", "error", reach, 1, None, None),
        ("claim_failed", "error", reach, 41, 60.0, 39),  # tries at 0, 1.5, ... 60
        ("claim_failed", "error", reach, 81, 120.0, 39),
        ("claim_failed", "error", "the server is read-only", 101, 150.0, 19),
        ("claim_recovered", "info", None, 101, 151.5, None),
        ("claim_failed", "error", reach, 1, None, None),
    ]
    assert all(e["worker"] == "w1" and e["logger"] == "durable.worker" for e in captured)
    with pytest.raises(ValueError, match="ends in _failed"):
        Repeats(get_logger(), "claim")


def test_errors_that_take_turns_are_each_logged_once_a_minute(
        captured: list[dict[str, Any]]) -> None:
    """A server that refuses, then times out, then refuses again: each text once a minute,
    not a line at every change."""
    clock = Clock()
    repeats = Repeats(get_logger("durable.worker"), "sweep_failed", clock=clock)
    for i in range(60):  # 90 s
        repeats.failed("connection refused" if i % 2 else "no connection within 10 s")
        clock.now += 1.5
    said = [(e["error"], e["failures"], e.get("failing_for")) for e in captured]
    assert said == [("no connection within 10 s", 1, None), ("connection refused", 2, 1.5),
                    ("no connection within 10 s", 41, 60.0),
                    ("connection refused", 42, 61.5)]


@pytest.fixture
def cli_logging() -> Iterator[io.StringIO]:
    """The command line's JSON rendering into a buffer; every handler put back after."""
    loggers = [logging.getLogger(name) for name in ("durable", "psycopg")]
    saved = [(logger, list(logger.handlers), logger.level) for logger in loggers]
    out = io.StringIO()
    try:
        durable.configure_logging(json=True, level="info", stream=out)
        durable.configure_logging(json=True, level="info", stream=out)  # replaces itself
        yield out
    finally:
        for logger, handlers, level in saved:
            for handler in logger.handlers:
                if handler not in handlers:
                    handler.close()
            logger.handlers = handlers
            logger.setLevel(level)


def test_the_command_line_renders_the_driver_s_warnings_as_its_own_lines_once_a_minute(
        cli_logging: io.StringIO) -> None:
    """psycopg's pool logs a failed connection as text of three lines, a few times a
    second, with an object's address in some; what the command line shows is one JSON
    line per message a minute, redacted."""
    pool = logging.getLogger("psycopg.pool")
    for i in range(5):
        pool.warning("error connecting in 'durable:s': connection failed: connection to "
                     "server at \"127.0.0.1\", port 5432 failed: server closed the "
                     "connection unexpectedly\n\tThis probably means the server terminated "
                     "abnormally\n\tbefore or while processing the request.")
        pool.warning("discarding closed connection: <_Pooled [BAD] at 0x7f%010x>", i)
    logging.getLogger("psycopg").warning(
        "reconnecting to postgresql://durable:hunter2@db.example/prod")
    pool.info("connection ok")  # below the driver's level: never reaches a handler
    lines = [json.loads(line) for line in cli_logging.getvalue().splitlines()]
    assert [(line["event"], line["level"], line["logger"]) for line in lines] == [
        ("driver_message", "warning", "psycopg.pool"),
        ("driver_message", "warning", "psycopg.pool"),
        ("driver_message", "warning", "psycopg"),
    ]
    assert lines[0]["message"] == (
        "error connecting in 'durable:s': connection failed: connection to server at "
        "\"127.0.0.1\", port 5432 failed: server closed the connection unexpectedly This "
        "probably means the server terminated abnormally before or while processing the "
        "request.")
    assert lines[1]["message"] == "discarding closed connection: <_Pooled [BAD] at 0x7f0000000000>"
    assert "hunter2" not in cli_logging.getvalue()
    assert lines[2]["message"] == "reconnecting to postgresql://durable:[redacted]@db.example/prod"


def test_the_command_line_s_level_holds_for_the_driver_s_lines() -> None:
    logger = logging.getLogger("psycopg")
    saved = list(logger.handlers), list(logging.getLogger("durable").handlers)
    out = io.StringIO()
    try:
        durable.configure_logging(json=True, level="error", stream=out)
        logging.getLogger("psycopg.pool").warning("error connecting")
        logging.getLogger("psycopg.pool").error("the pool is broken")
    finally:
        for handler in logger.handlers:
            if handler not in saved[0]:
                handler.close()
        logger.handlers = saved[0]
        logging.getLogger("durable").handlers = saved[1]
    [line] = [json.loads(line) for line in out.getvalue().splitlines()]
    assert (line["message"], line["level"]) == ("the pool is broken", "error")


def flows(registry: durable.Registry) -> None:
    @durable.workflow("outage.noop", registry=registry)
    async def noop(ctx: durable.WorkflowContext) -> str:
        return "done"


@pg_only
@pytest.mark.anyio
async def test_postgres_a_lasting_outage_is_logged_as_it_begins_and_as_it_ends(
        pg_url: str, registry: durable.Registry, captured: list[dict[str, Any]]) -> None:
    """The server unreachable through a proxy: the worker's claims fail again and again
    (each after the pool's 0.3 s), and its claim loop says so once; when the server is
    back, one ``claim_recovered`` with the count, and the worker runs runs again. Every
    other loop that failed (the sweep, the schedules) logs the same way: one line as its
    failures begin, one as they end. The interceptors are told of every failed try, so
    the metrics count them all and show the loop failing while it fails."""
    from durable.prometheus import MetricsInterceptor
    from durable.store._postgres import PostgresStore

    metrics, counters = MetricsInterceptor(), durable.Counters()

    def sample(name: str, loop: str = "claim") -> float | None:
        value: float | None = metrics.registry.get_sample_value(name, {"loop": loop})
        return value

    flows(registry)
    async with losing_proxy(pg_url.partition("?")[0]) as proxy:
        store = PostgresStore(proxy.url(pg_url), pool_timeout=0.3)
        await store.open()
        failed = 0
        real = store.claim

        async def counted(*args: Any, **kwargs: Any) -> Any:
            nonlocal failed
            try:
                return await real(*args, **kwargs)
            except StoreError:
                failed += 1
                raise

        store.claim = counted  # type: ignore[method-assign]
        where: dict[str, str] = {}  # event -> the function a record names

        class Where(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                where.setdefault(getattr(record, "event", ""), record.funcName)

        named = Where()
        logging.getLogger("durable.worker").addHandler(named)
        try:
            worker = durable.Worker(store, registry=registry, poll_interval=0.01,
                                    sweep_interval=0.05, schedule_interval=0.05,
                                    interceptors=[metrics, counters])
            async with anyio.create_task_group() as tg:
                await tg.start(worker.run)
                assert sample("durable_loop_failing") is None  # no failure yet
                proxy.down()
                await poll(lambda: failed >= 8, timeout=BOUND)
                assert sample("durable_loop_failing") == 1
                proxy.up()
                ended = await poll(lambda: [e for e in captured
                                            if e["event"] == "claim_recovered"], timeout=BOUND)
                client = durable.Client(store, registry=registry)
                await client.start("outage.noop", id="after")
                with anyio.fail_after(BOUND):
                    assert (await client.wait("after")).result == "done"
                # every loop that failed has run once since (the sweep's or the schedules'
                # last try may still have been waiting for the pool when the claim loop
                # recovered): then each has said so
                await poll(lambda: _loops(captured, "_failed") <= _loops(
                    captured, "_recovered"), timeout=BOUND)
                worker.shutdown(grace=0)
        finally:
            logging.getLogger("durable.worker").removeHandler(named)
            await store.aclose()
    # the first claim lost its connection, the others found none within 0.3 s: each error
    # text once (the test is far shorter than a minute)
    lines: dict[str, list[str]] = {}
    for entry in captured:
        if entry["event"].endswith("_failed"):
            lines.setdefault(entry["event"], []).append(entry["error"])
    claims = lines.pop("claim_failed")
    assert len(claims) == len(set(claims)) <= 2 and "PostgreSQL" in claims[-1], claims
    assert "no connection within 0.3 s" in claims[-1]
    assert ended[0]["failures"] == failed >= 8 and ended[0]["log_level"] == "info"
    assert where["claim_failed"] == where["claim_recovered"] == "_claim_loop", where
    recovered = Counter(e["event"] for e in captured if e["event"].endswith("_recovered"))
    assert recovered["claim_recovered"] == 1, recovered
    for event, errors in lines.items():
        assert len(errors) == len(set(errors)), (event, errors)
        if event != "claim_read_back_failed":  # a claim's aftermath, not a loop
            assert recovered[event.removesuffix("_failed") + "_recovered"] == 1, (
                event, recovered)
    # every failed try told, logged or not; the loop no longer failing
    assert counters.loop_failures["claim"] == failed == sample("durable_loop_failures_total")
    assert sample("durable_loop_failing") == 0
    for loop, count in counters.loop_failures.items():
        assert recovered[f"{loop}_recovered"] == 1 and sample("durable_loop_failing", loop) == 0
        assert sample("durable_loop_failures_total", loop) == count >= 1, loop


@pg_only
@pytest.mark.anyio
async def test_postgres_the_cli_worker_s_stderr_stays_json_lines_through_an_outage(
        pg_url: str, tmp_path: Path) -> None:
    """``durable worker --log-format json`` on the real PostgreSQL through a proxy taken
    down: psycopg's pool warns of every failed reconnection (text of three lines, a few a
    second); on stderr they are JSON lines of the worker's (``driver_message``), each
    message once; the worker then stops on SIGTERM as usual. The schema the worker created
    is said in a JSON line too (``database_created``; it was a plain line)."""
    module = tmp_path / "outage_flows.py"
    module.write_text("import durable\n\n\n@durable.workflow('outage.cli')\n"
                      "async def cli(ctx):\n    return 1\n")
    err = tmp_path / "stderr.txt"
    async with losing_proxy(pg_url.partition("?")[0]) as proxy:
        with open(err, "wb") as out:
            proc = await anyio.open_process(
                [sys.executable, "-m", "durable", "worker", "--db", proxy.url(pg_url),
                 "--import", str(module), "--log-format", "json", "--poll", "0.05"],
                cwd=ROOT, env=subprocess_env(), stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=out, start_new_session=True)
        async with stopped_by_sigterm(proc, BOUND):
            await poll(lambda: "worker_started" in err.read_text(), timeout=BOUND)
            proxy.down()
            await poll(lambda: err.read_text().count("driver_message") >= 1, timeout=BOUND)
            # the pool keeps trying to connect (0.5 s apart at first, then longer)
            await poll(lambda: proxy.refused >= 4, timeout=BOUND)
            proxy.up()
    text = err.read_text()
    assert proc.returncode == 0, text[-3000:]
    lines = [json.loads(line) for line in text.splitlines()]  # nothing but JSON lines
    driver = [(line["logger"], re.sub(r"0x[0-9a-f]+", "0x", line["message"]))
              for line in lines if line["event"] == "driver_message"]
    assert driver and len(driver) == len(set(driver)), driver
    assert any("error connecting" in message for _, message in driver), driver
    assert lines[-1]["event"] == "worker_stopped"
    [created] = [line for line in lines if line["event"] == "database_created"]  # a JSON
    assert created["level"] == "warning" and "schema" in created["at"]  # line, like the rest


class FailedReads:
    """Counts the reads of a run (``get_run``) through a store object that raised."""

    def __init__(self, store: Any) -> None:
        self.count = 0
        real = store.get_run

        async def counted(run_id: str) -> durable.Run | None:
            try:
                return await real(run_id)
            except StoreError:
                self.count += 1
                raise

        store.get_run = counted


@pg_only
@pytest.mark.anyio
async def test_postgres_a_wait_goes_on_through_an_outage(
        pg_url: str, registry: durable.Registry, captured: list[dict[str, Any]]) -> None:
    """A client behind a proxy taken down while it waits for a run (its worker reaches the
    server directly, and finishes the run during the outage): the wait reads again until
    the server is back and returns the finished run, instead of raising at its first
    failed read; the client logs the failed reads once and their end once."""
    from durable.store._postgres import PostgresStore

    entered, gate = anyio.Event(), anyio.Event()

    @durable.activity(registry=registry)
    async def held(ctx: durable.ActivityContext) -> str:
        entered.set()
        await gate.wait()
        return "through"

    @durable.workflow("outage.held", registry=registry)
    async def through(ctx: durable.WorkflowContext) -> str:
        return await held(ctx)

    result: durable.Run | None = None
    async with opened(pg_url) as direct, losing_proxy(pg_url.partition("?")[0]) as proxy:
        far = PostgresStore(proxy.url(pg_url), pool_timeout=0.3)
        await far.open()
        try:
            failed = FailedReads(far)
            client = durable.Client(far, registry=registry)
            async with worker_on(direct, registry), anyio.create_task_group() as tg:
                await client.start("outage.held", id="held")
                with anyio.fail_after(BOUND):
                    await entered.wait()

                async def waiting() -> None:
                    nonlocal result
                    result = await client.wait("held", timeout=BOUND, poll=0.05)

                tg.start_soon(waiting)
                proxy.down()
                await poll(lambda: failed.count >= 3, timeout=BOUND)
                gate.set()  # the run finishes while the client cannot read it
                await poll(async_finished(direct, "held"), timeout=BOUND)
                proxy.up()
                await poll(lambda: result is not None, timeout=BOUND)
        finally:
            await far.aclose()
    assert result is not None and (result.state, result.result) == (
        durable.RunState.COMPLETED, "through")
    errors = [e["error"] for e in captured if e["event"] == "wait_read_failed"]
    assert errors and len(errors) == len(set(errors)) <= 2, errors  # each text once
    [ended] = [e for e in captured if e["event"] == "wait_read_recovered"]
    assert ended["failures"] == failed.count >= 3 and ended["workflow_id"] == "held"


def async_finished(store: Any, run_id: str) -> Any:
    async def finished() -> bool:
        run = await store.get_run(run_id)
        return run is not None and run.state.finished
    return finished


@pg_only
@pytest.mark.anyio
async def test_postgres_a_wait_that_times_out_unable_to_read_cannot_tell(
        pg_url: str, registry: durable.Registry) -> None:
    """The store unreachable until the wait's timeout: the wait raises the store's error,
    saying it cannot tell whether the run finished, not TimeoutError (which says the run
    was seen unfinished); with the store reachable, a run that does not finish is still a
    TimeoutError."""
    from durable.store._postgres import PostgresStore

    flows(registry)
    async with losing_proxy(pg_url.partition("?")[0]) as proxy:
        far = PostgresStore(proxy.url(pg_url), pool_timeout=0.3)
        await far.open()
        try:
            failed = FailedReads(far)
            client = durable.Client(far, registry=registry)
            await client.start("outage.noop", id="unread")  # no worker: it stays queued
            with pytest.raises(TimeoutError, match=r"did not finish within 0\.3 s"):
                await client.wait("unread", timeout=0.3, poll=0.05)
            proxy.down()
            with pytest.raises(durable.StoreUnavailableError,
                               match="cannot tell whether it finished") as raised:
                await client.wait("unread", timeout=2.0, poll=0.05)
            assert f"{failed.count} reads failed in a row" in str(raised.value)
            assert failed.count >= 2
            # reads that failed, then the store back before the timeout: the run was seen
            # unfinished, so TimeoutError (psycopg's pool reconnects within a few seconds)
            before, ended = failed.count, []

            async def waiting() -> None:
                with pytest.raises(TimeoutError) as timed_out:
                    await client.wait("unread", timeout=12.0, poll=0.05)
                ended.append(timed_out.value)

            async with anyio.create_task_group() as tg:
                tg.start_soon(waiting)
                await poll(lambda: failed.count >= before + 2, timeout=BOUND)
                proxy.up()
            assert ended
        finally:
            await far.aclose()


@pg_only
@pytest.mark.anyio
async def test_postgres_show_follow_goes_on_through_an_outage(
        pg_url: str, registry: durable.Registry) -> None:
    """``show ID --follow`` reading through a proxy taken down while the run goes on (its
    worker reaches the server directly and finishes it meanwhile): one line says the store
    cannot be read, one that it answers again, and the follow prints the run's end and
    exits 0, where it used to exit 1 at its first failed read."""
    from .test_cli_follow import _gated, _row, following

    gates = _gated(registry)
    async with opened(pg_url) as direct, losing_proxy(pg_url.partition("?")[0]) as proxy:
        client = durable.Client(direct, registry=registry)
        async with worker_on(direct, registry):
            await client.start("follow.steps", ["a"], id="fo")
            async with following(proxy.url(pg_url), "fo") as (proc, out, err):
                at = await out.until(lambda t: _row(t, 1, "started"))
                proxy.down()
                at = await out.until("the store cannot be read", after=at)
                gates["a"].set()
                await poll(async_finished(direct, "fo"), timeout=BOUND)
                proxy.up()
                with anyio.fail_after(BOUND):  # the pool connects again within seconds
                    assert await proc.wait() == 0, err.text
                await out.until("run fo completed", after=at)
    text = out.text
    assert text.count("-- the store cannot be read: ") == 1, text
    assert "PostgreSQL" in text and "reading again every 0.5 s" in text
    assert text.count("-- the store answers again (unreadable for ") == 1, text
    assert text.index("cannot be read") < text.index("answers again") < text.index(
        "run fo completed")
    assert _row(text, 1, "completed")
    # stderr: psycopg's pool warnings, in the command line's format, each once
    assert all("driver_message" in line for line in err.text.splitlines()), err.text


def _loops(captured: list[dict[str, Any]], suffix: str) -> set[str]:
    """The loops whose events with ``suffix`` (``_failed``, ``_recovered``) were logged; a
    claim's read-back is a claim's aftermath, not a loop."""
    return {e["event"].removesuffix(suffix) for e in captured
            if e["event"].endswith(suffix) and e["event"] != "claim_read_back_failed"}
