"""``worker --metrics HOST:PORT``: a worker subprocess serves its metrics; they are scraped."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

pytest.importorskip("prometheus_client")

import durable

from .conftest import ROOT, subprocess_env
from .helpers import poll, python_process
from .httpserver import Rule, loopback_server
from .test_prometheus import samples, value

pytestmark = pytest.mark.anyio
TOKEN = "s3cr3t-t0ken-value"
ANNOUNCED = re.compile(r"durable: metrics at (http://\S+/metrics)")


async def test_a_worker_serves_metrics_scraped_over_http(tmp_path: Path) -> None:
    import tests.metricsflows as flows

    db = f"sqlite:///{tmp_path / 'm.db'}"
    orphans = durable.Registry()  # queued runs of a workflow this worker does not run

    @durable.workflow("metrics.orphan", registry=orphans)
    async def orphan(ctx: durable.WorkflowContext) -> None:
        return None

    log = tmp_path / "worker.log"
    async with loopback_server() as server, durable.Client.connect(db) as client:
        server.on(f"/hook/{TOKEN}", Rule(status=500))
        env = subprocess_env()
        env["METRICS_TEST_URL"] = f"{server.url}/hook/{TOKEN}?api_key={TOKEN}"
        env["METRICS_TEST_TOKEN"] = TOKEN
        await client.start(orphan, id="orphan-1")
        await client.start(orphan, id="orphan-2")
        argv = ["-m", "durable.worker", "--db", db, "--import", "tests.metricsflows",
                "--poll", "0.05", "--metrics", "127.0.0.1:0"]
        with python_process(argv, log, env=env) as proc:
            found = await poll(lambda: ANNOUNCED.search(log.read_text()), timeout=30)
            url = found.group(1)
            for i in range(3):
                await client.start(flows.ok, f"n{i}", id=f"ok-{i}")
            await client.start(flows.leaky, id="leaky")
            for run_id in ("ok-0", "ok-1", "ok-2", "leaky"):
                await client.wait(run_id, timeout=30)
            async with httpx.AsyncClient() as http:
                response = await http.get(url, timeout=10)
                missing = await http.get(url.replace("/metrics", "/nothing"), timeout=10)
            assert proc.poll() is None
        assert len(server.seen(f"/hook/{TOKEN}")) == 2  # really sent, twice (two tries)
    assert response.status_code == 200 and missing.status_code == 404
    assert response.headers["content-type"].startswith("text/plain")
    text = response.text
    assert TOKEN not in text  # nor in any label: the URL, header and error stay out
    page = samples(text)
    assert value(page, "durable_runs_started_total", workflow="metrics.ok") == 3
    assert value(page, "durable_runs_finished_total", workflow="metrics.ok",
                 state="completed") == 3
    assert value(page, "durable_runs_finished_total", workflow="metrics.leaky",
                 state="failed") == 1
    assert value(page, "durable_attempts_ended_total", workflow="metrics.ok",
                 outcome="completed") == 3
    assert value(page, "durable_step_tries_total", workflow="metrics.leaky",
                 activity="metrics.leak", outcome="error") == 2
    assert value(page, "durable_step_duration_seconds_count", workflow="metrics.ok",
                 activity="metrics.echo", outcome="completed") == 3
    assert value(page, "durable_claimed_runs_total") == 4
    assert value(page, "durable_claim_duration_seconds_count") >= 1
    assert value(page, "durable_journal_write_duration_seconds_count", kind="finish") == 4
    assert value(page, "durable_journal_write_duration_seconds_count", kind="append") >= 2
    assert value(page, "durable_attempts_running", workflow="metrics.ok") == 0
    # the queue, read from the store at the scrape: the orphans wait, nothing else is due
    assert value(page, "durable_queue_depth", workflow="metrics.orphan") == 2
    assert value(page, "durable_queue_age_seconds", workflow="metrics.orphan") > 0
    assert ("durable_queue_depth", (("workflow", "metrics.ok"),)) not in page
    assert value(page, "durable_lease_losses_total", workflow="metrics.ok") == 0
    assert "durable: metrics at" in log.read_text()


def _worker_cli(*args: str, block: str | None = None) -> subprocess.CompletedProcess[str]:
    code = ("import sys\n"
            + (f"sys.modules[{block!r}] = None\n" if block else "")
            + "from durable._cli import worker_main\n"
            f"sys.exit(worker_main({list(args)!r}))\n")
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=subprocess_env(),
                          capture_output=True, text=True, timeout=60)


def test_metrics_without_the_extra_is_one_line_naming_it(tmp_path: Path) -> None:
    done = _worker_cli("--db", f"sqlite:///{tmp_path / 'x.db'}", "--import", "tests.cliflows",
                       "--metrics", "127.0.0.1:0", block="prometheus_client")
    assert done.returncode == 2, done.stderr
    [line] = done.stderr.strip().splitlines()
    assert "prometheus extra" in line and "durable-fenced[prometheus]" in line
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "x.db").exists()  # nothing written half-way


def test_a_taken_or_malformed_metrics_address_is_one_line(tmp_path: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        done = _worker_cli("--db", f"sqlite:///{tmp_path / 'x.db'}", "--import",
                           "tests.cliflows", "--metrics", f"127.0.0.1:{port}")
    assert done.returncode == 2
    [line] = done.stderr.strip().splitlines()
    assert f"cannot serve the metrics on 127.0.0.1:{port}" in line
    bad = _worker_cli("--db", f"sqlite:///{tmp_path / 'x.db'}", "--import", "tests.cliflows",
                      "--metrics", "nowhere")
    assert bad.returncode == 2
    [line] = bad.stderr.strip().splitlines()
    assert "--metrics 'nowhere' is not HOST:PORT (e.g. 127.0.0.1:9464)" in line
    assert not (tmp_path / "x.db").exists()
