"""Which ``Host`` a server answers: the console's and the metrics' defence against DNS
rebinding (docs/console.md, *No page for another site's name*).

A site the operator visits can make its own name resolve to 127.0.0.1, or to an address of
the operator's network; the browser then treats a server there as that site, and the
site's scripts read its pages. Their requests carry the site's name in ``Host``. The
console answers only an address, ``localhost`` (and ``*.localhost``: RFC 6761, always
loopback) or a name it was told of, on every address it serves (``*`` among the names:
any). The metrics page keeps that rule on loopback only: a scraper names its targets as it
likes, and the page holds counts, not runs.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Collection
from urllib.parse import urlsplit


def loopback(address: str) -> bool:
    """Whether ``address`` (a socket's) is a loopback address: 127.0.0.0/8, ``::1``."""
    try:
        ip = ipaddress.ip_address(address.strip("[]"))
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)
    return ip.is_loopback or bool(mapped and mapped.is_loopback)


def rebindable(name: str) -> bool:
    """Whether ``name`` (a ``Host`` header's host) could be another site's name resolving
    to this machine: any DNS name but ``localhost`` and its subdomains. An address
    (``127.0.0.1``, ``[::1]``, ``0.0.0.0``) names no site."""
    name = name.strip("[]").lower().rstrip(".")
    if name == "localhost" or name.endswith(".localhost"):
        return False
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return True
    return False


def foreign_name(local_address: str, host: str, names: Collection[str] = (),
                 *, anywhere: bool = False) -> bool:
    """Whether a request that reached ``local_address`` with the ``Host`` header ``host``
    is to be refused: it names a host that is neither an address, ``localhost``, nor one
    of ``names`` (the host of the server's configured URL, names it was told to answer;
    ``*``: any), and it reached loopback, or any address when ``anywhere``."""
    if not anywhere and not loopback(local_address):
        return False
    if "*" in names:
        return False
    name = (urlsplit(f"//{host}").hostname or "").rstrip(".")
    return rebindable(name) and name not in {n.lower().rstrip(".") for n in names}
