"""The torture run on a small budget: real worker processes under kills, freezes and faults.

``scripts/torture.py`` (docs/torture.md) runs the real workflows against the fake services
while it SIGKILLs, SIGSTOPs/SIGCONTs and SIGTERMs workers, injects 5xx, dropped and hung
requests, and races cancels and replays; then checks the guarantees from the services'
ledger and the journal. Here it runs for ~25 s with two workers and a fixed seed (a failing
seed replays: ``python scripts/torture.py --seed N``), and every check must pass. A second
test holds the script to its contract on bad input and checks that it leaves nothing behind.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.pg import postgres_server

from .conftest import ROOT, subprocess_env

__all__ = ["postgres_server"]  # the PostgreSQL fixture (tests/pg.py)

SCRIPT = ROOT / "scripts" / "torture.py"
SEED = int(os.environ.get("DURABLE_TORTURE_SEED", "20261201"))
BUDGET = os.environ.get("DURABLE_TORTURE_BUDGET", "25")


def torture(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=ROOT, env=subprocess_env(),
                          capture_output=True, text=True, timeout=timeout)


def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie counts as dead)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_a_small_torture_run_passes_every_check(backend: str, tmp_path: Path,
                                                request: pytest.FixtureRequest) -> None:
    if backend == "postgres":
        request.getfixturevalue("postgres_server")  # skips without a server
    report_file = tmp_path / "report.json"
    done = torture("--seed", str(SEED), "--budget", BUDGET, "--workers", "2", "--runs", "10",
                   "--backend", backend, "--report", str(report_file),
                   timeout=float(BUDGET) + 90)
    assert done.stdout.startswith(f"torture: seed {SEED} (replay with --seed {SEED})"), done
    report = json.loads(report_file.read_text())
    failed = [c for c in report["checks"] if not c["ok"]]
    assert not failed, f"{done.stdout}\n{done.stderr[-3000:]}"
    assert done.returncode == 0, done
    applied = report["applied"]
    # the run did torture: workers were killed or shut down, and services faulted
    assert applied.get("SIGKILL", 0) + applied.get("SIGTERM", 0) > 0, applied
    assert sum(v for k, v in applied.items() if k.startswith("fault ")) > 0, applied
    assert sum(report["states"].values()) == 10, report["states"]
    for check in report["checks"]:
        assert check["check"] in done.stdout
    assert report["pids"] and not [p for p in report["pids"] if alive(p)], "processes left"


def test_bad_arguments_are_one_line_and_exit_2() -> None:
    done = torture("--workers", "0", timeout=30)
    assert done.returncode == 2, done
    assert done.stdout == ""
    assert done.stderr.strip().splitlines()[-1].endswith(
        "--workers must be between 1 and 16, not 0"), done.stderr
    assert "Traceback" not in done.stderr

