"""The side-by-side benchmark against DBOS Transact runs on a small budget and prints every row
it promises, and its plots (no timing asserted). Without dbos installed, the DBOS side is
skipped with the reason, and durable's figures are still all there."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

from .conftest import ROOT, subprocess_env

SCRIPT = ROOT / "scripts" / "bench_peer.py"
HAVE_DBOS = importlib.util.find_spec("dbos") is not None
HAVE_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None
LEVELS = ("own default", "WAL + NORMAL", "WAL + FULL (fsync per commit)")
NOOP_FIGURES = ("steps/s", "CPU ms per step", "commits per step", "fsyncs per step")


def promised() -> list[tuple[str, str]]:
    """(workload prefix, figure) of every row, at the sizes of ``--quick``; "a|b": the
    workload starts with a and also holds b."""
    rows = [(w, f) for w in ("sequential 10 x 2", "concurrent 20 x 2")
            for _ in LEVELS for f in NOOP_FIGURES]
    rows += [("HTTP: 20 at once", f) for f in (
        "requests in flight at the peak", "first arrival after the first start (ms)",
        "last arrival after the first start (ms)", "all finished (s)")]
    rows += [(f"{kind}|({backend}", q) for kind in ("deadline → abort", "operator cancel → abort")
             for backend in ("asyncio", "trio") for q in ("p50 ms", "p99 ms")]
    rows += [("memory: 50 waiting workflows", "RSS growth (MiB)")]
    rows += [("list/show at 2,000 runs", f) for f in (
        "list newest 50", "list failed, 50", "show one run's steps")]
    rows += [("crash → resumed", f) for f in (
        "SIGKILL → step 2 runs again (s)", "new process start → step 2 runs again (s)")]
    return rows


def test_the_peer_benchmark_prints_every_row_and_its_plots(tmp_path: Path) -> None:
    out_json = tmp_path / "peer.json"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--plots", str(tmp_path / "plots"),
         "--json", str(out_json)],
        cwd=ROOT, env=subprocess_env(), capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-4000:]
    lines = done.stdout.splitlines()
    assert lines[0].startswith("durable vs DBOS Transact, ") and "SQLite" in lines[0]
    table = [[cell.strip() for cell in line.strip("|").split("|")]
             for line in lines if line.startswith("| ") and not line.startswith("| workload")]
    assert all(len(row) == 6 for row in table), table
    for workload, figure in promised():
        first, *more = workload.split("|")
        matches = [r for r in table if r[0].startswith(first) and r[1].startswith(figure)
                   and all(part in r[0] for part in more)]
        assert matches, (workload, figure)
        for row in matches:
            assert row[3] != "n/a" or figure == "fsyncs per step", row  # durable's figure
            if not HAVE_DBOS:
                assert row[4] == "skipped: dbos is not installed (pip install dbos==3.4.0)"
            elif "(trio" in row[0]:
                assert row[4] == "n/a (DBOS runs on asyncio only)", row
            else:
                assert row[4] != "n/a" or figure == "fsyncs per step", row
    if not HAVE_DBOS:
        assert "skipped: DBOS side: dbos is not installed" in done.stdout
    if HAVE_MATPLOTLIB:
        for name in ("peer-steps.png", "peer-latency.png"):
            assert (tmp_path / "plots" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    else:  # the bench extra draws them; the test extra has no plotting library
        assert "plots: skipped (matplotlib is not installed)" in done.stdout
    figures = json.loads(out_json.read_text())
    assert figures["crash"]["durable"]["state"] == "completed"
    assert figures["latency"]["durable/asyncio"]["http"]["arrived"] == 20
