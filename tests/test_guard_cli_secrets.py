"""A store URL's password never reaches the CLI's output, however the URL carries it."""

from __future__ import annotations

from durable.store import SCHEMA_VERSION

from .pg import pg_url, postgres_server
from .test_cli import cli

__all__ = ["pg_url", "postgres_server"]  # fixtures


def test_a_password_given_as_a_url_option_is_never_printed(pg_url: str) -> None:
    """``?password=`` (libpq's option) is masked like ``user:password@``: migrate prints the
    URL it migrated, and a read command's refusal names the URL."""
    base, _, query = pg_url.partition("?")
    with_password = f"{base}?password=hunter2&{query}"  # trust auth: the server ignores it
    migrated = cli("migrate", db=with_password)
    assert migrated.returncode == 0, migrated.stderr
    assert "hunter2" not in migrated.stdout + migrated.stderr
    assert migrated.stdout == (f"{base}?password=***&{query}: schema version "
                               f"{SCHEMA_VERSION}\n")
    missing = cli("list", db=with_password.replace("schema=", "schema=x"))
    assert missing.returncode == 2 and "no durable schema" in missing.stderr
    assert "hunter2" not in missing.stdout + missing.stderr

