"""scripts/mutants.py on a small budget: every mutant still applies to the code (so the list
cannot rot as the code moves), one mutant is killed end to end, and a change no test can
see is reported as a survivor (the script can fail)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from .conftest import ROOT, subprocess_env

SCRIPT = ROOT / "scripts" / "mutants.py"


def _module():  # type: ignore[no-untyped-def]
    from scripts import mutants

    return mutants


def test_every_mutant_applies_once_and_names_tests_that_exist() -> None:
    m = _module()
    mutants = m.load()
    assert len(mutants) >= 40
    assert len({x["name"] for x in mutants}) == len(mutants)
    stale = {x["name"]: m.applies(x) for x in mutants if m.applies(x) is not None}
    assert stale == {}
    for x in mutants:
        files = [t.split("::")[0] for t in x["tests"] if t.startswith("tests/")]
        assert files and all((ROOT / f).is_file() for f in files), x["name"]


def test_a_mutant_is_killed_and_the_checkout_is_left_as_it_was() -> None:
    before = (ROOT / "durable" / "_steps.py").read_text()
    done = subprocess.run([sys.executable, str(SCRIPT), "--only", "no second look"],
                          cwd=ROOT, env=subprocess_env(), capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("KILLED   wait_for: no second look once the clock read "
                                  "past the deadline"), done
    assert done.stdout.strip().endswith("1 of 1 mutants killed")
    assert (ROOT / "durable" / "_steps.py").read_text() == before


def test_a_change_no_test_sees_survives(tmp_path: Path) -> None:
    m = _module()
    harmless = {"name": "a comment", "file": "durable/_steps.py",
                "old": "# past the deadline: look once more, after the clock read",
                "new": "# past the deadline: look again, after the clock read",
                "tests": ["tests/test_signals.py", "-k", "look_was_late"]}
    verdict, detail = m.run(harmless)
    assert verdict == "survived" and "passed" in detail, detail
    gone = dict(harmless, old="no such text in the file")
    assert m.run(gone) == ("stale", "its text is in durable/_steps.py 0 times, not once")


def test_bad_arguments_are_one_line_and_exit_2() -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), "--only", "no such mutant"], cwd=ROOT,
                          env=subprocess_env(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip() == ("mutants.py: no mutant's name contains 'no such mutant' "
                                   "(see --list)")


def test_candidates_in_another_file_run_and_a_bad_file_is_one_line(tmp_path: Path) -> None:
    candidates = tmp_path / "candidates.json"
    candidates.write_text('{"mutants": [{"name": "a comment", "file": "durable/_steps.py", '
                          '"old": "# past the deadline: look once more, after the clock read", '
                          '"new": "# past the deadline: look again", "tests": '
                          '["tests/test_signals.py", "-k", "look_was_late and asyncio"]}]}')
    done = subprocess.run([sys.executable, str(SCRIPT), "--file", str(candidates), "--list"],
                          cwd=ROOT, env=subprocess_env(), capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0 and done.stdout.startswith("a comment  [durable/_steps.py]")
    candidates.write_text('{"mutants": [{"name": "half a mutant", "file": "durable/_steps.py"}]}')
    done = subprocess.run([sys.executable, str(SCRIPT), "--file", str(candidates)], cwd=ROOT,
                          env=subprocess_env(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip() == (f"mutants.py: cannot read the mutants of {candidates}: "
                                   "mutant 1 has no old, new, tests")
