"""A model-based test of the store: random operation sequences checked against a model.

Hypothesis drives random sequences of create, claim, renew, append, put_records, finish,
release, recover, cancel, requeue (replay) and clock moves, issued by several fake workers
(one store instance each, on one database, as worker processes would have) and an operator,
against SQLite (a temp file per example) and PostgreSQL (a schema per example).
After every step the store's runs are compared with a small model of the run state machine:

- one running attempt per run and per concurrency key;
- tokens (epochs) strictly increasing in their scope: the run's key, or the run when it has
  no key (docs/design.md, the fencing token's scope);
- a fenced write (append, put_records, finish, release) succeeds exactly when its attempt
  still holds the run (running, same epoch, lease not expired): no write of a superseded
  attempt succeeds, and the journal holds exactly the entries of the writes that did;
- renew answers exactly the runs the worker still holds; recovery exactly the expired ones;
- no lost cancel: a requested cancel survives release and recovery until the run finishes
  (the store either cancels the run or hands it out with ``cancel_requested`` set);
- FIFO per key: a claim takes a key's first due queued run, and a run that has started keeps
  its key across release and recovery until it finishes (issue 8, item 1).

The store is async; the sync state machine calls it through an anyio blocking portal on
asyncio and trio. CI runs a small budget; ``DURABLE_MODEL_EXAMPLES`` and
``DURABLE_MODEL_STEPS`` make long runs (e.g. 2000 and 80).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Coroutine
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any, TypeVar

import anyio.from_thread
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from durable._clock import FakeClock
from durable._types import EntryKind, Fence, JournalWrite, NewRun, Run, RunState
from durable.store import Store, store_from_url
from tests.pg import postgres_server, psycopg

__all__ = ["postgres_server"]

T = TypeVar("T")

LEASE = 10.0
WORKERS = ("w0", "w1", "w2")
KEYS = ("k0", "k0", "k1", None)  # weighted: runs share a key often
WORKFLOWS = ("wf.a", "wf.b")
MAX_RECOVERIES = 3  # small, so sequences reach the bound
CLOCK_MOVES = (0.5, 0.5, 1.0, 1.0, 2.0, LEASE / 2, LEASE - 0.5, LEASE, LEASE + 1.0, 3 * LEASE)

SETTINGS = settings(
    max_examples=int(os.environ.get("DURABLE_MODEL_EXAMPLES", "40")),
    stateful_step_count=int(os.environ.get("DURABLE_MODEL_STEPS", "40")),
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


@dataclass
class MRun:
    """The model of one run."""

    id: str
    key: str | None
    workflow: str
    run_at: float
    seq: int
    state: str = "queued"
    epoch: int = 0
    attempt: int = 0
    worker: str | None = None
    lease_until: float | None = None
    cancel: bool = False
    recoveries: int = 0
    marks: list[str] = field(default_factory=list)  # data marks of successful appends

    @property
    def scope(self) -> str:
        return f"key:{self.key}" if self.key is not None else f"run:{self.id}"


@dataclass(frozen=True)
class Attempt:
    run_id: str
    epoch: int
    worker: str


class StoreModel(RuleBasedStateMachine):
    """The state machine; a subclass per test sets ``backend`` and ``make_url``."""

    backend = "asyncio"
    make_url: Callable[[], tuple[str, Callable[[], None]]]

    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock()
        self.runs: dict[str, MRun] = {}
        self.attempts: list[Attempt] = []
        self.scope_max: dict[str, int] = {}
        self.stack = ExitStack()
        url, cleanup = type(self).make_url()
        self.stack.callback(cleanup)
        self.portal = self.stack.enter_context(
            anyio.from_thread.start_blocking_portal(self.backend))
        self.stores: dict[str, Store] = {}
        for name in ("operator", *WORKERS):
            store = store_from_url(url, clock=self.clock, pool_size=2,
                                   max_recoveries=MAX_RECOVERIES)
            self.portal.call(store.open)
            self.stack.callback(self.portal.call, store.aclose)
            self.stores[name] = store

    def teardown(self) -> None:
        self.stack.close()

    def call(self, fn: Callable[..., Coroutine[Any, Any, T]], *args: Any, **kw: Any) -> T:
        return self.portal.call(lambda: fn(*args, **kw))

    @property
    def op(self) -> Store:
        return self.stores["operator"]

    # -- helpers on the model -------------------------------------------------------------------
    def holds(self, a: Attempt) -> bool:
        r = self.runs[a.run_id]
        now = self.clock.now()
        return (r.state == "running" and r.epoch == a.epoch
                and r.lease_until is not None and r.lease_until > now)

    def pick(self, data: st.DataObject) -> Attempt:
        """An attempt to write as: mostly the run's current one, sometimes a superseded one."""
        current = [a for a in self.attempts if self.runs[a.run_id].state == "running"
                   and self.runs[a.run_id].epoch == a.epoch]
        if current and data.draw(st.sampled_from((True, True, False))):
            return data.draw(st.sampled_from(current))
        return data.draw(st.sampled_from(self.attempts))

    def due(self, r: MRun) -> bool:
        return r.state == "queued" and r.run_at <= self.clock.now()

    def head(self, key: str) -> str | None:
        """The run a claim takes on ``key`` when none of its runs is running: its first in line.

        A run that has started (released, recovered or replayed) keeps its key: it goes first,
        ahead of every run that never started; those go FIFO by ``run_at``, then creation
        (docs/design.md, "A run that has started keeps its key"; issue 8, item 1).
        """
        due = [r for r in self.runs.values() if r.key == key and self.due(r)]
        if not due:
            return None
        return min(due, key=lambda r: (r.attempt == 0, r.run_at, r.seq)).id

    def running_keys(self) -> set[str]:
        return {r.key for r in self.runs.values() if r.state == "running" and r.key is not None}

    def interrupt(self, r: MRun, actual: Run | None, *, recovered: bool) -> None:
        """The model after release or recovery of ``r``, checked against the stored run."""
        assert actual is not None
        r.worker, r.lease_until = None, None
        if recovered:
            r.recoveries += 1
        if r.cancel:  # a pending cancel is never executed again
            r.state = "cancelled"
        elif r.recoveries > MAX_RECOVERIES:  # a poison pill ends failed
            r.state = "failed"
        else:
            r.state = "queued"
            assert actual.run_at <= self.clock.now(), (r.id, "not due at once", actual)
            r.run_at = actual.run_at
        assert actual.state.value == r.state, (
            f"{'recovery' if recovered else 'release'} of {r.id} (cancel={r.cancel}, "
            f"recoveries={r.recoveries}) left it {actual.state.value}, expected {r.state}")
        assert actual.recoveries == r.recoveries, (actual, r)

    # -- rules ---------------------------------------------------------------------------------
    @initialize(first=st.lists(st.tuples(st.sampled_from(KEYS), st.sampled_from(WORKFLOWS)),
                               min_size=2, max_size=5))
    def start(self, first: list[tuple[str | None, str]]) -> None:
        assert self.call(self.op.list_runs) == []
        for key, workflow in first:  # a few runs to work on from the first step
            self.create(key, workflow, 0.0)

    @rule(key=st.sampled_from(KEYS), workflow=st.sampled_from(WORKFLOWS),
          delay=st.sampled_from((0.0, 0.0, 0.0, 3.0)),
          again=st.sampled_from((False,) * 5 + (True,)), data=st.data())
    def create(self, key: str | None, workflow: str, delay: float, again: bool = False,
               data: st.DataObject | None = None) -> None:
        if again and self.runs and data is not None:  # start is idempotent by id
            r = self.runs[data.draw(st.sampled_from(sorted(self.runs)))]
            run, created = self.call(self.op.create_run,
                                     NewRun(r.id, r.workflow, ["other"], "other-key",
                                            self.clock.now()))
            assert not created and run.key == r.key and run.state.value == r.state
            return
        seq = len(self.runs)
        run_id = f"r{seq:03d}"
        now = self.clock.now()
        run, created = self.call(self.op.create_run,
                                 NewRun(run_id, workflow, [run_id], key, now + delay))
        assert created and run.state is RunState.QUEUED and run.key == key
        self.runs[run_id] = MRun(run_id, key, workflow, now + delay, seq, epoch=run.epoch)

    @rule(worker=st.sampled_from(WORKERS), limit=st.integers(1, 3),
          only=st.sampled_from((None, None, ("wf.a",))), data=st.data())
    def claim(self, worker: str, limit: int, only: tuple[str, ...] | None,
              data: st.DataObject) -> None:
        target: str | None = None
        queued = sorted(r.id for r in self.runs.values() if r.state == "queued")
        if queued and data.draw(st.sampled_from((False, False, False, True))):
            target = data.draw(st.sampled_from(queued))  # the inline path: one given run
        now = self.clock.now()
        # what the model says this claim takes: each free key's head, every due unkeyed run
        claimable = {r.id for r in self.runs.values() if r.key is None and self.due(r)}
        for key in {r.key for r in self.runs.values() if r.key is not None} - self.running_keys():
            head = self.head(key)
            if head is not None:
                claimable.add(head)
        claimable = {i for i in claimable if (target is None or i == target)
                     and (only is None or self.runs[i].workflow in only)}
        claimed = self.call(self.stores[worker].claim, worker, LEASE, limit,
                            run_id=target, workflows=list(only) if only else None)
        ids = [c.id for c in claimed]
        assert len(ids) == len(set(ids)) == min(limit, len(claimable)), (
            f"claim(limit={limit}, run_id={target}, workflows={only}) took {ids}, "
            f"expected {min(limit, len(claimable))} of {sorted(claimable)}")
        for c in claimed:
            r = self.runs[c.id]
            assert c.id in claimable, (
                f"claimed {c.id} ({r.state}, key {r.key}), expected one of {sorted(claimable)}"
                + (f": FIFO per key, {r.key}'s first in line is {self.head(r.key)}"
                   if r.key is not None else ""))
            assert c.state is RunState.RUNNING and c.worker == worker
            assert c.lease_expires_at is not None
            assert abs(c.lease_expires_at - (now + LEASE)) < 1e-3, (c, now)
            assert c.cancel_requested == r.cancel, (c, "a pending cancel was lost at claim")
            assert c.fencing_scope == r.scope, (c.fencing_scope, r.scope)
            prev = self.scope_max.get(r.scope, 0)
            assert c.epoch > prev and c.epoch > r.epoch, (
                f"token of {c.id} not increasing in its scope {r.scope}: {c.epoch} after {prev}")
            assert c.attempt == r.attempt + 1, (c.attempt, r.attempt)
        for c in claimed:
            r = self.runs[c.id]
            r.state, r.epoch, r.attempt, r.worker = "running", c.epoch, c.attempt, worker
            r.lease_until = now + LEASE
            self.scope_max[r.scope] = max(self.scope_max.get(r.scope, 0), c.epoch)
            self.attempts.append(Attempt(c.id, c.epoch, worker))

    @rule(worker=st.sampled_from(WORKERS), data=st.data())
    def renew(self, worker: str, data: st.DataObject) -> None:
        mine = [a for a in self.attempts if a.worker == worker]
        held = data.draw(st.lists(st.sampled_from(mine), unique=True, max_size=4)) if mine else []
        now = self.clock.now()
        expected = {(a.run_id, a.epoch) for a in held
                    if self.holds(a) and self.runs[a.run_id].worker == worker}
        answer = self.call(self.stores[worker].renew, worker,
                           [Fence(a.run_id, a.epoch) for a in held], LEASE)
        got = {(x.run_id, x.epoch) for x in answer}
        assert got == expected, f"renew by {worker}: got {sorted(got)}, expected {sorted(expected)}"
        for x in answer:
            r = self.runs[x.run_id]
            assert x.cancel_requested == r.cancel, (x, "renew lost or invented a cancel")
            r.lease_until = now + LEASE

    @precondition(lambda self: bool(self.attempts))
    @rule(data=st.data(), n=st.integers(1, 2), records=st.booleans())
    def append(self, data: st.DataObject, n: int, records: bool) -> None:
        """A journal append, or records written with journal entries (one transaction)."""
        a = self.pick(data)
        marks = [uuid.uuid4().hex[:8] for _ in range(n)]
        expected = self.holds(a)
        entries = [JournalWrite(EntryKind.VALUE, data={"mark": m}) for m in marks]
        fence = Fence(a.run_id, a.epoch)
        if records:
            ok = self.call(self.stores[a.worker].put_records, fence,
                           [("model", a.run_id, {"epoch": a.epoch})], entries)
        else:
            ok = self.call(self.stores[a.worker].append, fence, entries)
        what = "put_records" if records else "append"
        assert ok == expected, f"{what} by {a}: {ok}, expected {expected}"
        r = self.runs[a.run_id]
        if ok:
            r.marks.extend(marks)
        entries = self.call(self.op.journal, a.run_id)
        found = [(e.data.get("mark"), e.epoch) for e in entries if e.kind is EntryKind.VALUE]
        assert [m for m, _ in found] == r.marks, "the journal is not the writes that held"
        if ok:
            assert found[-n:] == [(m, a.epoch) for m in marks]

    @precondition(lambda self: bool(self.attempts))
    @rule(data=st.data(),
          state=st.sampled_from((RunState.COMPLETED, RunState.FAILED, RunState.CANCELLED)))
    def finish(self, data: st.DataObject, state: RunState) -> None:
        a = self.pick(data)
        expected = self.holds(a)
        ok = self.call(self.stores[a.worker].finish, Fence(a.run_id, a.epoch), state,
                       result="done" if state is RunState.COMPLETED else None,
                       error=None if state is RunState.COMPLETED else "model says so")
        assert ok == expected, f"finish({state}) by {a}: {ok}, expected {expected}"
        if ok:
            r = self.runs[a.run_id]
            r.state, r.worker, r.lease_until = state.value, None, None

    @precondition(lambda self: bool(self.attempts))
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        a = self.pick(data)
        expected = self.holds(a)
        ok = self.call(self.stores[a.worker].release, Fence(a.run_id, a.epoch),
                       [JournalWrite(EntryKind.RUN_INTERRUPTED, data={"reason": "shutdown"})])
        assert ok == expected, f"release by {a}: {ok}, expected {expected}"
        if ok:
            self.interrupt(self.runs[a.run_id], self.call(self.op.get_run, a.run_id),
                           recovered=False)

    @rule(data=st.data(), who=st.sampled_from(("operator", *WORKERS)))
    def recover(self, data: st.DataObject, who: str) -> None:
        now = self.clock.now()
        expired = {(r.id, r.epoch) for r in self.runs.values()
                   if r.state == "running" and r.lease_until is not None and r.lease_until <= now}
        one = data.draw(st.booleans()) and self.attempts
        if one:
            a = data.draw(st.sampled_from(self.attempts))
            got = self.call(self.stores[who].recover_stale, a.run_id, a.epoch)
            expected = expired & {(a.run_id, a.epoch)}
        else:
            got = self.call(self.stores[who].recover_stale)
            expected = expired
        found = {(f.run_id, f.epoch) for f in got}
        assert found == expected, f"recover: got {sorted(found)}, expected {sorted(expected)}"
        for run_id, _ in found:
            self.interrupt(self.runs[run_id], self.call(self.op.get_run, run_id), recovered=True)

    @precondition(lambda self: bool(self.runs))
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        r = self.runs[data.draw(st.sampled_from(sorted(self.runs)))]
        answer = self.call(self.op.request_cancel, r.id)
        if r.state in ("completed", "failed", "cancelled"):
            assert answer is None, (r.id, r.state, answer)
            return
        assert answer is not None, (r.id, r.state, "cancel answered nothing to cancel")
        if r.state == "running":
            assert answer.state is RunState.RUNNING and answer.cancel_requested, answer
            r.cancel = True
        else:  # queued, never started or interrupted: cancelled at once
            assert answer.state is RunState.CANCELLED, (r, answer)
            r.state = "cancelled"

    @precondition(lambda self: bool(self.runs))
    @rule(data=st.data())
    def requeue(self, data: st.DataObject) -> None:
        r = self.runs[data.draw(st.sampled_from(sorted(self.runs)))]
        answer = self.call(self.op.requeue, r.id, None, None)
        if r.state not in ("failed", "cancelled"):
            assert answer is None, (r.id, r.state, answer)
            return
        assert answer is not None and answer.state is RunState.QUEUED, answer
        assert not answer.cancel_requested
        r.state, r.cancel = "queued", False
        r.run_at = answer.run_at
        r.epoch = max(r.epoch, answer.epoch)

    @rule(seconds=st.sampled_from(CLOCK_MOVES))
    def move_clock(self, seconds: float) -> None:
        self.clock.advance(seconds)

    # -- the check after every step ------------------------------------------------------------
    @invariant()
    def matches_model(self) -> None:
        stored = {r.id: r for r in self.call(self.op.list_runs, limit=10_000)}
        assert set(stored) == set(self.runs)
        per_key: dict[str, list[str]] = {}
        for run_id, m in self.runs.items():
            s = stored[run_id]
            assert s.state.value == m.state, (run_id, s.state.value, m.state)
            if s.state is RunState.RUNNING:
                assert s.epoch == m.epoch and s.worker == m.worker, (s, m)
                assert s.lease_expires_at is not None and m.lease_until is not None
                assert abs(s.lease_expires_at - m.lease_until) < 1e-3, (s, m)
                if s.key is not None:
                    per_key.setdefault(s.key, []).append(run_id)
            if not s.state.finished:
                assert s.cancel_requested == m.cancel, (run_id, "cancel flag", s, m)
            assert s.epoch >= m.epoch, (run_id, "token went back", s.epoch, m.epoch)
            m.epoch = s.epoch
        for key, ids in per_key.items():
            assert len(ids) == 1, f"two running runs on key {key}: {ids}"
        self.clock.advance(0.01)  # time passes between steps: no two steps at one instant


def _sqlite_url() -> tuple[str, Callable[[], None]]:
    folder = tempfile.mkdtemp(prefix="durable-model-")
    return f"sqlite:///{folder}/model.db", lambda: shutil.rmtree(folder, ignore_errors=True)


def _postgres_url(server: str) -> Callable[[], tuple[str, Callable[[], None]]]:
    def make() -> tuple[str, Callable[[], None]]:
        schema = f"durable_model_{uuid.uuid4().hex[:12]}"

        def drop() -> None:
            with psycopg.connect(server, autocommit=True) as conn:
                conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'.encode())

        return f"{server}?schema={schema}", drop

    return make


@pytest.mark.parametrize("store_kind", ["sqlite", "postgres"])
def test_store_against_model(store_kind: str, anyio_backend: str,
                             request: pytest.FixtureRequest) -> None:
    if store_kind == "postgres":
        make = _postgres_url(str(request.getfixturevalue("postgres_server")))
    else:
        make = _sqlite_url

    class Machine(StoreModel):
        backend = anyio_backend

    Machine.make_url = staticmethod(make)  # type: ignore[assignment,method-assign]
    run_state_machine_as_test(Machine, settings=SETTINGS)
