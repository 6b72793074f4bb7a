"""Choosing a store from a URL."""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

from .._clock import Clock
from .._errors import ConfigError
from ._base import DEFAULT_MAX_RECOVERIES, Store


def _take_option(url: str, name: str) -> tuple[str, str | None]:
    """The URL without the query item ``name``, and its (last) value."""
    base, sep, query = url.partition("?")
    if not sep:
        return url, None
    kept: list[str] = []
    value: str | None = None
    for item in query.split("&"):
        if item.partition("=")[0] == name:
            value = item.partition("=")[2]
        elif item:
            kept.append(item)
    return (f"{base}?{'&'.join(kept)}" if kept else base), value


def store_from_url(url: str, *, clock: Clock | None = None, create: bool = True,
                   upgrade: bool = True, pool_size: int = 10, max_recoveries: int | None = None,
                   statement_timeout: float | None = None) -> Store:
    """A (not yet opened) store for ``sqlite:///path.db`` or ``postgresql://...``.

    ``sqlite:///durable.db`` is relative to the working directory,
    ``sqlite:////var/lib/durable.db`` absolute. ``?synchronous=full`` makes SQLite fsync
    every commit. ``?max_recoveries=N`` (both stores; default
    :data:`DEFAULT_MAX_RECOVERIES`) bounds how often a run is recovered before it ends
    failed. ``statement_timeout`` (seconds, PostgreSQL) bounds every statement.

    ``create=False``: a missing database is an error, not a new one. ``upgrade=False``: a
    schema older than this durable's is an error naming ``durable migrate``, not upgraded
    (the operator's read and control commands: they never change a database's schema under
    the workers that use it).
    """
    if not url:
        raise ConfigError("no database given: pass --db sqlite:///durable.db or set DURABLE_DB")
    url, from_url = _take_option(url, "max_recoveries")
    if from_url is not None:
        try:
            max_recoveries = int(from_url)
        except ValueError as exc:
            raise ConfigError(f"max_recoveries must be a whole number, got {from_url!r}") from exc
    if max_recoveries is None:
        max_recoveries = DEFAULT_MAX_RECOVERIES
    if max_recoveries < 0:
        raise ConfigError(f"max_recoveries must be 0 or more, got {max_recoveries}")
    scheme = url.split(":", 1)[0].lower() if ":" in url else ""
    if scheme == "sqlite":
        from ._sqlite import SqliteStore

        if not url.startswith("sqlite:///"):
            raise ConfigError(
                f"malformed SQLite URL {url!r}: write sqlite:///relative.db or "
                "sqlite:////absolute/path.db"
            )
        rest = url[len("sqlite:///"):]
        path, _, query = rest.partition("?")
        if not path:
            raise ConfigError(f"malformed SQLite URL {url!r}: no file name")
        options = {k: v[-1] for k, v in parse_qs(query).items()}
        unknown = set(options) - {"synchronous", "busy_timeout"}
        if unknown:
            raise ConfigError(f"unknown SQLite URL option(s): {', '.join(sorted(unknown))}")
        try:
            busy = float(options.get("busy_timeout", "5"))
        except ValueError as exc:
            raise ConfigError(
                f"busy_timeout must be seconds, got {options['busy_timeout']!r}") from exc
        synchronous = options.get("synchronous", "normal")
        if synchronous.upper() not in ("OFF", "NORMAL", "FULL", "EXTRA"):
            raise ConfigError(
                f"synchronous must be off, normal, full or extra, not {synchronous!r}")
        return SqliteStore(path, clock=clock, synchronous=synchronous, busy_timeout=busy,
                           create=create, upgrade=upgrade, max_recoveries=max_recoveries)
    if scheme in ("postgresql", "postgres"):
        try:
            from ._postgres import PostgresStore  # type: ignore[import-not-found,unused-ignore]
        except ImportError as exc:
            raise ConfigError(
                "PostgreSQL needs the postgres extra: pip install 'durable-fenced[postgres]'"
            ) from exc
        extra: dict[str, float] = {}
        if statement_timeout is not None:
            extra["statement_timeout"] = statement_timeout
        store: Store = PostgresStore(url, clock=clock, create=create, upgrade=upgrade,
                                     pool_size=pool_size,
                                     max_recoveries=max_recoveries, **extra)
        return store
    parts = urlsplit(url)
    if not parts.scheme and url.strip():  # a file's path: say the URL that names it
        from pathlib import Path

        hint = f"sqlite:///{Path(url).expanduser().absolute()}"
        raise ConfigError(f"{url!r} is not a database URL: for that file, give "
                          f"{hint} (or postgresql://...)")
    raise ConfigError(
        f"unsupported database URL scheme {parts.scheme or url!r}: use sqlite:///FILE "
        "or postgresql://..."
    )
