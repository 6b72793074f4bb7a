"""The store-calls benchmark runs, checks its runs completed, and prints every figure (no
timing asserted)."""

from __future__ import annotations

import json
import subprocess
import sys

from .conftest import ROOT, subprocess_env

SCRIPT = ROOT / "scripts" / "bench_store_calls.py"


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), "--runs", "20", *args], cwd=ROOT,
                          env=subprocess_env(), capture_output=True, text=True, timeout=120)


def test_the_store_calls_benchmark_times_each_statement() -> None:
    done = run("--json")
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(done.stdout)
    statements = report["statements"]
    # every call of a five-step run, each as often as the engine makes it: five
    # transactions a run, and one more for the last run's finish (nothing carries it)
    assert round(statements["BEGIN IMMEDIATE"]["per_run"] * 20) == 101
    commits = [v["per_run"] for k, v in statements.items() if k.startswith("COMMIT after")]
    assert round(sum(commits) * 20) == 101, statements
    appends = [v["per_run"] for k, v in statements.items() if k.startswith("An append")]
    assert appends == [4.0], statements
    assert 0 < report["sqlite_us_per_step"] < report["us_per_step"]
    done = run()
    assert done.returncode == 0, done.stderr[-4000:]
    assert "20 runs of 5 steps through the store's API alone (SQLite)" in done.stdout


def test_an_index_can_be_dropped_and_an_unknown_one_is_refused() -> None:
    done = run("--drop-index", "durable_runs_by_workflow_state", "--json")
    assert done.returncode == 0, done.stderr[-4000:]
    assert json.loads(done.stdout)["dropped"] == ["durable_runs_by_workflow_state"]
    done = run("--drop-index", "no_such_index")
    assert done.returncode == 2
    assert done.stderr.strip() == "bench_store_calls: no such index: no_such_index"
