"""The plans of the store's statements that read ``durable_runs``: each reads the index its
comment names, and none scans the table (migration 007 made several indexes partial: a
partial index serves a statement only when the statement's WHERE implies the index's).

SQLite: ``EXPLAIN QUERY PLAN`` of every named statement of ``queries.sql`` on a store with
runs in every state (no ANALYZE: the store never runs it). PostgreSQL: the generic plan
(a prepared statement's, whatever the parameters are) of the prune statements, which read
the partial ``durable_runs_by_end``. The list filters' plans: tests/test_store_console.py.
"""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from durable._clock import FakeClock
from durable._types import Fence, NewRun, RunState
from durable.store._base import SCHEMA_VERSION
from durable.store._sqlite import Q, SqliteStore, _append_sql
from tests.pg import connect_sync, pg_url, postgres_server
from tests.test_store_contract import clock, store_url

__all__ = ["clock", "pg_url", "postgres_server", "store_url"]

pytestmark = pytest.mark.anyio

# a value for every parameter of the statements below (the plan does not depend on them,
# except that a NULL :run_id keeps the claim on the queue)
VALUES: dict[str, Any] = {
    "state": "completed", "now": 1e9, "limit": 10, "run_id": None, "epoch": 3, "workflows": None,
    "worker": "w", "lease": 30.0, "cutoff": 1e9, "after_at": 0.0, "after_id": "", "ids": '["a"]',
    "held": '[["a", 1]]', "details": "{}", "key": "k1", "workflow": "wf", "name": "n",
    "id": "r1", "after": 0, "max_recoveries": 3, "cancelled_error": "x", "waiting_for": None,
    "seen_signals": 0, "run_at": None, "result": None, "error": None, "cap": 512,
}
# statement -> (a plan line that must be there, ...)
EXPECTED: dict[str, tuple[str, ...]] = {
    "claim": ("SEARCH r USING INDEX durable_runs_queue (run_at<?)",
              "SEARCH durable_runs USING COVERING INDEX durable_runs_epoch (epoch>?)",
              # the key's running run (009's key+state index, covering; the unique
              # durable_runs_one_running_per_key before it: a seek either way)
              "SEARCH x USING COVERING INDEX durable_runs_by_key_state "
              "(concurrency_key=? AND state=?)",
              "SEARCH y USING INDEX durable_runs_queued_by_key (concurrency_key=?)"),
    "claim_run": ("SEARCH r USING INDEX sqlite_autoindex_durable_runs_1 (id=?)",
                  "SEARCH durable_runs USING COVERING INDEX durable_runs_epoch (epoch>?)",
                  "SEARCH y USING INDEX durable_runs_queued_by_key (concurrency_key=?)"),
    "claimable": ("SEARCH r USING INDEX durable_runs_queue (run_at<?)",
                  "SEARCH y USING INDEX durable_runs_queued_by_key (concurrency_key=?)"),
    "next_run_at": ("SEARCH durable_runs USING INDEX durable_runs_queue",),
    # the worker's wait for a run not due yet: the queue index's range after now, in order
    "next_due": ("SEARCH r USING INDEX durable_runs_queue (run_at>?)",),
    "queue_stats": ("SEARCH durable_runs USING INDEX durable_runs_queue (run_at<?)",),
    "prunable_runs": ("SEARCH durable_runs USING INDEX durable_runs_by_end "
                      "(state=? AND (updated_at,id)>(?,?) AND updated_at<?)",),
    "prune_mark": ("SEARCH durable_runs USING INDEX durable_runs_by_end "
                   "(state=? AND updated_at<?)",),
    "prune_delete_runs": ("SEARCH durable_runs USING INDEX sqlite_autoindex_durable_runs_1 "
                          "(id=?)",),
    "latest_run": ("SEARCH durable_runs USING INDEX durable_runs_by_key_workflow "
                   "(concurrency_key=? AND workflow=?)",),
    # a key's runs of a workflow, counted (it picks the list's leading index): index only
    "key_workflow_rows": ("SEARCH durable_runs USING COVERING INDEX "
                          "durable_runs_by_key_workflow (concurrency_key=? AND workflow=?)",),
    "recover_stale": ("SEARCH durable_runs USING INDEX durable_runs_by_state (state=?)",),
    "any_expired": ("SEARCH durable_runs USING INDEX durable_runs_by_state (state=?)",),
    "renew": ("SEARCH durable_runs USING INDEX durable_runs_by_state (state=?)",),
    # an id prefix's count, which picks the list's leading index: the primary key's index
    # alone (covering: no table row read)
    "id_prefix_rows": ("SEARCH durable_runs USING COVERING INDEX "
                       "sqlite_autoindex_durable_runs_1 (id>? AND id<?)",),
    # the cancels a worker looks for after a change signal: 010's partial index alone,
    # whatever the worker holds (not every running run by durable_runs_by_state)
    "cancels_pending": ("SCAN durable_runs USING INDEX durable_runs_cancel_pending",),
    # the fence of a step's append: the run's row by its id, once per statement
    "append_entries": ("SEARCH durable_runs USING INDEX sqlite_autoindex_durable_runs_1 "
                       "(id=?)", "SCAN 2 CONSTANT ROWS"),
}
# the claim's order and the list's come from their index: no sort
UNSORTED = {"claim", "claimable", "latest_run", "next_due", "prunable_runs", "prune_mark"}
# fragments and templates (planned as parts of the statements above, or, list_unfinished,
# in tests/test_store_unfinished.py), and bulk seeding
SKIP = re.compile(r"runs_where_.*|claim_which_.*|claimable_where|recover_which_.*|recover"
                  r"|list_runs|list_unfinished|count_runs|seed_run|insert_run")


