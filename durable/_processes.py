"""Programs an activity runs (``git``, ``psql``, a cloud CLI): stopped with the attempt, and
with the worker.

:func:`process_group` runs a command in a process group of its own (a new session), so that
all of it can be signalled at once, whatever it started (``git`` starts ``git-remote-https``,
``ssh``, and on a local push ``git-receive-pack`` and its hooks). The group is tied to the
worker's life: a watcher in the group (started by ``/bin/sh`` before the command is exec'd
in its place: :data:`_WATCH`) blocks reading a pipe whose only writing end this process
holds, and kills the group when the read ends. The kernel closes that end when the worker
dies however it dies (SIGKILL, the OOM killer, a crash), so a push in flight does not go on
for an attempt that is gone while its run is taken over; the block closes it when it ends,
so nothing of the group outlives the block either. Bound to an attempt's lease
(``ActivityContext.process_group``), the watcher (then :data:`_WATCHER`, in Python) also
kills the group when the lease's local deadline passes without a renewal written to the
pipe: a frozen worker cannot act.

:func:`abort_process_group` is the kill on a cancel: the group is stopped, each of its TCP
connections that holds bytes not yet acknowledged is made to close with a reset
(``durable/_sockets.py``: a push request lying whole in the kernel's send queue would
otherwise be delivered after the cancel), then it is SIGKILLed.

Linux for the resets (``/proc``, ``pidfd_getfd``); the rest wherever there is ``/bin/sh``.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import IO, Any

import anyio
import anyio.abc

from ._lease import Lease
from ._logging import get_logger
from ._sockets import reset_if_unacknowledged

__all__ = ["abort_process_group", "process_group"]

_WATCH = """exec 3<&0 </dev/null
if [ -n "$3" ]; then
    "$1" -S -I -c "$2" "$3" >/dev/null 2>&1 &
else
    (read _ <&3; kill -s KILL 0) >/dev/null 2>&1 &
fi
shift 3
exec "$@" 3<&-
"""
"""Run by ``/bin/sh`` as the group's leader, the pipe as its standard input: keep the pipe
as fd 3 (single digits: what every ``sh`` redirects), start the watcher on it, and become
the command (same pid, its own exit status), without the pipe and with ``/dev/null`` as its
input. Arguments: the Python to run the watcher with, its code, the first deadline. With no
deadline (no lease to follow) the watcher is a subshell that kills the group when its read
ends, which costs a fork instead of a Python's start."""

_WATCHER = """import os, select, signal, sys, time
def now():
    if hasattr(time, "CLOCK_BOOTTIME"):
        return time.clock_gettime(time.CLOCK_BOOTTIME)
    return time.monotonic()
deadline = float(sys.argv[1]) if sys.argv[1] else None
pending = b""
while deadline is None or now() < deadline:
    wait = None if deadline is None else min(1.0, max(0.0, deadline - now()))
    if select.select([3], [], [], wait)[0]:
        data = os.read(3, 4096)
        if not data:
            break
        *lines, pending = (pending + data).split(b"\\n")
        if lines:
            deadline = float(lines[-1])
os.killpg(0, signal.SIGKILL)
"""
"""The watcher, in the group: it kills the group when its read of the pipe ends (the
worker died, or the block ended) or when the lease's deadline passes (on the clock leases
are kept on, which counts suspend) without a renewal written to the pipe: the worker may
be frozen, its event loop blocked, and nobody else can stop the program then. Each line
written is the next deadline. ``-S -I``: no site, no environment; about 12 ms of CPU, so
only for a group bound to a lease (:data:`_WATCH`)."""

_SYS_PIDFD_GETFD = 438
"""``pidfd_getfd(2)`` (Linux 5.6), the same number on every architecture."""

_SETTLED = frozenset(b"TtZX")
"""``/proc/<pid>/stat`` states of a process that writes nothing more: stopped, traced,
dead."""

