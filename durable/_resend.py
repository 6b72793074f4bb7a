"""A write whose answer was lost: sent again, or read back, never done twice.

A statement that gets no answer (the connection lost after it was sent) may have committed
all the same: left there, a caller who tried again would do it twice (a run queued twice, a
signal a later ``wait_for`` takes as a second one) or be told it could not (a cancel of a
cancelled run). :func:`answered` is the one mechanism for the client's writes and
retention's batches (docs/design.md, *An answer lost*).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from ._errors import NotSentError, StoreError, StoreUnavailableError
from ._logging import Logger

T = TypeVar("T")


async def answered(send: Callable[[], Awaitable[T]], again: Callable[[], Awaitable[T]],
                   log: Logger, event: str, what: str, doubt: str, **fields: Any) -> T:
    """``send()``, a write; if it gets no answer, ``again()``, which reads it back, or
    sends it once more where that is idempotent (by a run's or a signal's id, by a
    schedule's name, by a prune's conditions), and says how things stand; the first
    silence is logged as ``event`` with ``fields``. If ``again`` gets no answer either:
    ``"{what} got no answer (...): {doubt}"``. Nothing is sent again after
    :class:`NotSentError` (nothing was)."""
    try:
        return await send()
    except NotSentError:
        raise
    except StoreUnavailableError as exc:
        log.warning(event, error=str(exc), **fields)
        try:
            return await again()
        except StoreError as lost:
            raise StoreUnavailableError(f"{what} got no answer ({lost}): {doubt}") from lost
