"""Aborting a connection so that what is still on its way is dropped, not delivered late.

A TCP connection closed while bytes written to it are not yet acknowledged by the peer
(the network stalled, the service not reading) leaves them to the kernel, which goes on
sending them after the close, and then ends the stream: a request aborted by a cancel, a
step's timeout or a lost lease reaches the service complete, seconds or minutes after the
attempt that sent it was gone. A close with ``SO_LINGER`` on for 0 seconds sends a reset
instead and drops them. Bytes the peer's kernel already acknowledged are beyond reach; a
request wholly acknowledged before the abort is the service's to act on.

:func:`reset_if_unacknowledged` is the worker's HTTP transport's close (``durable/_pool.py``).
:func:`abort_process_group` does the same to the connections of a subprocess (``git push``
through ``git-remote-https`` or ``ssh``, ``psql``, a cloud CLI) when an activity running it is
cancelled: SIGKILL alone closes the dead process's sockets like any close, and a push whose
last bytes were still in the kernel's send queue lands after the cancel.

Linux only (``SIOCOUTQ``, ``/proc``, ``pidfd_getfd``); elsewhere a plain close and a plain
SIGKILL.
"""

from __future__ import annotations

import ctypes
import errno
import os
import signal
import socket
import struct
import sys
from collections.abc import Iterator

import anyio

from ._logging import get_logger

__all__ = ["abort_process_group", "reset_if_unacknowledged", "unacknowledged"]

try:
    import fcntl
    import termios

    _OUTQ: int | None = termios.TIOCOUTQ  # SIOCOUTQ on a TCP socket (Linux)
except (ImportError, AttributeError):  # pragma: no cover - not Linux
    _OUTQ = None

_RESET = struct.pack("ii", 1, 0)
"""SO_LINGER on, for 0 s: close() sends a reset and drops what is still queued."""

_SYS_PIDFD_GETFD = 438
"""``pidfd_getfd(2)`` (Linux 5.6), the same number on every architecture."""

_SETTLED = frozenset(b"TtZX")
"""``/proc/<pid>/stat`` states of a process that writes nothing more: stopped, traced,
dead."""

_log = get_logger("durable.process")


def unacknowledged(sock: socket.socket) -> int:
    """Bytes written to ``sock`` that its peer has not acknowledged (unsent or in flight);
    0 where the kernel cannot tell (not Linux, a closed socket)."""
    if _OUTQ is None:
        return 0
    try:
        return int(struct.unpack("i", fcntl.ioctl(sock.fileno(), _OUTQ, b"\0" * 4))[0])
    except (OSError, ValueError):
        return 0


def reset_if_unacknowledged(sock: socket.socket | None) -> bool:
    """Called just before a connection closes: makes the close a reset if the peer has not
    acknowledged all that was written. A close with nothing outstanding stays a plain one
    (a kept-alive connection closed at its expiry ends with a FIN). True if it will reset."""
    if sock is None or not unacknowledged(sock):
        return False
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET)
    except OSError:  # already closed or reset: nothing queued to drop
        return False
    return True


async def abort_process_group(pgid: int, *, settle_timeout: float = 0.5) -> int:
    """SIGKILL process group ``pgid``, and make every TCP connection of its processes that
    holds unacknowledged bytes close with a reset when they die. Returns how many did.

    The group is stopped first (SIGSTOP), so that nothing more is written while its
    connections are looked at (each member is awaited in a stopped state, at most
    ``settle_timeout`` seconds in all, shielded from cancellation); each member's sockets are
    borrowed with ``pidfd_getfd`` (which needs the right to ptrace it: a child of this
    process's user, under the default Yama policy too), given :func:`reset_if_unacknowledged`,
    and the borrowed copies closed. The SIGKILL is sent whatever happened before it. Where
    the sockets cannot be borrowed (not Linux, a kernel before 5.6, ptrace forbidden) the
    kill is a plain one, and ``process_connections_unreachable`` is logged with the reason.
    """
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
    reset: set[str] = set()  # one socket may be open in several members (inherited)
    for pid in members:
        try:
            links = {fd: os.readlink(f"/proc/{pid}/fd/{fd}")
                     for fd in os.listdir(f"/proc/{pid}/fd")}
        except OSError:  # gone, or not ours to look at
            continue
        sockets = {int(fd): link for fd, link in links.items()
                   if link.startswith("socket:") and link not in reset}
        if not sockets:
            continue
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:  # gone meanwhile
            continue
        stat = _stat(pid)
        if stat is None or stat[1] != pgid:  # the number taken by another process since
            os.close(pidfd)
            continue
        try:
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
