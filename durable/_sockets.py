"""Aborting a connection so that what is still on its way is dropped, not delivered late.

A TCP connection closed while bytes written to it are not yet acknowledged by the peer
(the network stalled, the service not reading) leaves them to the kernel, which goes on
sending them after the close, and then ends the stream: a request aborted by a cancel, a
step's timeout or a lost lease reaches the service complete, seconds or minutes after the
attempt that sent it was gone. A close with ``SO_LINGER`` on for 0 seconds sends a reset
instead and drops them. Bytes the peer's kernel already acknowledged are beyond reach; a
request wholly acknowledged before the abort is the service's to act on.

:func:`reset_if_unacknowledged` is the worker's HTTP transport's close (``durable/_pool.py``),
and is applied to a killed subprocess's connections too (``durable/_processes.py``). Linux
only (``SIOCOUTQ``); elsewhere a plain close.
"""

from __future__ import annotations

import socket
import struct

__all__ = ["reset_if_unacknowledged", "unacknowledged"]

try:
    import fcntl
    import termios

    _OUTQ: int | None = termios.TIOCOUTQ  # SIOCOUTQ on a TCP socket (Linux)
except (ImportError, AttributeError):  # pragma: no cover - not Linux
    _OUTQ = None

_RESET = struct.pack("ii", 1, 0)
"""SO_LINGER on, for 0 s: close() sends a reset and drops what is still queued."""


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
