"""Errors raised by the API clients, translated once from httpx at the boundary.

::

    ServiceError                   a call failed: status (None if no answer), method, url
     ├── NotFoundError             404 where "gone" is not an answer (reads, lists)
     ├── RetryLaterError           429 or 503; ``retry_after`` seconds from Retry-After
     ├── StaleFencingTokenError    409 "stale fencing token": a newer attempt holds the
     │                             resource; never retry with the same token
     └── ServiceUnreachableError   no HTTP answer: connect error, timeout, dropped
                                   connection. For a write, the outcome is unknown.

No error carries the API token: messages hold the method, the URL (userinfo removed) and
an excerpt of the response body. Errors pickle, so they can cross process boundaries.
Cancellation (``asyncio.CancelledError``, ``trio.Cancelled``) is never translated.
"""

from __future__ import annotations

import email.utils
import re
import time

import attrs

__all__ = [
    "NotFoundError",
    "RetryLaterError",
    "ServiceError",
    "ServiceUnreachableError",
    "StaleFencingTokenError",
    "parse_retry_after",
    "redact_url",
]

_USERINFO = re.compile(r"(?<=://)[^/@\s]+@")


def redact_url(url: str) -> str:
    """Drop ``user:password@`` from every URL in ``url``."""
    return _USERINFO.sub("***@", url)


@attrs.define(auto_exc=True, eq=False)
class ServiceError(Exception):
    """A call to an external service failed."""

    status: int | None
    method: str
    url: str = attrs.field(converter=redact_url)
    detail: str = ""

    def __str__(self) -> str:
        answer = "no answer" if self.status is None else f"HTTP {self.status}"
        text = f"{self.method} {self.url}: {answer}"
        return f"{text}: {self.detail}" if self.detail else text


@attrs.define(auto_exc=True, eq=False)
class NotFoundError(ServiceError):
    """404 from a call for which absence is not a normal outcome."""


@attrs.define(auto_exc=True, eq=False)
class RetryLaterError(ServiceError):
    """429 or 503: the service asks to be called again later."""

    retry_after: float | None = None

    def __str__(self) -> str:
        text = super().__str__()
        if self.retry_after is None:
            return text
        return f"{text} (retry after {self.retry_after:g}s)"


@attrs.define(auto_exc=True, eq=False)
class StaleFencingTokenError(ServiceError):
    """409: the service has seen a newer fencing token for this resource."""


@attrs.define(auto_exc=True, eq=False)
class ServiceUnreachableError(ServiceError):
    """No HTTP answer at all (connection refused or dropped, timeout)."""


def parse_retry_after(value: str | None, *, now: float | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` value (delay-seconds or an HTTP date)."""
    if value is None:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        if when.tzinfo is None:
            return None
        seconds = when.timestamp() - (time.time() if now is None else now)
    if seconds != seconds or seconds in (float("inf"), float("-inf")):
        return None
    return max(0.0, seconds)
