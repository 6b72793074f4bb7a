"""What the CLI says of a run is what the store returned, in words a person (or a script's
log) reads right: a real ``durable`` subprocess on a real SQLite file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .test_cli import cli


@pytest.fixture
def db(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'words.db'}"


def _start(db: str, *more: str) -> tuple[int, str, str]:
    done = cli("start", "cli.hello", '"world"', "--import", "tests.cliflows", "--id", "h1",
               *more, db=db)
    return done.returncode, done.stdout.strip(), done.stderr


def test_a_start_again_of_an_existing_run_says_it_returned_that_run(db: str) -> None:
    code, first, _ = _start(db)
    assert code == 0 and first == "h1  cli.hello  queued"
    code, again, err = _start(db)
    assert code == 0, err
    assert again == ("h1  cli.hello  queued  (started before with these arguments: that run, "
                     "as it is; nothing new queued)")
    assert cli("cancel", "h1", db=db).returncode == 0
    code, after_cancel, err = _start(db)  # a re-start does not start a cancelled run again
    assert code == 0, err
    assert after_cancel.startswith("h1  cli.hello  cancelled  (started before with these ")
    code, text, err = _start(db, "--json")
    assert code == 0, err
    data = json.loads(text)
    assert data["state"] == "cancelled" and data["created"] is False


def test_a_new_start_in_json_says_it_created_the_run(db: str) -> None:
    code, text, err = _start(db, "--json")
    assert code == 0, err
    data = json.loads(text)
    assert data["id"] == "h1" and data["state"] == "queued" and data["created"] is True


def test_a_resume_sent_again_says_the_workflow_is_not_paused_without_alarm(db: str) -> None:
    assert _start(db)[0] == 0
    assert cli("pause", "cli.hello", db=db).returncode == 0
    resumed = cli("resume", "cli.hello", db=db)
    assert resumed.returncode == 0 and resumed.stdout.startswith("cli.hello resumed (it was ")
    again = cli("resume", "cli.hello", db=db)  # a script's retry after a lost answer
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip() == ("cli.hello is not paused (resumed already, or never "
                                    "paused): its runs are claimed as usual; nothing to do")
