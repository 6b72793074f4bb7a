"""The torture run's own workflow: durable waiting under the chaos (``scripts/torture.py``).

The operations in ``workflows/`` never sleep or wait for a signal with a timeout, so the
torture run starts this one beside them; its workers import it (``--import
scripts._torture_flows``). Each step is a paid TTS item (``tts.synthesize``, its own
idempotency key), so the services' ledger says when each one was sent and by which attempt.
"""

from __future__ import annotations

from typing import Any

import durable
from activities import steps

__all__ = ["POKE", "nap"]

POKE = "poke"
"""The signal a nap run waits for after its sleep."""


@durable.workflow("torture.nap")
async def nap(ctx: durable.WorkflowContext, job: str, voice: str, seconds: float,
              timeout: float) -> dict[str, Any]:
    """An item, a durable sleep of ``seconds``, an item, a wait of up to ``timeout`` for the
    signal ``poke``, and an item that says whether it came.

    A sleep or a wait of the worker's wait threshold (2 s) or more releases the run (no
    lease held); a shorter one stays in the attempt: the torture run draws both.
    """
    await ctx.step(steps.synthesize, job, 0, voice, f"{job}: before the nap")
    await ctx.sleep(seconds)
    await ctx.step(steps.synthesize, job, 1, voice, f"{job}: after the nap")
    try:
        payload = await ctx.wait_for(POKE, timeout=timeout)
        poked = True
    except durable.SignalTimeout:
        payload, poked = None, False
    await ctx.step(steps.synthesize, job, 2, voice,
                   f"{job}: {'poked' if poked else 'not poked'}")
    return {"job": job, "poked": poked, "payload": payload}
