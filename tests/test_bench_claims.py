"""The claim benchmark runs: every configuration measured, no run claimed twice.

No timing is asserted (this machine's speed is not the test's business): only that
``scripts/bench_claims.py --quick --json`` exits 0, reports every configuration on every
backend, and that its journal check found each run claimed exactly once. PostgreSQL is the
machine's server (tests/pg.py); where none is reachable the script skips that column with
a reason, unless ``DURABLE_REQUIRE_POSTGRES`` is set (CI), where it must run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from typing import Any

from .conftest import ROOT, subprocess_env

PROCESSES = [1, 2, 4]
BATCHES = [32, 1]


def run_bench(*args: str) -> tuple[int, str, str]:
    command = [sys.executable, str(ROOT / "scripts" / "bench_claims.py"), "--quick", "--json",
               *args]
    if os.environ.get("DURABLE_REQUIRE_POSTGRES"):
        command.append("--require-postgres")
    proc = subprocess.Popen(command, cwd=ROOT, env=subprocess_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:  # its worker processes are in its process group
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
    return proc.returncode, out, err


def test_the_claim_benchmark_measures_every_configuration_and_claims_each_run_once() -> None:
    code, out, err = run_bench()
    assert code == 0, err[-4000:]
    report: dict[str, Any] = json.loads(out)
    assert report["double_claim_check"] == "OK", out
    measured = [b for b in ("sqlite", "postgres") if b not in report["skipped"]]
    assert "sqlite" in measured
    if "postgres" in report["skipped"]:
        assert "no PostgreSQL server reachable" in report["skipped"]["postgres"] or \
            "psycopg is not installed" in report["skipped"]["postgres"]
    configs = {(c["backend"], c["kind"], c["processes"], c["batch"]): c
               for c in report["configurations"]}
    expected = {(b, "store", p, batch) for b in measured for p in PROCESSES for batch in BATCHES}
    expected |= {(b, "claim_only", p, max(BATCHES)) for b in measured for p in PROCESSES}
    expected |= {(b, "raw", p, None) for b in measured for p in PROCESSES}
    assert set(configs) == expected
    for key, config in configs.items():
        assert config["check"] == "OK", (key, config["problems"])
        assert config["problems"] == []
        assert config["runs"] == report["runs"]
        assert config["claims_per_s"] > 0
        if config["kind"] != "raw":
            # every process took part in draining the queue or found it empty: together
            # they claimed every run once
            assert sum(config["per_process"]) == report["runs"]
            assert len(config["per_process"]) == config["processes"]
    if "postgres" in measured:
        assert report["target"]["processes"] == 4


def test_an_unreachable_postgres_is_skipped_with_one_line_or_refused_when_required() -> None:
    unreachable = "postgresql://postgres@127.0.0.1:9/test"  # the discard port: refused
    command = [sys.executable, str(ROOT / "scripts" / "bench_claims.py"), "--quick", "--json",
               "--backends", "postgres", "--pg-url", unreachable]
    proc = subprocess.run(command, cwd=ROOT, env=subprocess_env(), capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["configurations"] == []
    assert report["skipped"]["postgres"].startswith("no PostgreSQL server reachable at")
    note = [line for line in proc.stderr.splitlines() if "PostgreSQL column skipped" in line]
    assert len(note) == 1, proc.stderr
    refused = subprocess.run([*command, "--require-postgres"], cwd=ROOT, env=subprocess_env(),
                             capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2
    assert "no PostgreSQL server reachable" in refused.stderr
