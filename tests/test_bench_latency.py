"""scripts/bench_latency.py runs on a small budget and prints every figure it promises."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_bench_latency_small_budget() -> None:
    result = subprocess.run(
        [sys.executable, "scripts/bench_latency.py", "--runs", "8", "--samples", "3",
         "--idle", "1", "--pg", ""],
        cwd=ROOT, capture_output=True, text=True, timeout=240, check=False)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    for label in ("worker in this process", "worker on another store", "POLLING BASELINE",
                  "store calls, worker in this process",
                  "worker in another process", "chain of 8 x 5 steps",
                  "cancel->connection closed, change signal",
                  "cancel->connection closed, RENEWAL BASELINE", "idle worker process"):
        assert f"sqlite {label}" in out or label in out, (label, out)