async def test_every_statement_on_the_runs_reads_its_index(tmp_path: Path) -> None:
    path = tmp_path / "plans.db"
    store = SqliteStore(str(path), clock=FakeClock(start=1000.0))
    await store.open()
    try:
        for i in range(len(RunState)):
            for j in range(3):
                await store.create_run(
                    NewRun(f"r{i}{j}", "wf", [], f"k{i}{j}" if j else None, 1000.0))
    finally:
        await store.aclose()
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        for i, state in enumerate(RunState):  # rows in every state: the plans need no history
            conn.execute("UPDATE durable_runs SET state = ?, epoch = ? WHERE id LIKE ?",
                         (state.value, i, f"r{i}%"))
        seen: dict[str, list[str]] = {}
        for name, query in sorted(Q.items()):
            if SKIP.fullmatch(name) or "durable_runs" not in query:
                continue
            params: dict[str, Any] | list[Any] = {
                p: VALUES.get(p, "x") for p in re.findall(r":(\w+)", query)}
            if name == "append_entries":  # a template: planned as a pair (positional)
                query, params = _append_sql(2), ["r00", 0, 1000.0] + ["x"] * 12
            if name == "id_prefix_rows":  # a template: the prefix's range goes in
                query = query.replace("/*prefix*/", Q["runs_where_id_prefix"])
                params = {"id_prefix": "r", "id_prefix_end": "s", "cap": 512}
            steps = [row[3] for row in conn.execute("EXPLAIN QUERY PLAN " + query, params)]
            seen[name] = steps
            # a table scan of the runs (by any alias): every statement reads an index
            assert not any(re.fullmatch(r"SCAN (durable_runs|[a-z])", s) for s in steps), (
                name, steps)
            for line in EXPECTED.get(name, ()):
                assert line in steps, (name, line, steps)
            if name in UNSORTED:
                assert not any("TEMP B-TREE" in s for s in steps), (name, steps)
        assert set(EXPECTED) <= set(seen), set(EXPECTED) - set(seen)
    finally:
        conn.close()


@pytest.mark.parametrize(
    "anyio_backend", ["asyncio", "trio"])
async def test_postgres_prune_reads_the_partial_end_index_in_a_generic_plan(
        pg_url: str) -> None:
    """A prepared statement's generic plan does not know %(state)s: the statement's own
    ``state IN (...)`` is what lets it read the partial index (psycopg prepares a statement
    run five times)."""
    import durable
    from durable.store._postgres import Q as PQ

    async with durable.Client.connect(pg_url):  # the schema
        pass
    values: dict[str, Any] = {"state": "completed", "cutoff": 100.0, "after_at": 0.0,
                              "after_id": "", "limit": 10, "now": 1e9}
    with connect_sync(pg_url) as conn:
        conn.execute(
            "INSERT INTO durable_runs (id, workflow, args, state, run_at, created_at, updated_at)"
            " SELECT 'p' || g, 'wf', '[]', CASE WHEN g % 10 = 0 THEN 'queued' "
            "ELSE 'completed' END, g, g, g FROM generate_series(1, 5000) AS g")
        conn.execute("ANALYZE durable_runs")
        conn.execute("SET plan_cache_mode = force_generic_plan")
        for name in ("prunable_runs", "prune_mark"):
            names = list(dict.fromkeys(re.findall(r"%\((\w+)\)s", PQ[name])))
            body = PQ[name]
            for n, param in enumerate(names, start=1):
                body = body.replace(f"%({param})s", f"${n}")
            conn.execute(f"PREPARE plan_{name} AS {body}")
            args = ", ".join(f"'{values[n]}'" for n in names)
            plan = "\n".join(r[0] for r in conn.execute(f"EXPLAIN EXECUTE plan_{name} ({args})"))
            assert "durable_runs_by_end" in plan, (name, plan)
            assert "$1" in plan or "$2" in plan, plan  # generic: the parameters stay symbols


