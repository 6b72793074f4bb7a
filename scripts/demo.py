#!/usr/bin/env python3
"""A tour of durable: real workflows against fake services, with real workers and git.

    pip install -e '.[test]' && python scripts/demo.py [--db sqlite:///demo.db]

Starts the fake PaaS / git host / TTS / notifier on loopback (``scripts/fake_services.py``),
a worker subprocess (``python -m durable.worker --import workflows``) on a SQLite file in a
temporary directory (or ``--db``), and runs five scenarios, printing each run's journal:

1. a reset that succeeds;
2. a reset whose force push hangs past its timeout (git is killed mid-push; the recovery
   report lists what was already deleted; the slot stays occupied; one notification);
3. a teardown where one delete fails, then a replay that finishes only what is left;
4. a promote refused because the target repository exists;
5. an audio batch whose worker is SIGKILLed mid-way and resumed by another worker, with
   no item billed twice (the service's ledger is printed).

Exits 0 when every scenario ended as expected, 1 otherwise; leaves no process behind.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import anyio  # noqa: E402

import durable  # noqa: E402
import workflows  # noqa: E402
from durable._report import render_timeline  # noqa: E402
from workflows.audio import item_states  # noqa: E402
from workflows.records import Slot, read_slot, seed_slot  # noqa: E402

try:
    from scripts._fakes.harness import FakeServices, running_fake_services
except ImportError as exc:  # starlette and uvicorn come with the demo extras
    sys.exit(f"demo: the fake services need the demo extras ({exc}); "
             "run: pip install -e '.[demo]'")

GIT_TIMEOUT = 2.0
LEASE = 1.5
VOICE_PATH = "/v1/text-to-speech/narrator"
WIDTH = 100


class DemoFailure(Exception):
    """A scenario did not end as it should."""


def heading(text: str) -> None:
    print(f"\n{'=' * WIDTH}\n{text}\n{'=' * WIDTH}")


def note(text: str) -> None:
    print(f"  > {text}")


def expect(condition: bool, what: str) -> None:
    if not condition:
        raise DemoFailure(what)
    print(f"  ok: {what}")


class Tour:
    def __init__(self, services: FakeServices, tmp: Path, db_url: str, console_url: str):
        self.services = services
        self.tmp = tmp
        self.db_url = db_url
        self.console_url = console_url
        self.workers: list[subprocess.Popen[bytes]] = []

    # -- processes --------------------------------------------------------------------------
    def env(self) -> dict[str, str]:
        env = self.services.worker_env(self.tmp, git_timeout=GIT_TIMEOUT)
        env["DURABLE_CONSOLE_URL"] = self.console_url
        return env

    def start_worker(self, name: str) -> subprocess.Popen[bytes]:
        log = (self.tmp / f"{name}.log").open("ab")
        proc = subprocess.Popen(
            [sys.executable, "-m", "durable.worker", "--db", self.db_url,
             "--import", "workflows", "--lease", str(LEASE), "--poll", "0.05",
             "--grace", "2", "--log-level", "error"],
            cwd=ROOT, env=self.env(), start_new_session=True, stdin=subprocess.DEVNULL,
            stdout=log, stderr=subprocess.STDOUT)
        log.close()
        self.workers.append(proc)
        return proc

    def stop_workers(self) -> None:
        """SIGTERM (graceful) what still runs, then SIGKILL the process groups."""
        for proc in self.workers:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.workers:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # the group: git children too
            except ProcessLookupError:
                pass
            proc.wait(timeout=5)

    # -- seeding and printing ---------------------------------------------------------------
    async def seed(self, client: durable.Client, *names: str) -> None:
        for name in names:
            self.services.seed(
                applications=[{"uuid": f"app-{name}", "name": name,
                               "envs": [{"key": "DATABASE_URL", "value": "postgres://x"},
                                        {"key": "FEATURE_FLAGS", "value": "beta"}],
                               "volumes": [{"uuid": f"vol-{name}", "name": "uploads",
                                            "mount_path": "/data"}]}],
                databases=[{"uuid": f"db-{name}"}],
                repositories=[{"workspace": "slots", "slug": name,
                               "files": {"README.md": f"{name}: a user's work\n"}}])
            await seed_slot(client, Slot(name, app=f"app-{name}", project=f"proj-{name}",
                                         database=f"db-{name}", repository=f"slots/{name}",
                                         template="templates/starter"))

    async def show(self, client: durable.Client, run_id: str) -> durable.Run:
        run = await client.get(run_id)
        entries = await client.journal(run_id)
        print()
        for line in render_timeline(run, entries, console_url=self.console_url,
                                            width=96).splitlines():
            print(f"    {line}")
        print()
        return run

    async def wait(self, client: durable.Client, run_id: str) -> durable.Run:
        return await client.wait(run_id, timeout=60)

    async def slot(self, client: durable.Client, name: str) -> Slot:
        slot = await read_slot(client, name)
        assert slot is not None
        return slot

    # -- scenarios ----------------------------------------------------------------------------
    async def reset_succeeds(self, client: durable.Client) -> None:
        heading("1. A reset that succeeds")
        await client.start("slot.reset", "slot-1", id="reset-slot-1", key="slot-1", delay=0.5)
        note("started with a 0.5 s grace period (client.cancel() would stop it until then)")
        note(f"waiting screen: {await workflows.reset_status(client, 'slot-1')}")
        run = await self.wait(client, "reset-slot-1")
        await self.show(client, run.id)
        status = await workflows.reset_status(client, "slot-1")
        note(f"waiting screen: {status} - {workflows.status.MESSAGES[status]}")
        note(f"and for a slot never reset: {await workflows.reset_status(client, 'slot-9')} - "
             f"{workflows.status.MESSAGES['unknown']}")
        slot = await self.slot(client, "slot-1")
        expect(run.state is durable.RunState.COMPLETED and slot.occupancy == "vacant",
               "slot-1 is vacant, the template was force-pushed with a lease")
        outcomes = [n["body"]["outcome"] for n in self.notifications("slot-1")]
        expect(outcomes == ["reset_finished"], "one notification: reset_finished")

    def notifications(self, slot: str) -> list[dict[str, Any]]:
        return [n for n in self.services.notifications() if n["body"].get("slot") == slot]

    async def reset_hangs(self, client: durable.Client) -> None:
        heading(f"2. A reset whose force push hangs past its {GIT_TIMEOUT:g} s timeout")
        repo = self.services.repo_path("slots", "slot-2")
        before = _git_head(repo)
        pid_file = self.tmp / "hook.pid"
        hook = repo / "hooks" / "pre-receive"
        hook.write_text(f"#!/bin/sh\necho $$ > {pid_file}\nexec sleep 600\n")
        hook.chmod(0o755)
        note("slot-2's repository got a pre-receive hook that never returns")
        await client.start("slot.reset", "slot-2", id="reset-slot-2", key="slot-2")
        run = await self.wait(client, "reset-slot-2")
        await self.show(client, run.id)
        hook_pid = int(pid_file.read_text())
        await _poll(lambda: not _alive(hook_pid))
        expect(run.state is durable.RunState.FAILED, "the run failed at the force push")
        expect(not _alive(hook_pid), f"git and its hook (pid {hook_pid}) were killed, "
                                     "not left running in the background")
        expect(_git_head(repo) == before, f"slots/slot-2 main is still at {before[:12]}")
        slot = await self.slot(client, "slot-2")
        expect(slot.occupancy == "occupied" and "database db-slot-2: deleted"
               in (slot.state_reason or ""),
               "slot-2 stays occupied; its state reason is the recovery report above")
        notes = self.notifications("slot-2")
        expect([n["body"]["outcome"] for n in notes] == ["reset_failed"]
               and notes[0]["body"]["text"] == slot.state_reason,
               "one notification: reset_failed, with the same report (never 'finished')")

    async def teardown_then_replay(self, client: durable.Client) -> None:
        heading("3. A teardown where one delete fails, then a replay that finishes it")
        [repo] = [r for r in self.services.state()["repositories"]
                  if r["full_name"] == "slots/slot-3"]
        fault = self.services.add_fault(  # a teardown deletes a repository by its uuid
            f"/2.0/repositories/slots/{repo['uuid']}", method="DELETE", status=403,
            body={"type": "error", "error": {"message": "missing scope repository:delete"}})
        note("the git host answers 403 to deleting slots/slot-3")
        await client.start("slot.teardown", "slot-3", id="teardown-slot-3", key="slot-3")
        run = await self.wait(client, "teardown-slot-3")
        await self.show(client, run.id)
        slot = await self.slot(client, "slot-3")
        print("    slot-3's state reason starts:")
        for line in (slot.state_reason or "").splitlines()[:4]:
            print(f"      | {line}")
        expect(run.state is durable.RunState.FAILED and slot.lifecycle == "active"
               and slot.repository == "slots/slot-3" and slot.app == "app-slot-3",
               "the run failed; slot-3 keeps every id and lists what remains")
        self.services.clear_faults()
        note(f"fault {fault} removed (the token got its scope); replaying the same run")
        before = len(self.services.ledger())
        await client.replay("teardown-slot-3")
        run = await self.wait(client, "teardown-slot-3")
        await self.show(client, run.id)
        sent = [f"{e['method']} {e['path']}" for e in self.services.ledger()[before:]]
        slot = await self.slot(client, "slot-3")
        expect(sent == [f"DELETE /2.0/repositories/slots/{repo['uuid']}"],
               "the replay sent only the delete that was left (by the repository's uuid)")
        expect(run.state is durable.RunState.COMPLETED and slot.lifecycle == "retired"
               and slot.app is None and slot.repository is None,
               "slot-3 retired, its ids cleared only now")

    async def promote_refused(self, client: durable.Client) -> None:
        heading("4. A promote refused because the target repository exists")
        self.services.seed(repositories=[{"workspace": "acme", "slug": "shop",
                                          "files": {"README.md": "someone else's\n"}}])
        theirs = _git_head(self.services.repo_path("acme", "shop"))
        await client.start("slot.promote", "slot-4", "acme/shop", id="promote-slot-4",
                           key="slot-4")
        run = await self.wait(client, "promote-slot-4")
        await self.show(client, run.id)
        posts = [e for e in self.services.ledger(method="POST")
                 if e["path"].startswith("/2.0/")]
        expect(run.state is durable.RunState.FAILED and not posts
               and _git_head(self.services.repo_path("acme", "shop")) == theirs,
               "nothing was created or pushed; acme/shop is untouched")

    async def audio_survives_sigkill(self, client: durable.Client,
                                     worker: subprocess.Popen[bytes]) -> None:
        heading("5. An audio batch whose worker is killed (SIGKILL) mid-way")
        texts = [f"Chapter {i}." for i in range(8)]
        self.services.add_fault(VOICE_PATH, method="POST", latency=0.4, phase="after")
        note("the TTS service bills each call, then takes 0.4 s to answer")
        await client.start("audio.batch", "job-42", "narrator", texts, 2, id="audio-job-42",
                           key="job-42")

        def paid_and_unanswered() -> list[dict[str, Any]]:
            ledger = self.services.ledger(path=VOICE_PATH)
            answered = [e for e in ledger if e["ended_at"] is not None]
            waiting = [e for e in ledger if e["billed"] and e["ended_at"] is None]
            return waiting if len(answered) >= 2 else []

        in_flight = await _poll(paid_and_unanswered)
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait(timeout=10)
        states = item_states(await client.journal("audio-job-42"), len(texts))
        note(f"killed worker pid {worker.pid} with SIGKILL while "
             f"{in_flight[0]['idempotency_key']} was billed but not yet answered")
        note("items: " + ", ".join(f"{i}:{s}" for i, s in states.items()))
        stuck = await client.store.get_run("audio-job-42")
        note(f"the run is still '{stuck.state if stuck else '?'}', held by a dead worker "
             f"until its {LEASE:g} s lease lapses")
        second = self.start_worker("worker-2")
        note(f"started worker pid {second.pid}; it recovers the run and resumes it")
        run = await self.wait(client, "audio-job-42")
        await self.show(client, run.id)
        ledger = self.services.ledger(path=VOICE_PATH)
        calls = Counter(e["idempotency_key"] for e in ledger)
        billed = Counter(e["idempotency_key"] for e in ledger if e["billed"])
        print(f"    {'idempotency key':<36} {'calls':>5} {'billed':>6}")
        for key in sorted(calls):
            print(f"    {key:<36} {calls[key]:>5} {billed[key]:>6}")
        expect(run.state is durable.RunState.COMPLETED, "the batch completed on worker 2")
        expect(len(billed) == len(texts) and set(billed.values()) == {1},
               f"every item billed exactly once ({sum(billed.values())} billed calls for "
               f"{len(texts)} items; {sum(calls.values()) - len(calls)} resent call(s) "
               "answered from the idempotency record)")

    async def run(self) -> None:
        async with durable.Client.connect(self.db_url, console_url=self.console_url) as client:
            if await client.list(limit=1):
                raise DemoFailure(f"{self.db_url} already has runs; give a new database")
            await self.seed(client, "slot-1", "slot-2", "slot-3", "slot-4")
            self.services.seed(repositories=[{"workspace": "templates", "slug": "starter",
                                              "files": {"README.md": "# starter\n"}}])
            worker = self.start_worker("worker-1")
            heading("durable demo")
            print(f"  fake services  {self.services.url} (PaaS, git host, TTS, notifier; "
                  f"pid {self.services.pid})")
            print(f"  database       {self.db_url}")
            print(f"  worker         pid {worker.pid}: python -m durable.worker "
                  "--import workflows")
            print(f"  console links  {self.console_url} (the console is not part of the demo)")
            await self.reset_succeeds(client)
            await self.reset_hangs(client)
            await self.teardown_then_replay(client)
            await self.promote_refused(client)
            await self.audio_survives_sigkill(client, worker)


def _git_head(bare: Path) -> str:
    return subprocess.run(["git", "rev-parse", "refs/heads/main"], cwd=bare, check=True,
                          capture_output=True, text=True).stdout.strip()


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


async def _poll(predicate: Callable[[], Any], timeout: float = 20.0) -> Any:
    """Poll ``predicate`` (state in another process: no event to wait on), bounded."""
    with anyio.fail_after(timeout):
        while not (value := predicate()):  # noqa: ASYNC110
            await anyio.sleep(0.02)
        return value


@contextmanager
def _database(db: str | None) -> Iterator[tuple[str, Path]]:
    with tempfile.TemporaryDirectory(prefix="durable-demo-") as tmp:
        yield db or f"sqlite:///{Path(tmp) / 'demo.db'}", Path(tmp)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", help="database URL (default: SQLite in a temp directory)")
    parser.add_argument("--console-url", default="http://localhost:8080",
                        help="base URL for console links in messages")
    args = parser.parse_args(argv)
    durable.configure_logging(level="error")
    started = time.monotonic()
    with _database(args.db) as (db_url, tmp), running_fake_services() as services:
        tour = Tour(services, tmp, db_url, args.console_url)
        try:
            anyio.run(tour.run)
        except DemoFailure as exc:
            print(f"\nDEMO FAILED: {exc}", file=sys.stderr)
            for log in sorted(tmp.glob("worker-*.log")):
                print(f"--- {log.name}\n{log.read_text()[-3000:]}", file=sys.stderr)
            return 1
        finally:
            tour.stop_workers()
    heading(f"All five scenarios ended as expected in {time.monotonic() - started:.1f} s.")
    if args.db:
        print(f"  Look again: python -m durable show reset-slot-2 --db {json.dumps(args.db)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
