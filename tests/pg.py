"""The PostgreSQL server for tests: a schema of its own per test, dropped at teardown.

Import the fixtures into a test module (``from tests.pg import pg_url, postgres_server``;
``both``: a client on SQLite and on PostgreSQL).
They use the machine's server at ``PG_URL`` (trust auth, database ``test``); without one the
tests skip with the reason, unless ``DURABLE_REQUIRE_POSTGRES`` is set (CI), where an
unreachable server fails them.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any
from urllib.parse import parse_qs

import pytest

import durable

try:
    import psycopg
    from psycopg import sql
except ImportError:  # without the postgres extra, the postgres tests skip
    psycopg = None  # type: ignore[assignment]

PG_URL = "postgresql://postgres@127.0.0.1:5432/test"


@pytest.fixture(scope="session")
def postgres_server() -> str:
    if psycopg is None:
        pytest.skip("psycopg is not installed (pip install 'durable-fenced[postgres]')")
    try:
        with psycopg.connect(PG_URL, connect_timeout=3):
            pass
    except psycopg.Error as exc:
        reason = f"no PostgreSQL server reachable at {PG_URL}: {' '.join(str(exc).split())}"
        if os.environ.get("DURABLE_REQUIRE_POSTGRES"):  # CI: these tests must run
            pytest.fail(reason)
        pytest.skip(reason)
    return PG_URL


@pytest.fixture
def pg_url(postgres_server: str) -> Iterator[str]:
    """A PostgreSQL store URL with a schema of its own, dropped at teardown."""
    schema = f"durable_test_{uuid.uuid4().hex[:12]}"
    yield f"{postgres_server}?schema={schema}"
    with psycopg.connect(postgres_server, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


@pytest.fixture(params=["sqlite", "postgres"])
async def both(request: pytest.FixtureRequest, db_url: str, registry: durable.Registry,
               anyio_backend: str) -> AsyncIterator[durable.Client]:
    """A client on SQLite (asyncio and trio) and on PostgreSQL (both loops)."""
    url = str(request.getfixturevalue("pg_url")) if request.param == "postgres" else db_url
    async with durable.Client.connect(url, registry=registry) as c:
        yield c


def split_url(url: str) -> tuple[str, str]:
    """(server URL, schema) of a store URL made by ``pg_url``."""
    base, _, query = url.partition("?")
    return base, parse_qs(query)["schema"][0]


def connect_sync(url: str) -> Any:
    """A plain autocommit connection whose search_path is the store URL's schema."""
    base, schema = split_url(url)
    return psycopg.connect(base, autocommit=True, options=f"-c search_path={schema}")
