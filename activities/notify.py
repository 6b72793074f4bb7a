"""Client for a chat-style webhook notifier (``POST /hooks/{name}``).

Webhooks like this do not deduplicate: sending twice shows the message twice. Pass an
``idempotency_key`` so that a receiver which does deduplicate, and the test ledger, can
tell a retry from a second message.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import httpx

from ._http import IDEMPOTENCY_KEY_HEADER, ApiTransport, raise_for_status, segment

__all__ = ["Notifier"]


class Notifier:
    """Posts JSON messages to named hooks. ``http`` is injected and not closed here."""

    def __init__(self, http: httpx.AsyncClient, base_url: str, token: str) -> None:
        self._api = ApiTransport(http, base_url, token)

    def __repr__(self) -> str:
        return f"Notifier(base_url={self._api.base_url!r})"

    async def send(
        self, hook: str, message: Mapping[str, Any], *, idempotency_key: str | None = None
    ) -> None:
        """Deliver ``message``; raises ``ServiceError`` unless the hook answered 2xx."""
        headers = {IDEMPOTENCY_KEY_HEADER: idempotency_key} if idempotency_key else None
        response = await self._api.request(
            "POST", f"/hooks/{segment(hook)}", json_body=dict(message), headers=headers
        )
        raise_for_status(response)
