"""The CLI: readable output, and bad input gets one clear line, a non-zero exit, no writes."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from durable.store import SCHEMA_VERSION

from .conftest import ROOT, subprocess_env
from .helpers import at_schema


def cli(*args: str, db: str | None = None, module: str = "durable", cwd: Path = ROOT,
        env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", module, *args]
    if db is not None:
        cmd += ["--db", db]
    return subprocess.run(cmd, cwd=cwd, env={**subprocess_env(), **(env or {})},
                          capture_output=True, text=True, timeout=60)


def assert_one_line_error(result: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    for needle in needles:
        assert needle in lines[0]


def count_runs(path: Path) -> int:
    conn = sqlite3.connect(path)
    try:
        return int(conn.execute("SELECT count(*) FROM durable_runs").fetchone()[0])
    finally:
        conn.close()


@pytest.fixture
def db(tmp_path: Path) -> tuple[str, Path]:
    path = tmp_path / "cli.db"
    return f"sqlite:///{path}", path


def test_start_run_and_show(db: tuple[str, Path]) -> None:
    url, path = db
    started = cli("start", "cli.hello", '"world"', "--import", "tests.cliflows", "--id",
                  "h1", "--json", db=url)
    assert started.returncode == 0, started.stderr
    assert json.loads(started.stdout)["state"] == "queued"
    # idempotent: the same id again returns the same run
    again = cli("start", "cli.hello", '"world"', "--import", "tests.cliflows", "--id", "h1",
                db=url)
    assert again.returncode == 0 and count_runs(path) == 1
    listed = cli("list", "--json", db=url)
    assert [r["id"] for r in json.loads(listed.stdout)] == ["h1"]
    shown = cli("show", "h1", db=url)
    assert shown.returncode == 0
    assert "cli.hello" in shown.stdout and "queued" in shown.stdout
    data = json.loads(cli("show", "h1", "--json", db=url).stdout)
    assert data["run"]["id"] == "h1" and data["journal"][0]["kind"] == "run_created"


def test_unknown_workflow(db: tuple[str, Path]) -> None:
    url, path = db
    result = cli("start", "no.such", "--import", "tests.cliflows", db=url)
    assert_one_line_error(result, "unknown workflow 'no.such'", "cli.hello")
    assert not path.exists()


def test_arguments_that_are_not_json(db: tuple[str, Path]) -> None:
    url, path = db
    result = cli("start", "cli.hello", "world", "--import", "tests.cliflows", db=url)
    assert_one_line_error(result, "not JSON")
    assert not path.exists()


def test_an_id_reused_for_another_workflow(db: tuple[str, Path]) -> None:
    url, path = db
    assert cli("start", "cli.hello", '"a"', "--import", "tests.cliflows", "--id", "r",
               db=url).returncode == 0
    result = cli("start", "cli.other", '"a"', "--import", "tests.cliflows", "--id", "r",
                 db=url)
    assert_one_line_error(result, "already belongs to a cli.hello run")
    assert count_runs(path) == 1


def test_a_database_that_cannot_be_opened(tmp_path: Path) -> None:
    missing = f"sqlite:///{tmp_path / 'no' / 'such' / 'dir.db'}"
    assert_one_line_error(cli("start", "cli.hello", '"a"', "--import", "tests.cliflows",
                              db=missing), "does not exist")
    assert_one_line_error(cli("list", db=missing), "no database")
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not a database at all" * 100)
    assert_one_line_error(cli("list", db=f"sqlite:///{junk}"), "not a")
    assert junk.read_bytes() == b"this is not a database at all" * 100
    assert_one_line_error(cli("list", db="mysql://x"), "unsupported database URL")


def test_a_database_from_a_newer_schema_version(db: tuple[str, Path]) -> None:
    url, path = db
    assert cli("migrate", db=url).returncode == 0
    conn = sqlite3.connect(path)
    conn.execute("UPDATE durable_meta SET value = '99' WHERE key = 'schema_version'")
    conn.commit()
    conn.close()
    for args in (["list"], ["show", "x"], ["migrate"],
                 ["start", "cli.hello", '"a"', "--import", "tests.cliflows"]):
        assert_one_line_error(cli(*args, db=url), "schema version 99", "upgrade durable")
    assert count_runs(path) == 0


def test_read_and_control_commands_refuse_an_older_schema(db: tuple[str, Path]) -> None:
    """An operator's newer CLI never upgrades a database under the workers that use it:
    every command but start, schedule add, worker and migrate refuses a schema behind its
    own in one line that names ``durable migrate``, and leaves the file as it was."""
    url, path = db
    older = SCHEMA_VERSION - 1
    at_schema(url, older)
    before = path.read_bytes()
    for args in (["list"], ["show", "x"], ["show", "x", "--follow"], ["cancel", "x"],
                 ["signal", "x", "go"], ["approve", "x"], ["replay", "x"],
                 ["schedule", "list"], ["schedule", "pause", "s"],
                 ["prune", "--older-than", "1d"], ["console", "--bind", "127.0.0.1:0"]):
        assert_one_line_error(cli(*args, db=url), f"schema version {older}, older than",
                              f"upgrade it with: durable migrate --db {url}")
    assert path.read_bytes() == before
    migrated = cli("migrate", db=url)
    assert migrated.returncode == 0, migrated.stderr
    assert f"schema version {SCHEMA_VERSION}" in migrated.stdout
    listed = cli("list", db=url)
    assert (listed.returncode, listed.stdout.strip()) == (0, "no runs"), listed.stderr


def test_unknown_run_and_bad_module(db: tuple[str, Path]) -> None:
    url, _ = db
    assert cli("migrate", db=url).returncode == 0
    assert_one_line_error(cli("show", "nope", db=url), "no run with id 'nope'")
    assert_one_line_error(cli("cancel", "nope", db=url), "no run with id 'nope'")
    assert_one_line_error(cli("worker", "--import", "no_such_module_xyz", db=url),
                          "cannot import 'no_such_module_xyz'")
    assert_one_line_error(cli("--log-level", "error", db=url, module="durable.worker"),
                          "no workflows registered")
