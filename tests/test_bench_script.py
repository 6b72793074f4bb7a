"""scripts/bench.py runs end to end with small numbers and reports its figures.

No timing is asserted: the figures depend on the machine and its load. What is checked is
that every workload completed (the script verifies the journal itself and exits non-zero
otherwise) and that the report carries each figure the docs quote, for SQLite and, where the
machine's server is reachable, PostgreSQL.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from .conftest import ROOT, subprocess_env
from .pg import postgres_server  # noqa: F401  (a fixture)

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


UNREACHABLE = "postgresql://postgres@127.0.0.1:1/test"


def run_bench(tmp_path: Path, *args: str, status: int = 0) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--quick", *args],
        cwd=tmp_path, env=subprocess_env(), capture_output=True, text=True, timeout=240,
    )
    assert proc.returncode == status, proc.stderr[-3000:]
    return proc


def check_engine_figures(result: dict[str, Any], config: dict[str, Any]) -> None:
    for workload, runs in (("sequential", config["sequential"]),
                           ("concurrent", config["concurrent"])):
        figures = result[workload]
        assert figures["runs"] == runs
        assert figures["steps"] == runs * config["steps_per_run"]
        for name in ENGINE_FIGURES:
            assert positive(figures[name]), (workload, name, figures[name])
        assert figures["db_jobs_per_step"] >= 0
        assert len(figures["repeats_steps_per_s"]) == config["repeat"]
    assert result["sequential"]["concurrency"] == 1
    assert result["concurrent"]["concurrency"] == config["concurrent"]


def positive(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value > 0


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_quick_run_reports_every_figure_as_json(tmp_path: Path, backend: str) -> None:
    report = json.loads(run_bench(tmp_path, "--json", "--backend", backend,
                                  "--backends", "sqlite").stdout)

    assert report["config"]["quick"] is True
    assert report["machine"]["cpus"] >= 1
    assert list(report["backends"]) == [backend]
    assert report["postgres"] is None
    result = report["backends"][backend]
    check_engine_figures(result, report["config"])
    for name in BASELINES:
        assert positive(result["baselines"][name]), name
    aiosqlite_rate = result["baselines"]["aiosqlite_commits_per_s"]
    if backend == "asyncio":
        assert positive(aiosqlite_rate)
    else:  # aiosqlite does not run on trio
        assert aiosqlite_rate is None
    assert set(result["targets"]) == set(report["targets"])
    assert all(isinstance(met, bool) for met in result["targets"].values())
    # the timed run: SQLite's calls are a part of a step, and a rate if they were all of it
    seq = result["sequential"]
    assert 0 < seq["sqlite_ms_per_step"] < seq["timed_ms_per_step"]
    assert seq["sqlite_only_steps_per_s"] == pytest.approx(1000 / seq["sqlite_ms_per_step"])
    assert seq["sqlite_only_steps_per_s"] > seq["steps_per_s"] / 10
    assert positive(seq["sqlite_only_raw_share"])


def test_synchronous_full_strict_activities_and_the_text_table(tmp_path: Path) -> None:
    db = tmp_path / "bench.db"
    out = run_bench(tmp_path, "--backend", "asyncio", "--backends", "sqlite",
                    "--synchronous", "full",
                    "--on-doubt", "fail", "--sequential", "5", "--concurrent", "20",
                    "--db", str(db)).stdout

    assert "synchronous=full" in out
    assert "on_doubt=fail" in out
    assert "journaled steps/s" in out
    assert "aiosqlite" in out
    assert db.exists()  # the workloads ran on the file given, the baselines beside it
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("durable-bench-")] == []


def test_postgres_column_beside_sqlite_in_the_same_run(tmp_path: Path,
                                                       postgres_server: str) -> None:  # noqa: F811
    proc = run_bench(tmp_path, "--json", "--pg-url", postgres_server)  # default: both stores
    report = json.loads(proc.stdout)

    assert report["config"]["stores"] == ["sqlite", "postgres"]
    assert report["skipped"] == {}
    assert list(report["backends"]) == ["asyncio", "trio"]  # SQLite on both event loops
    pg = report["postgres"]
    assert pg["server_version"]
    assert list(pg["columns"]) == ["asyncio", "trio"]  # on trio, the store's loop thread
    for loop, result in pg["columns"].items():
        assert result["store"] == "postgres" and result["loop"] == loop
        check_engine_figures(result, report["config"])
        # counted by the server (the transactions that journaled the workload's entries):
        # one a step, the claim and the finish riding on the steps' writes, and the last
        # run's finish (20 x 5 steps: 101); its XID counter counted those and whatever else
        # wrote on the server meanwhile (a shared server: not bounded above here)
        seq = result["sequential"]
        assert 1.0 <= seq["commits_per_step"] <= 1.05
        assert seq["server_xids_per_step"] >= seq["commits_per_step"]
        assert positive(result["baselines"]["psycopg_commits_per_s"])
        assert "sqlite3_commits_per_s" not in result["baselines"]
        assert result["sequential"]["sqlite_ms_per_step"] is None  # nothing to time there
        assert set(result["targets"]) == set(report["targets"])
        assert all(isinstance(met, bool) for met in result["targets"].values())

    import psycopg  # the server was reachable, so psycopg is installed

    with psycopg.connect(postgres_server) as conn:  # every schema of the run was dropped
        left = conn.execute("SELECT nspname FROM pg_namespace WHERE nspname LIKE %s",
                            (pg["schema_prefix"] + "%",)).fetchall()
    assert left == []


def test_postgres_text_columns_on_both_loops(tmp_path: Path,
                                            postgres_server: str) -> None:  # noqa: F811
    out = run_bench(tmp_path, "--backends", "postgres", "--pg-url", postgres_server).stdout

    header = next(line for line in out.splitlines() if "postgres asyncio" in line)
    assert "postgres trio" in header and "sqlite" not in header
    assert "psycopg, 1 autocommit per await" in out
    steps = next(line for line in out.splitlines() if "journaled steps/s" in line)
    assert "n/a" not in steps and len(re.findall(r"\d[\d,]*", steps)) == 2, steps


def test_unreachable_postgres_skips_the_column_unless_required(tmp_path: Path) -> None:
    proc = run_bench(tmp_path, "--json", "--backend", "asyncio", "--pg-url", UNREACHABLE)
    report = json.loads(proc.stdout)
    assert report["postgres"] is None
    assert "no PostgreSQL server reachable" in report["skipped"]["postgres"]
    assert list(report["backends"]) == ["asyncio"]  # SQLite measured all the same
    notes = [line for line in proc.stderr.splitlines() if "PostgreSQL column skipped" in line]
    assert len(notes) == 1

    proc = run_bench(tmp_path, "--backend", "asyncio", "--backends", "postgres",
                     "--pg-url", UNREACHABLE, "--require-postgres", status=2)
    assert "no PostgreSQL server reachable" in proc.stderr


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_the_run_split_reports_a_step_and_a_run_apart(tmp_path: Path, backend: str) -> None:
    """scripts/bench_run_split.py: runs of 1 and of 9 steps, each completed and journaled
    (the engine workload checks it), split into a step's cost and a run's own."""
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench_run_split.py"), "--runs", "8",
         "--repeat", "1", "--backend", backend, "--json"],
        cwd=tmp_path, env=subprocess_env(), capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    for length in ("1", "9"):
        figures = report["per_run_of"][length]
        assert 0 < figures["sqlite_ms"] < figures["wall_ms"], (length, figures)
    # the split is what the difference of the two lengths says; its sign is a measurement
    # (8 runs on a loaded machine can come out either way: no timed assertion here)
    per_run_of = report["per_run_of"]
    for key, split in (("per_step", lambda f: (per_run_of["9"][f] - per_run_of["1"][f]) / 8),
                       ("per_run_besides_steps",
                        lambda f: per_run_of["1"][f] - (per_run_of["9"][f]
                                                        - per_run_of["1"][f]) / 8)):
        assert set(report[key]) == {"wall_ms", "sqlite_ms", "cpu_ms"}
        for figure in ("wall_ms", "sqlite_ms", "cpu_ms"):
            assert report[key][figure] == pytest.approx(split(figure)), (key, figure)


def test_the_run_split_refuses_a_run_count_of_zero(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench_run_split.py"), "--runs", "0"],
        cwd=tmp_path, env=subprocess_env(), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "--runs and --repeat must be at least 1" in proc.stderr
    assert "Traceback" not in proc.stderr
