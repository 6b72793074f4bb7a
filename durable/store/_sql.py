"""Loading the store's SQL from its named ``.sql`` files."""

from __future__ import annotations

import re
from importlib import resources

_NAME = re.compile(r"^--\s*name:\s*(\w+)\s*$", re.MULTILINE)


def load_queries(dialect: str) -> dict[str, str]:
    """The named queries of ``sql/<dialect>/queries.sql``."""
    text = resources.files(__package__).joinpath("sql", dialect, "queries.sql").read_text()
    parts = _NAME.split(text)
    queries: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        queries[name] = body.strip().rstrip(";")
    return queries


def load_migrations(dialect: str) -> list[tuple[int, str]]:
    """The migrations ``sql/<dialect>/NNN_*.sql`` as (version, script), in order."""
    folder = resources.files(__package__).joinpath("sql", dialect)
    found: list[tuple[int, str]] = []
    for entry in folder.iterdir():
        match = re.fullmatch(r"(\d{3})_\w+\.sql", entry.name)
        if match:
            found.append((int(match.group(1)), entry.read_text()))
    found.sort()
    numbers = [number for number, _ in found]
    if len(set(numbers)) != len(numbers):  # two branches that each took the next number
        twice = sorted({n for n in numbers if numbers.count(n) > 1})
        raise RuntimeError(f"two {dialect} migrations share the number(s) {twice}: "
                           "renumber one (each number is applied once)")
    return found