_REAP_TIMEOUT = 5.0

_held: set[int] = set()
"""The worker's ends of the watchers' pipes. A child forked without exec (multiprocessing)
closes its copies at once: a copy would keep the pipes open, and the groups alive, after
the worker died."""


def _close_in_child() -> None:
    for fd in _held:
        with contextlib.suppress(OSError):
            os.close(fd)
    _held.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_close_in_child)

_log = get_logger("durable.process")

_Stream = int | IO[Any] | None


@asynccontextmanager
async def process_group(
    command: Sequence[str],
    *,
    stdout: _Stream = subprocess.PIPE,
    stderr: _Stream = subprocess.PIPE,
    cwd: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    lease: Lease | None = None,
) -> AsyncIterator[anyio.abc.Process]:
    """Run ``command`` in a process group of its own, for the length of the block; its
    standard input is ``/dev/null`` (give a program its input as a file).

    The block ends with the group gone: if it ends by an exception or a cancel (an
    activity's timeout, an operator's cancel, a lost lease) while the command still runs,
    the group is aborted (:func:`abort_process_group`); then the command is reaped
    (shielded, at most 5 s), and whatever is left of the group is killed by its watcher. If
    this process dies, the watcher kills the group; with a ``lease``
    (:meth:`durable.ActivityContext.process_group`), also when the lease's local deadline
    passes without a renewal, whatever this process is doing. A process that leaves the
    group (``setsid``, a daemon) is beyond reach. ``FileNotFoundError`` if ``command[0]`` is
    not found (on ``env``'s ``PATH``, as ``subprocess`` looks)."""
    path = (env if env is not None else os.environ).get("PATH", os.defpath)
    if shutil.which(command[0], path=path) is None:
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), command[0])
    watched, held = os.pipe()  # not inherited: the watched end is given as stdin
    _held.add(held)
    os.set_blocking(held, False)  # a renewal never waits for the watcher
    deadline = "" if lease is None else repr(lease.boot_deadline)
    python = sys.executable or "python3"
    try:
        process = await anyio.open_process(
            ["/bin/sh", "-c", _WATCH, "durable-watch", python, _WATCHER, deadline, *command],
            stdin=watched, stdout=stdout, stderr=stderr, cwd=cwd, env=env,
            start_new_session=True)
    except BaseException:
        _held.discard(held)
        os.close(held)
        raise
    finally:
        os.close(watched)

    def renewed(boot_deadline: float) -> None:
        with contextlib.suppress(OSError):  # full (the watcher stopped) or gone
            os.write(held, f"{boot_deadline!r}\n".encode())

    if lease is not None:
        lease.watch(renewed)
    try:
        yield process
    except BaseException:
        if process.returncode is None:
            await abort_process_group(process.pid)  # shielded: it runs when cancelled
        raise
    finally:
        if lease is not None:
            lease.unwatch(renewed)
        with anyio.CancelScope(shield=True), anyio.move_on_after(_REAP_TIMEOUT):
            await process.aclose()
        _held.discard(held)
        os.close(held)  # the watcher kills what is left of the group


async def abort_process_group(pgid: int, *, settle_timeout: float = 0.5) -> int:
    """SIGKILL process group ``pgid``, and make every TCP connection of its processes that
    holds unacknowledged bytes close with a reset when they die. Returns how many will.

    The group is stopped first (SIGSTOP), so that nothing more is written while its
    connections are looked at (each member is awaited in a stopped state, at most
    ``settle_timeout`` seconds in all, shielded from cancellation); each member's sockets
    are borrowed with ``pidfd_getfd`` (which needs the right to ptrace it: a child of this
    process's user, under the default Yama policy too), given a reset if they hold bytes on
    their way (``durable/_sockets.py``), and the borrowed copies closed. The SIGKILL is sent
    whatever happened before it. Where the sockets cannot be borrowed (not Linux, a kernel
    before 5.6, ptrace forbidden) the kill is a plain one, and
    ``process_connections_unreachable`` is logged with the reason."""
    reset = 0
    try:
        with anyio.CancelScope(shield=True):
            os.killpg(pgid, signal.SIGSTOP)
            members = await _settled_members(pgid, settle_timeout)
            reset = _reset_connections(pgid, members)
    except (ProcessLookupError, PermissionError):  # gone already, or not ours
        pass
    finally:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    return reset


