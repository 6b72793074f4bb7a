"""Used as a library, durable logs like one: through ``logging``, silent until configured,
structured, and never with a secret in it, whoever handles the records."""

from __future__ import annotations

import io
import json
import logging
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

import durable
import durable.testing
from durable._logging import get_logger

from .conftest import ROOT, subprocess_env
from .helpers import stopped_by_sigterm

TOKEN = "s3cr3t-t0ken-value"

# An application that embeds a client and a worker: one run completes, one fails with a
# token in its error (so warnings are logged). ``basic`` configures logging the plain way and
# keeps what reached its handler; either way it says at the end whether structlog was loaded.
EMBED = '''
import json, logging, sys
mode, db, backend, out = sys.argv[1:5]
kept = []
if mode == "basic":
    logging.basicConfig(level=logging.DEBUG, format="%(levelname)s %(name)s %(message)s")

    class Keep(logging.Handler):
        def emit(self, record):
            kept.append({"logger": record.name, "level": record.levelname,
                         "event": getattr(record, "event", None),
                         "fields": getattr(record, "fields", None),
                         "message": record.getMessage()})

    logging.getLogger("durable").addHandler(Keep())

import anyio
import durable
import durable.testing

TOKEN = "s3cr3t-t0ken-value"
reg = durable.Registry()


@durable.activity(registry=reg)
async def greet(ctx, name):
    return f"hello {name}"


@durable.activity(registry=reg)
async def leak(ctx):
    raise durable.NonRetryableError(
        f"refused: Bearer {TOKEN}; retry with authorization={TOKEN}")


@durable.workflow("embed.hello", registry=reg)
async def hello(ctx, name):
    return await greet(ctx, name)


@durable.workflow("embed.leak", registry=reg)
async def leaky(ctx):
    await leak(ctx)


async def main():
    async with durable.Client.connect(f"sqlite:///{db}", registry=reg) as client:
        worker = durable.Worker(client.store, registry=reg, poll_interval=0.01)
        async with anyio.create_task_group() as tg:
            await tg.start(worker.run)
            await client.start("embed.hello", "you", id="h")
            await client.start("embed.leak", id="l")
            assert (await client.wait("h", timeout=30)).state is durable.RunState.COMPLETED
            assert (await client.wait("l", timeout=30)).state is durable.RunState.FAILED
            worker.shutdown(grace=0)


anyio.run(main, backend=backend)
with open(out, "w") as f:
    json.dump({"structlog_loaded": "structlog" in sys.modules, "records": kept}, f)
'''


def embed(tmp_path: Path, mode: str, backend: str) -> tuple[subprocess.CompletedProcess[str],
                                                             dict[str, Any]]:
    script, out = tmp_path / "embed.py", tmp_path / "out.json"
    script.write_text(EMBED)
    proc = subprocess.run(
        [sys.executable, str(script), mode, str(tmp_path / "app.db"), backend, str(out)],
        cwd=tmp_path, env=subprocess_env(), capture_output=True, text=True, timeout=120)
    assert out.exists(), proc.stderr  # the application ran to its end
    result: dict[str, Any] = json.loads(out.read_text())
    return proc, result


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_an_embedding_application_that_configures_nothing_sees_nothing(
        tmp_path: Path, backend: str) -> None:
    proc, result = embed(tmp_path, "silent", backend)
    assert proc.returncode == 0
    assert (proc.stdout, proc.stderr) == ("", "")  # not even the failed run's warnings
    assert result["structlog_loaded"] is False  # the engine does not need it


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_a_plain_logging_setup_gets_structured_redacted_records(
        tmp_path: Path, backend: str) -> None:
    proc, result = embed(tmp_path, "basic", backend)
    assert proc.returncode == 0 and proc.stdout == ""
    records = result["records"]
    by_event = {(r["event"], r["fields"].get("workflow_id")): r for r in records}
    completed = by_event["run_completed", "h"]
    assert completed["logger"] == "durable.attempt" and completed["level"] == "INFO"
    assert completed["fields"]["workflow"] == "embed.hello"
    assert completed["fields"]["attempt"] == 1 and isinstance(completed["fields"]["epoch"], int)
    step = by_event["step_completed", "h"]  # debug records arrive too, with the step's fields
    assert step["level"] == "DEBUG" and step["fields"]["step"] == 1
    assert step["fields"]["activity"].endswith("greet")
    claimed = by_event["run_claimed", "h"]
    assert claimed["fields"]["worker"] and claimed["message"].startswith("run_claimed ")
    failed = by_event["step_failed", "l"]
    assert failed["level"] == "WARNING"
    assert "Bearer [redacted]; retry with authorization=[redacted]" in failed["fields"]["error"]
    assert any(r["logger"] == "durable.worker" and r["event"] == "worker_started"
               for r in records)
    # the plain handler on the root logger printed the same records, fields in the message
    assert "WARNING durable.attempt step_failed workflow_id=l " in proc.stderr
    assert "INFO durable.attempt run_completed workflow_id=h " in proc.stderr
    assert "Bearer [redacted]; retry with authorization=[redacted]" in proc.stderr
    assert TOKEN not in proc.stderr and TOKEN not in json.dumps(records)


