"""Worker liveness on one machine, kept by the kernel: a lock each worker process holds.

A worker whose store is a local SQLite file holds an exclusive ``flock`` on its own lock
file, ``<database>-workers/<worker id>.lock``, from before its first claim until its last
attempt has ended. The kernel releases the lock when the process dies (SIGKILL, OOM, a
crash) and keeps it while the process is frozen (SIGSTOP, a debugger): so whoever can take
a worker's lock knows that worker is dead, and its runs can be taken over at once, whatever
their lease. Being able to take the lock is proof of death; anything else (no file, no
permission, any error) proves nothing and leaves the run to its lease.

Why ``flock``: its locks belong to the open file description, so two workers of one process
exclude each other, and a probe that opens and closes the file does not drop its owner's
lock (POSIX ``lockf``/``fcntl`` record locks belong to the process: a probe in the same
process would succeed and its ``close`` would release the worker's own lock). An open file
description is shared by forked children, so the descriptor is opened close-on-exec (an
exec'd child such as ``git`` never holds it) and closed in every child forked without exec
(:func:`os.register_at_fork`), whose copy would otherwise keep a dead worker's lock alive.

SQLite in WAL mode works only between processes of one host (they share memory), so every
worker of a SQLite file is on this machine and its lock is visible here.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import weakref
from collections.abc import Iterator
from hashlib import sha256
from pathlib import Path

SUFFIX = ".lock"
_PLAIN = re.compile(r"[A-Za-z0-9._-]")
_MAX_NAME = 200


def lock_dir(database: str) -> Path:
    """The folder of the lock files of a SQLite database's workers: ``<database>-workers``
    next to it (the real path: every spelling of one file names one folder)."""
    return Path(os.path.realpath(database) + "-workers")


def lock_name(worker_id: str) -> str:
    """The lock file's name of a worker id: one name per id, never shared by two ids.

    Characters other than ASCII letters, digits, ``.``, ``_`` and ``-`` are written as
    ``%XX`` (the UTF-8 bytes), so the mapping is injective and the name has no ``/``; an id
    whose name would be too long for a file system is ``=`` and its SHA-256 (``=`` is never
    the first character of an escaped name)."""
    escaped = "".join(c if _PLAIN.fullmatch(c) else "".join(f"%{b:02X}" for b in c.encode())
                      for c in worker_id)
    if len(escaped) > _MAX_NAME or escaped in ("", ".", ".."):
        escaped = "=" + sha256(worker_id.encode()).hexdigest()
    return escaped + SUFFIX


def _open(path: Path, create: bool) -> int:
    flags = os.O_RDWR | os.O_CLOEXEC | (os.O_CREAT if create else 0)
    return os.open(path, flags, 0o600)


_held: weakref.WeakSet[WorkerLock] = weakref.WeakSet()


def _close_in_child() -> None:
    """In a child forked without exec: drop the copies of every held lock's descriptor (the
    parent's stay open and locked), so the child never keeps a dead worker's lock alive."""
    for lock in list(_held):
        lock.forget()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_close_in_child)


class InUseError(Exception):
    """Another live process holds the lock of this worker id."""


class WorkerLock:
    """The lock a live worker holds on its own file (:func:`hold`)."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    @property
    def held(self) -> bool:
        return self._fd is not None

    def forget(self) -> None:
        """Close this process's descriptor without unlinking (a forked child's copy)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)

    def release(self) -> None:
        """A clean stop: remove the file, then let the lock go."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            _unlink_if_same(self.path, fd)
        finally:
            os.close(fd)
        _held.discard(self)


