"""Errors a user meets in the first hour: each is one line that says what is wrong and where.

Imports that raise, a database that was just created by a typo, a folder given as the
database, a missing one, an id reused for another workflow.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, NoReturn

import pytest

import durable

from .conftest import subprocess_env
from .helpers import python_process
from .test_cli import ROOT, assert_one_line_error, cli, count_runs
from .tmpfs import tmpfs

RAISES = "import durable\n\nvalue = 1 / 0\n"
BROKEN = "import durable\n\ndef f(:\n    pass\n"


@pytest.fixture
def modules(tmp_path: Path) -> Path:
    (tmp_path / "mymod.py").write_text(RAISES)
    (tmp_path / "brokenmod.py").write_text(BROKEN)
    (tmp_path / "outer.py").write_text("import inner\n")
    (tmp_path / "inner.py").write_text("x = 1\nraise RuntimeError('inner failed')\n")
    (tmp_path / "needsdep.py").write_text("import no_such_dependency_xyz\n")
    return tmp_path


@pytest.mark.parametrize("command", [
    ["start", "any.workflow", "--import"],
    ["worker", "--import"],
])
def test_a_module_that_raises_at_import_is_one_line(modules: Path,
                                                    command: list[str]) -> None:
    url = f"sqlite:///{modules / 'x.db'}"
    cases = {
        "mymod": ("ZeroDivisionError: division by zero", "(mymod.py line 3)"),
        "mymod.py": ("ZeroDivisionError: division by zero", "(mymod.py line 3)"),
        "brokenmod": ("SyntaxError: invalid syntax", "(brokenmod.py line 3)"),
        "outer": ("RuntimeError: inner failed", "(inner.py line 2)"),
        "needsdep": ("No module named 'no_such_dependency_xyz'", "(needsdep.py line 1)"),
    }
    for module, (error, where) in cases.items():
        result = cli(*command, module, db=url, cwd=modules)
        assert result.returncode == 2, result.stderr
        assert_one_line_error(result, f"cannot import {module!r}", error, where, "--traceback")
    assert not (modules / "x.db").exists()  # refused before the database was opened


def test_the_worker_module_says_the_same(modules: Path) -> None:
    result = cli("--import", "mymod", db=f"sqlite:///{modules / 'x.db'}",
                 module="durable.worker", cwd=modules)
    assert result.returncode == 2
    assert_one_line_error(result, "cannot import 'mymod'", "ZeroDivisionError", "line 3")


def test_traceback_flag_and_environment_show_the_full_traceback(modules: Path) -> None:
    url = f"sqlite:///{modules / 'x.db'}"
    for result in (cli("start", "w", "--import", "mymod", "--traceback", db=url, cwd=modules),
                   cli("start", "w", "--import", "mymod", db=url, cwd=modules,
                       env={"DURABLE_TRACEBACK": "1"}),
                   cli("--import", "mymod", "--traceback", db=url, cwd=modules,
                       module="durable.worker")):
        assert result.returncode == 2
        assert "Traceback (most recent call last)" in result.stderr
        assert 'mymod.py", line 3' in result.stderr and "1 / 0" in result.stderr
        last = result.stderr.strip().splitlines()[-1]
        assert last.startswith("durable: error: cannot import 'mymod'")
    quiet = cli("start", "w", "--import", "mymod", db=url, cwd=modules,
                env={"DURABLE_TRACEBACK": "0"})
    assert_one_line_error(quiet, "cannot import 'mymod'")


def test_the_error_and_its_traceback_are_redacted(modules: Path) -> None:
    secret = "tok-9f8e7d-secret"
    (modules / "leaky.py").write_text(
        f"raise RuntimeError('config: Authorization: Bearer {secret}')\n")
    url = f"sqlite:///{modules / 'x.db'}"
    for flag in ((), ("--traceback",)):
        result = cli("start", "w", "--import", "leaky", *flag, db=url, cwd=modules)
        assert result.returncode == 2
        assert "[redacted]" in result.stderr
        assert secret not in result.stderr
        if flag:  # the source line shown in the traceback is redacted too
            assert "Traceback (most recent call last)" in result.stderr


def test_a_module_that_cannot_be_found_says_where_to_look(modules: Path) -> None:
    result = cli("start", "w", "--import", "no_such_module_xyz", cwd=modules,
                 db=f"sqlite:///{modules / 'x.db'}")
    assert result.returncode == 2
    assert_one_line_error(result, "cannot import 'no_such_module_xyz'", "PYTHONPATH")


# -- databases ---------------------------------------------------------------------------------
def created_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "created a new database" in line]


def test_start_and_migrate_say_when_they_create_a_database(tmp_path: Path) -> None:
    # a relative path, as a mistyped --db usually is: the message gives the absolute one
    first = cli("start", "cli.hello", '"a"', "--import", "tests.cliflows", db="sqlite:///typo.db",
                cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert created_lines(first.stderr) == [
        f"durable: created a new database at {tmp_path / 'typo.db'}"]
    again = cli("start", "cli.hello", '"b"', "--import", "tests.cliflows",
                db="sqlite:///typo.db", cwd=tmp_path)
    assert again.returncode == 0 and created_lines(again.stderr) == []
    assert count_runs(tmp_path / "typo.db") == 2

    migrated = cli("migrate", db="sqlite:///other.db", cwd=tmp_path)
    assert migrated.returncode == 0, migrated.stderr
    assert created_lines(migrated.stderr) == [
        f"durable: created a new database at {tmp_path / 'other.db'}"]
    assert created_lines(cli("migrate", db="sqlite:///other.db", cwd=tmp_path).stderr) == []


def test_the_worker_says_when_it_creates_a_database(tmp_path: Path) -> None:
    path = tmp_path / "fresh.db"
    log = tmp_path / "worker.log"
    with python_process(["-m", "durable.worker", "--db", f"sqlite:///{path}", "--import",
                         "tests.cliflows", "--poll", "0.05"], log,
                        env=subprocess_env()) as proc:
        deadline = time.monotonic() + 30
        while "worker_started" not in log.read_text():  # signals are handled from then on
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.02)  # polling the worker's log file, bounded
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, log.read_text()
    # one of the worker's log lines (JSON ones with --log-format json)
    [line] = [line for line in log.read_text().splitlines() if "database_created" in line]
    assert f"at={path}" in line and "warning" in line, line


@pytest.mark.parametrize("command", [["list"], ["show", "x"], ["cancel", "x"],
                                     ["replay", "x"]])
def test_read_only_commands_refuse_a_missing_database(tmp_path: Path,
                                                      command: list[str]) -> None:
    result = cli(*command, db="sqlite:///missing.db", cwd=tmp_path)
    assert result.returncode == 2
    assert_one_line_error(result, f"no database at {tmp_path / 'missing.db'}",
                          "relative to the current folder")
    assert not (tmp_path / "missing.db").exists()


@pytest.mark.parametrize("command", [["list"], ["migrate"],
                                     ["start", "cli.hello", '"a"', "--import",
                                      "tests.cliflows"]])
def test_a_folder_given_as_the_database(tmp_path: Path, command: list[str]) -> None:
    result = cli(*command, db=f"sqlite:///{tmp_path}")
    assert result.returncode == 2
    assert_one_line_error(result, f"{tmp_path}: it is a folder, not a file",
                          f"sqlite:///{tmp_path / 'durable.db'}")
    assert "unable to open" not in result.stderr


def test_a_missing_folder_for_a_new_database(tmp_path: Path) -> None:
    target = tmp_path / "no" / "such" / "x.db"
    for command in (["migrate"], ["start", "cli.hello", '"a"', "--import", "tests.cliflows"]):
        result = cli(*command, db=f"sqlite:///{target}")
        assert result.returncode == 2
        assert_one_line_error(result, f"cannot create SQLite database {target}",
                              f"folder {target.parent} does not exist")
    assert not (tmp_path / "no").exists()


def test_an_id_reused_says_what_differs_without_python_none(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'c.db'}"
    assert cli("start", "cli.hello", '"a"', "--import", "tests.cliflows", "--id", "r",
               db=url).returncode == 0
    for args, asked in ((["cli.other", '"a"'], 'asked for: cli.other with ["a"] and no key'),
                        (["cli.hello", '"a"', "--key", "k"],
                         "asked for: cli.hello with [\"a\"] and key 'k'")):
        result = cli("start", *args, "--import", "tests.cliflows", "--id", "r", db=url)
        assert result.returncode == 2
        assert_one_line_error(result, "run id 'r' already belongs to a cli.hello run with "
                              'arguments ["a"] and no key', asked)
        assert "None" not in result.stderr
    assert count_runs(tmp_path / "c.db") == 1


def test_argument_errors_are_one_line_naming_the_help(tmp_path: Path) -> None:
    result = cli("list", "--state", "nope", db=f"sqlite:///{tmp_path / 'x.db'}")
    assert result.returncode == 2
    assert_one_line_error(result, "durable list: error:", "invalid choice: 'nope'",
                          "'failed'", "durable list --help")


def test_an_unreachable_postgresql_server_is_named_by_host_and_port() -> None:
    pytest.importorskip("psycopg")
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = int(sock.getsockname()[1])
    sock.close()  # nobody listens there
    result = cli("list", db=f"postgresql://nobody:pw-secret@127.0.0.1:{port}/x")
    assert result.returncode == 2
    assert_one_line_error(result, f"cannot reach PostgreSQL at 127.0.0.1:{port} "
                                  f"(postgresql://nobody:***@127.0.0.1:{port}/x)")
    assert "pw-secret" not in result.stderr


@pytest.mark.parametrize(("option", "value"), [
    ("tcp_user_timeout", "abc"), ("keepalives", "maybe"), ("connect_timeout", "10s"),
    ("keepalives_count", "1.5"),
])
def test_a_postgresql_url_option_that_is_not_a_number_is_a_mistake_not_an_outage(
        option: str, value: str) -> None:
    """libpq reads its whole-number options only when it connects, and its refusal came out
    as "cannot reach PostgreSQL", as if the server were down. The store checks them first:
    the URL is malformed, and nothing is tried. (The server is never asked: the host is
    one nobody resolves.)"""
    pytest.importorskip("psycopg")
    url = f"postgresql://nobody:pw-secret@db.invalid:5432/x?{option}={value}"
    result = cli("list", db=url)
    assert result.returncode == 2
    assert_one_line_error(result, f"malformed PostgreSQL URL postgresql://nobody:***@"
                                  f"db.invalid:5432/x?{option}={value}: {option} must be a "
                                  f"whole number, not {value!r}")
    assert "pw-secret" not in result.stderr


@pytest.mark.parametrize(("query", "says"), [
    ("sslmode=bogus", 'invalid sslmode value: "bogus"'),
    ("target_session_attrs=primry", 'invalid target_session_attrs value: "primry"'),
    ("channel_binding=always", 'invalid channel_binding value: "always"'),
    ("port=abc", 'invalid integer value "abc" for connection option "port"'),
    ("port=99999", 'invalid port number: "99999"'),
])
def test_a_postgresql_url_option_libpq_refuses_is_a_mistake_not_an_outage(
        query: str, says: str) -> None:
    """The values libpq itself refuses before it connects (an unknown ``sslmode``, a port
    that is not one) said "cannot reach PostgreSQL", as if the server were down: the URL
    is malformed, in libpq's words. (Nobody listens at the address: were the value taken,
    the connection would be refused.)"""
    pytest.importorskip("psycopg")
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = int(sock.getsockname()[1])
    sock.close()
    url = f"postgresql://nobody:pw-secret@127.0.0.1:{port}/x?{query}"
    result = cli("list", db=url)
    assert result.returncode == 2
    assert_one_line_error(result, f"malformed PostgreSQL URL postgresql://nobody:***@"
                                  f"127.0.0.1:{port}/x?{query}: {says}")
    assert "cannot reach" not in result.stderr and "pw-secret" not in result.stderr


@pytest.mark.parametrize(("args", "says"), [
    ((), "missing a required argument: 'name'"),
    (('"a"', '"b"'), "too many positional arguments"),
])
def test_a_start_with_the_wrong_arguments_is_refused_before_anything_is_written(
        tmp_path: Path, args: tuple[str, ...], says: str) -> None:
    """The command imports the workflow: arguments that its function could not take are
    refused at once, in one line naming what it takes, instead of a run queued to fail at
    its first attempt (a schedule's arguments likewise, before it fires)."""
    db = tmp_path / "d.db"
    started = cli("start", "cli.hello", *args, "--import", "tests.cliflows",
                  db=f"sqlite:///{db}")
    assert_one_line_error(started, f"cannot start cli.hello: {says}", "it takes (name)")
    scheduled = cli("schedule", "add", "nightly", "cli.hello", *args, "--cron", "0 3 * * *",
                    "--import", "tests.cliflows", db=f"sqlite:///{db}")
    assert_one_line_error(scheduled, f"cannot start cli.hello: {says}", "it takes (name)")
    assert not db.exists()


@pytest.mark.parametrize("option", [["--timeout", "0"], ["--delay", "nan"],
                                    ["--start-within", "-5"], ["--start-within", "inf"]])
def test_a_start_with_a_time_it_cannot_use_is_one_line(tmp_path: Path,
                                                       option: list[str]) -> None:
    db = tmp_path / "d.db"
    started = cli("start", "cli.hello", '"a"', "--import", "tests.cliflows", *option,
                  db=f"sqlite:///{db}")
    assert_one_line_error(started, f"{option[0].removeprefix('--')} must be ")
    assert not db.exists()


@pytest.mark.parametrize(("option", "value"), [
    ("lease", 0.0), ("lease", float("nan")), ("lease", float("inf")),
    ("poll_interval", float("nan")), ("poll_interval", -1.0), ("grace", float("nan")),
    ("grace", -1.0), ("heartbeat_interval", float("nan")), ("sweep_interval", -2.0),
    ("liveness_interval", 0.0), ("schedule_interval", float("inf")),
    ("prune_interval", 0.0), ("prune_older_than", float("nan")),
    ("durable_wait_threshold", float("nan")),
])
def test_a_worker_time_it_cannot_use_is_a_config_error_naming_it(
        tmp_path: Path, option: str, value: float) -> None:
    """Each of a worker's times must be a finite number in its range: NaN made the first
    poll raise out of anyio (a traceback), an infinite lease never lapsed."""
    store = durable.store_from_url(f"sqlite:///{tmp_path / 'unused.db'}")  # never opened
    with pytest.raises(durable.ConfigError, match=rf"^{option} must be .*, not {value!r}"):
        durable.Worker(store, **{option: value})  # type: ignore[arg-type]


@pytest.mark.parametrize(("option", "value"), [
    ("concurrency", 1.5), ("concurrency", 0), ("concurrency", -2),
    ("concurrency", float("nan")), ("concurrency", True), ("concurrency", "4"),
    ("http_connections", 2.5), ("http_connections", float("nan")),
    ("http_connections", True), ("http_connections", 0),
])
def test_a_worker_count_it_cannot_use_is_a_config_error_naming_it(
        tmp_path: Path, option: str, value: Any) -> None:
    """The worker's counts are whole numbers of 1 or more: ``concurrency=1.5`` (or NaN,
    or True) was accepted (``< 1`` is false of each), NaN then never let a claim through
    and 1.5 took two runs at once; a bool is not a count. A ConfigError naming the option
    and the value, when the worker is made."""
    store = durable.store_from_url(f"sqlite:///{tmp_path / 'unused.db'}")  # never opened
    with pytest.raises(durable.ConfigError,
                       match=rf"^{option} must be at least 1 \(a whole number\), not "
                             rf"{re.escape(repr(value))}$"):
        durable.Worker(store, **{option: value})
    assert durable.Worker(store, concurrency=1, http_connections=1).concurrency == 1


@pytest.mark.parametrize("option", ["--poll", "--lease", "--grace"])
def test_a_worker_time_it_cannot_use_is_one_line(tmp_path: Path, option: str) -> None:
    db = tmp_path / "d.db"
    result = cli(option, "nan", "--import", "tests.cliflows", db=f"sqlite:///{db}",
                 module="durable.worker")
    assert_one_line_error(result, "must be", "not nan")
    assert not db.exists()


def test_an_empty_concurrency_key_is_refused(tmp_path: Path) -> None:
    """``--key "$SLOT"`` with SLOT unset gives ``--key ""``: every such run would share one
    key and wait for each other. A key is a non-empty string; nothing is written."""
    db = tmp_path / "d.db"
    started = cli("start", "cli.hello", '"a"', "--import", "tests.cliflows", "--key", "",
                  db=f"sqlite:///{db}")
    assert_one_line_error(started, "a concurrency key must be a non-empty string")
    scheduled = cli("schedule", "add", "nightly", "cli.hello", '"a"', "--cron", "0 3 * * *",
                    "--key", " ", "--import", "tests.cliflows", db=f"sqlite:///{db}")
    assert_one_line_error(scheduled, "a concurrency key must be a non-empty string")
    assert not db.exists()


def test_a_list_limit_beyond_the_database_integers_lists_everything(tmp_path: Path) -> None:
    """A limit larger than any run count is no limit (it raised an OverflowError out of
    sqlite3, a traceback)."""
    db = f"sqlite:///{tmp_path / 'd.db'}"
    assert cli("start", "cli.hello", '"a"', "--import", "tests.cliflows", "--id", "r",
               db=db).returncode == 0
    listed = cli("list", "--limit", str(10**20), db=db)
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.splitlines()[1].startswith("r ")


def test_a_database_on_a_read_only_file_system_says_so(tmp_path: Path) -> None:
    """A database copied onto read-only media (a backup, a snapshot mounted read-only):
    SQLite in WAL mode must create its -wal and -shm files to open the database, even to
    read it, and said only "unable to open database file". The error says why, and what to
    do; nothing is changed."""

    def refused(why: str) -> NoReturn:
        pytest.skip(f"a read-only file system needs a mount of its own ({why})")

    with tmpfs(tmp_path / "media", "8m", refused) as media:
        db = media / "d.db"
        assert cli("start", "cli.hello", '"a"', "--import", "tests.cliflows", "--id", "r",
                   db=f"sqlite:///{db}").returncode == 0
        subprocess.run(["mount", "-o", "remount,ro", str(media)], check=True)
        for command in (["list"], ["show", "r"], ["cancel", "r"]):
            result = cli(*command, db=f"sqlite:///{db}")
            assert_one_line_error(result, f"cannot open SQLite database {db}",
                                  f"the file system holding {media} is mounted read-only",
                                  "copy the file to a writable folder")
        assert sorted(p.name for p in media.iterdir()) == ["d.db"]


@pytest.mark.parametrize(("option", "said"), [
    (["--delay", "1e300"], "--delay must be at most 100 years (3155760000 s), not 1e+300"),
    (["--delay", "3e11"], "--delay must be at most 100 years"),
    (["--start-within", "1e300"], "--start-within must be at most 100 years"),
    (["--timeout", "1e12"], "--timeout must be at most 100 years"),
    (["--delay", "-1"], "--delay must be 0 or more seconds, not -1.0"),
])
def test_a_time_past_the_calendar_is_refused_and_nothing_is_written(
        tmp_path: Path, option: list[str], said: str) -> None:
    """A finite number of seconds far enough out (``--delay 1e300``) was stored, and then
    ``show`` of the run was a traceback (a year past 9999): now refused in one line, naming
    the option, before the database is touched."""
    db = f"sqlite:///{tmp_path / 'd.db'}"
    assert cli("migrate", db=db).returncode == 0
    result = cli("start", "cli.hello", '"x"', "--import", "tests.cliflows", *option,
                 "--id", "far", db=db)
    assert_one_line_error(result, said)
    assert count_runs(tmp_path / "d.db") == 0


@pytest.mark.parametrize("age", ["99999999999999999999d", "5000000w"])
def test_prune_refuses_an_age_past_the_calendar_in_one_line(tmp_path: Path, age: str) -> None:
    db = f"sqlite:///{tmp_path / 'd.db'}"
    assert cli("migrate", db=db).returncode == 0
    result = cli("prune", "--older-than", age, "--dry-run", db=db)
    assert_one_line_error(result, f"--older-than takes an age of at most 100 years, not {age!r}")


def test_a_time_stored_past_the_calendar_is_shown_not_a_traceback(tmp_path: Path) -> None:
    """A run stored before times were bounded (its ``run_at`` past year 9999) is shown, its
    time as epoch seconds, where ``show`` was a traceback."""
    import sqlite3

    db_path = tmp_path / "d.db"
    db = f"sqlite:///{db_path}"
    assert cli("start", "cli.hello", '"x"', "--import", "tests.cliflows", "--id", "old",
               db=db).returncode == 0
    with sqlite3.connect(db_path) as conn:
        conn.execute("UPDATE durable_runs SET run_at = 1e300 WHERE id = 'old'")
    shown = cli("show", "old", db=db)
    assert shown.returncode == 0, shown.stderr
    assert "1e+300 (epoch seconds, past the calendar)" in shown.stdout, shown.stdout


@pytest.mark.parametrize("command", [["list"], ["show", "r-1"], ["show", "r-1", "--json"]])
def test_a_reader_that_goes_away_stops_the_command_quietly(tmp_path: Path,
                                                           command: list[str]) -> None:
    """``durable list | head -1``: the reader closes the pipe; the command stops as a pipe's
    writer killed by SIGPIPE does (exit 141), with nothing on stderr. Before: a
    ``BrokenPipeError`` traceback and exit 1."""
    db = f"sqlite:///{tmp_path / 'd.db'}"
    assert cli("start", "cli.hello", '"x"', "--import", "tests.cliflows", "--id", "r-1",
               db=db).returncode == 0
    process = subprocess.Popen(
        [sys.executable, "-m", "durable", *command, "--db", db], cwd=ROOT,
        env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert process.stdout is not None and process.stderr is not None
    process.stdout.close()  # gone before the command writes a line
    with process.stderr:
        stderr = process.stderr.read().decode()
    assert process.wait(timeout=60) == 141, stderr
    assert stderr == ""


@pytest.mark.parametrize(("option", "said"), [
    (["--id", "a\nb"], "--id must not hold control characters ('\\n' at 1): 'a\\nb'"),
    (["--id", "x" * 1001], "--id must be at most 1000 characters, not 1001"),
    (["--key", "k\x1b[31mred"], "a concurrency key must not hold control characters "
                                "('\\x1b' at 1)"),
])
def test_an_id_or_key_no_line_can_show_is_refused(tmp_path: Path, option: list[str],
                                                   said: str) -> None:
    """A newline in a run id split the rows of ``durable list``, an escape sequence in a key
    reached the operator's terminal as a command, and a 100,000-character id was taken and
    printed whole: refused in one line, nothing written."""
    db = f"sqlite:///{tmp_path / 'd.db'}"
    assert cli("migrate", db=db).returncode == 0
    result = cli("start", "cli.hello", '"x"', "--import", "tests.cliflows", *option, db=db)
    assert_one_line_error(result, said)
    assert count_runs(tmp_path / "d.db") == 0
    ok = cli("start", "cli.hello", '"x"', "--import", "tests.cliflows", "--id", "ünï ok",
             db=db)
    assert ok.returncode == 0, ok.stderr


@pytest.mark.parametrize(("args", "said"), [
    (["worker", "--import", "tests.cliflows", "--poll", "0"],
     "--poll must be positive seconds, not 0.0"),
    (["worker", "--import", "tests.cliflows", "--wait-threshold", "-1"],
     "--wait-threshold must be 0 or more seconds, not -1.0"),
    (["worker", "--import", "tests.cliflows", "--concurrency", "0"],
     "--concurrency must be at least 1"),
    (["list", "--since", "2026-12-02", "--until", "2026-12-01"],
     "--since must not be after --until"),
])
def test_a_bad_option_is_named_by_its_flag(tmp_path: Path, args: list[str], said: str) -> None:
    """Before: ``poll_interval must be positive seconds`` for ``--poll``, and
    ``created_from must not be after created_to`` for ``--since``/``--until``."""
    db = f"sqlite:///{tmp_path / 'd.db'}"
    assert cli("migrate", db=db).returncode == 0
    assert_one_line_error(cli(*args, db=db), said)


def test_a_file_s_path_given_as_the_database_says_its_url(tmp_path: Path) -> None:
    """``--db /tmp/x.db`` was "unsupported database URL scheme '/tmp/x.db'"; the URL that
    names that file is said."""
    path = tmp_path / "x.db"
    result = cli("list", "--db", str(path))
    assert_one_line_error(result, f"{str(path)!r} is not a database URL: for that file, "
                                  f"give sqlite:///{path} (or postgresql://...)")
    assert not path.exists()
