"""The state-change benchmark runs and prints every figure (no timing asserted)."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

from .conftest import ROOT, subprocess_env

SCRIPT = ROOT / "scripts" / "bench_state_change.py"


def test_the_state_change_benchmark_prints_every_figure() -> None:
    args = [sys.executable, str(SCRIPT), "--history", "500", "--runs", "40", "--repeat", "1"]
    done = subprocess.run(args, cwd=ROOT, env=subprocess_env(), capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-4000:]
    lines = done.stdout.splitlines()
    assert "500 finished runs" in lines[0] and "durable_runs_queue" in lines[1]
    assert len(lines) == 17, lines
    for line in lines[2:]:
        assert float(line.split()[-1]) >= 0, line
    done = subprocess.run([*args, "--json"], cwd=ROOT, env=subprocess_env(),
                          capture_output=True, text=True, timeout=120)
    report = json.loads(done.stdout)
    # every claim and finish wrote something to the WAL; the schema is this checkout's
    assert report["median"]["claim_frames"] >= 1 and report["median"]["finish_frames"] >= 1
    assert report["durable"] == str(ROOT)


def test_the_state_change_benchmark_makes_a_store_with_history(tmp_path: Path) -> None:
    path = tmp_path / "history.db"
    done = subprocess.run([sys.executable, str(SCRIPT), "--history", "300", "--make-db",
                           str(path)], cwd=ROOT, env=subprocess_env(), capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-4000:]
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT count(*) FROM durable_runs").fetchone() == (300,)

