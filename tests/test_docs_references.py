"""Every file, folder and test that README.md and docs/*.md point to exists in the repository.

Checked in each Markdown file:

- relative link targets, ``[text](target)`` (images included), resolved from the file's folder;
- paths written in backticks that start with a folder of the repository (``durable/...``,
  ``docs/...``, ``scripts/...``, ``tests/...``, ...); ``<placeholder>`` parts and ``*`` match
  anything, and a ``::name`` suffix must be defined in that file;
- ``../``-relative paths anywhere in the text, which must stay inside the repository;
- test names in backticks (```test_...```), which must be defined under ``tests/``.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
TOP = ("durable", "docs", "scripts", "tests", "workflows", "activities", ".ci")

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
CODE = re.compile(r"`([^`\n]+)`")
UP = re.compile(r"(?<![\w./-])((?:\.\./)+[\w.-]+(?:/[\w.-]+)*)")
TEST_NAME = re.compile(r"test_\w+")


def _exists(pattern: str) -> bool:
    """Whether a repository path exists; ``<...>`` parts and ``*`` match anything."""
    glob = re.sub(r"<[^>]+>", "*", pattern).rstrip("/")
    if "*" not in glob:
        return (ROOT / glob).exists()
    return any(ROOT.glob(glob))


def _defined_tests() -> set[str]:
    names: set[str] = set()
    for path in (ROOT / "tests").rglob("*.py"):
        names.update(re.findall(r"^\s*(?:async\s+)?def\s+(test_\w+)", path.read_text(), re.M))
    return names


def missing_references(text: str, where: Path, tests: set[str]) -> list[str]:
    """The references in ``text`` (a Markdown file in folder ``where``) that do not exist."""
    missing: list[str] = []
    for target in LINK.findall(text):
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # a URL or an anchor in the same file
        path = (where / target.split("#", 1)[0]).resolve()
        if not path.is_relative_to(ROOT) or not path.exists():
            missing.append(f"link {target}")
    for up in UP.findall(text):
        path = (where / up).resolve()
        if not path.is_relative_to(ROOT) or not path.exists():
            missing.append(f"path {up}")
    for code in CODE.findall(text):
        for word in code.split():
            word = word.strip("(),;:'\"")
            path, _, name = word.partition("::")
            if path.split("/", 1)[0] in TOP and "/" in path:
                if not _exists(path):
                    missing.append(f"path {path}")
                elif name and (ROOT / path).is_file():
                    source = (ROOT / path).read_text()
                    if not re.search(rf"\b(?:def|class)\s+{re.escape(name.split('.')[0])}\b",
                                     source):
                        missing.append(f"name {word}")
            elif TEST_NAME.fullmatch(word) and word not in tests:
                missing.append(f"test {word}")
    return missing


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_reference_in_the_docs_exists(doc: Path) -> None:
    missing = missing_references(doc.read_text(encoding="utf-8"), doc.parent, _defined_tests())
    assert not missing, f"{doc.relative_to(ROOT)} points to what is not in the repository: " \
                        f"{missing}"


def test_the_check_finds_each_kind_of_dangling_reference() -> None:
    text = "\n".join([
        "| incident (../shared/background) |",            # a folder outside the repository
        "see [the picture](architecture-old.svg)",          # a link to a missing file
        "in `durable/store/_missing.py` and `docs/nope/`",  # backticked paths
        "`durable/_worker.py::NoSuchClass`",                # a name not defined there
        "`test_that_was_renamed_long_ago`",                 # a test that does not exist
    ])
    found = missing_references(text, ROOT / "docs", _defined_tests())
    assert found == [
        "link architecture-old.svg",
        "path ../shared/background",
        "path durable/store/_missing.py",
        "path docs/nope/",
        "name durable/_worker.py::NoSuchClass",
        "test test_that_was_renamed_long_ago",
    ]


def test_the_check_accepts_what_exists() -> None:
    text = ("[design](design.md#execution-model), ![arch](architecture.svg), "
            "`durable/store/sql/<dialect>/*.sql`, `durable/_worker.py::Worker`, "
            "`tests/test_docs_references.py`, `test_the_check_accepts_what_exists`, "
            "[home](https://example.org/x)")
    assert missing_references(text, ROOT / "docs", _defined_tests()) == []
