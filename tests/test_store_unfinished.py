"""``Store.list_unfinished``: the queued and the running runs together, newest first, in
keyset pages, one statement per page (so one snapshot): what ``durable cancel`` by filter
reads. On SQLite and PostgreSQL, asyncio and trio; the plans of every filter shape on both
(each state's part read in an index, in the list's order)."""

from __future__ import annotations

import itertools
import re
import sqlite3
from typing import Any

import pytest

from durable._clock import FakeClock
from durable._types import EntryKind, Fence, JournalWrite, NewRun, Run, RunState
from durable.store import Store
from durable.store._base import list_unfinished_query
from tests.pg import connect_sync, pg_url, postgres_server
from tests.test_store_console import KEYS, WORKFLOWS, fill, model, store
from tests.test_store_contract import clock, store_url

__all__ = ["clock", "pg_url", "postgres_server", "store", "store_url"]

pytestmark = pytest.mark.anyio

SHAPES = [dict(shape) for n in range(4) for shape in itertools.combinations(
    [("workflow", "wf.a"), ("key", "k1"), ("before", (1010.0, "x"))], n)]
"""Every filter shape of the listing: workflow, key, cursor, combined."""


async def pages(store: Store, size: int, **filters: Any) -> list[str]:
    seen: list[str] = []
    cursor = None
    while True:
        page = await store.list_unfinished(limit=size, before=cursor, **filters)
        seen += [r.id for r in page]
        if len(page) < size:
            return seen
        cursor = (page[-1].created_at, page[-1].id)


def unfinished(runs: list[Run], **f: Any) -> list[str]:
    """What list_unfinished must answer: the model list's queued and running runs."""
    state_of = {r.id: r.state for r in runs}
    return [i for i in model(runs, **f) if state_of[i] in (RunState.QUEUED, RunState.RUNNING)]


async def test_pages_visit_every_queued_and_running_run_once_in_order(
        store: Store, clock: FakeClock) -> None:
    runs = await fill(store, clock, seed=5)
    states = {r.state for r in runs}
    assert {RunState.QUEUED, RunState.RUNNING, RunState.COMPLETED} <= states
    shapes: list[dict[str, Any]] = [{}, *({"workflow": w} for w in WORKFLOWS),
                                    *({"key": k} for k in KEYS if k),
                                    {"workflow": "wf.a", "key": "k1"}, {"key": "missing"}]
    for f in shapes:
        want = unfinished(runs, **f)
        for size in (1, 2, 5, 100):
            assert await pages(store, size, **f) == want, (f, size)
    assert unfinished(runs)  # (not vacuous)


async def test_a_run_that_changes_state_between_pages_is_read_once(
        store: Store, clock: FakeClock) -> None:
    """Runs r0..r5, r4 and r1 running. After the first page (r5, r4) a worker's shutdown
    releases r1 (running to queued) and a claim takes r2 (queued to running): each is read
    once, on the page of its creation time, in the state it had at that page's read."""
    for i in range(6):
        await store.create_run(NewRun(f"r{i}", "wf", [], None, clock.now()))
        clock.advance(1.0)
    held = {i: (await store.claim("w1", 30.0, 1, run_id=i))[0] for i in ("r4", "r1")}
    first = await store.list_unfinished(limit=2)
    assert [(r.id, r.state) for r in first] == [("r5", RunState.QUEUED),
                                                ("r4", RunState.RUNNING)]
    assert await store.release(Fence("r1", held["r1"].epoch), [JournalWrite(
        EntryKind.RUN_INTERRUPTED, data={"reason": "worker shutdown"})])
    assert await store.claim("w2", 30.0, 1, run_id="r2")
    rest = await store.list_unfinished(limit=100, before=(first[-1].created_at, first[-1].id))
    assert [(r.id, r.state) for r in rest] == [
        ("r3", RunState.QUEUED), ("r2", RunState.RUNNING), ("r1", RunState.QUEUED),
        ("r0", RunState.QUEUED)]


async def test_every_shape_reads_each_state_in_an_index(
        store_url: str, store: Store, clock: FakeClock) -> None:
    """SQLite: each branch searches the state's range of an index led by the state (with
    the workflow or the key before it), in the list's order, and the two are merged
    (``MERGE (UNION ALL)``); no branch scans the table or sorts its index's rows.
    PostgreSQL (statistics, 3,000 runs, 60 unfinished): each branch an index scan, no
    sequential scan of the runs."""
    await fill(store, clock, seed=6)
    if store_url.startswith("sqlite"):
        from durable.store._sqlite import Q

        conn = sqlite3.connect(store_url[len("sqlite:///"):])
        try:
            for f in SHAPES:
                query, params = list_unfinished_query(Q, **f)
                steps = [row[3] for row in conn.execute(
                    "EXPLAIN QUERY PLAN " + query, params | {"limit": 100})]
                index = ("durable_runs_by_key_state (concurrency_key=? AND state=?"
                         if "key" in f else
                         "durable_runs_by_workflow_state (workflow=? AND state=?"
                         if "workflow" in f else "durable_runs_by_state (state=?")
                searches = [s for s in steps if s.startswith("SEARCH durable_runs")]
                assert len(searches) == 2 and all(
                    s.startswith(f"SEARCH durable_runs USING INDEX {index}") for s in searches
                ), (f, steps)
                assert "MERGE (UNION ALL)" in steps, (f, steps)
                assert not any(re.fullmatch(r"SCAN durable_runs.*", s) for s in steps), steps
                # a branch's sort is of the page it read (its LIMIT), never of the index
                for i, step in enumerate(steps):
                    if step.startswith("SEARCH durable_runs"):
                        assert "TEMP B-TREE" not in steps[i + 1], (f, steps)
        finally:
            conn.close()
        return
    from durable.store._postgres import Q as PQ

    with connect_sync(store_url) as conn:
        conn.execute(
            "INSERT INTO durable_runs (id, workflow, args, concurrency_key, state, run_at,"
            " created_at, updated_at) SELECT 'u' || g, 'wf.' || (g % 3), '[]',"
            " CASE WHEN g % 2 = 0 THEN 'k' || g END, CASE WHEN g % 100 = 0 THEN 'queued'"
            " WHEN g % 100 = 1 THEN 'running' ELSE 'completed' END, g, g, g"
            " FROM generate_series(1, 3000) AS g")
        conn.execute("ANALYZE durable_runs")
        for f in SHAPES:
            query, params = list_unfinished_query(PQ, **f)
            plan = "\n".join(r[0] for r in conn.execute(
                "EXPLAIN (COSTS OFF) " + query, params | {"limit": 100}))
            assert plan.count("Index Scan") + plan.count("Index Only Scan") >= 2, (f, plan)
            assert "Seq Scan" not in plan, (f, plan)
