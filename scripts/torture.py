"""A torture run: real workflows and worker processes under kills, freezes, faults and races.

    python scripts/torture.py [--seed N] [--budget 60] [--workers 3] [--runs 12]
                              [--backend sqlite|postgres] [--lease 2] [--report FILE]
                              [--disk-full]

Starts the fake services on loopback (``scripts/_fakes``), seeds slots, and runs
``--workers`` worker processes (``python -m durable.worker --import workflows``) on one
database while a scheduler, driven by one seeded random generator, starts ``--runs`` runs
(slot.reset, slot.teardown and audio.batch, several on each concurrency key) and meanwhile:
SIGKILLs workers and starts new ones, SIGSTOPs one past its lease and SIGCONTs it (on
SQLite every second one into a busy database: the script holds the write lock across the
SIGCONT, so no renewal can tell the thawed worker its lease is gone), sends
SIGTERM (graceful shutdown), injects service faults (5xx, dropped connections before or
after the service did the work, hangs), and races operator cancels (also right after a
SIGTERM of the worker holding the run) and replays; with ``--disk-full`` (root, to mount
it) the database (PostgreSQL: its tables, on a tablespace) lives on a tmpfs of its own,
which the scheduler fills to the last byte for a while now and then. After the chaos phase
(60 % of ``--budget``), the faults are cleared and the surviving workers finish what they
can until the budget ends; then every worker is shut down with SIGTERM and the script
checks, from the services' ledger and the journal:

- every run is finished or queued (resumable), none left running after the shutdown, and
  none sat running past its lease while workers were alive;
- no completed step was started again;
- an in-doubt ``on_doubt="fail"`` step was never re-sent silently;
- within each fencing scope (the run's key, or the run) and each run, no two attempts'
  handled requests overlap in time;
- a frozen-then-continued worker sent nothing for an attempt whose lease ran out;
- no TTS item was billed twice, and no notification sent twice;
- every operator cancel was honoured: the run ended cancelled (or was finishing anyway),
  and no step started after the cancel could be seen;
- no worker logged an engine error: a crashed attempt, a failed interceptor, or a traceback
  that escaped the worker's handlers;
- a run started with ``{"approval": true}`` (some are: they journal their plan and wait,
  released, for a decision the scheduler sends, approve or reject, an approve sometimes
  again with its signal id) sent no DELETE before an approve was received, received each
  signal once, and recorded a signal id once;
- a schedule that fires every 2 s through the chaos (``tick``, a small TTS job, fired by
  every worker's scheduler) started one run for every fire between its creation and its
  deletion at the chaos's end (2.5 s at each end not judged), and none after;
- a nap run (``torture.nap``, ``scripts/_torture_flows.py``: a durable sleep, then a wait
  for the signal ``poke`` with a timeout, each shorter or longer than the workers' wait
  threshold; a poker sends most of them their signal near the wait's deadline) journaled its
  sleep and its wait once (between replays), sent nothing before its wake time, ended its
  wait once, timed out never early nor on a signal recorded before the deadline, and never
  sat queued past its wake-up after the chaos; and a step whose retry delay released its
  run was not tried again before its journaled retry time.

The fleet mixes event loops by default (``--loops mixed``: every second worker started runs
on trio; the PostgreSQL store there on an asyncio loop of its own, in a thread).

Prints its seed first (``--seed`` replays the same schedule; process timing still varies),
what it applied (kills, freezes, shutdowns, faults, cancels, replays), and a table of the
checks. Exits 0 when every check passed, 1 otherwise, 2 on bad arguments. Loopback only;
every process it starts runs in its own process group and is killed in a ``finally``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import logging
import math
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Awaitable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import anyio  # noqa: E402
import anyio.abc  # noqa: E402

import durable  # noqa: E402
import workflows  # noqa: E402,F401  (registers the operations: each activity's on_doubt)
from durable._approval import approval_view, send_decision  # noqa: E402
from durable._schedules import ScheduleSpec  # noqa: E402
from durable.store import store_from_url  # noqa: E402
from scripts._torture_flows import POKE  # noqa: E402
from tests.pgproxy import LosingProxy, losing_proxy  # noqa: E402
from tests.tmpfs import (  # noqa: E402
    FILLER,
    fill,
    pg_tablespace,
    tablespace_option,
    tmpfs,
)
from workflows.records import Slot, seed_slot  # noqa: E402

try:
    from scripts._fakes.harness import FakeServices, running_fake_services
except ImportError as exc:  # starlette and uvicorn come with the demo/test extras
    sys.exit(f"torture: the fake services need the test extras ({exc}); "
             "run: pip install -e '.[test]'")

PG_SERVER = "postgresql://postgres@127.0.0.1:5432/test"
TEMPLATE_FILES = {"README.md": "# starter\n", "app.py": "print('hello')\n"}
VOICE = "narrator"
GRACE = 1.0
CHAOS_SHARE = 0.6
FAULT_PATHS = [  # (method, glob) of the requests the workflows send
    ("DELETE", "/api/v1/databases/*"),
    ("DELETE", "/api/v1/applications/*/envs/*"),
    ("DELETE", "/api/v1/applications/*/storages/*"),
    ("DELETE", "/api/v1/applications/*"),
    ("GET", "/api/v1/applications/*"),
    ("GET", "/2.0/repositories/*"),
    ("DELETE", "/2.0/repositories/*"),
    ("POST", "/v1/text-to-speech/*"),
    ("POST", "/hooks/*"),
]
ACTIONS = {"kill": 1, "term": 1, "freeze": 1, "fault": 3, "cancel": 1, "term_cancel": 1,
           "replay": 1, "start": 2, "pg_terminate": 1, "pg_lose": 2, "pause": 1}
PAUSABLE = ("slot.reset", "slot.teardown", "audio.batch")
"""The workflows an operator pauses now and then (``durable pause``), for 1-4 s each. Not the
nap runs (their wake-ups are judged on time)."""
TICK = ScheduleSpec(name="tick", workflow="audio.batch", args=["tick", VOICE, ["tick la la"], 1],
                    cron="* * * * * */2")
"""Every two seconds, from the chaos's start to its end: a small TTS job, unkeyed."""
TICK_MARGIN = 2.5
"""Seconds at each end of the schedule's life whose fires are not judged (the store's clock
and this script's may differ a little)."""
GATED_SHARE = 0.35
"""Share of the slot runs started with ``{"approval": true}``: they journal their plan and
wait (released, no lease) for an approve or a reject, which ``decide`` sends."""
REJECT_SHARE = 0.2
NAP_SHARE = 0.5
"""Nap runs (``torture.nap``: a durable sleep, then a wait for a signal with a timeout) per
slot or audio run in the plan, at least two."""
POKE_SHARE = 0.7
"""Share of the nap runs' waits that a signal is sent to, near the wait's deadline (from
0.4 s before it to 0.1 s after it): the race between a signal and the timeout."""
TIMED_SHARE = 0.5
"""Share of the nap runs started with a workflow ``timeout`` (drawn from 3-9 s: shorter than
the run's sleep, wait and the chaos's hold-ups often enough that some run out; it counts
from the first claim across attempts, docs/design.md)."""
TIMEOUT_SLACK = 1.0
"""Seconds past a run's timeout (from its first claim's stamp) that a step's start or a
request may still show: the first attempt sets its deadline on its own clock once the claim
has returned (a busy machine's latency), and a request's arrival is stamped by the service."""
CLOCK_SLACK = 0.05
"""Seconds by which two processes' readings of the machine's one wall clock may disagree
(each reads it at its own moment around an event)."""


WAKE_SLACK = 3.0
"""Seconds a due nap run may wait to be claimed in the settling phase: the workers poll every
50 ms, and one that was just continued or started needs a moment."""

FROZEN_SLACK = 0.5
"""Seconds a freeze must outlast the lease for the frozen worker's runs to count as lost
(the lease runs from the last renewal before the freeze: at most the lease)."""

BUSY_THAW = 0.3
"""Seconds the script holds SQLite's write lock from just before it continues a frozen
worker (every second freeze on SQLite): the thawed worker's renewal waits for the lock, so
only its own local deadline can stop what its attempts send meanwhile."""


@dataclass
class Freeze:
    pid: int
    stopped_at: float
    continue_at: float
    continued_at: float | None = None
    busy: bool = False
    """SQLite: continue it into a busy database (``BUSY_THAW``)."""
    busy_held: bool = False
    """Whether the write lock was taken for its SIGCONT (it may be held by a worker)."""


@dataclass
class Pause:
    """An operator's pause of a workflow, on the store's clock: every claim that read its
    clock after ``paused_by`` (read once the pause had committed) and before ``resuming_at``
    (read before the resume was sent) saw the pause."""

    workflow: str
    resume_at: float  # time.monotonic()
    paused_by: float | None = None  # None: the pause's answer was lost (not judged)
    resuming_at: float | None = None


