"""The retention benchmark runs on a small database and reports every figure (no timing
asserted); on PostgreSQL too when a server is there."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from .conftest import ROOT, subprocess_env
from .pg import pg_url, postgres_server

__all__ = ["pg_url", "postgres_server"]

SCRIPT = ROOT / "scripts" / "bench_prune.py"
ROWS = ["prune batch (100 runs, one transaction)", "a start by another store, idle",
        "a start by another store, during the prune"]


def run(tmp_path: Path, *extra: str) -> tuple[str, dict[str, Any]]:
    out = tmp_path / "prune.json"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--runs", "2000", "--starts", "20", "--batch", "100",
         "--json", str(out), *extra],
        cwd=ROOT, env=subprocess_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-4000:]
    assert done.stdout.startswith("bench_prune: load average")
    return done.stdout, json.loads(out.read_text())


def check(stdout: str, figures: dict[str, Any], store: str) -> None:
    section = stdout.split(f"{store}: ", 1)[1]
    assert section.startswith("2,000 finished runs, 1,400 pruned in"), section[:200]
    assert "600 kept" in section.splitlines()[0]
    for row in ROWS:
        assert f"| {row} |" in section, row
    assert "a start's p99 during the prune / idle:" in section
    assert figures[store]["pruned"] == 1400 and figures[store]["batches_ms"]["n"] >= 14


def test_the_prune_benchmark_reports_every_figure(tmp_path: Path) -> None:
    stdout, figures = run(tmp_path)
    check(stdout, figures, "sqlite")
    assert "postgres" not in figures


def test_the_prune_benchmark_on_postgres(tmp_path: Path, pg_url: str) -> None:
    stdout, figures = run(tmp_path, "--pg-url", pg_url)
    check(stdout, figures, "sqlite")
    check(stdout, figures, "postgres")
