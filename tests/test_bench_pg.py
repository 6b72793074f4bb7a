"""The PostgreSQL group commit benchmark runs and prints what it promises.

No timing is asserted: only that ``scripts/bench_pg.py --quick --json`` exits 0 and reports
every workload with and without group commit, the plain psycopg baseline and both targets.
Without a reachable server it skips with the reason, unless ``DURABLE_REQUIRE_POSTGRES`` is
set (CI), where it must run (tests/pg.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

from .conftest import ROOT, subprocess_env


def test_the_group_commit_benchmark_measures_both_modes_and_the_baseline() -> None:
    command = [sys.executable, str(ROOT / "scripts" / "bench_pg.py"), "--quick", "--json"]
    if os.environ.get("DURABLE_REQUIRE_POSTGRES"):
        command.append("--require-postgres")
    proc = subprocess.run(command, cwd=ROOT, env=subprocess_env(), capture_output=True,
                          text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    report: dict[str, Any] = json.loads(proc.stdout)
    if report["skipped"]:
        assert "no PostgreSQL server reachable" in report["skipped"] or \
            "psycopg is not installed" in report["skipped"]
        pytest.skip(report["skipped"])
    results = report["results"]
    for workload in ("concurrent", "sequential"):
        for mode in ("on", "off"):
            assert results[workload][mode]["steps_per_s"] > 0
    assert results["concurrent"]["on"]["writes_per_batch"] >= 1
    assert results["concurrent"]["off"]["batches"] == 0
    assert set(results["appends_per_s"]) == {"on", "off", "plain"}
    assert all(cpu > 0 for cpu in results["appends_cpu_us"].values())
    assert set(results["claim_ms"]) == {"claim_with", "claim", "append", "claimable"}
    assert all(ms > 0 for ms in results["claim_ms"].values())
    assert set(results["targets"]) == {"concurrent_gain", "sequential_share"}
    assert results["issue_gain"] > 0
    for mode in ("on", "off"):
        assert results["concurrent"][mode]["client_cpu_us_per_step"] > 0
        server = results["concurrent"][mode]["server_cpu_us_per_step"]
        assert server is None or server >= 0
    for target in results["targets"].values():
        assert isinstance(target["met"], bool)


def test_the_statement_probe_measures_every_variant_and_its_server_side() -> None:
    command = [sys.executable, str(ROOT / "scripts" / "bench_pg.py"), "--statements",
               "--quick", "--json"]
    if os.environ.get("DURABLE_REQUIRE_POSTGRES"):
        command.append("--require-postgres")
    proc = subprocess.run(command, cwd=ROOT, env=subprocess_env(), capture_output=True,
                          text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    report: dict[str, Any] = json.loads(proc.stdout)
    if report["skipped"]:
        pytest.skip(report["skipped"])
    results = report["results"]
    assert "append_entry (the store's)" in results
    assert results["plain INSERT (t: bigserial, text)"]["share"] == 1.0
    for result in results.values():
        assert result["per_s"] > 0 and result["client_cpu_us"] > 0
        assert result["execution_ms"] >= 0 and result["wal"].startswith("records=")