@dataclass
class Torture:
    seed: int
    budget: float
    workers: int
    runs: int
    backend: str
    lease: float
    tmp: Path
    services: FakeServices
    db_url: str
    rng: random.Random = field(init=False)
    gate_rng: random.Random = field(init=False)
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    live: list[subprocess.Popen[bytes]] = field(default_factory=list)
    freezes: list[Freeze] = field(default_factory=list)
    counts: Counter[str] = field(default_factory=Counter)
    plan: list[tuple[str, list[Any], str | None, str]] = field(default_factory=list)
    started: list[str] = field(default_factory=list)
    hang_release_at: list[float] = field(default_factory=list)
    stuck: dict[str, float] = field(default_factory=dict)
    proxy: LosingProxy | None = None
    """PostgreSQL: the workers reach the server through it (``pg_lose``)."""
    loops: str = "asyncio"
    """The workers' event loop: ``asyncio``, ``trio``, or ``mixed`` (every second worker
    started runs on trio, so one fleet has both)."""
    disk: Path | None = None
    """``--disk-full``: the tmpfs that holds the database (PostgreSQL: its tablespace),
    filled now and then."""
    full_until: float | None = None
    """While the disk is full: when the filler goes (monotonic)."""
    tick_window: list[float] = field(default_factory=lambda: [0.0, 0.0])
    """When the TICK schedule was added and when it was deleted (time.time())."""
    doubled: list[str] = field(default_factory=list)
    """Decisions sent twice with one signal id and recorded twice (never, if ids hold)."""
    lockouts: list[str] = field(default_factory=list)
    """SQLite: this script's writes that waited out the busy timeout, with who held the
    database's locks then."""
    wait_rng: random.Random = field(init=False)
    naps: list[str] = field(default_factory=list)
    """The nap runs' ids (``torture.nap``)."""
    pokes: dict[str, float | None] = field(default_factory=dict)
    """Nap run -> when the poke is due (time.time()), or None: its wait is left to time out."""
    poked: dict[str, float] = field(default_factory=dict)
    """Nap run -> when ``signal`` returned, the poke recorded (committed before then)."""
    late_wakes: dict[str, float] = field(default_factory=dict)
    """Nap runs seen queued longer than the slack after they were due, in the settling
    phase (no faults, every worker alive): a lost wake-up."""
    pauses: list[Pause] = field(default_factory=list)
    """The operator's pauses of a workflow, one at a time (the last may still hold)."""
    timeouts: dict[str, float] = field(default_factory=dict)
    """Nap run -> the workflow timeout it is started with (``start(timeout=)``)."""
    busy_hold: tuple[sqlite3.Connection, float] | None = None
    """SQLite: the connection holding the write lock across a SIGCONT, and when it lets go
    (monotonic)."""

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        # the approval gates draw from a generator of their own, so that adding them left
        # every earlier seed's plan and schedule of actions as it was
        self.gate_rng = random.Random(f"{self.seed}:gates")
        self.wait_rng = random.Random(f"{self.seed}:waits")

    # -- processes ---------------------------------------------------------------------------
    def env(self) -> dict[str, str]:
        return self.services.worker_env(self.tmp)

    def start_worker(self) -> subprocess.Popen[bytes]:
        n = len(self.procs)
        loop = self.loops if self.loops != "mixed" else ("asyncio", "trio")[n % 2]
        log = (self.tmp / f"worker-{n}.log").open("ab")
        proc = subprocess.Popen(
            [sys.executable, "-m", "durable.worker", "--db",
             self.db_url if self.proxy is None else self.proxy.url(self.db_url),
             "--import", "workflows", "--import", "scripts._torture_flows",
             "--lease", str(self.lease), "--poll", "0.05",
             "--grace", str(GRACE), "--concurrency", "8", "--log-level", "warning",
             "--backend", loop],
            cwd=ROOT, env=self.env(), start_new_session=True, stdin=subprocess.DEVNULL,
            stdout=log, stderr=subprocess.STDOUT)
        log.close()
        self.procs.append(proc)
        self.live.append(proc)
        self.counts["worker starts"] += 1
        self.counts[f"worker starts on {loop}"] += 1
        return proc

    def frozen_pids(self) -> set[int]:
        return {f.pid for f in self.freezes if f.continued_at is None}

    def pick_worker(self, holding: set[int] | None = None) -> subprocess.Popen[bytes] | None:
        """A live worker that is not frozen; one of ``holding`` (pids) when there is one."""
        frozen = self.frozen_pids()
        choices = [p for p in self.live if p.poll() is None and p.pid not in frozen]
        busy = [p for p in choices if holding and p.pid in holding]
        return self.rng.choice(busy or choices) if choices else None

    async def holders(self, client: durable.Client) -> set[int]:
        """The pids of the workers holding running runs (``host:pid:suffix`` worker ids)."""
        return {int(r.worker.split(":")[1]) for r in
                await client.list(state=durable.RunState.RUNNING, limit=1000) if r.worker}

    def kill_all(self) -> None:
        """SIGKILL every process group this run started (their git children too)."""
        for proc in self.procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGCONT)
                os.killpg(proc.pid, signal.SIGKILL)
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)

    # -- the plan ----------------------------------------------------------------------------
    async def seed_world(self, client: durable.Client) -> None:
        slots = max(2, self.runs // 2)  # most resets find their slot occupied
        audio_jobs = max(1, self.runs // 4)
        repositories: list[dict[str, Any]] = [
            {"workspace": "templates", "slug": "starter", "files": TEMPLATE_FILES}]
        for i in range(slots):
            name = f"s{i}"
            repositories.append({"workspace": "slots", "slug": name,
                                 "files": {"README.md": f"work done in {name}\n"}})
            self.services.seed(
                applications=[{
                    "uuid": f"app-{name}", "name": name,
                    "envs": [{"key": "API_KEY", "value": "s3cret-value"},
                             {"key": "DEBUG", "value": "1"}],
                    "volumes": [{"uuid": f"vol-{name}", "name": "data", "mount_path": "/data"}],
                    "file_storages": [{"uuid": f"file-{name}", "mount_path": "/etc/app.conf"}],
                }],
                databases=[{"uuid": f"db-{name}"}])
            await seed_slot(client, Slot(name, app=f"app-{name}", project=f"proj-{name}",
                                         database=f"db-{name}", repository=f"slots/{name}",
                                         template="templates/starter"))
        self.services.seed(repositories=repositories)
        per_key: dict[str, list[tuple[str, list[Any]]]] = defaultdict(list)
        for _ in range(self.runs):
            if self.rng.random() < 0.4:
                job = f"job{self.rng.randrange(audio_jobs)}"
                texts = [f"{job} text {i} " + "la " * self.rng.randrange(1, 30)
                         for i in range(self.rng.randrange(3, 7))]
                per_key[job].append(("audio.batch", [job, VOICE, texts, 2]))
            else:
                slot = f"s{self.rng.randrange(slots)}"
                per_key[slot].append(("slot.reset", [slot]))
        for slot in sorted(k for k in per_key if k.startswith("s")):
            if self.rng.random() < 0.5:  # a teardown retires the slot: last on its key
                per_key[slot][-1] = ("slot.teardown", [slot])
        for runs in per_key.values():  # some wait for an operator's approval of their plan
            for i, (workflow, args) in enumerate(runs):
                if workflow.startswith("slot.") and self.gate_rng.random() < GATED_SHARE:
                    runs[i] = (workflow, [*args, {"approval": True}])
        # interleave the keys, each key's runs in order (queued behind one another)
        queues = {k: list(v) for k, v in sorted(per_key.items())}
        while queues:
            key = self.rng.choice(sorted(queues))
            workflow, args = queues[key].pop(0)
            self.plan.append((workflow, args, key, f"{workflow.split('.')[1]}-{key}-"
                              f"{len(self.plan)}"))
            if not queues[key]:
                del queues[key]
        # durable waiting: sleeps and waits shorter and longer than the workers' threshold
        # (2 s: a longer one releases the run), placed among the others by a generator of
        # their own
        for i in range(max(2, round(NAP_SHARE * self.runs))):
            seconds, timeout = (round(self.wait_rng.choice(
                [self.wait_rng.uniform(0.3, 1.8), self.wait_rng.uniform(2.0, 4.0)]), 3)
                for _ in range(2))
            run_id = f"nap-{i}"
            self.plan.insert(self.wait_rng.randrange(len(self.plan) + 1), (
                "torture.nap", [f"nap{i}", VOICE, seconds, timeout], None, run_id))
            self.naps.append(run_id)
        # workflow timeouts on some of them, from a generator of their own again (each
        # earlier seed's plan and schedule of actions stay as they were)
        timed = random.Random(f"{self.seed}:timeouts")
        for run_id in self.naps:
            if timed.random() < TIMED_SHARE:
                self.timeouts[run_id] = round(timed.uniform(3.0, 9.0), 3)

    async def start_next(self, client: durable.Client) -> None:
        workflow, args, key, run_id = self.plan[len(self.started)]
        await client.start(workflow, *args, id=run_id, key=key,
                           timeout=self.timeouts.get(run_id))
        self.started.append(run_id)

    # -- chaos -------------------------------------------------------------------------------
    async def act(self, client: durable.Client, action: str) -> None:
        if action == "start" and len(self.started) < len(self.plan):
            await self.start_next(client)
        elif action in ("kill", "term"):
            proc = self.pick_worker(await self.holders(client))
            if proc is None:
                return
            if action == "kill":
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                self.counts["SIGKILL"] += 1
            else:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGTERM)  # the worker only: a graceful shutdown
                self.counts["SIGTERM"] += 1
            self.live.remove(proc)
            self.start_worker()
        elif action == "freeze" and not self.frozen_pids():
            proc = self.pick_worker(await self.holders(client))
            if proc is None:
                return
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGSTOP)
            now = time.time()
            # past the lease, the renewal period and the sweep: its runs are surely lost
            # every second freeze on SQLite is continued into a busy database (no draw from
            # the generator: every earlier seed's schedule of actions stays as it was)
            busy = self.backend == "sqlite" and len(self.freezes) % 2 == 1
            self.freezes.append(Freeze(proc.pid, now, now + 1.5 * self.lease + 1.5, busy=busy))
            self.counts["SIGSTOP/SIGCONT"] += 1
        elif action == "fault":
            self.inject_fault()
        elif action in ("cancel", "term_cancel"):
            await self.cancel(client, action == "term_cancel")
        elif action == "pg_terminate" and self.backend == "postgres":
            self.counts["PostgreSQL connections terminated"] += terminate_connections(
                self.db_url)
        elif action == "pg_lose" and self.proxy is not None:
            # the next statement of a worker that names a run not finished (a claim, an
            # append, a finish, a renewal, a read): its answer lost after the server ran
            # it, or the statement itself lost; the connection closed either way
            unfinished = sorted(r.id for r in await client.list(limit=1000)
                                if not r.state.finished)
            if not unfinished:
                return
            run_id = self.rng.choice(unfinished)
            if self.rng.random() < 0.5:
                self.proxy.lose_answer_to(run_id)
            else:
                self.proxy.lose_request(run_id)
        elif action == "disk_full" and self.disk is not None and self.full_until is None:
            fill(self.disk)
            self.full_until = time.monotonic() + self.rng.uniform(0.5, 2.5) * self.lease
            self.counts["disk full"] += 1
        elif action == "pause" and (not self.pauses or self.pauses[-1].resuming_at):
            pause = Pause(self.rng.choice(PAUSABLE),
                          time.monotonic() + self.rng.uniform(1.0, 4.0))
            self.pauses.append(pause)  # resumed by the pauser, even if the answer is lost
            await client.pause(pause.workflow, origin={"via": "torture"})
            pause.paused_by = await client.store.now()
            self.counts["workflows paused"] += 1
        elif action == "replay":
            done = [r for r in await client.list(limit=1000)
                    if r.state in (durable.RunState.FAILED, durable.RunState.CANCELLED)]
            if done:
                run = self.rng.choice(done)
                try:
                    await client.replay(run.id)
                    self.counts["replays"] += 1
                except durable.StoreError:
                    raise  # not a refusal: the database did not answer (a full disk)
                except durable.DurableError:
                    self.counts["replays refused"] += 1

    async def decide(self, client: durable.Client, name: str, *,
                     every: bool = False) -> None:
        """Approve or reject the plan of a started gated run that waits for a decision (with
        ``every``: each of them); sometimes the same decision twice (one signal id: the
        second is no news)."""
        waiting = []
        for run_id in self.started:
            if not self.gated(run_id):
                continue
            run = await client.get(run_id)
            if run.state.finished:
                continue
            gate = approval_view(run, await client.journal(run_id))
            if gate is not None and gate.decision == "waiting":
                waiting.append(run_id)
        targets = waiting if every else [self.gate_rng.choice(waiting)] if waiting else []
        for run_id in targets:
            self.counts["decisions"] += 1
            signal_id = f"torture-{name}-{self.counts['decisions']}"
            try:
                await send_decision(client, run_id, name, {"note": "torture"}, id=signal_id,
                                    origin={"via": "torture"})
                self.counts[f"{name}s"] += 1
                if name == "approve" and self.gate_rng.random() < 0.3:
                    # a double click that got past the form: the same signal again, raw
                    # (send_decision itself refuses a plan already approved; an id sent
                    # with another payload is refused: RunConflictError)
                    [sent] = [s for s in await client.store.list_signals(run_id)
                              if s.signal_id == signal_id]
                    if await client.signal(run_id, name, sent.payload, id=signal_id):
                        self.doubled.append(f"{run_id}: signal {signal_id} recorded twice")
                    self.counts["approvals sent twice, recorded once"] += 1
            except durable.StoreError:
                raise
            except durable.InvalidStateError:  # it finished or was decided meanwhile
                self.counts["decisions refused"] += 1

    def gated(self, run_id: str) -> bool:
        return any(r == run_id and args and args[-1] == {"approval": True}
                   for _, args, _, r in self.plan)

    def inject_fault(self) -> None:
        method, path = self.rng.choice(FAULT_PATHS)
        kind = self.rng.choice(["500", "503", "drop", "drop-after", "500-after", "hang",
                                "slow", "slow"])
        times = self.rng.randrange(1, 3)
        if kind == "slow":  # widens the window in which a kill or a freeze lands mid-step
            self.services.add_fault(path, method=method, latency=self.rng.uniform(0.3, 1.5),
                                    times=self.rng.randrange(1, 5))
        elif kind == "hang":
            self.services.add_fault(path, method=method, hang=True, times=1)
            self.hang_release_at.append(time.monotonic() + self.rng.uniform(0.5, 3.0))
        elif kind.startswith("drop"):
            self.services.add_fault(path, method=method, drop=True, times=times,
                                    phase="after" if kind.endswith("after") else "before")
        else:
            self.services.add_fault(path, method=method, status=int(kind[:3]), times=times,
                                    phase="after" if kind.endswith("after") else "before")
        self.counts[f"fault {kind}"] += 1

    async def cancel(self, client: durable.Client, with_shutdown: bool) -> None:
        runs = [r for r in await client.list(limit=1000) if not r.state.finished]
        if with_shutdown:
            runs = [r for r in runs if r.state is durable.RunState.RUNNING and r.worker]
        if not runs:
            return
        run = self.rng.choice(runs)
        if with_shutdown and run.worker:
            pid = int(run.worker.split(":")[1])
            proc = next((p for p in self.live if p.pid == pid), None)
            if proc is not None and proc.pid not in self.frozen_pids():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGTERM)
                self.live.remove(proc)
                self.start_worker()
                self.counts["SIGTERM"] += 1
        try:
            await client.cancel(run.id)
            self.counts["cancels"] += 1
        except durable.StoreError:
            raise  # not a refusal: the database did not answer (a full disk)
        except durable.DurableError:
            self.counts["cancels refused (already finished)"] += 1

    async def guarded(self, action: Awaitable[None]) -> None:
        """Run one of this script's actions; a write of its own that the database refused
        is counted (a full disk, a connection terminated) or reported (locked out), not
        fatal."""
        try:
            await action
        except durable.StoreError as exc:
            if self.backend == "sqlite" and "database is locked" in str(exc):
                # this script's own write waited out the busy timeout
                self.lockouts.append(self.lock_report(str(exc)))
            elif (self.backend == "postgres" and self.full_until is None
                  and isinstance(exc, durable.StoreUnavailableError)):
                # its own connections are terminated with the workers' (pg_terminate): a
                # read is sent once more on another connection, and both can be cut (while
                # the disk is full, a refusal is counted as the full disk's, below)
                self.counts["script actions cut by a terminated connection"] += 1
            elif self.full_until is None:
                raise
            else:  # its own write (a start, cancel, replay, decision) on the full disk
                self.counts["scheduler writes refused by the full disk"] += 1

    async def decider(self, client: durable.Client) -> None:
        """During the chaos, every 0.3-1.2 s: approve (4 in 5) or reject a waiting plan."""
        while True:
            await anyio.sleep(self.gate_rng.uniform(0.3, 1.2))
            name = "reject" if self.gate_rng.random() < REJECT_SHARE else "approve"
            await self.guarded(self.decide(client, name))

    async def poker(self, client: durable.Client) -> None:
        """During the chaos: every 0.05-0.2 s, look for nap runs that began to wait for their
        signal; for most of them, send it at a time drawn near the wait's deadline."""
        async with anyio.create_task_group() as tg:
            while True:
                await anyio.sleep(self.wait_rng.uniform(0.05, 0.2))
                await self.guarded(self.find_waits(client, tg))

    async def find_waits(self, client: durable.Client, tg: anyio.abc.TaskGroup) -> None:
        for run_id in self.naps:
            if run_id not in self.started or run_id in self.pokes:
                continue
            entries = await client.journal(run_id)
            until = next((e.data.get("until") for e in entries
                          if e.kind is durable.EntryKind.WAIT_STARTED), None)
            if until is None:
                continue  # not waiting yet
            due = (float(until) + self.wait_rng.uniform(-0.4, 0.1)
                   if self.wait_rng.random() < POKE_SHARE else None)
            self.pokes[run_id] = due
            if due is None:
                self.counts["waits left to time out"] += 1
            else:
                self.counts["waits poked near their deadline"] += 1
                tg.start_soon(self.guarded, self.poke(client, run_id, due))

    async def poke(self, client: durable.Client, run_id: str, due: float) -> None:
        await anyio.sleep(max(0.0, due - time.time()))
        try:
            seq = await client.signal(run_id, POKE, {"sent": due}, id=f"poke-{run_id}")
        except durable.StoreError:
            raise
        except durable.InvalidStateError:  # the run finished meanwhile (timed out, a cancel)
            self.counts["pokes refused (the run had finished)"] += 1
            return
        if seq:
            self.poked[run_id] = time.time()  # the signal committed before now
            self.counts["pokes"] += 1

    async def pauser(self, client: durable.Client) -> None:
        """During the chaos, every 50 ms: resume the paused workflow when its time is up."""
        while True:
            await anyio.sleep(0.05)
            if self.pauses and self.pauses[-1].resuming_at is None \
                    and time.monotonic() >= self.pauses[-1].resume_at:
                await self.guarded(self.resume(client))

    async def resume(self, client: durable.Client) -> None:
        pause = self.pauses[-1]
        resuming_at = await client.store.now()
        await client.resume(pause.workflow)
        pause.resuming_at = resuming_at

    async def end_pause(self, client: durable.Client) -> None:
        """After the chaos: the last pause is resumed, whatever it takes (the database may
        refuse a write a moment longer after a terminated connection)."""
        with anyio.fail_after(60):
            while self.pauses and self.pauses[-1].resuming_at is None:
                await self.guarded(self.resume(client))
                if self.pauses[-1].resuming_at is None:
                    await anyio.sleep(0.2)

    async def tender(self) -> None:
        """``tend`` every 50 ms during the chaos, beside the scheduler's actions."""
        while True:
            self.tend()
            await anyio.sleep(0.05)

    def tend(self) -> None:
        """Continue frozen workers when their time is up (a ``busy`` one with SQLite's write
        lock held, ``BUSY_THAW``); wake hung requests."""
        now = time.time()
        if self.busy_hold is not None and time.monotonic() >= self.busy_hold[1]:
            self.let_go()
        for f in self.freezes:
            if f.continued_at is None and now >= f.continue_at:
                if f.busy and self.busy_hold is None:
                    f.busy_held = self.hold_write_lock()
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(f.pid, signal.SIGCONT)
                f.continued_at = time.time()
        if self.full_until is not None and time.monotonic() >= self.full_until:
            self.free_disk()
        due = [t for t in self.hang_release_at if t <= time.monotonic()]
        if due:
            self.services.release()
            self.hang_release_at = [t for t in self.hang_release_at if t > time.monotonic()]

    def hold_write_lock(self) -> bool:
        """Take SQLite's write lock for ``BUSY_THAW`` s, if it is free now (a worker may
        hold it, the frozen one among them: then nothing is held)."""
        conn = sqlite3.connect(sqlite_file(self.tmp, self.disk), timeout=0,
                               isolation_level=None)
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error:
            conn.close()
            self.counts["busy thaws (lock taken elsewhere)"] += 1
            return False
        self.busy_hold = (conn, time.monotonic() + BUSY_THAW)
        self.counts["busy thaws"] += 1
        return True

    def let_go(self) -> None:
        if self.busy_hold is not None:
            conn, self.busy_hold = self.busy_hold[0], None
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            conn.close()

    def calm(self) -> None:
        """End the chaos: no faults, nothing hung, nothing frozen, ``--workers`` alive."""
        self.services.clear_faults()
        self.services.release()
        self.hang_release_at.clear()
        self.free_disk()
        self.let_go()
        for f in self.freezes:
            if f.continued_at is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(f.pid, signal.SIGCONT)
                f.continued_at = time.time()
        self.live = [p for p in self.live if p.poll() is None]
        while len(self.live) < self.workers:
            self.start_worker()

    def free_disk(self) -> None:
        if self.disk is not None:
            (self.disk / FILLER).unlink(missing_ok=True)
        self.full_until = None

    def lock_report(self, error: str) -> str:
        """Who holds the SQLite database's locks now (``/proc/locks``), each holder named
        (a worker, this script) with its state (``T``: stopped); with ``py-spy`` on PATH,
        the stacks of holders that are not stopped are dumped beside the workers' logs
        (``lockout-<pid>.txt``, kept by ``--logs``)."""
        db = sqlite_file(self.tmp, self.disk)
        # readers do not hold a writer up in WAL mode: name the write, checkpoint and
        # recovery locks, and any exclusive lock on the file
        holders = [(pid, what) for pid, what in sqlite_lock_holders(db)
                   if not what.startswith("read") and "(read)" not in what]
        names = {p.pid: f"worker-{i}" for i, p in enumerate(self.procs)}
        names[os.getpid()] = "this script"
        parts = []
        dumped = set()
        for pid, what in holders:
            state = process_state(pid)
            parts.append(f"{names.get(pid, 'pid')} {pid} ({state}) holds {what}")
            # a stopped process (T: frozen by this script) cannot be dumped, nor need be
            if pid not in dumped and pid != os.getpid() and state != "T" and shutil.which(
                    "py-spy"):
                dumped.add(pid)
                with contextlib.suppress(OSError, subprocess.SubprocessError):
                    dump = subprocess.run(["py-spy", "dump", "--pid", str(pid)],
                                          capture_output=True, text=True, timeout=30)
                    (self.tmp / f"lockout-{pid}.txt").write_text(dump.stdout
                                                                        + dump.stderr)
        return f"{error}: " + ("; ".join(parts) or "no writer holds a lock any more")

    async def watch_stuck(self, store: Any) -> None:
        """Note runs running past their lease (plus a sweep's slack) while workers are alive,
        and nap runs left queued past their wake-up (a due sleep or wait: no lease, no key
        in the way, and every worker polls every 50 ms)."""
        now = time.time()
        for run in await store.list_runs(state=durable.RunState.RUNNING, limit=10_000):
            if run.lease_expires_at is not None and run.lease_expires_at < now - 2 * self.lease - 2:
                self.stuck[run.id] = max(self.stuck.get(run.id, 0.0), now - run.lease_expires_at)
        for run in await store.list_runs(state=durable.RunState.QUEUED, limit=10_000):
            if run.id in self.naps and run.run_at < now - WAKE_SLACK:
                self.late_wakes[run.id] = max(self.late_wakes.get(run.id, 0.0), now - run.run_at)

    async def run(self) -> dict[str, Any]:
        """The whole run; SIGTERM cancels it at its next await (never inside a ``Popen`` or
        a kill, which a signal raising at any bytecode could interrupt, leaving a worker
        unrecorded and running), then raises KeyboardInterrupt, as Ctrl-C does."""
        report: dict[str, Any] | None = None
        with anyio.open_signal_receiver(signal.SIGTERM) as signals:
            async with anyio.create_task_group() as group:
                async def stop_on_sigterm() -> None:
                    async for _ in signals:
                        group.cancel_scope.cancel()
                        return
                group.start_soon(stop_on_sigterm)
                if self.backend != "postgres":
                    report = await self._run()
                else:
                    async with losing_proxy(PG_SERVER) as self.proxy:
                        report = await self._run()
                group.cancel_scope.cancel()
        if report is None:
            raise KeyboardInterrupt
        return report

    async def _run(self) -> dict[str, Any]:
        began = time.monotonic()
        chaos_end = began + CHAOS_SHARE * self.budget
        end = began + self.budget
        store = store_from_url(self.db_url, create=False)
        async with durable.Client.connect(self.db_url) as client:
            await self.seed_world(client)
            for _ in range(self.workers):
                self.start_worker()
            for _ in range(max(1, len(self.plan) // 3)):
                await self.start_next(client)
            await store.open()
            try:
                # a frequent schedule, fired by every worker's scheduler through the chaos
                await client.add_schedule(TICK)
                self.tick_window[0] = time.time()
                actions = dict(ACTIONS, disk_full=1) if self.disk is not None else ACTIONS
                async with anyio.create_task_group() as chaos:
                    # frozen workers are continued on time, whatever an action waits for: a
                    # worker frozen inside a SQLite write transaction holds the write lock,
                    # and an action's write waits for it (30 s, then fails) until then
                    chaos.start_soon(self.tender)
                    chaos.start_soon(self.decider, client)
                    chaos.start_soon(self.poker, client)
                    chaos.start_soon(self.pauser, client)
                    while time.monotonic() < chaos_end:
                        action = self.rng.choices(list(actions), list(actions.values()))[0]
                        await self.guarded(self.act(client, action))
                        await anyio.sleep(self.rng.uniform(0.2, 0.6))
                    chaos.cancel_scope.cancel()
                self.calm()
                await self.end_pause(client)
                self.tick_window[1] = time.time()
                await client.delete_schedule(TICK.name)
                while len(self.started) < len(self.plan):
                    await self.start_next(client)
                while time.monotonic() < end:
                    await self.watch_stuck(store)
                    await self.decide(client, "approve", every=True)
                    runs = await store.list_runs(limit=10_000)
                    if all(r.state.finished for r in runs):
                        break
                    await anyio.sleep(0.3)
                await self.shutdown()
                return await self.check(client, store)
            finally:
                await store.aclose()

    async def shutdown(self) -> None:
        """SIGTERM every worker (graceful: they release what they hold) and wait for them."""
        for proc in self.live:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + GRACE + 10
        for proc in self.procs:
            remaining = max(0.0, deadline - time.monotonic())
            with contextlib.suppress(subprocess.TimeoutExpired):
                await anyio.to_thread.run_sync(lambda p=proc, t=remaining: p.wait(timeout=t))
            if proc.poll() is None:
                self.counts["workers that ignored SIGTERM"] += 1
        self.kill_all()

    # -- the checks --------------------------------------------------------------------------
    async def check(self, client: durable.Client, store: Any) -> dict[str, Any]:
        if self.proxy is not None:
            self.counts["PostgreSQL answers lost"] = self.proxy.answers_lost
            self.counts["PostgreSQL statements lost"] = self.proxy.requests_lost
        if self.disk is not None:  # that the full disk reached the workers' writes
            self.counts["worker errors on the full disk"] = sum(
                text.count("disk is full") + text.count("No space left on device")
                for text in (log.read_text(errors="replace")
                             for log in self.tmp.glob("worker-*.log")))
        runs = {r.id: r for r in await store.list_runs(limit=10_000)}
        journals = {run_id: await store.journal(run_id) for run_id in runs}
        ledger = self.services.ledger()
        notes = self.services.notifications()
        on_doubt = {name: a.on_doubt for name, a in durable.default_registry.activities.items()}
        fired = [r for r in runs if r.startswith(f"{TICK.name}@")]
        checks = [
            check_states(runs, self.stuck),
            check_completed_once(journals, ledger),
            check_in_doubt(journals, ledger, on_doubt),
            check_overlap(ledger),
            check_frozen(journals, ledger, self.freezes, self.lease),
            check_billing(ledger),
            check_notifications(notes, journals),
            check_cancels(journals, runs, max(2.5, self.lease)),
            check_worker_logs(sorted(self.tmp.glob("worker-*.log"))),
            check_gates(journals, ledger, [r for r in runs if self.gated(r)], self.doubled),
            check_schedule(fired, *self.tick_window),
            check_waits(journals, ledger, self.naps, self.poked, self.late_wakes),
            check_retries(journals),
            check_pauses(journals, runs, self.pauses),
            check_timeouts(journals, ledger, runs),
        ]
        if self.backend == "sqlite":
            checks.append(("no write of this script locked out (30 s)", not self.lockouts,
                           "; ".join(self.lockouts)[:600] or "none"))
        return {"seed": self.seed, "backend": self.backend, "budget": self.budget,
                "workers": self.workers, "loops": self.loops, "runs": len(self.plan),
                "fires": len(fired),
                "lease": self.lease, "disk_full": self.disk is not None,
                "freezes": [{"pid": f.pid, "stopped_at": f.stopped_at,
                             "continued_at": f.continued_at} for f in self.freezes],
                "states": dict(Counter(r.state.value for r in runs.values())),
                "errors": {r.id: (r.error or "")[:160] for r in runs.values()
                           if r.state is durable.RunState.FAILED},
                "applied": dict(sorted(self.counts.items())),
                "requests": len(ledger),
                "pids": [p.pid for p in self.procs] + [self.services.pid],
                "checks": [{"check": c, "ok": ok, "detail": d} for c, ok, d in checks]}


# -- checks, each a (name, ok, detail) from the journal and the services' ledger ---------------
Check = tuple[str, bool, str]


def _run_of(idempotency_key: str | None) -> str | None:
    return None if not idempotency_key else idempotency_key.split("/", 1)[0]


def check_states(runs: dict[str, Any], stuck: dict[str, float]) -> Check:
    left = sorted(r.id for r in runs.values() if r.state is durable.RunState.RUNNING)
    bad = [f"{i} running after every worker shut down" for i in left]
    bad += [f"{i} sat running {s:.1f}s past its lease" for i, s in sorted(stuck.items())]
    return ("every run finished or resumable (queued), none stuck running", not bad,
            "; ".join(bad) or f"{len(runs)} runs")


def check_completed_once(journals: dict[str, list[Any]], ledger: list[dict[str, Any]]) -> Check:
    """From the journal: a completed step is never started again. From the ledger: no
    attempt after the one that completed a step sent that step's requests."""
    bad = []
    steps = 0
    tokens = defaultdict(set)  # idempotency key -> tokens the service handled requests of
    for x in ledger:
        if x["fencing_token"] is not None and x["handled"]:
            tokens[x["idempotency_key"]].add(x["fencing_token"])
    for run_id, entries in journals.items():
        done: set[str] = set()
        for e in entries:
            if e.kind is durable.EntryKind.RUN_REPLAYED and e.data.get("from_step"):
                done = {k for k in done if int(k.split(":")[0]) < int(e.data["from_step"])} \
                    if all(k.split(":")[0].isdigit() for k in done) else set()
            elif e.kind is durable.EntryKind.STEP_STARTED and e.step_key in done:
                bad.append(f"{run_id} {e.step_key} started again at epoch {e.epoch}")
            elif e.kind is durable.EntryKind.STEP_COMPLETED and e.step_key:
                if e.step_key not in done:
                    later = {t for t in tokens[f"{run_id}/{e.step_key}"] if t > e.epoch}
                    if later and not any(x.kind is durable.EntryKind.RUN_REPLAYED
                                         and x.data.get("from_step") for x in entries):
                        bad.append(f"{run_id} {e.step_key} completed at epoch {e.epoch}, "
                                   f"requests handled for it with token {min(later)}")
                done.add(e.step_key)
                steps += 1
    return ("no completed step executed twice", not bad, "; ".join(bad) or f"{steps} steps")


def check_in_doubt(journals: dict[str, list[Any]], ledger: list[dict[str, Any]],
                   on_doubt: Mapping[str, str]) -> Check:
    """A step left started by an attempt is in doubt; with on_doubt='fail' it is never sent
    again by a later attempt unless an operator asked (replay --rerun-in-doubt)."""
    sent = defaultdict(set)  # idempotency key -> tokens whose request the service handled
    for e in ledger:
        if e["fencing_token"] is not None and e["handled"]:
            sent[e["idempotency_key"]].add(e["fencing_token"])
    bad, surfaced = [], 0
    for run_id, entries in journals.items():
        open_steps: dict[str, tuple[str, int]] = {}  # step key -> (activity, epoch)
        doubt: dict[str, int] = {}  # in-doubt fail step -> epoch it was left in
        rerun_allowed = False
        for e in entries:
            if e.kind is durable.EntryKind.RUN_CLAIMED:
                for key, (name, epoch) in open_steps.items():
                    if on_doubt.get(name) == "fail" and epoch < e.epoch:
                        doubt.setdefault(key, epoch)
                open_steps.clear()
            elif e.kind is durable.EntryKind.RUN_REPLAYED:
                rerun_allowed = e.data.get("in_doubt") == "rerun"
            elif e.kind is durable.EntryKind.STEP_STARTED and e.step_key:
                if e.step_key in doubt and not rerun_allowed:
                    later = {t for t in sent[f"{run_id}/{e.step_key}"] if t > doubt[e.step_key]}
                    if later:
                        bad.append(f"{run_id} {e.step_key} ({e.name}) in doubt since epoch "
                                   f"{doubt[e.step_key]}, sent again with token {min(later)}")
                open_steps[e.step_key] = (e.name or "", e.epoch)
            elif e.step_key and e.kind in (durable.EntryKind.STEP_COMPLETED,
                                           durable.EntryKind.STEP_FAILED,
                                           durable.EntryKind.STEP_RETRYING):
                open_steps.pop(e.step_key, None)
        surfaced += len(doubt)
    return ('in-doubt on_doubt="fail" steps surfaced, never silently re-run', not bad,
            "; ".join(bad) or f"{surfaced} in doubt")


def _overlaps(groups: dict[str, dict[int, list[float]]], what: str) -> list[str]:
    """Tokens whose requests arrived after a higher token's first request (same group)."""
    bad = []
    for name, tokens in groups.items():
        for token, (_, last) in tokens.items():
            newer = [(first, t) for t, (first, _) in tokens.items() if t > token and first < last]
            if newer:
                first, t = min(newer)
                bad.append(f"{what} {name}: token {token} sent a request {last - first:.3f}s "
                           f"after token {t}'s first")
    return bad


def check_overlap(ledger: list[dict[str, Any]]) -> Check:
    """Every request that carried a token (sent, whether the service then refused it or not):
    within a scope and within a run, an attempt's requests all arrive before the next
    attempt's first. A refused request is the service's fence catching what the engine
    should not have sent."""
    by_scope: dict[str, dict[int, list[float]]] = defaultdict(dict)
    by_run: dict[str, dict[int, list[float]]] = defaultdict(dict)
    sent = [e for e in ledger if e["fencing_token"] is not None]
    for e in sent:
        run = _run_of(e["idempotency_key"])
        for groups, name in ((by_scope, e["fencing_scope"]), (by_run, run)):
            if name is None:
                continue
            span = groups[name].setdefault(e["fencing_token"], [e["arrived_at"]] * 2)
            span[0], span[1] = min(span[0], e["arrived_at"]), max(span[1], e["arrived_at"])
    bad = _overlaps(by_scope, "scope") + _overlaps(by_run, "run")
    refused = sum(1 for e in sent if e["refused"])
    return ("per key and per run, no two attempts' requests overlap", not bad,
            "; ".join(bad) or f"{len(sent)} fenced requests, {len(by_scope)} scopes, "
            f"{refused} refused by a service's fence")


def check_frozen(journals: dict[str, list[Any]], ledger: list[dict[str, Any]],
                 freezes: list[Freeze], lease: float) -> Check:
    bad, attempts, short = [], 0, 0
    for f in freezes:
        if f.continued_at is None:
            continue
        if f.continued_at - f.stopped_at < lease + FROZEN_SLACK:
            # continued early by the end of the chaos (calm): its leases may still hold,
            # and it may go on with its runs; nothing to judge
            short += 1
            continue
        mine = f":{f.pid}:"
        for run_id, entries in journals.items():
            for e in entries:
                if (e.kind is durable.EntryKind.RUN_CLAIMED and mine in str(e.data.get("worker"))
                        and e.at < f.stopped_at):
                    attempts += 1
                    late = [x for x in ledger if x["fencing_token"] == e.epoch
                            and _run_of(x["idempotency_key"]) == run_id
                            and x["arrived_at"] > f.continued_at]
                    if late:
                        bad.append(f"{run_id} epoch {e.epoch}: {len(late)} request(s) after "
                                   f"its worker (pid {f.pid}) was continued, e.g. "
                                   f"{late[0]['method']} {late[0]['path']} (claimed "
                                   f"{f.stopped_at - e.at:.3f} s before a freeze of "
                                   f"{f.continued_at - f.stopped_at:.3f} s; the request "
                                   f"{late[0]['arrived_at'] - f.continued_at:.3f} s after it)")
    cut = f" ({short} cut short by the end of the chaos, not judged)" if short else ""
    busy = sum(f.busy_held for f in freezes)
    into = f", {busy} continued into a busy database" if busy else ""
    return ("a frozen-then-continued worker sent nothing for a run it lost", not bad,
            "; ".join(bad) or f"{len(freezes)} freezes{cut}{into}, {attempts} attempts held")


def check_billing(ledger: list[dict[str, Any]]) -> Check:
    billed = Counter(e["idempotency_key"] for e in ledger if e["billed"])
    bad = [f"{k} billed {n} times" for k, n in billed.items() if n > 1 or k is None]
    return ("no TTS item billed twice", not bad, "; ".join(bad) or f"{len(billed)} billed")


def check_notifications(notes: list[dict[str, Any]], journals: dict[str, list[Any]]) -> Check:
    by_key = Counter(n["idempotency_key"] for n in notes)
    bad = [f"{k} delivered {n} times" for k, n in by_key.items() if n > 1 or k is None]
    replayed = {i for i, es in journals.items()
                if any(e.kind is durable.EntryKind.RUN_REPLAYED for e in es)}
    outcomes = Counter((_run_of(n["idempotency_key"]), json.dumps(n["body"].get("outcome")))
                       for n in notes if isinstance(n["body"], dict))
    bad += [f"{run} notified outcome {o} {n} times" for (run, o), n in outcomes.items()
            if n > 1 and run not in replayed]
    return ("no notification sent twice", not bad, "; ".join(bad) or f"{len(notes)} sent")


def check_gates(journals: dict[str, list[Any]], ledger: list[dict[str, Any]],
                gated: list[str], doubled: Sequence[str] = ()) -> Check:
    """A gated run sent no DELETE before an approve of its plan was received (journaled),
    received each signal once, and a signal id sent twice was recorded once, across kills,
    freezes and replays."""
    bad, acted, held = list(doubled), 0, 0
    for run_id in gated:
        entries = journals.get(run_id, [])
        received = [e for e in entries if e.kind is durable.EntryKind.SIGNAL_RECEIVED]
        for seq, n in Counter(e.data.get("seq") for e in received).items():
            if n > 1:
                bad.append(f"{run_id} received signal {seq} {n} times")
        approved = [e.seq for e in received if e.data.get("name") == "approve"]
        started: dict[str, int] = {}
        for e in entries:
            if e.kind is durable.EntryKind.STEP_STARTED and e.step_key:
                started.setdefault(e.step_key, e.seq)
        deletes = [x for x in ledger if x["method"] == "DELETE"
                   and _run_of(x["idempotency_key"]) == run_id]
        for x in deletes:
            at = started.get(x["idempotency_key"].split("/", 1)[1])
            if not approved or at is None or at < approved[0]:
                bad.append(f"{run_id} sent DELETE {x['path']} "
                           + ("with no approve received" if not approved
                              else "before its approve was received"))
        acted += bool(deletes)
        held += not approved
    return ("nothing deleted before its plan was approved", not bad, "; ".join(bad[:5]) or
            f"{len(gated)} gated runs: {acted} deleted after an approve, {held} never approved")


def check_schedule(fired: list[str], since: float, until: float) -> Check:
    """Every fire of TICK between its creation and its deletion started one run (each fire
    is found within the grace while any worker lives: none may be passed over), and none
    after the deletion."""
    times = set()
    for run_id in fired:
        stamp = run_id.split("@", 1)[1].rstrip("Z")
        times.add(dt.datetime.fromisoformat(stamp).replace(tzinfo=dt.UTC).timestamp())
    expected = [float(t) for t in range(math.ceil(since + TICK_MARGIN),
                                         math.floor(until - TICK_MARGIN) + 1) if t % 2 == 0]
    missing = [t for t in expected if t not in times]
    after = sorted(t for t in times if t > until + TICK_MARGIN)
    bad = [f"no run for the fire at {iso(t)}" for t in missing]
    bad += [f"a run for {iso(t)}, after the schedule was deleted" for t in after]
    return ("every fire of the schedule started one run", not bad, "; ".join(bad[:5]) or
            f"{len(times)} fires, {len(expected)} judged")


def _segments(entries: list[Any]) -> list[list[Any]]:
    """A run's journal cut at each replay (a replay starts a pending sleep or wait afresh)."""
    parts: list[list[Any]] = [[]]
    for e in entries:
        if e.kind is durable.EntryKind.RUN_REPLAYED:
            parts.append([])
        parts[-1].append(e)
    return parts


def check_waits(journals: dict[str, list[Any]], ledger: list[dict[str, Any]],
                naps: Sequence[str], poked: Mapping[str, float],
                late_wakes: Mapping[str, float]) -> Check:
    """Durable waiting through the chaos, from each nap run's journal and the ledger. Between
    two replays (a replay starts a sleep or wait left pending afresh, docs/design.md): the
    sleep was journaled once and nothing after it was sent before its wake time; the wait was
    journaled once and ended once, a timeout not before its deadline, and never while a
    signal recorded before the deadline was left unreceived. And no nap run sat queued past
    its wake-up while the workers were well (``late_wakes``)."""
    bad = [f"{run_id} sat queued {late:.1f}s past its wake-up"
           for run_id, late in sorted(late_wakes.items())]
    slept = received = timed_out = 0
    kinds = durable.EntryKind
    for run_id in naps:
        entries = journals.get(run_id, [])
        requests = [x for x in ledger if _run_of(x["idempotency_key"]) == run_id
                    and not str(x["idempotency_key"]).endswith("#0")]
        deadline: float | None = None
        any_received = False
        for part in _segments(entries):
            timers = [e for e in part if e.kind is kinds.TIMER_STARTED]
            waits = [e for e in part if e.kind is kinds.WAIT_STARTED]
            for what, found in (("sleep", timers), ("wait", waits)):
                if len(found) > 1:
                    bad.append(f"{run_id}: its {what} journaled {len(found)} times at once "
                               f"(epochs {', '.join(str(e.epoch) for e in found)})")
            if timers:
                timer = timers[0]
                wake = float(timer.data["until"])
                early: list[str] = [
                    f"{e.kind.value} of step {e.step} {wake - e.at:.3f}s" for e in part
                    if e.step is not None and e.step > (timer.step or 0)
                    and e.kind in (kinds.STEP_STARTED, kinds.TIMER_FIRED)
                    and e.at < wake - CLOCK_SLACK]
                early += [f"{x['method']} {x['path']} {wake - x['arrived_at']:.3f}s"
                          for x in requests
                          if timer.at <= x["arrived_at"] < wake - CLOCK_SLACK]
                if early:
                    bad.append(f"{run_id}: {early[0]} before its sleep's wake time")
                slept += any(e.kind is kinds.TIMER_FIRED for e in part)
            if waits:
                deadline = float(waits[0].data["until"])
            ends = [e for e in part if e.kind in (kinds.SIGNAL_RECEIVED, kinds.SIGNAL_TIMEOUT)]
            if len(ends) > 1:
                bad.append(f"{run_id}: its wait ended {len(ends)} times: "
                           + ", ".join(e.kind.value for e in ends))
            for e in ends:
                if e.kind is kinds.SIGNAL_RECEIVED:
                    received += 1
                    any_received = True
                elif deadline is None:
                    bad.append(f"{run_id}: a wait timed out that was never journaled")
                elif e.at < deadline - CLOCK_SLACK:
                    bad.append(f"{run_id}: its wait timed out {deadline - e.at:.3f}s before "
                               "its deadline")
                elif (not any_received
                      and poked.get(run_id, math.inf) < deadline - CLOCK_SLACK):
                    bad.append(f"{run_id}: its wait timed out although its signal was "
                               f"recorded {deadline - poked[run_id]:.3f}s before the deadline")
                else:
                    timed_out += 1
    return ("every durable sleep and wait ended once, on time", not bad,
            "; ".join(bad[:5]) or f"{len(naps)} nap runs: {slept} slept, {received} "
            f"signals received, {timed_out} waits timed out")


def check_pauses(journals: dict[str, list[Any]], runs: dict[str, Any],
                 pauses: Sequence[Pause]) -> Check:
    """No attempt of a paused workflow began while it was paused: no ``run_claimed`` entry of
    one of its runs is stamped after the pause had committed and before the resume was sent
    (each claim's time is the store's, read before its statement, as the window's ends)."""
    bad: list[str] = []
    judged = claims = 0
    for pause in pauses:
        if pause.paused_by is None or pause.resuming_at is None:
            continue  # its answer was lost: when it took hold is not known
        judged += 1
        for run_id, run in runs.items():
            if run.workflow != pause.workflow:
                continue
            for e in journals[run_id]:
                if e.kind is durable.EntryKind.RUN_CLAIMED:
                    claims += 1
                    if pause.paused_by + CLOCK_SLACK < e.at < pause.resuming_at - CLOCK_SLACK:
                        bad.append(f"{run_id} attempt {e.attempt} claimed at {iso(e.at)}, "
                                   f"while {pause.workflow} was paused ({iso(pause.paused_by)}"
                                   f" to {iso(pause.resuming_at)})")
    return ("no attempt of a paused workflow began while it was paused", not bad,
            "; ".join(bad[:5]) or f"{len(pauses)} pauses, {judged} judged, {claims} claims "
            "of their workflows")


def check_timeouts(journals: dict[str, list[Any]], ledger: list[dict[str, Any]],
                   runs: dict[str, Any]) -> Check:
    """A run's workflow timeout held across its attempts: between two replays (a replay
    counts it anew), no step started and no request of the run arrived later than the
    timeout after the segment's first claim (:data:`TIMEOUT_SLACK` past it), whatever
    attempt, recovery or release came between. Counts the runs that timed out, those
    failed by an attempt claimed after their time ran out, and those such an attempt
    completed (their work was done, their end unrecorded)."""
    kinds = durable.EntryKind
    bad: list[str] = []
    timed = ran_out = overdue = finished_late = 0
    closest = -math.inf  # the latest step start or request, from its deadline
    for run_id, run in sorted(runs.items()):
        timeout = getattr(run, "timeout", None)
        if timeout is None:
            continue
        timed += 1
        parts = _segments(journals.get(run_id, []))
        requests = [x for x in ledger if _run_of(x["idempotency_key"]) == run_id]
        for i, part in enumerate(parts):
            claims = [e for e in part if e.kind is kinds.RUN_CLAIMED]
            if not claims:
                continue
            deadline = claims[0].at + float(timeout)
            ends = parts[i + 1][0].at if i + 1 < len(parts) else math.inf
            starts = [e for e in part if e.kind is kinds.STEP_STARTED]
            sent = [x for x in requests if claims[0].at <= x["arrived_at"] < ends]
            closest = max([closest, *(e.at - deadline for e in starts),
                           *(x["arrived_at"] - deadline for x in sent)])
            late = [f"step {e.step} started" for e in starts
                    if e.at > deadline + TIMEOUT_SLACK]
            late += [f"{x['method']} {x['path']} arrived" for x in sent
                     if x["arrived_at"] > deadline + TIMEOUT_SLACK]
            if late:
                bad.append(f"{run_id}: {late[0]} after its {timeout:g} s timeout ran out "
                           f"({iso(deadline)})")
            for e in part:
                error = str(e.data.get("error", "")) if e.kind is kinds.RUN_FAILED else ""
                if "workflow timed out" in error:
                    ran_out += 1
                    overdue += "did nothing new" in error
                finished_late += e.kind is kinds.RUN_COMPLETED and bool(e.data.get("overdue"))
    return ("every workflow timeout held across attempts", not bad,
            "; ".join(bad[:5]) or f"{timed} timed runs: {ran_out} timed out ({overdue} when "
            f"an attempt was claimed after the time ran out), {finished_late} completed by "
            "such an attempt" + ("" if closest == -math.inf else
                                 f"; the latest step or request {closest:+.3f}s from its "
                                 "deadline"))


def check_retries(journals: dict[str, list[Any]]) -> Check:
    """A retry delay long enough to release the run (``step_retrying`` with ``retry_at``) was
    waited out by every attempt that took the run up again: between two replays (a replay
    starts a pending delay afresh), the step's next try started no earlier than its
    ``retry_at``."""
    bad, waited = [], 0
    for run_id, entries in journals.items():
        for part in _segments(entries):
            due: dict[str, float] = {}
            for e in part:
                if e.kind is durable.EntryKind.STEP_RETRYING and e.step_key and isinstance(
                        e.data.get("retry_at"), int | float):
                    due[e.step_key] = float(e.data["retry_at"])
                elif e.kind is durable.EntryKind.STEP_STARTED and e.step_key in due:
                    retry_at = due.pop(e.step_key)
                    if e.at < retry_at - CLOCK_SLACK:
                        bad.append(f"{run_id} {e.step_key} tried again {retry_at - e.at:.3f}s "
                                   "before its retry time")
                    waited += 1
    return ("every released retry delay waited out", not bad,
            "; ".join(bad[:5]) or f"{waited} released retries")


def iso(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%H:%M:%S")


ENGINE_ERRORS = ("attempt_crashed", "interceptor_failed", "Traceback (most recent call last)")
"""What a worker's log holds only when the engine itself went wrong: an attempt that ended on
an error the engine did not expect, a hook that raised, or a traceback that escaped the
worker's handlers. Faults the torture makes (a full disk, lost connections, kills) are
logged as other events."""


def check_worker_logs(logs: list[Path]) -> Check:
    bad = []
    for log in logs:
        lines = log.read_text(errors="replace").splitlines()
        for i, line in enumerate(lines):
            if any(marker in line for marker in ENGINE_ERRORS) and not (
                    line.startswith("Traceback") and i and any(
                        marker in lines[i - 1] for marker in ENGINE_ERRORS[:2])):
                bad.append(f"{log.name}:{i + 1}: " + " | ".join(lines[i:i + 3])[:400])
    return ("no engine error in the workers' logs", not bad,
            "; ".join(bad[:3]) + (f" (and {len(bad) - 3} more)" if len(bad) > 3 else "")
            if bad else f"{len(logs)} logs")


def check_cancels(journals: dict[str, list[Any]], runs: dict[str, Any], bound: float) -> Check:
    bad, honoured = [], 0
    for run_id, entries in journals.items():
        for i, e in enumerate(entries):
            if e.kind is not durable.EntryKind.RUN_CANCEL_REQUESTED:
                continue
            window = []
            for x in entries[i + 1:]:
                if x.kind is durable.EntryKind.RUN_REPLAYED:
                    break
                window.append(x)
            ended = next((x for x in window if x.kind in (
                durable.EntryKind.RUN_CANCELLED, durable.EntryKind.RUN_COMPLETED,
                durable.EntryKind.RUN_FAILED)), None)
            late = [x for x in window if x.kind is durable.EntryKind.STEP_STARTED
                    and x.at > e.at + bound]
            if ended is None:
                bad.append(f"{run_id}: cancel requested, run still {runs[run_id].state.value}")
            elif ended.kind is not durable.EntryKind.RUN_CANCELLED and ended.at > e.at + bound:
                bad.append(f"{run_id}: cancel requested, run went on and ended "
                           f"{ended.kind.value} {ended.at - e.at:.1f}s later")
            elif late:
                bad.append(f"{run_id}: cancel requested, then {late[0].step_key} started "
                           f"{late[0].at - e.at:.1f}s later")
            else:
                honoured += 1
    return ("every cancel honoured", not bad, "; ".join(bad) or f"{honoured} cancels")


# -- output ------------------------------------------------------------------------------------
def table(report: dict[str, Any]) -> str:
    lines = [f"seed {report['seed']}  backend {report['backend']}  budget {report['budget']}s  "
             f"workers {report['workers']} ({report['loops']})  runs {report['runs']}  "
             f"lease {report['lease']}s",
             "applied: " + ", ".join(f"{k} {v}" for k, v in report["applied"].items()),
             "runs: " + ", ".join(f"{k} {v}" for k, v in sorted(report["states"].items()))
             + f" ({report['fires']} of them started by the schedule)"
             + f"; {report['requests']} requests in the services' ledger", ""]
    for run_id, error in sorted(report["errors"].items()):
        lines.insert(-1, f"  failed {run_id}: {error}")
    width = max(len(c["check"]) for c in report["checks"])
    lines.append(f"{'check'.ljust(width)}  result  detail")
    lines.append(f"{'-' * width}  ------  ------")
    for c in report["checks"]:
        lines.append(f"{c['check'].ljust(width)}  {'pass' if c['ok'] else 'FAIL':6}  {c['detail']}")
    return "\n".join(lines)


DISK_SIZE = "64m"


def mount_refused(why: str) -> NoReturn:
    sys.exit("torture.py: --disk-full puts the database on a tmpfs of its own, and that "
             f"was refused: {why}")


def drop_schema(schema: str) -> None:
    import psycopg

    with psycopg.connect(PG_SERVER, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'.encode())


SHM_LOCKS = {120: "the write lock", 121: "the checkpoint lock", 122: "the recovery lock"}
"""Byte offsets of SQLite's WAL-index (-shm) locks; 123-127 are the read marks."""


def sqlite_lock_holders(db: Path) -> list[tuple[int, str]]:
    """``(pid, what)`` for every POSIX lock held on ``db`` or its ``-shm`` file."""
    files = {}
    for path, label in ((db, "the database file"), (Path(f"{db}-shm"), "-shm")):
        with contextlib.suppress(OSError):
            files[os.stat(path).st_ino] = label
    held = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/locks").read_text().splitlines():
            fields = line.split()
            if len(fields) < 8 or fields[1] != "POSIX":
                continue
            inode = int(fields[5].rsplit(":", 1)[1])
            if inode not in files:
                continue
            start, mode, pid = int(fields[6]), fields[3].lower(), int(fields[4])
            what = (f"{SHM_LOCKS.get(start, f'read mark {start - 123}')} ({mode})"
                    if files[inode] == "-shm" else f"{mode} lock at byte {start}")
            held.append((pid, f"{what} on {files[inode]}" if files[inode] != "-shm" else what))
    return held


def process_state(pid: int) -> str:
    """``R``, ``S``, ``T`` (stopped), ... from ``/proc/<pid>/stat``; ``gone`` if it is."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "gone"


def sqlite_file(tmp: Path, disk: Path | None) -> Path:
    return (disk or tmp) / "torture.db"


@contextlib.contextmanager
def database(backend: str, tmp: Path, disk: Path | None = None) -> Iterator[str]:
    if backend == "sqlite":
        yield f"sqlite:///{sqlite_file(tmp, disk)}"
        return
    schema = f"torture_{uuid.uuid4().hex[:12]}"
    with contextlib.ExitStack() as stack:
        where = ""
        if disk is not None:  # the store's tables on a tablespace on the small disk
            tmp.chmod(0o755)  # for the server's user, on the way to the tablespace
            name = stack.enter_context(pg_tablespace(PG_SERVER, disk, mount_refused))
            where = f"&{tablespace_option(name)}"
        stack.callback(drop_schema, schema)  # dropped first, before any tablespace
        # the application name tags this run's connections, last: terminate_connections
        # reads it off the end
        yield f"{PG_SERVER}?schema={schema}{where}&application_name={schema}"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # one line, exit 2 (no usage block)
        print(f"torture.py: {message}", file=sys.stderr)
        sys.exit(2)


def terminate_connections(db_url: str) -> int:
    """``pg_terminate_backend`` every connection of this run (its application name), as a
    server restart or a network cut would: the workers' pools must recover."""
    import psycopg

    name = db_url.rsplit("application_name=", 1)[1]
    with psycopg.connect(PG_SERVER, autocommit=True) as conn:
        rows = conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                            "WHERE application_name = %s AND pid <> pg_backend_pid()",
                            (name,)).fetchall()
    return len(rows)


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = _Parser(
        prog="torture.py", description="Real workflows and workers under kills, freezes, "
        "faults and races; checks the guarantees from the ledger and the journal.")
    parser.add_argument("--seed", type=int, default=None,
                        help="replay a schedule (default: random)")
    parser.add_argument("--budget", type=float, default=60.0, metavar="SECONDS",
                        help="wall-clock budget: chaos for 60%%, then settling (default 60)")
    parser.add_argument("--workers", type=int, default=3, metavar="N", help="default 3")
    parser.add_argument("--runs", type=int, default=12, metavar="N", help="default 12")
    parser.add_argument("--backend", choices=["sqlite", "postgres"], default="sqlite",
                        help="the store (default sqlite; postgres: 127.0.0.1:5432, db test)")
    parser.add_argument("--lease", type=float, default=2.0, metavar="SECONDS", help="default 2")
    parser.add_argument("--loops", choices=["asyncio", "trio", "mixed"], default="mixed",
                        help="the workers' event loop; mixed: every second worker started "
                        "runs on trio (default mixed)")
    parser.add_argument("--disk-full", action="store_true",
                        help="the database on a tmpfs of its own (mounting it needs root; "
                        "PostgreSQL: its tables, on a tablespace there), filled to the last "
                        "byte now and then for a while")
    parser.add_argument("--keep", type=Path, default=None, metavar="FILE",
                        help="SQLite: keep a copy of the database in FILE, to read it after "
                        "(python -m durable show ID --db sqlite:///FILE)")
    parser.add_argument("--logs", type=Path, default=None, metavar="DIR",
                        help="keep the workers' logs (worker-N.log) in DIR, also when the run "
                        "ends on an error")
    parser.add_argument("--report", type=Path, default=None, metavar="FILE",
                        help="also write the results as JSON to FILE")
    args = parser.parse_args(argv)
    for name, low, high in (("budget", 5, 3600), ("workers", 1, 16), ("runs", 1, 200),
                            ("lease", 0.5, 60)):
        value = getattr(args, name)
        if not low <= value <= high:
            parser.error(f"--{name} must be between {low} and {high}, not {value}")
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(2**32)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    # this script's own pool replaces the connections it terminates: psycopg_pool says so on
    # stderr, once per connection, which is the point of the exercise, not news
    logging.getLogger("psycopg.pool").setLevel(logging.ERROR)
    print(f"torture: seed {args.seed} (replay with --seed {args.seed})", flush=True)
    # SIGTERM ends it as Ctrl-C does, through the finally that kills what it started (by
    # default it ended at once, and left its workers running on a deleted database); while
    # the run's event loop runs, Torture.run receives it instead
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    with tempfile.TemporaryDirectory(prefix="durable-torture-") as tmp_name:
        tmp = Path(tmp_name)
        with contextlib.ExitStack() as stack:
            disk = (stack.enter_context(tmpfs(tmp / "disk", DISK_SIZE, mount_refused))
                    if args.disk_full else None)
            services = stack.enter_context(running_fake_services(tmp / "git"))
            db_url = stack.enter_context(database(args.backend, tmp, disk))
            torture = Torture(args.seed, args.budget, args.workers, args.runs, args.backend,
                              args.lease, tmp, services, db_url, loops=args.loops,
                              disk=disk)
            try:
                report = anyio.run(torture.run)
            finally:
                signal.signal(signal.SIGTERM, signal.SIG_IGN)  # stopping already: clean up
                torture.kill_all()
                if args.logs is not None:
                    args.logs.mkdir(parents=True, exist_ok=True)
                    for log in [*tmp.glob("worker-*.log"), *tmp.glob("lockout-*.txt")]:
                        shutil.copyfile(log, args.logs / log.name)
            if args.keep is not None and args.backend == "sqlite":
                shutil.copyfile(sqlite_file(tmp, disk), args.keep)
    print(table(report))
    if args.report is not None:
        args.report.write_text(json.dumps(report, indent=2))
    return 0 if all(c["ok"] for c in report["checks"]) else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM, after the finally blocks killed it all
        print("torture: stopped; every process it started was killed", file=sys.stderr)
        sys.exit(130)
