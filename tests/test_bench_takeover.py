"""The crash → resumed benchmark runs: both rows measured, each takeover by its own path.

No timing is asserted: only that ``scripts/bench_takeover.py --quick --json`` exits 0,
reports every row (PostgreSQL's where a server is reachable), and that its check found
every liveness takeover made by the dead worker's lock before the old lease expired, and
every lease-only takeover by the lease."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from typing import Any

from .conftest import ROOT, subprocess_env


def test_the_takeover_benchmark_measures_every_path() -> None:
    command = [sys.executable, str(ROOT / "scripts" / "bench_takeover.py"), "--quick", "--json"]
    proc = subprocess.Popen(command, cwd=ROOT, env=subprocess_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:  # its victim processes are in its process group
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
    assert proc.returncode == 0, err[-4000:]
    report: dict[str, Any] = json.loads(out)
    assert report["check"] == "OK" and report["problems"] == []
    rows = report["rows"]
    expected = {"liveness", "lease_only", "postgres_lease"}
    if "postgres" in report["skipped"]:  # no server here: the row is skipped with the reason
        assert report["skipped"]["postgres"].startswith(("no PostgreSQL server reachable",
                                                         "psycopg is not installed"))
        expected.discard("postgres_lease")
    assert set(rows) == expected
    assert rows["liveness"]["kills"] == 3 and rows["lease_only"]["kills"] == 1
    for row in rows.values():
        assert len(row["samples"]) == row["kills"]
        assert row["min_s"] <= row["median_s"] <= row["p99_s"] <= row["max_s"]
        assert row["min_s"] > 0