def _stat(pid: int) -> tuple[int, int] | None:
    """(state, process group) of ``pid`` from ``/proc``, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    fields = data.rpartition(b")")[2].split()  # after the command's name, which may hold ")"
    return fields[0][0], int(fields[2])


def _members(pgid: int) -> Iterator[int]:
    try:
        names = os.listdir("/proc")
    except OSError:
        return
    for name in names:
        if name.isdigit():
            stat = _stat(int(name))
            if stat is not None and stat[1] == pgid:
                yield int(name)


async def _settled_members(pgid: int, timeout: float) -> list[int]:
    """The group's processes, once each is stopped or dead (or ``timeout`` has passed: one
    in an uninterruptible sleep does not hold the kill up)."""
    if not sys.platform.startswith("linux"):
        return []
    members = list(_members(pgid))
    with anyio.move_on_after(timeout):
        delay = 0.0005
        while True:
            states = [_stat(pid) for pid in members]
            if all(stat is None or stat[0] in _SETTLED for stat in states):
                break
            await anyio.sleep(delay)  # a SIGSTOP lands at the member's next return to user
            delay = min(delay * 2, 0.02)
    return members


def _reset_connections(pgid: int, members: list[int]) -> int:
    """A reset for each TCP connection of the (stopped) ``members`` of group ``pgid`` that
    holds bytes on their way; how many."""
    reset: set[str] = set()  # one socket may be open in several members (inherited)
    for pid in members:
        try:
            links = {fd: os.readlink(f"/proc/{pid}/fd/{fd}")
                     for fd in os.listdir(f"/proc/{pid}/fd")}
        except OSError as exc:
            if exc.errno in (errno.ENOENT, errno.ESRCH):  # gone
                continue
            # not ours to look at (a process that made itself non-dumpable, a security
            # policy): nor to borrow from
            _log.warning("process_connections_unreachable", pgid=pgid, pid=pid,
                         error=os.strerror(exc.errno or 0))
            return len(reset)
        sockets = {int(fd): link for fd, link in links.items()
                   if link.startswith("socket:") and link not in reset}
        if not sockets:
            continue
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:  # gone meanwhile
            continue
        try:
            stat = _stat(pid)
            if stat is None or stat[1] != pgid:  # the number taken by another process since
                continue
            for fd, link in sockets.items():
                try:
                    borrowed = _borrow(pidfd, fd)
                except OSError as exc:
                    if exc.errno in (errno.EBADF, errno.ESRCH):  # closed, or the member died
                        continue
                    _log.warning("process_connections_unreachable", pgid=pgid, pid=pid,
                                 error=os.strerror(exc.errno or 0))
                    return len(reset)
                with borrowed:
                    if (borrowed.family in (socket.AF_INET, socket.AF_INET6)
                            and borrowed.type == socket.SOCK_STREAM
                            and reset_if_unacknowledged(borrowed)):
                        reset.add(link)
        finally:
            os.close(pidfd)
    return len(reset)


_libc: ctypes.CDLL | None = None


def _borrow(pidfd: int, fd: int) -> socket.socket:
    """A copy of file descriptor ``fd`` of the process behind ``pidfd``, as a socket."""
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    copy = int(_libc.syscall(_SYS_PIDFD_GETFD, pidfd, fd, 0))
    if copy < 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))
    try:
        return socket.socket(fileno=copy)
    except OSError:
        os.close(copy)
        raise
