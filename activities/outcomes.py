"""Outcome values shared by the clients.

They are string enums, so a journal can store them as text and read them back with
``DeleteOutcome(text)``.
"""

from __future__ import annotations

import enum

__all__ = ["DeleteOutcome"]


class DeleteOutcome(enum.StrEnum):
    """What a delete found: both mean the resource is gone now."""

    DELETED = "deleted"
    """This call deleted it."""
    ALREADY_GONE = "already_gone"
    """404: it was gone before this call (an earlier attempt, or someone else)."""
