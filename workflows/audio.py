"""Batch audio generation: one job, many paid text-to-speech items, none billed twice.

The crash-wedge incident guarded such a job with a status flag and no lease: a SIGKILL left
it "generating" forever. Here the job is a run (leased, recovered when its worker dies) and
each item a journaled step with its own idempotency key.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import anyio

import durable
from activities import steps
from durable._progress import states_by_key

from ._outcome import collapse

__all__ = ["BatchIncompleteError", "ItemState", "batch", "item_states"]

ItemState = Literal["pending", "running", "done", "error", "in_doubt"]


class BatchIncompleteError(Exception):
    """Some items failed; a replay regenerates only those."""


@durable.workflow("audio.batch")
async def batch(ctx: durable.WorkflowContext, job: str, voice: str, texts: list[str],
                concurrency: int = 4) -> dict[str, Any]:
    """Generate one audio file per text, ``concurrency`` TTS calls at a time.

    Start it keyed by the job, so a double click cannot start a second generation::

        await client.start("audio.batch", "job-7", "voice-1", texts, 4,
                           id="audio-job-7", key="job-7")

    Each item is the step ``item-<i>`` (explicit keys: tasks start in no fixed order), so
    its state (pending, done, error) is in the journal. A failed item does not stop the
    others; if any failed the run fails naming them, and a replay regenerates only the
    items that are not done. A worker killed mid-way leaves its in-flight items in doubt;
    the attempt that resumes the run sends them again with the same idempotency key, so the
    service answers from its record and no item is ever billed twice.
    """
    if concurrency < 1:
        raise ValueError("concurrency must be at least 1")
    await steps.check_config(ctx, ["tts"])
    await ctx.items(len(texts))  # item i is the step item-<i>: progress for show --follow
    limiter = anyio.CapacityLimiter(concurrency)
    results: dict[int, dict[str, Any]] = {}
    errors: dict[int, str] = {}

    async def generate(item: int, text: str) -> None:
        async with limiter:
            try:
                results[item] = await ctx.step(steps.synthesize, job, item, voice, text,
                                               key=f"item-{item}")
            except durable.ActivityError as exc:
                errors[item] = str(exc)

    try:
        async with anyio.create_task_group() as tg:
            for item, text in enumerate(texts):
                tg.start_soon(generate, item, text)
    except BaseExceptionGroup as group:
        raise collapse(group) from None
    if errors:
        raise BatchIncompleteError(
            f"{len(errors)} of {len(texts)} items failed; a replay regenerates only these: "
            + "; ".join(f"item {i}: {errors[i]}" for i in sorted(errors)))
    ordered = [results[i] for i in range(len(texts))]
    return {"job": job, "items": len(texts),
            "replayed": sum(1 for r in ordered if r["replayed"]),
            "files": [r["path"] for r in ordered]}


def item_states(entries: Sequence[durable.JournalEntry], count: int,
                run: durable.Run | None = None) -> dict[int, ItemState]:
    """Each item's state, read from a batch run's journal (for a progress screen).

    The engine's judgement (what ``show --follow`` and ``show --json`` count as progress),
    named as this screen names them. An item started by an attempt that is over, with no
    outcome, is ``in_doubt``; without ``run``, the latest attempt in the journal is taken
    to be the one running.
    """
    states = states_by_key(entries, [f"item-{i}" for i in range(count)], run)
    return {i: _NAMES[states[f"item-{i}"]] for i in range(count)}


_NAMES: dict[str, ItemState] = {"pending": "pending", "in_flight": "running", "done": "done",
                                "failed": "error", "in_doubt": "in_doubt"}
