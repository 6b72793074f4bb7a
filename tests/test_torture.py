"""The torture run on a small budget: real worker processes under kills, freezes and faults.

``scripts/torture.py`` (docs/torture.md) runs the real workflows against the fake services
while it SIGKILLs, SIGSTOPs/SIGCONTs and SIGTERMs workers, injects 5xx, dropped and hung
requests, and races cancels and replays; then checks the guarantees from the services'
ledger and the journal. Here it runs for ~25 s with two workers and a fixed seed (a failing
seed replays: ``python scripts/torture.py --seed N``), and every check must pass. A second
test holds the script to its contract on bad input and checks that it leaves nothing behind.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from durable._types import EntryKind, JournalEntry
from tests.pg import postgres_server

from .conftest import ROOT, subprocess_env

__all__ = ["postgres_server"]  # the PostgreSQL fixture (tests/pg.py)

SCRIPT = ROOT / "scripts" / "torture.py"
SEED = int(os.environ.get("DURABLE_TORTURE_SEED", "20261201"))
BUDGET = os.environ.get("DURABLE_TORTURE_BUDGET", "25")


def torture(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=ROOT, env=subprocess_env(),
                          capture_output=True, text=True, timeout=timeout)


def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie counts as dead)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


@pytest.mark.parametrize("backend", ["sqlite", "postgres", "sqlite-disk-full",
                                     "postgres-disk-full"])
def test_a_small_torture_run_passes_every_check(backend: str, tmp_path: Path,
                                                request: pytest.FixtureRequest) -> None:
    if backend.startswith("postgres"):
        request.getfixturevalue("postgres_server")  # skips without a server
    report_file = tmp_path / "report.json"
    store, *disk_full = backend.split("-", 1)
    done = torture("--seed", str(SEED), "--budget", BUDGET, "--workers", "2", "--runs", "10",
                   "--backend", store, "--report", str(report_file),
                   *(["--disk-full"] if disk_full else []), timeout=float(BUDGET) + 90)
    if disk_full and done.returncode == 2 and "tmpfs of its own, and that was refused" in (
            done.stderr):
        pytest.skip(done.stderr.strip().splitlines()[-1])  # a tmpfs needs root
    assert done.stdout.startswith(f"torture: seed {SEED} (replay with --seed {SEED})"), done
    assert report_file.exists(), f"no report: {done.stdout}\n{done.stderr[-3000:]}"
    report = json.loads(report_file.read_text())
    failed = [c for c in report["checks"] if not c["ok"]]
    assert not failed, f"{done.stdout}\n{done.stderr[-3000:]}"
    assert done.returncode == 0, done
    applied = report["applied"]
    # the run did torture: workers were killed or shut down, and services faulted
    assert applied.get("SIGKILL", 0) + applied.get("SIGTERM", 0) > 0, applied
    assert sum(v for k, v in applied.items() if k.startswith("fault ")) > 0, applied
    gates = next(c["detail"] for c in report["checks"]
                 if c["check"] == "nothing deleted before its plan was approved")
    assert not gates.startswith("0 gated runs"), gates  # some runs waited for a decision
    # one fleet, both event loops (on trio, PostgreSQL's store runs on a loop thread)
    assert applied.get("worker starts on trio", 0) > 0, applied
    assert applied.get("worker starts on asyncio", 0) > 0, applied
    if backend == "postgres":  # the workers went through the proxy that loses answers
        assert {"PostgreSQL answers lost", "PostgreSQL statements lost"} <= set(applied)
    if disk_full:  # the database's own tmpfs was filled, and unmounted afterwards
        assert applied.get("disk full", 0) > 0 and report["disk_full"], applied
        assert "durable-torture-" not in Path("/proc/mounts").read_text()
    assert report["fires"] > 0  # the schedule fired through the chaos
    waits = next(c["detail"] for c in report["checks"]
                 if c["check"] == "every durable sleep and wait ended once, on time")
    assert report["runs"] == 15 and waits.startswith("5 nap runs: "), waits  # 10 + 5 naps
    assert sum(report["states"].values()) == 15 + report["fires"], report["states"]
    for check in report["checks"]:
        assert check["check"] in done.stdout
    assert report["pids"] and not [p for p in report["pids"] if alive(p)], "processes left"


def test_bad_arguments_are_one_line_and_exit_2() -> None:
    done = torture("--workers", "0", timeout=30)
    assert done.returncode == 2, done
    assert done.stdout == ""
    assert done.stderr.strip().splitlines()[-1].endswith(
        "--workers must be between 1 and 16, not 0"), done.stderr
    assert "Traceback" not in done.stderr



# -- the checks themselves: each one fails on the violation it names ------------------------------
def _checks() -> Any:
    from scripts import torture as t

    return t


def _journal(run_id: str, *rows: tuple[str, int, float, str | None, str | None, dict[str, Any]]
             ) -> list[JournalEntry]:
    return [JournalEntry(seq, run_id, epoch, EntryKind(kind), at, step_key=key, name=name,
                         data=data)
            for seq, (kind, epoch, at, key, name, data) in enumerate(rows, 1)]


def _request(run: str, key: str, token: int, at: float, *, scope: str = "key:s1",
             handled: bool = True, billed: bool = False) -> dict[str, Any]:
    return {"idempotency_key": f"{run}/{key}", "fencing_token": token, "fencing_scope": scope,
            "arrived_at": at, "ended_at": at + 0.01, "handled": handled, "refused": not handled,
            "billed": billed, "method": "DELETE", "path": "/api/v1/databases/db-s1"}


def test_the_overlap_check_fails_on_an_old_token_sent_after_a_newer_one() -> None:
    t = _checks()
    fine = [_request("a", "1:x", 1, 10.0), _request("a", "2:y", 2, 11.0),
            _request("b", "1:x", 3, 12.0)]
    assert t.check_overlap(fine)[1]
    late = [*fine, _request("a", "3:z", 2, 12.5, handled=False)]  # refused, but sent
    ok, detail = t.check_overlap(late)[1:]
    assert not ok and "token 2 sent a request 0.500s after token 3's first" in detail


def test_the_completed_step_check_fails_on_a_step_started_or_sent_again() -> None:
    t = _checks()
    journal = _journal("a", ("run_claimed", 1, 1.0, None, None, {}),
                       ("step_started", 1, 1.1, "1:x", "x", {}),
                       ("step_completed", 1, 1.2, "1:x", "x", {}),
                       ("run_claimed", 2, 5.0, None, None, {}))
    assert t.check_completed_once({"a": journal}, [_request("a", "1:x", 1, 1.1)])[1]
    ok, detail = t.check_completed_once({"a": journal}, [_request("a", "1:x", 2, 5.1)])[1:]
    assert not ok and "requests handled for it with token 2" in detail
    again = [*journal, *_journal("a", ("step_started", 2, 5.1, "1:x", "x", {}))]
    assert not t.check_completed_once({"a": again}, [])[1]


def test_the_in_doubt_check_fails_on_a_fail_step_sent_again_by_a_later_attempt() -> None:
    t = _checks()
    journal = _journal("a", ("run_claimed", 1, 1.0, None, None, {}),
                       ("step_started", 1, 1.1, "n", "notify.send", {}),
                       ("run_claimed", 2, 5.0, None, None, {}),
                       ("step_started", 2, 5.1, "n", "notify.send", {}))
    on_doubt = {"notify.send": "fail"}
    assert t.check_in_doubt({"a": journal}, [_request("a", "n", 1, 1.1)], on_doubt)[1]
    ok, detail = t.check_in_doubt({"a": journal}, [_request("a", "n", 2, 5.1)], on_doubt)[1:]
    assert not ok and "sent again with token 2" in detail
    assert t.check_in_doubt({"a": journal}, [_request("a", "n", 2, 5.1)],
                            {"notify.send": "retry"})[1]


def test_the_frozen_check_fails_on_a_request_after_the_worker_continued() -> None:
    t = _checks()
    journal = _journal("a", ("run_claimed", 1, 1.0, None, None, {"worker": "vm:4242:abc"}))
    freeze = t.Freeze(4242, stopped_at=2.0, continue_at=6.0, continued_at=6.0)
    assert t.check_frozen({"a": journal}, [_request("a", "1:x", 1, 1.5)], [freeze], 2.0)[1]
    ok, detail = t.check_frozen({"a": journal}, [_request("a", "1:x", 1, 6.2)], [freeze],
                                2.0)[1:]
    assert not ok and "after its worker (pid 4242) was continued" in detail
    # continued early by the end of the chaos (0.5 s into a 2 s lease): it may go on
    cut = t.Freeze(4242, stopped_at=2.0, continue_at=6.0, continued_at=2.5)
    ok, detail = t.check_frozen({"a": journal}, [_request("a", "1:x", 1, 2.6)], [cut],
                                2.0)[1:]
    assert ok and "1 cut short by the end of the chaos, not judged" in detail


def test_the_billing_and_notification_checks_fail_on_duplicates() -> None:
    t = _checks()
    once = [_request("j", "item-1", 1, 1.0, billed=True), _request("j", "item-2", 1, 1.1,
                                                                    billed=True)]
    assert t.check_billing(once)[1]
    assert not t.check_billing([*once, _request("j", "item-1", 2, 5.0, billed=True)])[1]
    note = {"idempotency_key": "r/failed-notify", "body": {"outcome": "reset_failed"}}
    assert t.check_notifications([note], {"r": []})[1]
    assert not t.check_notifications([note, dict(note)], {"r": []})[1]
    other_key = {"idempotency_key": "r/failed-2-notify", "body": {"outcome": "reset_failed"}}
    assert not t.check_notifications([note, other_key], {"r": []})[1]  # item 7's shape


def test_the_cancel_check_fails_when_the_run_goes_on() -> None:
    t = _checks()
    runs = {"a": type("R", (), {"state": type("S", (), {"value": "completed"})()})()}
    honoured = _journal("a", ("run_cancel_requested", 1, 10.0, None, None, {}),
                        ("run_cancelled", 1, 10.8, None, None, {}))
    assert t.check_cancels({"a": honoured}, runs, 2.5)[1]
    went_on = _journal("a", ("run_cancel_requested", 1, 10.0, None, None, {}),
                       ("step_started", 2, 14.0, "8", "paas.delete_volumes", {}),
                       ("run_completed", 2, 15.0, None, None, {}))
    ok, detail = t.check_cancels({"a": went_on}, runs, 2.5)[1:]
    assert not ok and "ended run_completed 5.0s later" in detail


def test_the_log_check_fails_on_a_crashed_attempt_or_an_escaped_traceback(
        tmp_path: Path) -> None:
    t = _checks()
    quiet = tmp_path / "worker-0.log"
    quiet.write_text("2026-12-05T00:42:50Z [warning  ] claim_failed  error='disk is full'\n")
    assert t.check_worker_logs([quiet])[1:] == (True, "1 logs")
    crashed = tmp_path / "worker-1.log"
    crashed.write_text("2026-12-05T00:42:50Z [error    ] attempt_crashed  error=boom\n"
                       "Traceback (most recent call last):\n"
                       '  File "durable/_worker.py", line 636, in _execute\n'
                       "RuntimeError: boom\n")
    ok, detail = t.check_worker_logs([quiet, crashed])[1:]
    assert not ok and detail.startswith("worker-1.log:1: ") and "attempt_crashed" in detail
    assert "worker-1.log:2" not in detail  # the crash's own traceback is not a second error
    escaped = tmp_path / "worker-2.log"
    escaped.write_text("Traceback (most recent call last):\n  File \"x.py\"\nKeyError: 'k'\n")
    ok, detail = t.check_worker_logs([escaped])[1:]
    assert not ok and "worker-2.log:1: Traceback" in detail and "KeyError" in detail


def test_the_lock_report_names_the_process_holding_sqlite_s_write_lock(tmp_path: Path) -> None:
    """What a write locked out of the database is told: who holds the write lock, and that
    it is stopped (a frozen worker inside a transaction holds it until continued)."""
    t = _checks()
    db = tmp_path / "torture.db"
    with subprocess.Popen(
            [sys.executable, "-c", "import sqlite3, sys\n"
             f"c = sqlite3.connect({str(db)!r}, isolation_level=None)\n"
             "c.execute('PRAGMA journal_mode = WAL'); c.execute('CREATE TABLE t (x)')\n"
             "c.execute('BEGIN IMMEDIATE'); c.execute('INSERT INTO t VALUES (1)')\n"
             "print('held', flush=True); sys.stdin.read()"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as holder:
        try:
            assert holder.stdout is not None and holder.stdout.readline() == "held\n"
            assert (holder.pid, "the write lock (write)") in t.sqlite_lock_holders(db)
            holder.send_signal(signal.SIGSTOP)
            try:
                # the kernel stops it soon after the signal, not at once (CI once read "R")
                deadline = time.monotonic() + 10
                while t.process_state(holder.pid) != "T" and time.monotonic() < deadline:
                    time.sleep(0.01)  # a bounded poll
                assert t.process_state(holder.pid) == "T"
            finally:
                holder.send_signal(signal.SIGCONT)
        finally:
            holder.kill()
            holder.wait()
    assert t.sqlite_lock_holders(db) == []  # the kernel released them with the process
    assert t.process_state(holder.pid) == "gone"


def _children(pid: int) -> list[int]:
    kids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == pid:
            kids.append(int(stat.parent.name))
    return kids


def _worker_children(pid: int) -> list[int]:
    found = []
    for kid in _children(pid):
        try:
            if b"durable.worker" in Path(f"/proc/{kid}/cmdline").read_bytes():
                found.append(kid)
        except OSError:
            continue
    return found


def test_sigterm_ends_the_run_and_everything_it_started() -> None:
    """Stopped with SIGTERM (a CI timeout, ``kill``), it kills its workers and the fake
    services as on Ctrl-C, instead of leaving them running on a deleted database."""
    with subprocess.Popen([sys.executable, str(SCRIPT), "--seed", "7", "--budget", "60",
                           "--workers", "2", "--runs", "4"], cwd=ROOT, env=subprocess_env(),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        try:
            deadline = time.monotonic() + 60
            while len(_worker_children(proc.pid)) < 2:  # bounded poll: the fleet is up
                assert proc.poll() is None and time.monotonic() < deadline, proc.returncode
                time.sleep(0.05)
            started = _children(proc.pid)
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert proc.returncode == 130, err[-2000:]
    assert err.strip().splitlines()[-1] == (
        "torture: stopped; every process it started was killed"), err[-2000:]
    assert "Traceback" not in err, err[-2000:]
    left = [p for p in started if alive(p)]
    assert not left, f"left running: {left}"


def test_the_gate_check_fails_on_a_delete_before_the_approve_or_a_signal_taken_twice() -> None:
    t = _checks()
    approved = _journal("a", ("step_completed", 1, 1.0, "plan", "inventory.plan", {}),
                        ("signal_received", 1, 2.0, "4", "durable.wait_for",
                         {"name": "approve", "seq": 1}),
                        ("step_started", 1, 3.0, "delete-database", "paas.delete_database", {}))
    delete = dict(_request("a", "delete-database", 1, 3.1), path="/api/v1/databases/db-s1")
    ok, detail = t.check_gates({"a": approved}, [delete], ["a"])[1:]
    assert ok and detail == "1 gated runs: 1 deleted after an approve, 0 never approved"
    unapproved = [e for e in approved if e.kind is not EntryKind.SIGNAL_RECEIVED]
    ok, detail = t.check_gates({"a": unapproved}, [delete], ["a"])[1:]
    assert not ok and "a sent DELETE /api/v1/databases/db-s1 with no approve received" in detail
    early = [approved[0], approved[2], approved[1]]  # the delete started before the receipt
    early = [JournalEntry(i, e.run_id, e.epoch, e.kind, e.at, step_key=e.step_key,
                          name=e.name, data=e.data) for i, e in enumerate(early, 1)]
    ok, detail = t.check_gates({"a": early}, [delete], ["a"])[1:]
    assert not ok and "before its approve was received" in detail
    twice = [*approved, *_journal("a", ("signal_received", 2, 9.0, "4", "durable.wait_for",
                                        {"name": "approve", "seq": 1}))]
    ok, detail = t.check_gates({"a": twice}, [delete], ["a"])[1:]
    assert not ok and "a received signal 1 2 times" in detail
    assert t.check_gates({"b": approved}, [delete], [])[1]  # an ungated run is not judged


def test_the_schedule_check_fails_on_a_fire_passed_over_or_one_after_the_deletion() -> None:
    t = _checks()
    since, until = 1_800_000_000.3, 1_800_000_012.7  # 08:00:00.3 to 08:00:12.7 UTC: fires
    # from 08:00:04 to 08:00:10 are judged (2.5 s at each end are not)
    fired = [f"tick@2027-01-15T08:00:{s:02d}Z" for s in range(0, 14, 2)]  # 08:00:00 .. :12
    ok, detail = t.check_schedule(fired, since, until)[1:]
    assert ok and detail == "7 fires, 4 judged"
    ok, detail = t.check_schedule([f for f in fired if not f.endswith(":06Z")], since, until)[1:]
    assert not ok and detail == "no run for the fire at 08:00:06"
    late = [*fired, "tick@2027-01-15T08:00:16Z"]
    ok, detail = t.check_schedule(late, since, until)[1:]
    assert not ok and detail == "a run for 08:00:16, after the schedule was deleted"


def test_the_gate_check_fails_on_a_signal_id_recorded_twice() -> None:
    t = _checks()
    doubled = ["a: signal torture-approve-3 recorded twice"]
    ok, detail = t.check_gates({"a": []}, [], ["a"], doubled)[1:]
    assert not ok and detail == doubled[0]


def _nap(*rows: tuple[str, int, float, int | None, dict[str, Any]]) -> list[JournalEntry]:
    """A nap run's journal: (kind, epoch, at, step, data) rows."""
    return [JournalEntry(seq, "n", epoch, EntryKind(kind), at, step=step,
                         step_key=None if step is None else str(step), data=data)
            for seq, (kind, epoch, at, step, data) in enumerate(rows, 1)]


