"""Small helpers for engine tests (no mocks: real stores, real workers, real sockets)."""

from __future__ import annotations

import os
import signal
import socket
import sqlite3
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import anyio

import durable
import durable.testing
from durable.store._sql import load_migrations
from durable.store._sqlite import _split_script

from .conftest import ROOT, subprocess_env


@asynccontextmanager
async def stopped_by_sigterm(proc: anyio.abc.Process, bound: float = 30.0
                             ) -> AsyncIterator[None]:
    """The block, then SIGTERM to ``proc`` and its end within ``bound``; a process still
    running after that (the block or the wait failed) is SIGKILLed with its group."""
    try:
        yield
        proc.send_signal(signal.SIGTERM)
        with anyio.fail_after(bound):
            await proc.wait()
    finally:
        if proc.returncode is None:
            os.killpg(proc.pid, signal.SIGKILL)
            with anyio.move_on_after(10, shield=True):
                await proc.wait()


@asynccontextmanager
async def running_worker(client: durable.Client, registry: durable.Registry,
                         **options: Any) -> AsyncIterator[durable.Worker]:
    """A worker on ``client``'s store running ``registry``'s workflows for the block."""
    async with durable.testing.running_worker(client, registry=registry, **options) as worker:
        yield worker


async def poll(predicate: Callable[[], Any], *, timeout: float = 10.0,
               interval: float = 0.01) -> Any:
    """Evaluate an async or sync predicate until it is truthy; fail after ``timeout``."""
    with anyio.fail_after(timeout):
        while True:
            value = predicate()
            if hasattr(value, "__await__"):
                value = await value
            if value:
                return value
            await anyio.sleep(interval)


async def died_in_step_one(client: durable.Client, workflow: str, run_id: str,
                           activity: str) -> durable.Run:
    """Start ``run_id`` and leave it as a worker that died in step 1 (``activity``) would:
    claimed by ``dead-worker`` (lease 30 s), the step started, nothing after."""
    from durable._types import Fence, JournalWrite

    await client.start(workflow, id=run_id)
    [run] = await client.store.claim("dead-worker", 30.0, 1, run_id=run_id)
    assert await client.store.append(Fence(run.id, run.epoch), [
        JournalWrite(durable.EntryKind.STEP_STARTED, 1, "1", activity, 1, {"args": []})])
    return run


async def given_away(store: durable.Store, run_id: str, epoch: int) -> bool:
    """Whether the store no longer holds ``run_id`` under ``epoch`` (recovered, by a
    worker's sweep or by this call, and maybe claimed again): for a poll after moving a fake
    clock past its lease."""
    await store.recover_stale()
    run = await store.get_run(run_id)
    return run is not None and (run.state is not durable.RunState.RUNNING
                                or run.epoch != epoch)


def kinds(entries: list[durable.JournalEntry]) -> list[str]:
    return [e.kind.value for e in entries]


@contextmanager
def python_process(args: list[str], log: Path, *, env: Mapping[str, str] | None = None,
                   prefix: Sequence[str] = ()) -> Iterator[subprocess.Popen[bytes]]:
    """``python ARGS`` in a session of its own, output appended to ``log`` (never a pipe
    nobody reads); its whole process group is SIGKILLed at exit if still running.
    ``prefix``: a command that runs it (``ip netns exec NAME``: on another host)."""
    with open(log, "ab") as out:
        proc = subprocess.Popen([*prefix, sys.executable, *args], cwd=ROOT,
                                env=dict(env) if env is not None else subprocess_env(),
                                start_new_session=True, stdin=subprocess.DEVNULL,
                                stdout=out, stderr=subprocess.STDOUT)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def at_schema(url: str, version: int) -> None:
    """The database of a store URL (a new SQLite file, or a PostgreSQL URL's schema, not yet
    there) as a durable of schema ``version`` left it: the migrations up to that number,
    nothing later (SQLite in WAL, as every durable opens it)."""
    scripts = [(number, script) for number, script
               in load_migrations("sqlite" if url.startswith("sqlite:") else "postgres")
               if number <= version]
    meta = (f"INSERT INTO durable_meta (key, value) VALUES ('schema_version', '{version}') "
            "ON CONFLICT (key) DO UPDATE SET value = excluded.value")
    if url.startswith("sqlite:///"):
        conn = sqlite3.connect(url[len("sqlite:///"):], isolation_level=None)
        try:
            conn.execute("PRAGMA journal_mode = WAL")
            for _, script in scripts:
                for statement in _split_script(script):
                    conn.execute(statement)
            conn.execute(meta)
        finally:
            conn.close()
        return
    from .pg import connect_sync, split_url

    _, schema = split_url(url)
    with connect_sync(url) as pg:
        pg.execute(f'CREATE SCHEMA "{schema}"'.encode())
        for _, script in scripts:
            pg.execute(script.encode())
        pg.execute(meta.encode())


def tcp_address(address: tuple[str, int]) -> str:
    return f"{int.from_bytes(socket.inet_aton(address[0]), 'little'):08X}:{address[1]:04X}"


def tcp_queues(local: tuple[str, int], remote: tuple[str, int]) -> tuple[int, int] | None:
    """(tx_queue, rx_queue) of the IPv4 TCP socket from ``local`` to ``remote``, from
    /proc/net/tcp: bytes the kernel holds that the peer has not acknowledged, and bytes
    received not yet read; None if no such socket (closed, reset). Both ends name it: a
    listener's address is shared, and a local port may also be in use (or in TIME_WAIT)
    towards another address."""
    wanted = (tcp_address(local), tcp_address(remote))
    with open("/proc/net/tcp") as table:
        for line in table.readlines()[1:]:
            fields = line.split()
            if (fields[1], fields[2]) == wanted:
                tx, rx = fields[4].split(":")
                return int(tx, 16), int(rx, 16)
    return None


def durable_output(db_url: str, *args: str) -> str:
    """``python -m durable ARGS --db DB_URL``'s output, piped (so plain, 100 columns wide);
    it must exit 0."""
    env = subprocess_env()
    env.pop("COLUMNS", None)
    proc = subprocess.run([sys.executable, "-m", "durable", *args, "--db", db_url], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout
