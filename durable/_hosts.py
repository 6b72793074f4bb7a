"""Which ``Host`` a server on loopback answers: the console's and the metrics' defence against
DNS rebinding (docs/console.md, *No page for another site's name*).

A site the operator visits can make its own name resolve to 127.0.0.1; the browser then
treats a server on loopback as that site, and the site's scripts read its pages. Their
requests carry the site's name in ``Host``. A server on loopback answers only an address,
``localhost`` (and ``*.localhost``: RFC 6761, always loopback) or a name it was told of; on
another address it was exposed on purpose and answers any name.
"""

from __future__ import annotations

import ipaddress
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


def foreign_name(local_address: str, host: str, named: str | None = None) -> bool:
    """Whether a request that reached ``local_address`` with the ``Host`` header ``host``
    is to be refused: it reached loopback and names a host that is neither an address,
    ``localhost``, nor ``named`` (the host of the server's configured URL)."""
    if not loopback(local_address):
        return False
    name = (urlsplit(f"//{host}").hostname or "").rstrip(".")
    return rebindable(name) and name != (named or "").lower().rstrip(".")