def hold(folder: Path, worker_id: str, *, attempts: int = 50) -> WorkerLock:
    """Create (0600) and lock the worker's file; :class:`InUseError` if a live process
    holds it; OSError when the folder or file cannot be made.

    A probe (:func:`probe_dead`) may hold the lock for an instant, or may have unlinked the
    file between our open and our lock: then we try again, so the lock we keep is on the
    file that the path names."""
    folder.mkdir(mode=0o700, exist_ok=True)
    path = folder / lock_name(worker_id)
    for _ in range(attempts):
        fd = _open(path, create=True)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                fd = -1
                _sleep_a_little()
                continue
            if _same_file(path, fd):
                lock = WorkerLock(path, fd)
                _held.add(lock)
                fd = -1
                return lock
        finally:
            if fd >= 0:
                os.close(fd)
    raise InUseError(f"worker id {worker_id!r} is in use by a live process ({path} is locked)")


def _sleep_a_little() -> None:
    import time

    time.sleep(0.02)  # a probe holds the lock for microseconds


def _same_file(path: Path, fd: int) -> bool:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino)


def _unlink_if_same(path: Path, fd: int) -> None:
    if _same_file(path, fd):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


@contextlib.contextmanager
def probe_dead(folder: Path, worker_id: str) -> Iterator[bool]:
    """Whether the worker is dead for sure: its lock file exists and its lock can be taken.

    While the block runs the lock stays taken, so no new process with that id can take it
    (and claim) meanwhile; when the block ends without an error, the dead worker's file is
    removed. False (proves nothing: leave the run to its lease) when there is no file, it
    cannot be opened, or someone holds the lock (the worker lives, or is frozen)."""
    path = folder / lock_name(worker_id)
    try:
        fd = _open(path, create=False)
    except OSError:
        yield False
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            dead = False
        else:
            dead = True
        yield dead
        if dead:
            _unlink_if_same(path, fd)
    finally:
        os.close(fd)


def holder_alive(folder: Path, worker_id: str) -> bool | None:
    """Whether a worker lives, asked by a read (``durable show``, ``list``, the console):
    three-valued, and nothing written.

    False: its lock file is there and a shared lock on it could be taken, so the kernel let
    the worker's lock go (dead for sure, as :func:`probe_dead` judges). True: its lock is
    held (the worker lives, or is frozen). None: nothing can be told (no file: it never
    held one, stopped cleanly or was swept; the file cannot be opened, say by another
    user; any other error). No file is created or removed, and the shared lock is let go
    at once: a sweep or a starting worker whose exclusive lock meets it for that instant
    takes it at its next look (:func:`hold` tries again)."""
    return _lock_held(folder / lock_name(worker_id))


def _lock_held(path: Path) -> bool | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return None
    finally:
        os.close(fd)
    return False


def any_alive(folder: Path) -> bool | None:
    """Whether some worker of the folder's database lives (its lock held), by the same
    read-only look as :func:`holder_alive`: True if one does; False if no lock file's lock
    is held (none there, or no folder: no worker ever held one); None when the folder, or
    a file in it, cannot be read. (A worker whose lock could not be made holds none: False
    says none was found, not that none runs.)"""
    try:
        names = [n for n in os.listdir(folder) if n.endswith(SUFFIX)]
    except FileNotFoundError:
        return False
    except OSError:
        return None
    found: bool | None = False
    for name in names:
        alive = _lock_held(folder / name)
        if alive:
            return True
        if alive is None and (folder / name).exists():  # (not one that went meanwhile)
            found = None
    return found


def dead_lock_files(folder: Path, skip: str | None = None) -> list[str]:
    """The lock file names in ``folder`` whose lock can be taken now (dead workers'), as
    names (see :func:`lock_name`); the caller decides what to do with them."""
    try:
        names = [n for n in os.listdir(folder) if n.endswith(SUFFIX) and n != skip]
    except OSError:
        return []
    dead: list[str] = []
    for name in names:
        try:
            fd = _open(folder / name, create=False)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            continue
        else:
            dead.append(name)
        finally:
            os.close(fd)
    return dead


def remove_if_dead(folder: Path, name: str) -> bool:
    """Remove a lock file whose lock can be taken (a dead worker with nothing to recover)."""
    try:
        fd = _open(folder / name, create=False)
    except OSError:
        return False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False
        _unlink_if_same(folder / name, fd)
        return True
    finally:
        os.close(fd)
