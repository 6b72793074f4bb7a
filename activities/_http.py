"""The one place where the clients talk HTTP and translate httpx's failures."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

import attrs
import httpx

from .errors import (
    NotFoundError,
    RetryLaterError,
    ServiceError,
    ServiceUnreachableError,
    StaleFencingTokenError,
    parse_retry_after,
)
from .outcomes import DeleteOutcome

IDEMPOTENCY_KEY_HEADER = "Idempotency-Key"
STALE_FENCING_TOKEN = "stale fencing token"
_DETAIL_LIMIT = 300
_SHORTEST_SECRET = 4
"""A shorter "credential" is not blanked out of messages (it would blank ordinary words)."""


def segment(value: str) -> str:
    """One URL path segment, percent-encoded ("/" included)."""
    if not value:
        raise ValueError("empty path segment")
    return quote(value, safe="")


def _strip_slash(url: str) -> str:
    return str(url).rstrip("/")


@attrs.frozen
class ApiTransport:
    """Sends authenticated requests through an injected ``httpx.AsyncClient``.

    The client is not owned: the caller (the engine's fenced per-attempt client, a test)
    opens and closes it, and sets its timeouts and default headers.
    """

    http: httpx.AsyncClient
    base_url: str = attrs.field(converter=_strip_slash)
    token: str = attrs.field(repr=False)

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        json_body: Any = None,
        headers: Mapping[str, str] | None = None,
        accept: str = "application/json",
    ) -> httpx.Response:
        """Send a request; transport failures become :class:`ServiceUnreachableError`.

        HTTP error statuses are returned, not raised: see :func:`raise_for_status`.
        """
        url = self.base_url + path
        all_headers = {"Authorization": f"Bearer {self.token}", "Accept": accept}
        all_headers.update(headers or {})
        try:
            return await self.http.request(
                method, url, params=params, json=json_body, headers=all_headers
            )
        except httpx.TransportError as exc:
            # ctx.http already named the target in exc; this error names method and URL
            # itself, so it takes the driver's own message (exc's cause) to say it once
            cause = exc.__cause__ if isinstance(exc.__cause__, httpx.TransportError) else exc
            detail = type(exc).__name__
            if isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout)):
                detail += ": cannot connect"
            if str(cause):
                detail += f": {cause}"
            raise ServiceUnreachableError(None, method, url, detail) from exc


def without_credentials(text: str, request: httpx.Request) -> str:
    """``text`` with the credential ``request`` carried (its Authorization value) blanked:
    a service may quote the token it refused, and an error's text is journaled, logged,
    shown and sent on in failure reports."""
    scheme, _, credential = request.headers.get("Authorization", "").partition(" ")
    for secret in (credential.strip(), scheme.strip()):
        if len(secret) >= _SHORTEST_SECRET and secret.lower() not in ("bearer", "basic"):
            text = text.replace(secret, "***")
    return text


def error_detail(response: httpx.Response) -> str:
    """A short message from an error body (Coolify, Bitbucket, ElevenLabs shapes), without
    the request's credential (:func:`without_credentials`)."""
    return without_credentials(_error_text(response), response.request)[:_DETAIL_LIMIT]


def _error_text(response: httpx.Response) -> str:
    try:
        data = response.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        return response.text
    message: Any = data
    if isinstance(data, dict):
        for key in ("message", "error", "detail"):
            if key in data:
                message = data[key]
                break
        if isinstance(message, dict):
            message = message.get("message", message)
    text = message if isinstance(message, str) else json.dumps(message)
    return text


def is_stale_fencing_refusal(response: httpx.Response) -> bool:
    if response.status_code != 409:
        return False
    try:
        data = response.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        return False
    return isinstance(data, dict) and data.get("error") == STALE_FENCING_TOKEN


def status_error(response: httpx.Response) -> ServiceError:
    """The exception for a non-2xx response."""
    status = response.status_code
    method, url = response.request.method, str(response.request.url)
    detail = error_detail(response)
    if is_stale_fencing_refusal(response):
        return StaleFencingTokenError(status, method, url, detail)
    if status in (429, 503):
        retry_after = parse_retry_after(response.headers.get("Retry-After"))
        return RetryLaterError(status, method, url, detail, retry_after)
    if status == 404:
        return NotFoundError(status, method, url, detail)
    return ServiceError(status, method, url, detail)


def raise_for_status(response: httpx.Response) -> None:
    if not response.is_success:
        raise status_error(response)


async def delete(
    transport: ApiTransport, path: str, *, params: Mapping[str, str] | None = None
) -> DeleteOutcome:
    """DELETE where 404 means "already gone"; any other failure raises."""
    response = await transport.request("DELETE", path, params=params)
    if response.status_code == 404:
        return DeleteOutcome.ALREADY_GONE
    raise_for_status(response)
    return DeleteOutcome.DELETED