@pytest.fixture
def durable_output() -> Iterator[io.StringIO]:
    """What a plain handler on the ``durable`` logger prints, every level."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s %(message)s"))
    logger = logging.getLogger("durable")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        yield stream
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def test_fields_and_tracebacks_are_redacted_before_any_handler(
        durable_output: io.StringIO) -> None:
    seen: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record)

    keep = Keep()
    logging.getLogger("durable").addHandler(keep)
    log = get_logger("durable.probe", authorization=f"Bearer {TOKEN}").bind(step=2)
    try:
        try:
            raise RuntimeError(f"GET https://user:{TOKEN}@host/x?token={TOKEN} failed")
        except RuntimeError:
            log.exception("probe_failed", url=f"https://h/?api_key={TOKEN}",
                          headers={"X-Api": TOKEN},
                          nested={"password": TOKEN, "items": [f"Bearer {TOKEN}"]})
    finally:
        logging.getLogger("durable").removeHandler(keep)
    out = durable_output.getvalue()
    assert out.startswith("ERROR durable.probe probe_failed authorization=[redacted] step=2 ")
    assert "Traceback" in out and "user:[redacted]@host" in out
    assert TOKEN not in out
    [record] = seen
    assert record.exc_info is None and record.exc_text and TOKEN not in record.exc_text
    fields = record.fields  # type: ignore[attr-defined]
    assert fields["authorization"] == "[redacted]" and fields["headers"] == "[redacted]"
    assert fields["nested"] == {"password": "[redacted]", "items": ["Bearer [redacted]"]}
    assert fields["url"] == "https://h/?api_key=[redacted]" and fields["step"] == 2


@pytest.mark.parametrize("name", ["cookie", "set_cookie", "Set-Cookie", "client_secret",
                                  "db_passwd", "credentials", "x_api_key", "headers"])
def test_a_field_named_for_a_credential_is_blanked_whatever_its_value(
        durable_output: io.StringIO, name: str) -> None:
    """A value no pattern recognises (a bare session id, a raw key) is kept out by its
    field's name alone."""
    get_logger("durable.probe").warning("probe", **{name: "sid-7f3a9c", "step": 1})
    out = durable_output.getvalue()
    assert "sid-7f3a9c" not in out and f"{name}=[redacted]" in out, out


def test_disabled_levels_cost_no_record(durable_output: io.StringIO) -> None:
    logging.getLogger("durable").setLevel(logging.INFO)
    get_logger("durable.probe").debug("probe_debug", step=1)
    get_logger("durable.probe").info("probe_info", step=1)
    assert durable_output.getvalue() == "INFO durable.probe probe_info step=1\n"


def test_the_redacting_filter_guards_an_applications_own_handler() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(name)s %(message)s auth=%(authorization)s"))
    handler.addFilter(durable.RedactingFilter())
    logger = logging.getLogger("tests.someapp")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        try:
            raise ValueError(f"upstream said password={TOKEN}")
        except ValueError:
            logger.error("calling %s", f"https://u:{TOKEN}@h/p?token={TOKEN}", exc_info=True,
                         extra={"authorization": f"Bearer {TOKEN}"})
    finally:
        logger.removeHandler(handler)
        logger.propagate = True
    out = stream.getvalue()
    assert out.startswith("tests.someapp calling https://u:[redacted]@h/p?token=[redacted] "
                          "auth=[redacted]\n")
    assert "ValueError: upstream said password=[redacted]" in out
    assert TOKEN not in out


