"""The migrations of both stores: numbered 1, 2, ... once each, up to SCHEMA_VERSION.

Two branches that each took the next free number would otherwise apply only one of the two
files to a new database (a number at or below the database's version is skipped).
"""

from __future__ import annotations

import pytest

from durable.store import SCHEMA_VERSION, _sql


@pytest.mark.parametrize("dialect", ["sqlite", "postgres"])
def test_migrations_are_numbered_once_each_up_to_the_schema_version(dialect: str) -> None:
    numbers = [number for number, _ in _sql.load_migrations(dialect)]
    assert numbers == list(range(1, SCHEMA_VERSION + 1))


def test_two_migrations_with_one_number_are_refused(monkeypatch: pytest.MonkeyPatch,
                                                     tmp_path: object) -> None:
    from importlib import resources
    from pathlib import Path

    folder = Path(str(resources.files(_sql.__package__).joinpath("sql", "sqlite")))
    fake = Path(str(tmp_path)) / "sql" / "sqlite"
    fake.mkdir(parents=True)
    for entry in folder.iterdir():
        (fake / entry.name).write_text(entry.read_text())
    (fake / f"{SCHEMA_VERSION:03d}_another.sql").write_text("SELECT 1;")

    class Files:
        def joinpath(self, *parts: str) -> Path:
            return Path(str(tmp_path)).joinpath(*parts)

    monkeypatch.setattr(_sql.resources, "files", lambda package: Files())
    with pytest.raises(RuntimeError, match=f"share the number.*{SCHEMA_VERSION}"):
        _sql.load_migrations("sqlite")