def test_the_wait_check_fails_on_an_early_wake_a_second_timer_or_an_untrue_timeout() -> None:
    t = _checks()
    before = [("run_claimed", 1, 0.9, None, {}), ("step_completed", 1, 1.0, 1, {}),
              ("timer_started", 1, 1.1, 2, {"until": 4.0})]
    after = [("timer_fired", 2, 4.05, 2, {}), ("step_started", 2, 4.05, 3, {}),
             ("step_completed", 2, 4.1, 3, {}), ("wait_started", 2, 4.2, 4, {"until": 6.0})]
    timed_out = ("signal_timeout", 2, 6.01, 4, {})
    sent = _request("n", "3#1", 2, 4.06)

    def check(rows: list[tuple[str, int, float, int | None, dict[str, Any]]],
              ledger: list[dict[str, Any]] | None = None, poked: dict[str, float] | None = None,
              late: dict[str, float] | None = None) -> tuple[bool, str]:
        ok, detail = t.check_waits({"n": _nap(*rows)}, [sent] if ledger is None else ledger,
                                   ["n"], poked or {}, late or {})[1:]
        return ok, detail

    assert check([*before, *after, timed_out]) == (
        True, "1 nap runs: 1 slept, 0 signals received, 1 waits timed out")
    received = ("signal_received", 2, 5.0, 4, {"seq": 1})
    assert check([*before, *after, received], poked={"n": 4.9}) == (
        True, "1 nap runs: 1 slept, 1 signals received, 0 waits timed out")
    # a replay starts a sleep left pending afresh: a second timer after it is no fault
    replayed = [*before, ("run_cancelled", 1, 2.0, None, {}), ("run_replayed", 1, 2.5, None, {}),
                ("timer_started", 2, 2.6, 2, {"until": 4.0}), *after, timed_out]
    assert check(replayed)[0]

    early = [*before, ("step_started", 2, 3.5, 3, {}), *after[2:], timed_out]
    assert check(early) == (False, "n: step_started of step 3 0.500s before its sleep's wake "
                                   "time")
    ok, detail = check([*before, *after, timed_out], [_request("n", "3#1", 2, 3.75)])
    assert not ok and detail == ("n: DELETE /api/v1/databases/db-s1 0.250s before its sleep's "
                                 "wake time")
    twice = [*before, ("timer_started", 2, 2.6, 2, {"until": 4.5}), *after, timed_out]
    assert check(twice) == (False, "n: its sleep journaled 2 times at once (epochs 1, 2)")
    assert check([*before, *after, received, timed_out]) == (
        False, "n: its wait ended 2 times: signal_received, signal_timeout")
    assert check([*before, *after, ("signal_timeout", 2, 5.0, 4, {})]) == (
        False, "n: its wait timed out 1.000s before its deadline")
    assert check([*before, *after, timed_out], poked={"n": 5.5}) == (
        False, "n: its wait timed out although its signal was recorded 0.500s before the "
               "deadline")
    assert check([*before, *after, timed_out], poked={"n": 5.99})[0]  # a race: not judged
    assert check([*before, *after, timed_out], late={"n": 4.25}) == (
        False, "n sat queued 4.2s past its wake-up")


