"""Client for a paid text-to-speech API shaped after ElevenLabs.

Every call costs money, so :meth:`TtsClient.synthesize` requires an idempotency key:
retrying with the same key returns the audio already paid for instead of a second bill.
Derive the key from what must happen once (job and item), never from the attempt.
"""

from __future__ import annotations

import attrs
import httpx

from ._http import IDEMPOTENCY_KEY_HEADER, ApiTransport, raise_for_status, segment

__all__ = ["Speech", "TtsClient"]

REPLAYED_HEADER = "Idempotent-Replayed"


@attrs.frozen
class Speech:
    audio: bytes = attrs.field(repr=lambda audio: f"<{len(audio)} bytes>")
    content_type: str
    replayed: bool
    """True when the service answered from its idempotency record (not billed again)."""
    request_id: str | None = None
    character_cost: int | None = None


class TtsClient:
    """``POST /v1/text-to-speech/{voice_id}``. ``http`` is injected and not closed here."""

    def __init__(self, http: httpx.AsyncClient, base_url: str, token: str) -> None:
        self._api = ApiTransport(http, base_url, token)

    def __repr__(self) -> str:
        return f"TtsClient(base_url={self._api.base_url!r})"

    async def synthesize(
        self,
        voice_id: str,
        text: str,
        *,
        idempotency_key: str,
        model_id: str | None = None,
        output_format: str | None = None,
    ) -> Speech:
        """Audio for ``text``; raises ``ServiceError`` (``RetryLaterError`` on 429/503)."""
        if not idempotency_key:
            raise ValueError("a paid call needs an idempotency key")
        body: dict[str, str] = {"text": text}
        if model_id is not None:
            body["model_id"] = model_id
        params = {"output_format": output_format} if output_format else None
        response = await self._api.request(
            "POST",
            f"/v1/text-to-speech/{segment(voice_id)}",
            params=params,
            json_body=body,
            headers={IDEMPOTENCY_KEY_HEADER: idempotency_key},
            accept="audio/mpeg",
        )
        raise_for_status(response)
        cost = response.headers.get("character-cost")
        return Speech(
            audio=response.content,
            content_type=response.headers.get("content-type", "audio/mpeg"),
            replayed=response.headers.get(REPLAYED_HEADER, "").lower() == "true",
            request_id=response.headers.get("request-id"),
            character_cost=int(cost) if cost and cost.isdigit() else None,
        )
