"""``durable worker --log-format json``: Python's own messages (a warning, asyncio's error
for a task whose failure nobody retrieved) are JSON lines too, redacted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

import durable

from .conftest import ROOT, subprocess_env
from .helpers import poll, stopped_by_sigterm
from .pg import pg_url, postgres_server  # noqa: F401  (fixtures)

pytestmark = pytest.mark.anyio
TOKEN = "s3cr3t-t0ken-value"
BOUND = 30.0


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "postgres":
        return str(request.getfixturevalue("pg_url"))
    return f"sqlite:///{tmp_path / 'durable.db'}"


async def test_python_s_warnings_and_asyncio_s_errors_are_redacted_json_lines(
        store_url: str, tmp_path: Path) -> None:
    async with durable.Client.connect(store_url) as client:
        await client.start("pythonlog.noisy", id="noisy")
    err = tmp_path / "stderr.txt"
    env = {**subprocess_env(), "PYTHON_LOG_TOKEN": TOKEN}
    with open(err, "wb") as out:
        proc = await anyio.open_process(
            [sys.executable, "-m", "durable", "worker", "--db", store_url, "--backend",
             "asyncio", "--import", "tests.pythonlogflows", "--log-format", "json",
             "--poll", "0.05"],
            cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=out, start_new_session=True)
    async with stopped_by_sigterm(proc, BOUND):
        await poll(lambda: "run_completed" in err.read_text(), timeout=BOUND)
    text = err.read_text()
    assert proc.returncode == 0, text[-3000:]
    assert TOKEN not in text
    lines = [json.loads(line) for line in text.splitlines()]  # nothing but JSON lines
    python = {line["logger"]: line for line in lines if line["event"] == "python_message"}
    assert set(python) == {"py.warnings", "asyncio"}, lines
    assert "the v1 API is deprecated" in python["py.warnings"]["message"]
    assert python["py.warnings"]["level"] == "warning"
    assert "never retrieved" in python["asyncio"]["message"]
    assert python["asyncio"]["level"] == "error"
    assert "Authorization: [redacted]" in python["asyncio"]["exception"]