def test_the_retry_check_fails_on_a_try_before_its_released_delay_ran_out() -> None:
    t = _checks()
    retrying = ("step_retrying", 1, 1.0, 3, {"retry_in": 4.0, "retry_at": 5.0})
    on_time = [("run_claimed", 1, 0.5, None, {}), ("step_started", 1, 0.9, 3, {}), retrying,
               ("run_claimed", 2, 5.0, None, {}), ("step_started", 2, 5.01, 3, {})]
    assert t.check_retries({"n": _nap(*on_time)})[1:] == (True, "1 released retries")
    early = [*on_time[:3], ("run_claimed", 2, 3.0, None, {}), ("step_started", 2, 3.5, 3, {})]
    assert t.check_retries({"n": _nap(*early)})[1:] == (
        False, "n 3 tried again 1.500s before its retry time")
    replayed = [*on_time[:3], ("run_replayed", 1, 2.0, None, {}),
                ("run_claimed", 2, 2.1, None, {}), ("step_started", 2, 2.2, 3, {})]
    assert t.check_retries({"n": _nap(*replayed)})[1]  # a replay starts the delay afresh


def test_the_timeout_check_fails_on_a_step_or_request_after_the_time_ran_out() -> None:
    """Timeout 5 s from the first claim (at 1.0): a step started by a later attempt at 6.5,
    within the slack, passes; one at 7.5 fails, and so does a request of the run arriving
    then; after a replay the count starts anew. The counts say what ended how."""
    t = _checks()
    runs = {"n": type("R", (), {"timeout": 5.0})(), "u": type("R", (), {"timeout": None})()}
    first = [("run_claimed", 1, 1.0, None, {}), ("step_started", 1, 1.1, 1, {}),
             ("step_completed", 1, 1.2, 1, {})]
    fine = [*first, ("run_claimed", 2, 5.5, None, {}), ("step_started", 2, 6.5, 2, {}),
            ("run_failed", 2, 6.6, None, {"error": "TimeoutError: workflow timed out ..."})]
    ok, detail = t.check_timeouts({"n": _nap(*fine), "u": []}, [], runs)[1:]
    assert ok and detail == ("1 timed runs: 1 timed out (0 when an attempt was claimed after "
                             "the time ran out), 0 completed by such an attempt; the latest "
                             "step or request +0.500s from its deadline")
    late = [*first, ("run_claimed", 2, 7.0, None, {}), ("step_started", 2, 7.5, 2, {})]
    ok, detail = t.check_timeouts({"n": _nap(*late)}, [], runs)[1:]
    assert not ok and detail.startswith("n: step 2 started after its 5 s timeout ran out")
    sent = _request("n", "2", 2, 7.2)
    ok, detail = t.check_timeouts({"n": _nap(*first)}, [sent], runs)[1:]
    assert not ok and "n: DELETE /api/v1/databases/db-s1 arrived after" in detail
    replayed = [*first, ("run_failed", 1, 6.0, None, {"error": "workflow timed out after 5 s"
                                                     " ..., before attempt 2 began; it did "
                                                     "nothing new: ..."}),
                ("run_replayed", 1, 20.0, None, {}), ("run_claimed", 3, 20.1, None, {}),
                ("step_started", 3, 21.0, 2, {}), ("run_completed", 3, 21.5, None, {})]
    ok, detail = t.check_timeouts({"n": _nap(*replayed)}, [_request("n", "2", 3, 21.0)],
                                  runs)[1:]
    assert ok and "1 timed out (1 when an attempt" in detail
    done_late = [*first, ("run_claimed", 2, 9.0, None, {}),
                 ("run_completed", 2, 9.1, None, {"overdue": True, "timeout": 5.0})]
    assert "1 completed by such an attempt" in t.check_timeouts(
        {"n": _nap(*done_late)}, [], runs)[2]


