"""audio.batch: the crash-wedge incident. Paid items, bounded concurrency, never billed twice.

The incident's job stayed "generating" forever after a SIGKILL, and a double start meant
double billing. Here the job is a leased run that another worker resumes, and every item
carries an idempotency key that stays the same across tries and attempts.
"""

from __future__ import annotations

import os
import signal
from collections import Counter
from pathlib import Path

import pytest

import durable
from durable import RunState
from workflows.audio import item_states

from .helpers import poll, running_worker
from .ops import Ops, ops_fixture, worker_process  # noqa: F401

pytestmark = pytest.mark.anyio
VOICE_PATH = "/v1/text-to-speech/voice-1"
TEXTS = [f"Line {i}: the quick brown fox." for i in range(6)]


def billed_per_key(ops: Ops) -> Counter[str]:
    return Counter(e["idempotency_key"] for e in ops.services.ledger(path=VOICE_PATH)
                   if e["billed"])


async def test_a_failed_item_does_not_stop_the_others_and_a_replay_redoes_only_it(
        ops: Ops) -> None:
    ops.services.add_fault(VOICE_PATH, method="POST", status=400, times=1)
    failed = await ops.run("audio.batch", "job-1", "voice-1", TEXTS, 2, key="job-1",
                           id="audio-1")
    assert failed.state is RunState.FAILED
    assert failed.error is not None and "1 of 6 items failed" in failed.error
    states = item_states(await ops.client.journal("audio-1"), len(TEXTS))
    assert sorted(states.values()) == ["done"] * 5 + ["error"]
    assert sum(billed_per_key(ops).values()) == 5

    before = len(ops.services.ledger())
    await ops.client.replay("audio-1")
    async with running_worker(ops.client, durable.default_registry):
        done = await ops.client.wait("audio-1", timeout=30)
    assert done.state is RunState.COMPLETED, done.error
    assert len(ops.services.ledger()[before:]) == 1  # only the failed item was sent again
    billed = billed_per_key(ops)
    assert len(billed) == len(TEXTS) and set(billed.values()) == {1}
    assert all(Path(p).stat().st_size > 0 for p in done.result["files"])


async def test_no_item_is_billed_twice_across_a_sigkill_and_resume(ops: Ops) -> None:
    # the service bills, then takes a while to answer: a kill then loses a paid answer
    ops.services.add_fault(VOICE_PATH, method="POST", latency=0.4, phase="after")
    await ops.client.start("audio.batch", "job-2", "voice-1", TEXTS, 2, key="job-2",
                           id="audio-2")
    with worker_process(ops, "--lease", "1") as proc:
        paid_in_flight = await poll(lambda: [
            e for e in ops.services.ledger(path=VOICE_PATH)
            if e["billed"] and e["ended_at"] is None], timeout=20)
        os.killpg(proc.pid, signal.SIGKILL)  # no finally, no exit hook runs
        proc.wait(timeout=10)
    lost_key = paid_in_flight[0]["idempotency_key"]
    stuck = await ops.client.store.get_run("audio-2")
    assert stuck is not None and stuck.state is RunState.RUNNING  # held by a dead worker

    async with running_worker(ops.client, durable.default_registry, lease=1.0,
                              sweep_interval=0.05):
        done = await ops.client.wait("audio-2", timeout=30)

    assert done.state is RunState.COMPLETED, done.error
    billed = billed_per_key(ops)
    assert len(billed) == len(TEXTS) and set(billed.values()) == {1}  # each item once
    assert ops.services.state()["tts"]["billed_calls"] == len(TEXTS)
    calls = [e for e in ops.services.ledger(path=VOICE_PATH)
             if e["idempotency_key"] == lost_key]
    assert [e["billed"] for e in calls] == [True, False]  # resent, answered from the record
    assert calls[1]["fencing_token"] > calls[0]["fencing_token"]
    journal = await ops.client.journal("audio-2")
    doubted = {e.step_key for e in journal if e.kind is durable.EntryKind.STEP_IN_DOUBT}
    assert doubted and all(k.startswith("item-") for k in doubted)
    assert done.result["replayed"] >= 1
    assert len({Path(p).name for p in done.result["files"]}) == len(TEXTS)
