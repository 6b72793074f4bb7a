"""``python -m durable console`` and ``worker --console`` as a user runs them (subprocesses)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from .browser import free_port, serving_process
from .conftest import subprocess_env


def durable(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "durable", *args], cwd=cwd,
                          env=subprocess_env(), capture_output=True, text=True, timeout=60,
                          check=False)


@pytest.fixture
def db(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'durable.db'}"
    assert durable("migrate", "--db", url, cwd=tmp_path).returncode == 0
    return url


@pytest.mark.parametrize(("args", "message"), [
    (["--bind", "127.0.0.1:http"], "--bind '127.0.0.1:http' is not HOST:PORT"),
    (["--bind", "localhost"], "is not HOST:PORT"),
    (["--bind", "127.0.0.1:70000"], "--bind '127.0.0.1:70000' is not HOST:PORT"),
    (["--token-file", "missing.txt"], "cannot read --token-file missing.txt"),
    (["--allow-host", "console.example.org:8080"],
     "--allow-host 'console.example.org:8080' is not a host name"),
    (["--allow-host", "https://console.example.org"], "is not a host name"),
    (["--allow-host", ""], "--allow-host '' is not a host name"),
])
def test_a_mistake_is_one_line(tmp_path: Path, db: str, args: list[str], message: str) -> None:
    done = durable("console", "--db", db, *args, cwd=tmp_path)
    assert done.returncode == 2
    assert message in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_a_taken_port_and_a_missing_database_are_one_line(tmp_path: Path, db: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = durable("console", "--db", db, "--bind", f"127.0.0.1:{port}", cwd=tmp_path)
    assert done.returncode == 2 and "the port is in use" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    done = durable("console", "--db", "sqlite:///nowhere.db", "--bind", "127.0.0.1:0",
                   cwd=tmp_path)
    assert done.returncode == 2 and "no database at" in done.stderr
    assert not (tmp_path / "nowhere.db").exists()


def test_the_console_binds_loopback_unless_told_otherwise() -> None:
    """Without --bind, and with a bare ``:PORT``, the console listens on 127.0.0.1 only:
    serving every interface is asked for by name (0.0.0.0:PORT)."""
    from durable._cli import build_parser
    from durable.console import bind_socket, parse_bind

    default = build_parser().parse_command_line(["console"]).bind
    assert parse_bind(default, "--bind")[0] == "127.0.0.1"
    for given in (":0", "127.0.0.1:0"):
        with bind_socket(*parse_bind(given, "--bind")) as sock:
            assert sock.getsockname()[0] == "127.0.0.1", given
    with bind_socket(*parse_bind("0.0.0.0:0", "--bind")) as sock:
        assert sock.getsockname()[0] == "0.0.0.0"


def test_an_empty_token_file_is_refused(tmp_path: Path, db: str) -> None:
    (tmp_path / "token").write_text("\n")
    done = durable("console", "--db", db, "--token-file", "token", cwd=tmp_path)
    assert done.returncode == 2 and "is empty" in done.stderr


def _status_for_host(url: str, host: str) -> int:
    request = urllib.request.Request(url, headers={"Host": host})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as refused:
        refused.close()
        return refused.code


def test_the_console_command_answers_the_names_it_is_given(tmp_path: Path, db: str) -> None:
    """``durable console --allow-host NAME`` (repeatable): a request naming one of them
    is served, another DNS name is refused (DNS rebinding), an address always served."""
    port = free_port()
    console = [sys.executable, "-m", "durable", "console", "--db", db, "--bind",
               f"127.0.0.1:{port}", "--allow-host", "durable.internal", "--allow-host",
               "Ops.Example.org"]
    with serving_process(console, port, tmp_path / "console.log"):
        runs = f"http://127.0.0.1:{port}/runs"
        assert _status_for_host(runs, "durable.internal") == 200
        assert _status_for_host(runs, f"ops.example.org:{port}") == 200
        assert _status_for_host(runs, f"127.0.0.1:{port}") == 200
        assert _status_for_host(runs, "rebind.example") == 403


def _get(url: str) -> dict[str, object]:
    with urllib.request.urlopen(url, timeout=10) as response:
        data: dict[str, object] = json.load(response)
        return data


def test_a_worker_serves_the_console_and_its_reports_link_to_it(tmp_path: Path,
                                                                db: str) -> None:
    port = free_port()
    console = f"http://127.0.0.1:{port}"
    worker = [sys.executable, "-m", "durable.worker", "--db", db, "--import", "tests.cliflows",
              "--poll", "0.05", "--console", f"127.0.0.1:{port}",
              "--allow-host", "durable.internal"]
    with serving_process(worker, port, tmp_path / "worker.log"):
        assert durable("start", "cli.hello", '"x"', "--id", "h-1", "--import", "tests.cliflows",
                       "--db", db, cwd=tmp_path).returncode == 0
        deadline = time.monotonic() + 30
        while True:  # a bounded poll of the console's own API
            run = _get(f"{console}/api/runs/h-1")
            if run["run"]["state"] == "completed":  # type: ignore[index]
                break
            assert time.monotonic() < deadline, "the run did not complete"
            time.sleep(0.05)
        assert run["report"]["run_link"].endswith(f"{console}/runs/h-1")  # type: ignore[index]
        status = _get(f"{console}/api/status?id=h-1")
        assert status["status"] == "completed"
        assert _status_for_host(f"{console}/api/runs/h-1", "durable.internal") == 200
        assert _status_for_host(f"{console}/api/runs/h-1", "rebind.example") == 403
    log = (tmp_path / "worker.log").read_text()
    assert f"durable: console at {console}/runs" in log


def test_list_filters_by_time_and_id_prefix_like_the_console(tmp_path: Path, db: str) -> None:
    for run_id in ("alpha-1", "alpha-2", "beta-1"):
        assert durable("start", "cli.hello", '"x"', "--id", run_id, "--import",
                       "tests.cliflows", "--delay", "600", "--db", db,
                       cwd=tmp_path).returncode == 0
    shown = durable("list", "--db", db, "--prefix", "alpha", "--json", cwd=tmp_path)
    assert [r["id"] for r in json.loads(shown.stdout)] == ["alpha-2", "alpha-1"]
    future = durable("list", "--db", db, "--since", "2999-01-01", cwd=tmp_path)
    assert future.stdout.strip() == "no runs"
    past = durable("list", "--db", db, "--until", "2000-01-01T00:00Z", "--json", cwd=tmp_path)
    assert json.loads(past.stdout) == []
    everything = durable("list", "--db", db, "--since", "0", "--json", cwd=tmp_path)
    assert len(json.loads(everything.stdout)) == 3
    bad = durable("list", "--db", db, "--since", "soon", cwd=tmp_path)
    assert bad.returncode == 2 and "--since 'soon' is not a time" in bad.stderr


def test_cli_actions_are_journaled_with_their_origin(tmp_path: Path, db: str) -> None:
    assert durable("start", "cli.hello", '"x"', "--id", "later", "--import", "tests.cliflows",
                   "--delay", "600", "--db", db, cwd=tmp_path).returncode == 0
    assert durable("cancel", "later", "--db", db, cwd=tmp_path).returncode == 0
    assert durable("replay", "later", "--db", db, cwd=tmp_path).returncode == 0
    journal = json.loads(durable("show", "later", "--json", "--db", db, cwd=tmp_path).stdout)
    origins = {e["kind"]: e["data"]["origin"] for e in journal["journal"]
               if "origin" in e["data"]}
    assert set(origins) == {"run_cancelled", "run_replayed"}
    for origin in origins.values():
        assert origin["via"] == "cli" and origin["host"] == socket.gethostname()
        assert origin["user"]
