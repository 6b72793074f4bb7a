"""A real full disk: a small tmpfs of its own (mounting one needs root) and a file that
fills it to the last byte; for PostgreSQL, a tablespace on it. Used by
``tests/test_disk_full.py`` and ``scripts/torture.py`` (``--disk-full``)."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NoReturn

FILLER = "filler"


@contextlib.contextmanager
def tmpfs(where: Path, size: str, refused: Callable[[str], NoReturn]) -> Iterator[Path]:
    """A tmpfs of ``size`` (mount's ``size=``, e.g. ``8m``) mounted on the new folder
    ``where`` for the block, then unmounted (lazily: a process still in it lets go). If
    mounting is refused (not root, or no CAP_SYS_ADMIN), ``refused`` is called with what
    mount said, and raises (a test's skip, a script's exit)."""
    where.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs",
                              str(where)], capture_output=True, text=True, check=False)
    if mounted.returncode != 0:
        refused(mounted.stderr.strip() or f"mount exited {mounted.returncode}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill(disk: Path, leave: int = 0) -> Path:
    """Fill the file system of ``disk`` with one file (FILLER) to the last byte, then give
    back ``leave`` bytes; the file, to unlink when the disk is to have room again."""
    filler = disk / FILLER
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        for chunk in (1 << 20, 4096, 1):
            with contextlib.suppress(OSError):  # ENOSPC: full at this grain
                while True:
                    os.write(fd, b"\0" * chunk)
    finally:
        os.close(fd)
    if leave:
        os.truncate(filler, max(0, filler.stat().st_size - leave))
    return filler


def free_bytes(disk: Path) -> int:
    st = os.statvfs(disk)
    return st.f_bavail * st.f_frsize


@contextlib.contextmanager
def pg_tablespace(server: str, disk: Path, refused: Callable[[str], NoReturn]
                  ) -> Iterator[str]:
    """A PostgreSQL tablespace on ``disk`` (a tmpfs of :func:`tmpfs`, in folders the
    server's user can enter), dropped afterwards with whatever is left in it; its name.
    A store URL whose ``options`` say ``-c default_tablespace=NAME`` creates its tables
    there, so they run out of room when the disk is filled (the server's WAL does not).
    ``refused`` is called (and raises) when the server cannot use the folder: it runs on
    another machine, or the folder cannot be given to its user."""
    import psycopg
    from psycopg import sql

    name = f"durable_disk_{os.urandom(6).hex()}"
    folder = disk / "tablespace"
    folder.mkdir()
    try:
        shutil.chown(folder, "postgres", "postgres")
        with psycopg.connect(server, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE TABLESPACE {} LOCATION {}").format(
                sql.Identifier(name), sql.Literal(str(folder))))
    except (LookupError, PermissionError, psycopg.Error) as exc:
        refused(f"the server cannot put a tablespace on a folder of this machine (it runs "
                f"elsewhere, or as another user): {exc}")
    try:
        yield name
    finally:
        with psycopg.connect(server, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP TABLESPACE IF EXISTS {}").format(sql.Identifier(name)))


def tablespace_option(name: str) -> str:
    """The store URL's query parameter that puts its tables in tablespace ``name``."""
    return f"options=-c%20default_tablespace%3D{name}"
