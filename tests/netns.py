"""Another host, of the tests' own: a network namespace joined to this one by a veth pair,
whose link can be cut: packets are then dropped, nothing is refused, which is what a dead
host or a cut network does to a TCP connection (a proxy cannot: its kernel acknowledges
what it is sent). Making one needs root (CAP_NET_ADMIN). Used by
``tests/test_postgres_partition.py``."""

from __future__ import annotations

import contextlib
import os
import secrets
import subprocess
from collections.abc import Callable, Iterator
from typing import NoReturn


class OtherHost:
    """The namespace ``name``, at ``peer``; this side of the link at ``address``."""

    def __init__(self, name: str, link: str, address: str, peer: str) -> None:
        self.name, self.link, self.address, self.peer = name, link, address, peer
        self.exec = ["ip", "netns", "exec", name]
        """The prefix of a command run on that host."""

    def cut(self) -> None:
        """Cut the link: from now on every packet between the hosts is dropped."""
        _ip("link", "set", self.link, "down")

    def heal(self) -> None:
        _ip("link", "set", self.link, "up")


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


@contextlib.contextmanager
def other_host(refused: Callable[[str], NoReturn]) -> Iterator[OtherHost]:
    """An :class:`OtherHost` for the block, then removed. If the namespace cannot be made
    (not root, no ``ip``), ``refused`` is called with why, and raises (a test's skip)."""
    tag = secrets.token_hex(3)
    name, link, peer_link = f"durable-{os.getpid()}-{tag}", f"dv{tag}a", f"dv{tag}b"
    third, fourth = int(tag[:2], 16), int(tag[2:4], 16) & 0xFC  # a /30 of 10.232.0.0/16
    address, peer = f"10.232.{third}.{fourth + 1}", f"10.232.{third}.{fourth + 2}"
    try:
        made = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True,
                              check=False)
    except FileNotFoundError:
        refused("no `ip` command (iproute2)")
    if made.returncode != 0:
        refused(made.stderr.strip() or f"ip netns add exited {made.returncode}")
    try:
        _ip("link", "add", link, "type", "veth", "peer", "name", peer_link, "netns", name)
        _ip("addr", "add", f"{address}/30", "dev", link)
        _ip("link", "set", link, "up")
        _ip("-n", name, "addr", "add", f"{peer}/30", "dev", peer_link)
        _ip("-n", name, "link", "set", peer_link, "up")
        _ip("-n", name, "link", "set", "lo", "up")
        yield OtherHost(name, link, address, peer)
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False)  # its veth end, and ours