def test_capture_logs_collects_every_level_and_nothing_leaks_out(
        durable_output: io.StringIO) -> None:
    with durable.testing.capture_logs() as logs:
        get_logger("durable.probe", workflow_id="r1").debug("probe_debug", step=1)
    assert logs == [{"workflow_id": "r1", "step": 1, "event": "probe_debug",
                     "log_level": "debug", "logger": "durable.probe"}]
    assert durable_output.getvalue() == ""  # captured instead of passed on
    get_logger("durable.probe").info("probe_after")
    assert durable_output.getvalue() == "INFO durable.probe probe_after\n"  # handlers back


def test_configure_logging_renders_console_lines_and_replaces_itself() -> None:
    logger = logging.getLogger("durable")
    before = list(logger.handlers), logger.level
    first, second = io.StringIO(), io.StringIO()
    try:
        durable.configure_logging(level="warning", stream=first)
        durable.configure_logging(level="info", stream=second)
        get_logger("durable.probe", workflow_id="r1").info("probe_info", detail=f"Bearer {TOKEN}")
        get_logger("durable.probe").debug("probe_debug")
    finally:
        for handler in logger.handlers:
            if handler not in before[0]:
                handler.close()
        logger.handlers = before[0]
        logger.setLevel(before[1])
    assert first.getvalue() == ""
    [line] = second.getvalue().splitlines()
    assert "[info     ] probe_info" in line
    assert "workflow_id=r1" in line and "detail='Bearer [redacted]'" in line
    assert line[:4].isdigit() and line[19:20] in (".", "Z")  # an ISO timestamp leads


# -- the command line ----------------------------------------------------------------------------
APP_MODULE = '''
import logging, os
import durable
import durable.testing

# the application's own handler on durable's logger, beside the command line's rendering
handler = logging.FileHandler(os.environ["APP_LOG"])
handler.setFormatter(logging.Formatter("%(levelname)s %(name)s %(message)s"))
logging.getLogger("durable").addHandler(handler)


@durable.activity("clilog.leak")
async def leak(ctx):
    raise durable.NonRetryableError("refused: Authorization: Bearer {token}")


@durable.workflow("clilog.leaky")
async def leaky(ctx):
    await leak(ctx)
'''


@pytest.mark.anyio
async def test_the_cli_worker_writes_json_lines_on_stderr(tmp_path: Path) -> None:
    module = tmp_path / "clilog_flows.py"
    module.write_text(APP_MODULE.replace("{token}", TOKEN))
    db_url = f"sqlite:///{tmp_path / 'cli.db'}"
    reg = durable.Registry()

    @durable.workflow("clilog.leaky", registry=reg)
    async def leaky(ctx: durable.WorkflowContext) -> None:  # the worker runs the module's
        raise AssertionError("not run here")

    stdout, stderr, app_log = (tmp_path / n for n in ("stdout.txt", "stderr.txt", "app.log"))
    env = {**subprocess_env(), "APP_LOG": str(app_log)}
    async with durable.Client.connect(db_url, registry=reg) as client:
        await client.start("clilog.leaky", id="c1")
        with open(stdout, "wb") as out, open(stderr, "wb") as err:
            proc = await anyio.open_process(
                [sys.executable, "-m", "durable", "worker", "--db", db_url, "--import",
                 str(module), "--log-format", "json", "--poll", "0.05"],
                cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                start_new_session=True)
        async with stopped_by_sigterm(proc):
            done = await client.wait("c1", timeout=60)
            assert done.state is durable.RunState.FAILED
    assert proc.returncode == 0, stderr.read_text()
    assert stdout.read_text() == ""
    text = stderr.read_text()
    lines = [json.loads(line) for line in text.splitlines()]  # nothing but JSON lines
    assert TOKEN not in text
    for line in lines:
        assert {"event", "level", "timestamp"} <= set(line), line
    events = [line["event"] for line in lines]
    assert events[0] == "worker_started" and events[-1] == "worker_stopped"
    assert events.count("run_failed") == 1  # one handler, though main() configured first
    claimed = next(line for line in lines if line["event"] == "run_claimed")
    assert claimed["workflow_id"] == "c1" and claimed["workflow"] == "clilog.leaky"
    assert claimed["attempt"] == 1 and claimed["worker"] and claimed["level"] == "info"
    failed = next(line for line in lines if line["event"] == "step_failed")
    assert failed["level"] == "warning" and failed["step"] == 1
    assert "Authorization: [redacted]" in failed["error"]
    # the application's own handler got the same records, redacted
    app = app_log.read_text()
    assert "WARNING durable.attempt run_failed workflow_id=c1 " in app
    assert "Authorization: [redacted]" in app and TOKEN not in app
