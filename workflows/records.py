"""The application's table of slots, kept in the engine's fenced records (namespace ``slot``).

Workflows read a slot with ``ctx.get_record`` (journaled: a replay sees the same value) and
write it only with ``ctx.set_records``, which commits the record and its journal entry in one
transaction, only if the attempt still holds its lease and epoch: a superseded attempt can
never mark a slot vacant or retired. Outside a run, :func:`seed_slot` writes unfenced (for
provisioning and tests) and :func:`read_slot` reads.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import attrs

import durable

__all__ = ["NAMESPACE", "Slot", "SlotError", "load_slot", "read_slot", "save_slot", "seed_slot"]

NAMESPACE = "slot"
Occupancy = Literal["occupied", "vacant"]
Lifecycle = Literal["active", "retired"]


class SlotError(Exception):
    """Bad input: an unknown slot, or a slot in a state the operation does not apply to."""


@attrs.frozen
class Slot:
    """One slot: a preview environment (an app, a database, a repository) lent to a user."""

    name: str
    occupancy: Occupancy = "occupied"
    lifecycle: Lifecycle = "active"
    app: str | None = None
    """PaaS application uuid."""
    project: str | None = None
    """PaaS project uuid."""
    database: str | None = None
    """PaaS database uuid."""
    repository: str | None = None
    """Git host repository, ``workspace/slug``."""
    template: str | None = None
    """Repository whose main branch a reset force-pushes, ``workspace/slug``."""
    state_reason: str | None = None
    """Why the slot is in its state: the recovery report of a failed operation, say."""
    updated_by: str | None = None
    """The run that wrote this version."""

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Slot:
        fields = {f.name for f in attrs.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in fields})

    def to_json(self) -> dict[str, Any]:
        return attrs.asdict(self)

    def evolve(self, **changes: Any) -> Slot:
        return attrs.evolve(self, **changes)


async def load_slot(ctx: durable.WorkflowContext, name: str) -> Slot:
    """Read a slot inside a run (journaled); an unknown slot is a :class:`SlotError`."""
    value = await ctx.get_record(NAMESPACE, name)
    if not isinstance(value, dict):
        raise SlotError(f"unknown slot {name!r}: no such record; nothing was touched")
    return Slot.from_json(value)


async def save_slot(ctx: durable.WorkflowContext, slot: Slot, summary: str, *,
                    key: str | None = None) -> None:
    """Write a slot as one fenced step, atomic with its journal entry."""
    value = slot.evolve(updated_by=ctx.workflow_id).to_json()
    await ctx.set_records({(NAMESPACE, slot.name): value}, summary=summary, key=key)


async def seed_slot(client: durable.Client, slot: Slot) -> None:
    """Create or replace a slot outside any run (unfenced)."""
    await client.store.put_records(None, [(NAMESPACE, slot.name, slot.to_json())])


async def read_slot(client: durable.Client, name: str) -> Slot | None:
    record = await client.store.get_record(NAMESPACE, name)
    return None if record is None or not isinstance(record.value, dict) \
        else Slot.from_json(record.value)
