"""Mutants of the mechanisms that carry the guarantees: each must make a test fail.

    python scripts/mutants.py                 # every mutant in scripts/mutants.json (about 40 min)
    python scripts/mutants.py --only NAME     # one (a substring of its name)
    python scripts/mutants.py --list          # the mutants and the tests meant to kill them
    python scripts/mutants.py --file FILE     # candidates kept in another file of this shape

Each mutant takes one guard out of the code (a fence's lease check in a statement, a
renewal's cancel flag, the clock read before a signal's look, ...): one exact piece of
text in one file, replaced. For each, a copy of the checkout is made with the mutant in
it (the checkout itself is never written), and the tests named for it run there (``pytest
-x``, on the copy's modules: ``PYTHONPATH`` points at it). The mutant is **killed** when a
test fails, and **survives** when they all pass: then no test would notice that guard
going, which is what this script is for (docs/torture.md, *Mutants*).

``equivalent`` in the file lists changes that look like mutants but are not run: removing
them changes nothing, since another part already ensures the same (each says which).

Prints one line per mutant; exits 0 when every mutant was killed, 1 when one survived or
no longer applies (its text is not in its file exactly once: the code moved, and the
mutant must follow it), 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
MUTANTS = Path(__file__).with_suffix(".json")
COPIED = ("durable", "tests", "workflows", "activities", "scripts", "pyproject.toml")
TIMEOUT = 900.0
"""Seconds one mutant's tests may take (a survivor runs them all)."""


FIELDS = ("name", "file", "old", "new", "tests")


def load(path: Path = MUTANTS) -> list[dict[str, Any]]:
    """The mutants of ``path``; ValueError naming what is wrong with it."""
    data = json.loads(path.read_text())
    if not isinstance(data, dict) or not isinstance(data.get("mutants"), list):
        raise ValueError('it is not an object with a list "mutants"')
    for i, m in enumerate(data["mutants"]):
        missing = [f for f in FIELDS if not isinstance(m, dict) or f not in m]
        if missing:
            raise ValueError(f"mutant {i + 1} has no {', '.join(missing)}")
    return list(data["mutants"])


def applies(mutant: dict[str, Any], root: Path = ROOT) -> str | None:
    """Why ``mutant`` cannot be applied to the code under ``root``; None when it can."""
    text = (root / mutant["file"]).read_text()
    found = text.count(mutant["old"])
    if found != 1:
        return f"its text is in {mutant['file']} {found} times, not once"
    if mutant["old"] == mutant["new"]:
        return "it changes nothing"
    return None


def copy_tree(into: Path) -> None:
    for name in COPIED:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, into / name, ignore=shutil.ignore_patterns(
                "__pycache__", "*.pyc", ".mypy_cache", ".ruff_cache"))
        else:
            shutil.copy2(source, into / name)


def run(mutant: dict[str, Any]) -> tuple[str, str]:
    """("killed" | "survived" | "stale", detail) of one mutant, in a copy of the checkout."""
    why = applies(mutant)
    if why is not None:
        return "stale", why
    with tempfile.TemporaryDirectory(prefix="durable-mutant-") as tmp:
        tree = Path(tmp)
        copy_tree(tree)
        target = tree / mutant["file"]
        target.write_text(target.read_text().replace(mutant["old"], mutant["new"]))
        env = dict(os.environ, PYTHONPATH=str(tree), PYTHONDONTWRITEBYTECODE="1")
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:randomly", "-p",
             "no:cacheprovider", *mutant["tests"]],
            cwd=tree, env=env, capture_output=True, text=True, timeout=TIMEOUT)
    lines = done.stdout.strip().splitlines()
    last = lines[-1] if lines else done.stderr.strip()[-300:]
    if done.returncode == 0:
        return "survived", last
    if done.returncode in (1, 3):  # tests failed (or errored), as a mutant should make them
        # which test killed it: a kill by a test that has nothing to do with the guard
        # (a flaky one) is worth a look
        failed = [line.split(" - ")[0] for line in lines
                  if line.startswith(("FAILED ", "ERROR "))]
        return "killed", f"{last}; {failed[0]}" if failed else last
    return "stale", f"pytest could not run the tests (exit {done.returncode}): {last}"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:
        self.exit(2, f"mutants.py: {message}\n")


def main(argv: list[str] | None = None) -> int:
    parser = _Parser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", metavar="NAME", help="the mutants whose name contains NAME")
    parser.add_argument("--list", action="store_true", help="list them and exit")
    parser.add_argument("--file", type=Path, default=MUTANTS,
                        help="the mutants' file (default: scripts/mutants.json)")
    args = parser.parse_args(argv)
    try:
        mutants = load(args.file)
    except (OSError, ValueError) as e:
        parser.error(f"cannot read the mutants of {args.file}: {e}")
    if args.only is not None:
        mutants = [m for m in mutants if args.only in m["name"]]
        if not mutants:
            parser.error(f"no mutant's name contains {args.only!r} (see --list)")
    if args.list:
        for m in mutants:
            print(f"{m['name']}  [{m['file']}]  {' '.join(m['tests'])}")
        return 0
    failed = 0
    for m in mutants:
        began = time.monotonic()
        verdict, detail = run(m)
        failed += verdict != "killed"
        print(f"{verdict.upper():8} {m['name']} ({time.monotonic() - began:.0f} s): {detail}",
              flush=True)
    print(f"{len(mutants) - failed} of {len(mutants)} mutants killed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
