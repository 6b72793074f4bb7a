"""The README's main command: the demo runs every scenario, exits 0, leaves no process."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

from .conftest import ROOT, subprocess_env
from .ops import alive

EXPECTED = [
    "1. A reset that succeeds",
    "ok: one notification: reset_finished",
    "2. A reset whose force push hangs past its",
    "were killed, not left running in the background",
    "ok: slot-2 stays occupied; its state reason is the recovery report above",
    "done (not repeated by a replay): steps 1, 3, 4, 5, 6, 7, 8, 9, 10, 12, 13",
    "failed: step 11 git.force_push_with_lease after 1 try, error above",
    "3. A teardown where one delete fails, then a replay that finishes it",
    "ok: the replay sent only the delete that was left",
    "4. A promote refused because the target repository exists",
    "AlreadyExistsError: repository acme/shop already exists",
    "5. An audio batch whose worker is killed (SIGKILL) mid-way",
    "item 2: 46 bytes (not billed again",
    "ok: every item billed exactly once (8 billed calls for 8 items",
    "All five scenarios ended as expected",
]


def test_the_demo_runs_every_scenario() -> None:
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "scripts" / "demo.py")], cwd=ROOT, env=subprocess_env(),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
    text = output.decode(errors="replace")
    assert proc.returncode == 0, text[-4000:]
    for line in EXPECTED:
        assert line in text, f"missing {line!r} in:\n{text[-4000:]}"
    # the demo's workers and fake services ran in their own process groups: all gone
    pids = [int(p) for p in re.findall(r"\bpid (\d+)", text)]
    assert len(pids) >= 4  # the fake services, two workers and git's hook
    for pid in pids:
        assert not alive(pid), f"pid {pid} still running after the demo"