@pytest.mark.parametrize(
    "anyio_backend", ["asyncio", "trio"])
async def test_postgres_cancels_pending_reads_its_partial_index(pg_url: str) -> None:
    """A worker's look for cancels reads migration 010's partial index (the running runs
    with a cancel pending), not every running run: 5,000 runs, 2,000 of them running, 5
    flagged, 2 of those running."""
    import durable
    from durable.store._postgres import Q as PQ

    async with durable.Client.connect(pg_url):  # the schema
        pass
    with connect_sync(pg_url) as conn:
        conn.execute(
            "INSERT INTO durable_runs (id, workflow, args, state, run_at, created_at, updated_at,"
            " cancel_requested) SELECT 'c' || g, 'wf', '[]', CASE WHEN g % 5 < 2 THEN 'running'"
            " ELSE 'completed' END, g, g, g, g % 997 = 0 FROM generate_series(1, 5000) AS g")
        conn.execute("ANALYZE durable_runs")
        plan = "\n".join(r[0] for r in conn.execute("EXPLAIN " + PQ["cancels_pending"]))
        assert "durable_runs_cancel_pending" in plan, plan
        rows = conn.execute(PQ["cancels_pending"]).fetchall()
        assert sorted(r[0] for r in rows) == ["c2991", "c4985"]


async def test_a_store_at_schema_6_upgrades_with_its_runs(
        store_url: str, clock: FakeClock, monkeypatch: pytest.MonkeyPatch) -> None:
    """Migration 007 rebuilds indexes of a table that has rows: after the upgrade every run
    is where it was, the claim takes the queued runs in order (the partial queue) with
    epochs above every earlier one (the partial epoch index), and prune finds the finished
    runs by their end (the partial ``durable_runs_by_end``)."""
    from durable._retention import prune
    from durable.store import _postgres, _sql, _sqlite, store_from_url

    real = _sql.load_migrations

    def up_to_6(dialect: str) -> list[tuple[int, str]]:
        return [(n, script) for n, script in real(dialect) if n <= 6]

    with monkeypatch.context() as patch:
        for module in (_sqlite, _postgres):
            patch.setattr(module, "load_migrations", up_to_6)
            patch.setattr(module, "SCHEMA_VERSION", 6)
            # the statements as a version of schema 6 sent them: without what later
            # migrations added (13's column, 14's table)
            for name, query in list(module.Q.items()):
                if (older := _as_of_schema_12(query)) != query:
                    patch.setitem(module.Q, name, older)
        old = store_from_url(store_url, clock=clock)
        await old.open()
        try:
            assert await old.schema_version() == 6
            for i in range(4):
                await old.create_run(NewRun(f"r{i}", "wf", [], "k" if i < 2 else None,
                                            clock.now()))
            first = await old.claim("w", 30.0, 2)
            assert [r.id for r in first] == ["r0", "r2"]
            for run in first:
                assert await old.finish(Fence(run.id, run.epoch), RunState.COMPLETED)
        finally:
            await old.aclose()
    clock.advance(100.0)
    new = store_from_url(store_url, clock=clock)
    await new.open()
    try:
        assert await new.schema_version() == SCHEMA_VERSION  # 7, and any later one
        assert (await new.count_runs())[RunState.COMPLETED] == 2
        assert (await new.latest_run("wf", "k")).id == "r1"  # type: ignore[union-attr]
        claimed = await new.claim("w", 30.0, 10)
        assert [r.id for r in claimed] == ["r1", "r3"]
        assert min(r.epoch for r in claimed) > max(r.epoch for r in first)
        pruned: list[str] = []
        assert await prune(new, 50.0, seen=lambda p: pruned.append(p.id)) == 2
        assert sorted(pruned) == ["r0", "r2"]
    finally:
        await new.aclose()


def _as_of_schema_12(query: str) -> str:
    """A statement as it was before schema 13 added ``start_within`` (the inserts) and 14
    ``durable_paused`` (the claims' condition; the pause statements are not sent)."""
    old = query.replace(", start_within)", ")")
    old = re.sub(r",\s*(:start_within\b|%\(start_within\)s::double precision)", "", old)
    old = re.sub(r"\s*AND NOT EXISTS \(SELECT 1 FROM durable_paused AS p WHERE "
                 r"p\.workflow = r\.workflow\)", "", old)
    assert "start_within" not in old, old
    return old
