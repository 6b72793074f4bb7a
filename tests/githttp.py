"""git's smart HTTP protocol on loopback, through the real ``git http-backend``.

A small HTTP/1.1 server (a thread per connection) that hands each request to
``git http-backend`` as CGI, so that ``git clone``/``git push`` run over HTTP as against a
git host. A push can be *held*: the server reads its request's head and then nothing more
until the test releases it, with the kernel's least receive buffer, so that the request
lies in the pushing side's kernel (unsent, unacknowledged), as with a remote slow to read.
What became of each held push is kept: ``complete`` (the whole request arrived and was
handed to git, which updated the ref), ``reset``, or ``end of stream after N of M bytes``.
"""

from __future__ import annotations

import os
import socket
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import attrs


def git(*args: str, cwd: Path) -> str:
    """Run git (with an identity) and answer its output; raises if it fails."""
    identity = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@localhost",
                "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@localhost"}
    return subprocess.run(["git", *args], cwd=cwd, env={**os.environ, **identity},
                          check=True, capture_output=True, text=True).stdout.strip()


def commit(work: Path, files: dict[str, str | bytes], message: str) -> str:
    """Write ``files`` into the working copy ``work`` (made if new) and commit them; the
    commit's id."""
    if not (work / ".git").exists():
        git("init", "--quiet", "-b", "main", str(work), cwd=work.parent)
    for name, content in files.items():
        if isinstance(content, bytes):
            (work / name).write_bytes(content)
        else:
            (work / name).write_text(content)
    git("add", "--all", cwd=work)
    git("commit", "--quiet", "-m", message, cwd=work)
    return git("rev-parse", "HEAD", cwd=work)


@attrs.frozen
class HeldPush:
    peer: tuple[str, int]
    """The pushing side's address of the connection."""
    length: int
    """The request body's length (its Content-Length)."""


class GitHttpServer:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1)  # the least
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen()
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.hold_pushes = False
        self.held: list[HeldPush] = []
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        """(method, target, headers with lower-case names) of each request, in order."""
        self.outcomes: list[str] = []
        self.release = threading.Event()
        self._lock = threading.Lock()
        self._connections: list[socket.socket] = []

    def repository(self, name: str, branch: str = "main") -> str:
        """A new bare repository ``name`` that accepts pushes; its URL."""
        path = self.root / name
        subprocess.run(["git", "init", "--quiet", "--bare", "-b", branch, str(path)],
                       check=True)
        subprocess.run(["git", "-C", str(path), "config", "http.receivepack", "true"],
                       check=True)
        return f"{self.url}/{name}"

    def serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:  # closed: the server stops
                return
            with self._lock:
                self._connections.append(conn)
            threading.Thread(target=self._connection, args=(conn,), daemon=True).start()

    def close(self) -> None:
        self.release.set()
        self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()
        with self._lock:
            for conn in self._connections:
                conn.close()

    def _connection(self, conn: socket.socket) -> None:
        peer = conn.getpeername()
        try:
            while self._request(conn, peer):
                pass
        except OSError:
            pass
        finally:
            conn.close()

    def _request(self, conn: socket.socket, peer: tuple[str, int]) -> bool:
        head = b""
        while not head.endswith(b"\r\n\r\n"):  # a byte at a time: the body stays unread
            byte = conn.recv(1)
            if not byte:
                return False
            head += byte
        request_line, *lines = head.decode("latin-1").split("\r\n")
        method, target, _ = request_line.split(" ", 2)
        headers = {}
        for line in lines:
            if ":" in line:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
        self.requests.append((method, target, headers))
        length = int(headers.get("content-length", "0"))
        if headers.get("expect", "").lower() == "100-continue":
            conn.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
        push = method == "POST" and target.endswith("/git-receive-pack")
        if push and self.hold_pushes:
            self.held.append(HeldPush(peer, length))
            self.release.wait(60)
        body = bytearray()
        try:
            while len(body) < length:
                chunk = conn.recv(length - len(body))
                if not chunk:
                    break
                body += chunk
        except ConnectionResetError:
            if push:
                self.outcomes.append("reset")
            return False
        if len(body) < length:
            if push:
                self.outcomes.append(f"end of stream after {len(body)} of {length} bytes")
            return False
        status, response_headers, content = self._backend(method, target, headers, bytes(body))
        if push:
            self.outcomes.append("complete")
        conn.sendall(f"HTTP/1.1 {status}\r\n".encode() + response_headers
                     + f"Content-Length: {len(content)}\r\n\r\n".encode() + content)
        return True

    def _backend(self, method: str, target: str, headers: dict[str, str], body: bytes
                 ) -> tuple[str, bytes, bytes]:
        path, _, query = target.partition("?")
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "GIT_PROJECT_ROOT": str(self.root), "GIT_HTTP_EXPORT_ALL": "1",
            "REQUEST_METHOD": method, "PATH_INFO": path, "QUERY_STRING": query,
            "CONTENT_TYPE": headers.get("content-type", ""),
            "CONTENT_LENGTH": str(len(body)), "REMOTE_ADDR": "127.0.0.1",
            "GIT_PROTOCOL": headers.get("git-protocol", ""),
            "HTTP_CONTENT_ENCODING": headers.get("content-encoding", ""),
        }
        out = subprocess.run(["git", "http-backend"], input=body, env=env,
                             capture_output=True, check=False, timeout=60).stdout
        separator = b"\r\n\r\n" if b"\r\n\r\n" in out else b"\n\n"
        cgi_head, _, content = out.partition(separator)
        status, kept = "200 OK", b""
        for line in cgi_head.decode("latin-1").splitlines():
            name, _, value = line.partition(":")
            if name.lower() == "status":
                status = value.strip()
            elif name.lower() != "content-length" and line:
                kept += f"{line}\r\n".encode("latin-1")
        return status, kept, content


@contextmanager
def git_http_server(root: Path) -> Iterator[GitHttpServer]:
    root.mkdir(parents=True, exist_ok=True)
    server = GitHttpServer(root)
    thread = threading.Thread(target=server.serve, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.close()
        thread.join(10)
