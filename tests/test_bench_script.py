"""scripts/bench.py runs end to end with small numbers and reports its figures.

No timing is asserted: the figures depend on the machine and its load. What is checked is
that every workload completed (the script verifies the journal itself and exits non-zero
otherwise) and that the report carries each figure the docs quote.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from .conftest import ROOT, subprocess_env

BENCH = ROOT / "scripts" / "bench.py"
ENGINE_FIGURES = (
    "steps_per_s",
    "ms_per_step",
    "overhead_ms_per_step",
    "cpu_ms_per_step",
    "runs_per_s",
    "starts_per_s",
    "plain_steps_per_s",
)
BASELINES = (
    "plain_async_sequential_steps_per_s",
    "plain_async_concurrent_steps_per_s",
    "sqlite3_commits_per_s",
    "store_thread_commits_per_s",
)


def run_bench(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--quick", *args],
        cwd=tmp_path, env=subprocess_env(), capture_output=True, text=True, timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def positive(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value > 0


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_quick_run_reports_every_figure_as_json(tmp_path: Path, backend: str) -> None:
    report = json.loads(run_bench(tmp_path, "--json", "--backend", backend).stdout)

    assert report["config"]["quick"] is True
    assert report["machine"]["cpus"] >= 1
    assert list(report["backends"]) == [backend]
    result = report["backends"][backend]
    for workload, runs in (("sequential", report["config"]["sequential"]),
                           ("concurrent", report["config"]["concurrent"])):
        figures = result[workload]
        assert figures["runs"] == runs
        assert figures["steps"] == runs * report["config"]["steps_per_run"]
        for name in ENGINE_FIGURES:
            assert positive(figures[name]), (workload, name, figures[name])
        assert figures["db_jobs_per_step"] >= 0
        assert len(figures["repeats_steps_per_s"]) == report["config"]["repeat"]
    assert result["sequential"]["concurrency"] == 1
    assert result["concurrent"]["concurrency"] == report["config"]["concurrent"]
    for name in BASELINES:
        assert positive(result["baselines"][name]), name
    aiosqlite_rate = result["baselines"]["aiosqlite_commits_per_s"]
    if backend == "asyncio":
        assert positive(aiosqlite_rate)
    else:  # aiosqlite does not run on trio
        assert aiosqlite_rate is None
    assert set(result["targets"]) == set(report["targets"])
    assert all(isinstance(met, bool) for met in result["targets"].values())


def test_synchronous_full_strict_activities_and_the_text_table(tmp_path: Path) -> None:
    db = tmp_path / "bench.db"
    out = run_bench(tmp_path, "--backend", "asyncio", "--synchronous", "full",
                    "--on-doubt", "fail", "--sequential", "5", "--concurrent", "20",
                    "--db", str(db)).stdout

    assert "synchronous=full" in out
    assert "on_doubt=fail" in out
    assert "journaled steps/s" in out
    assert "aiosqlite" in out
    assert db.exists()  # the workloads ran on the file given, the baselines beside it
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("durable-bench-")] == []