def test_the_pause_check_fails_on_a_claim_while_the_workflow_was_paused() -> None:
    """A run of the paused workflow claimed inside the window fails the check; one claimed
    before the pause committed or after the resume was sent does not, nor a run of another
    workflow, nor a pause whose answer was lost (when it took hold is not known)."""
    t = _checks()
    runs = {"r": type("R", (), {"workflow": "slot.reset"})(),
            "o": type("R", (), {"workflow": "audio.batch"})()}

    def claimed(run_id: str, at: float) -> list[JournalEntry]:
        return [JournalEntry(1, run_id, 1, EntryKind.RUN_CLAIMED, at, attempt=1)]

    pause = t.Pause("slot.reset", 0.0, paused_by=100.0, resuming_at=110.0)
    fine = {"r": claimed("r", 99.0) + claimed("r", 111.0), "o": claimed("o", 105.0)}
    assert t.check_pauses(fine, runs, [pause])[1]
    lost = t.Pause("slot.reset", 0.0, paused_by=None, resuming_at=110.0)
    assert t.check_pauses({"r": claimed("r", 105.0), "o": []}, runs, [lost])[1]
    ok, detail = t.check_pauses({"r": claimed("r", 105.0), "o": []}, runs, [pause])[1:]
    assert not ok and "r attempt 1 claimed at" in detail and "slot.reset was paused" in detail
