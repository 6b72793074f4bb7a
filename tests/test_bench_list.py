"""The list benchmark runs and reports every shape (no timing asserted), with its plans."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

from .conftest import ROOT, subprocess_env

SCRIPT = ROOT / "scripts" / "bench_list.py"


def shape_names() -> list[str]:
    spec = importlib.util.spec_from_file_location("bench_list", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return [name for name, _, _ in module.shapes([(0.0, "run-000000000000")] * 1000)]


def test_the_list_benchmark_prints_every_shape_and_its_plan() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--sizes", "2000",
         "--repeats", "3", "--plans"],
        cwd=ROOT, env=subprocess_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-4000:]
    lines = done.stdout.splitlines()
    assert "2,000 runs" in lines[1]
    names = shape_names()
    assert len(names) == len(set(names)) >= 20
    for name in names:
        row = next(line for line in lines if line.startswith(f"| {name} "))
        assert float(row.split("|")[2]) >= 0, row
        assert f"{name}:" in lines, name
    plans = done.stdout.split("\n\n", 1)[1]
    assert "USING INDEX" in plans and not any(
        line.strip() == "SCAN durable_runs" for line in plans.splitlines())


def test_bad_sizes_are_one_line() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--sizes", "lots"],
        cwd=ROOT, env=subprocess_env(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "--sizes must be whole numbers" in done.stderr
