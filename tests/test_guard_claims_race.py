"""A claim on PostgreSQL never takes a run that another transaction's claim holds: its
candidates are locked with ``FOR UPDATE SKIP LOCKED`` and its update checks the run is still
queued. Without both, a claim that read the run as queued before the other committed would
wait on the row and then take it again, a second attempt of one run with a higher epoch.

Deterministic, on the real server: another connection's claim of the run is left open (its
row locked, not committed), the store's claim runs beside it, and that transaction commits
only once the store's claim has ended or is seen waiting on its lock (``pg_blocking_pids``).
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from durable._types import NewRun, RunState
from durable.store import store_from_url

from .helpers import poll
from .pg import pg_url, postgres_server, split_url

psycopg = pytest.importorskip("psycopg")

__all__ = ["pg_url", "postgres_server"]

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # its rival: psycopg's async API
async def test_a_claim_beside_another_s_uncommitted_claim_of_the_run_takes_nothing(
        pg_url: str) -> None:
    store = store_from_url(pg_url)
    await store.open()
    try:
        await store.create_run(NewRun("r", "wf", [], None, None))
        base, schema = split_url(pg_url)
        options = f"-c search_path={schema}"
        async with await psycopg.AsyncConnection.connect(base, options=options) as other, \
                await psycopg.AsyncConnection.connect(base, autocommit=True) as looker:
            # another worker's claim, under way: the row changed and locked, not committed
            await other.execute(
                "UPDATE durable_runs SET state = 'running', worker = 'other', "
                "attempt = attempt + 1, epoch = nextval('durable_epochs'), "
                "lease_expires_at = updated_at + 30 WHERE id = 'r'")
            other_pid = other.info.backend_pid
            took: list[Any] = []
            ended = anyio.Event()

            async def claim() -> None:
                took.extend(await store.claim("me", 30.0, 10))
                ended.set()

            async def waits_on_the_other() -> bool:
                cur = await looker.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE %s = ANY "
                    "(pg_blocking_pids(pid))", (other_pid,))
                row = await cur.fetchone()
                return bool(row and row[0])

            async with anyio.create_task_group() as tg:
                tg.start_soon(claim)
                await poll(lambda: ended.is_set() or waits_on_the_other(), timeout=10)
                await other.commit()
                with anyio.fail_after(10):
                    await ended.wait()
        assert took == []  # it skipped the locked run: it is the other's
        run = await store.get_run("r")
        assert run is not None and (run.state, run.worker, run.attempt) == (
            RunState.RUNNING, "other", 1)
    finally:
        await store.aclose()
