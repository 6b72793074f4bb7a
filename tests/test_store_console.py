"""The store's queries for the operator's console: the runs list (filters, keyset pages, id
prefix), counts per state, and the origin of operator actions in the journal.

Every test runs on SQLite and PostgreSQL (as in tests/test_store_contract.py),
on asyncio and trio; the query-plan test is SQLite's (PITFALLS.md: ``IS NULL OR`` scans).
"""

from __future__ import annotations

import itertools
import random
import re
import sqlite3
from collections import Counter
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from durable import Client
from durable._clock import FakeClock
from durable._errors import ConfigError
from durable._types import EntryKind, Fence, NewRun, Run, RunState
from durable.store import Store, store_from_url
from durable.store._base import prefix_end
from durable.store._sqlite import count_runs_query, list_runs_query, list_runs_statement
from tests.pg import pg_url, postgres_server
from tests.test_store_contract import clock, store_url

__all__ = ["clock", "pg_url", "postgres_server", "store_url"]

pytestmark = pytest.mark.anyio

IDS = ["a%b-1", "a_b-2", "axb-3", "a%%-4", "a-5", "ab-6", "b-7", "B-8", "é-9", "\uffff-10",
       "\U0010ffff-11", "a\\b-12", "a%b_13", "slot-14", "slot-15", "slot.reset-16"]
WORKFLOWS = ["wf.a", "wf.b", "wf_a"]
KEYS = [None, "k1", "k%", "k_"]
PREFIXES = ["a%", "a_", "a", "a%b", "ax", "slot", "slot.", "é", "\uffff", "\U0010ffff", "zzz",
            "a\\", "B"]


@pytest.fixture
async def store(store_url: str, clock: FakeClock) -> AsyncIterator[Store]:
    s = store_from_url(store_url, clock=clock)
    await s.open()
    try:
        yield s
    finally:
        await s.aclose()


async def fill(store: Store, clock: FakeClock, seed: int, copies: int = 3) -> list[Run]:
    """Runs of several workflows, keys and states; many share a created_at (the clock moves
    only now and then). Returns every run as read back one by one."""
    rnd = random.Random(seed)
    ids: list[str] = []
    for copy in range(copies):
        for base in IDS:
            run_id = f"{base}.{copy}"
            await store.create_run(NewRun(run_id, rnd.choice(WORKFLOWS), [], rnd.choice(KEYS),
                                          clock.now()))
            ids.append(run_id)
            if rnd.random() < 0.4:
                clock.advance(rnd.choice([0.5, 1.0, 2.0]))
    for run_id in ids:
        roll = rnd.random()
        if roll < 0.6:
            claimed = await store.claim("w1", 30.0, 1, run_id=run_id)
            if claimed and roll < 0.45:
                state = rnd.choice([RunState.COMPLETED, RunState.FAILED])
                assert await store.finish(Fence(run_id, claimed[0].epoch), state)
        elif roll < 0.75:
            await store.request_cancel(run_id)
    runs = [await store.get_run(run_id) for run_id in ids]
    assert all(r is not None for r in runs)
    return [r for r in runs if r is not None]


def newest_first(runs: list[Run]) -> list[Run]:
    return sorted(runs, key=lambda r: (r.created_at, r.id), reverse=True)


def model(runs: list[Run], **f: Any) -> list[str]:
    """What list_runs must answer, by a plain Python filter over every run."""
    def keep(r: Run) -> bool:
        return ((f.get("state") is None or r.state is f["state"])
                and (f.get("workflow") is None or r.workflow == f["workflow"])
                and (f.get("key") is None or r.key == f["key"])
                and (f.get("before") is None or (r.created_at, r.id) < f["before"])
                and (f.get("created_from") is None or r.created_at >= f["created_from"])
                and (f.get("created_to") is None or r.created_at < f["created_to"])
                and (not f.get("id_prefix") or r.id.startswith(f["id_prefix"])))
    return [r.id for r in newest_first([r for r in runs if keep(r)])]


FILTERS = ("state", "workflow", "key", "before", "created_from", "created_to", "id_prefix")


def pick(rnd: random.Random, runs: list[Run], name: str) -> Any:
    times = sorted({r.created_at for r in runs})
    if name == "state":
        return rnd.choice(list(RunState))
    if name == "workflow":
        return rnd.choice([*WORKFLOWS, "missing"])
    if name == "key":
        return rnd.choice([k for k in KEYS if k] + ["missing"])
    if name == "before":
        r = rnd.choice(runs)
        return rnd.choice([(r.created_at, r.id), (r.created_at, r.id + "~"),
                           (r.created_at + 0.25, "")])
    if name in ("created_from", "created_to"):
        return rnd.choice(times) + rnd.choice([0.0, 0.0, 0.25, -0.25])
    return rnd.choice(PREFIXES)


# -- the runs list ---------------------------------------------------------------------------
async def test_every_filter_shape_answers_exactly_the_matching_runs(
        store: Store, clock: FakeClock) -> None:
    runs = await fill(store, clock, seed=1)
    assert len({r.state for r in runs}) == len(RunState)  # the data covers every state
    rnd = random.Random(2)
    for n in range(len(FILTERS) + 1):
        for shape in itertools.combinations(FILTERS, n):
            for _ in range(3):
                f = {name: pick(rnd, runs, name) for name in shape}
                got = [r.id for r in await store.list_runs(limit=1000, **f)]
                assert got == model(runs, **f), f
                limited = [r.id for r in await store.list_runs(limit=2, **f)]
                assert limited == got[:2], f


async def test_either_index_leading_an_id_prefix_answers_exactly_the_matching_runs(
        store_url: str, store: Store, clock: FakeClock) -> None:
    """Both statements of a shape with an id prefix (SqliteStore.list_runs picks one by how
    many ids the prefix's range holds): the range leading, the other filters checked on its
    rows; the other filters' index (or the newest-first one) leading, each id checked."""
    if not store_url.startswith("sqlite"):
        pytest.skip("the _checked statements are SQLite's")
    runs = await fill(store, clock, seed=11)
    rnd = random.Random(12)
    conn = sqlite3.connect(store_url[len("sqlite:///"):])
    conn.row_factory = sqlite3.Row
    try:
        for n in range(len(FILTERS)):
            for shape in itertools.combinations(FILTERS[:-1], n):
                for _ in range(3):
                    f = {name: pick(rnd, runs, name) for name in (*shape, "id_prefix")}
                    for leads in (True, False):
                        for pair in (True, False):  # with a key, a workflow and a state
                            query, params = list_runs_query(prefix_leads=leads,
                                                            pair_leads=pair, **f)
                            for limit in (1000, 2):
                                got = [r["id"] for r in conn.execute(
                                    query, params | {"limit": limit})]
                                assert got == model(runs, **f)[:limit], (f, leads, pair)
    finally:
        conn.close()


async def test_a_wide_id_prefix_is_led_by_the_list_s_order_a_narrow_one_by_its_range(
        store_url: str, store: Store, clock: FakeClock) -> None:
    """A prefix that most ids share ("run-") read by its range would read and sort them all
    (128 ms at 100,000 runs, scripts/bench_list.py); one that few share, by the newest-first
    index, would walk it all (9 ms with state=completed). The store counts the range's ids
    first, up to a cap, and lets the smaller side lead."""
    if not store_url.startswith("sqlite"):
        pytest.skip("EXPLAIN QUERY PLAN is SQLite's")
    runs = await fill(store, clock, seed=13)
    conn = sqlite3.connect(store_url[len("sqlite:///"):])
    try:
        def plan(cap: int, **f: Any) -> str:
            query, params = list_runs_statement(conn, cap, **f)
            return " | ".join(row[3] for row in conn.execute("EXPLAIN QUERY PLAN " + query,
                                                              params | {"limit": 2}))

        wide = sum(r.id.startswith("a") for r in runs)
        assert wide > 4
        by_range = "SEARCH durable_runs USING INDEX sqlite_autoindex_durable_runs_1"
        assert plan(4, id_prefix="a") == "SCAN durable_runs USING INDEX durable_runs_newest"
        assert plan(wide + 1, id_prefix="a").startswith(by_range)
        assert plan(4, id_prefix="a", state=RunState.FAILED).startswith(
            "SEARCH durable_runs USING INDEX durable_runs_by_state (state=?)")
        assert plan(wide + 1, id_prefix="a", state=RunState.FAILED).startswith(by_range)
        assert plan(4, id_prefix="a-5").startswith(by_range)  # one id: fewer than the cap
    finally:
        conn.close()
    # the store's own choice answers the same either way
    for rows in (1, 10_000):
        store.probe_cap = rows  # type: ignore[attr-defined]
        got = [r.id for r in await store.list_runs(limit=2, id_prefix="a")]
        assert got == model(runs, id_prefix="a")[:2]


async def test_a_key_s_runs_are_read_by_state_or_by_workflow_whatever_its_history(
        store_url: str, store: Store, clock: FakeClock) -> None:
    """A key that every run of a resource shares keeps them all: what is queued or running
    on it, or a workflow's runs on it, are read from the key's own indexes
    (durable_runs_by_key_state, _by_key_workflow: migration 009), not by walking all of the
    key's runs (18 ms at 33,000, scripts/bench_list.py); with all three, the smaller of the
    key's runs of the workflow (counted up to a cap) and its runs in the state leads."""
    if not store_url.startswith("sqlite"):
        pytest.skip("EXPLAIN QUERY PLAN is SQLite's")
    runs = await fill(store, clock, seed=14)
    conn = sqlite3.connect(store_url[len("sqlite:///"):])
    try:
        def plan(cap: int = 512, **f: Any) -> str:
            query, params = list_runs_statement(conn, cap, **f)
            return " | ".join(row[3] for row in conn.execute("EXPLAIN QUERY PLAN " + query,
                                                              params | {"limit": 2}))

        by_state = ("SEARCH durable_runs USING INDEX durable_runs_by_key_state "
                    "(concurrency_key=? AND state=?)")
        by_workflow = ("SEARCH durable_runs USING INDEX durable_runs_by_key_workflow "
                       "(concurrency_key=? AND workflow=?)")
        assert plan(key="k1", state=RunState.QUEUED) == by_state
        assert plan(key="k1", workflow="wf.a") == by_workflow
        pair = sum(r.key == "k1" and r.workflow == "wf.a" for r in runs)
        assert pair > 1
        three = {"key": "k1", "workflow": "wf.a", "state": RunState.QUEUED}
        assert plan(pair + 1, **three) == by_workflow
        assert plan(pair, **three) == by_state
        sent: list[str] = []  # a prefix's range that leads checks the rest: no pair count
        conn.set_trace_callback(sent.append)
        list_runs_statement(conn, 512, id_prefix="a-5", **three)
        conn.set_trace_callback(None)
        assert len(sent) == 1 and "id >= " in sent[0], sent  # the prefix's count alone
        counts = " | ".join(row[3] for row in conn.execute(
            "EXPLAIN QUERY PLAN " + count_runs_query(key="k1")[0], {"key": "k1"}))
        assert "COVERING INDEX durable_runs_by_key_state" in counts, counts
    finally:
        conn.close()
    for rows in (1, 10_000):  # the store's own choice answers the same either way
        store.probe_cap = rows  # type: ignore[attr-defined]
        for f in ({"key": "k1", "workflow": "wf.a", "state": s} for s in RunState):
            got = [r.id for r in await store.list_runs(limit=2, **f)]
            assert got == model(runs, **f)[:2], f


async def test_pages_visit_every_run_once_in_order(store: Store, clock: FakeClock) -> None:
    runs = await fill(store, clock, seed=3)
    assert len({r.created_at for r in runs}) < len(runs) / 2  # many ties on created_at
    filters: list[dict[str, Any]] = [{}, {"state": RunState.QUEUED}, {"workflow": "wf.a"},
                                     {"key": "k1"}, {"id_prefix": "a"},
                                     {"created_from": runs[5].created_at,
                                      "created_to": runs[-5].created_at}]
    for f in filters:
        for size in (1, 3, 7):
            seen: list[str] = []
            cursor = None
            while True:
                page = await store.list_runs(limit=size, before=cursor, **f)
                seen += [r.id for r in page]
                if len(page) < size:
                    break
                cursor = (page[-1].created_at, page[-1].id)
            assert seen == model(runs, **f), (f, size)


async def test_an_id_prefix_is_literal(store: Store, clock: FakeClock) -> None:
    for run_id in ["a%b", "a_b", "axb", "aXb", "a%", "a", "b%", "a\\%"]:
        await store.create_run(NewRun(run_id, "wf", [], None, clock.now()))
        clock.advance(1)

    async def ids(prefix: str) -> set[str]:
        return {r.id for r in await store.list_runs(id_prefix=prefix)}

    assert await ids("a%") == {"a%b", "a%"}
    assert await ids("a_") == {"a_b"}
    assert await ids("a\\") == {"a\\%"}
    assert await ids("%") == set()
    assert await ids("_") == set()
    assert await ids("a%b") == {"a%b"}
    assert await ids("") == {r.id for r in await store.list_runs()}


def test_prefix_end() -> None:
    assert prefix_end("ab") == "ac"
    assert prefix_end("a%") == "a&"
    assert prefix_end("a\U0010ffff") == "b"
    assert prefix_end("\U0010ffff\U0010ffff") is None
    assert prefix_end("a\ud7ff") == "a\ue000"


async def test_the_highest_code_point_as_a_prefix(store: Store, clock: FakeClock) -> None:
    for run_id in ["\U0010ffff", "\U0010ffffx", "\U0010ffff\U0010ffff", "\uffff"]:
        await store.create_run(NewRun(run_id, "wf", [], None, clock.now()))
    found = {r.id for r in await store.list_runs(id_prefix="\U0010ffff\U0010ffff")}
    assert found == {"\U0010ffff\U0010ffff"}
    found = {r.id for r in await store.list_runs(id_prefix="\U0010ffff")}
    assert found == {"\U0010ffff", "\U0010ffffx", "\U0010ffff\U0010ffff"}


# -- counts ----------------------------------------------------------------------------------
async def test_counts_per_state(store: Store, clock: FakeClock) -> None:
    assert await store.count_runs() == dict.fromkeys(RunState, 0)
    runs = await fill(store, clock, seed=4)
    for workflow in [None, *WORKFLOWS, "missing"]:
        for key in [None, *KEYS[1:], "missing"]:
            want = Counter(r.state for r in runs
                           if (workflow is None or r.workflow == workflow)
                           and (key is None or r.key == key))
            got = await store.count_runs(workflow=workflow, key=key)
            assert got == {s: want.get(s, 0) for s in RunState}, (workflow, key)
    times = sorted(r.created_at for r in runs)
    cut, late = times[len(times) // 3], times[2 * len(times) // 3]
    for workflow in [None, "wf.a"]:  # a time window counts its runs only (the console's)
        for key in [None, "k1"]:
            for start, end in [(cut, None), (None, late), (cut, late)]:
                want = Counter(r.state for r in runs
                               if (workflow is None or r.workflow == workflow)
                               and (key is None or r.key == key)
                               and (start is None or r.created_at >= start)
                               and (end is None or r.created_at < end))
                got = await store.count_runs(workflow=workflow, key=key, created_from=start,
                                             created_to=end)
                assert got == {s: want.get(s, 0) for s in RunState}, (workflow, key, start)
    assert list(await Client(store).counts()) == [s.value for s in RunState]
    assert await Client(store).counts("wf.a", "k1") == {
        s.value: n for s, n in (await store.count_runs(workflow="wf.a", key="k1")).items()}


# -- who and where an operator action came from ------------------------------------------------
async def test_the_origin_of_cancels_and_replays_is_journaled(store: Store,
                                                              clock: FakeClock) -> None:
    console = {"via": "console", "remote": "127.0.0.1", "user_agent": "Mozilla/5.0"}
    cli = {"via": "cli", "user": "root", "host": "box"}
    for run_id in ["queued", "running", "plain"]:
        await store.create_run(NewRun(run_id, "wf", [], None, clock.now()))
    assert await store.request_cancel("queued", by=console) is not None
    (running,) = await store.claim("w1", 30.0, 1, run_id="running")
    assert await store.request_cancel("running", by=cli) is not None
    assert await store.request_cancel("plain") is not None  # as before: no origin

    async def last(run_id: str) -> tuple[EntryKind, Any]:
        entry = (await store.journal(run_id))[-1]
        return entry.kind, entry.data

    assert await last("queued") == (EntryKind.RUN_CANCELLED,
                                    {"by": "operator", "origin": console})
    assert await last("running") == (EntryKind.RUN_CANCEL_REQUESTED,
                                     {"by": "operator", "origin": cli})
    assert await last("plain") == (EntryKind.RUN_CANCELLED, {"by": "operator"})

    assert await store.requeue("queued", None, "rerun", by=cli) is not None
    assert await last("queued") == (EntryKind.RUN_REPLAYED,
                                    {"from_step": None, "in_doubt": "rerun", "origin": cli})
    assert await store.requeue("plain", None, None) is not None
    assert await last("plain") == (EntryKind.RUN_REPLAYED, {"from_step": None, "in_doubt": None})

    client = Client(store)
    await client.cancel("queued", origin=console)
    assert await last("queued") == (EntryKind.RUN_CANCELLED,
                                    {"by": "operator", "origin": console})
    assert await store.finish(Fence("running", running.epoch), RunState.FAILED, error="boom")
    await client.replay("running", in_doubt="accept", origin=cli)
    assert await last("running") == (EntryKind.RUN_REPLAYED,
                                     {"from_step": None, "in_doubt": "accept", "origin": cli})


# -- the client's checks ---------------------------------------------------------------------
@pytest.mark.parametrize(("call", "message"), [
    (lambda c: c.list(limit=-1), "limit must be a whole number"),
    (lambda c: c.list(limit=1.5), "limit must be a whole number"),
    (lambda c: c.list(created_from=5.0, created_to=4.0), "created_from must not be after"),
    (lambda c: c.list(before=("x", "y")), "before must be the (created_at, id)"),
    (lambda c: c.list(before=3.0), "before must be the (created_at, id)"),
    (lambda c: c.list(state="lost"), "unknown state 'lost'"),
    (lambda c: c.list(id_prefix=3), "id_prefix must be a string"),
    (lambda c: c.list(created_from="yesterday"), "created_from must be a datetime or seconds"),
    (lambda c: c.cancel("r1", origin={"when": object()}), "origin must be JSON values"),
    (lambda c: c.cancel("r1", origin=["cli"]), "origin must be a mapping"),
])
async def test_bad_input_is_one_line(store: Store, call: Callable[[Client], Any],
                                     message: str) -> None:
    await store.create_run(NewRun("r1", "wf", [], None, store.clock.now()))
    with pytest.raises(ConfigError) as info:
        await call(Client(store))
    assert message in str(info.value) and "\n" not in str(info.value)
    assert [e.kind for e in await store.journal("r1")] == [EntryKind.RUN_CREATED]


async def test_the_client_lists_with_every_filter(store: Store, clock: FakeClock) -> None:
    import datetime as dt

    runs = await fill(store, clock, seed=5)
    client = Client(store)
    start = runs[10].created_at
    f = {"workflow": "wf.a", "created_from": start, "id_prefix": "a"}
    got = await client.list(limit=1000, created_from=dt.datetime.fromtimestamp(start, dt.UTC),
                            workflow="wf.a", id_prefix="a")
    assert [r.id for r in got] == model(runs, **f)
    page = await client.list(limit=3)
    rest = await client.list(limit=1000, before=(page[-1].created_at, page[-1].id))
    assert [r.id for r in page + rest] == model(runs)


# -- query plans (SQLite) ----------------------------------------------------------------------
async def test_every_filter_shape_is_an_indexed_query(store_url: str, store: Store,
                                                      clock: FakeClock) -> None:
    """Each shape searches an index in the sort's order; none scans the table. Fails if the
    statement goes back to ``(:x IS NULL OR col = :x)`` (that plan is a SCAN)."""
    if not store_url.startswith("sqlite"):
        pytest.skip("EXPLAIN QUERY PLAN is SQLite's; docs/list-queries.md has PostgreSQL's")
    await fill(store, clock, seed=6)
    values: dict[str, Any] = {"state": RunState.FAILED, "workflow": "wf.a", "key": "k1",
                              "before": (clock.now(), "x"), "created_from": 1.0,
                              "created_to": clock.now(), "id_prefix": "a%"}
    conn = sqlite3.connect(store_url[len("sqlite:///"):])
    try:
        def plan(query: str, params: dict[str, Any]) -> list[str]:
            return [row[3] for row in conn.execute("EXPLAIN QUERY PLAN " + query, params)]

        for n in range(len(FILTERS) + 1):
            for shape in itertools.combinations(FILTERS, n):
                query, params = list_runs_query(**{k: values[k] for k in shape})
                steps = plan(query, params | {"limit": 100})
                assert not any(re.fullmatch(r"SCAN durable_runs", s) for s in steps), shape
                if shape:
                    assert steps[0].startswith("SEARCH durable_runs USING INDEX"), (shape, steps)
                else:
                    assert steps == ["SCAN durable_runs USING INDEX durable_runs_newest"]
                if "id_prefix" not in shape:  # read in the sort's order: no sorting
                    assert not any("TEMP B-TREE" in s for s in steps), (shape, steps)
                    continue
                for leads in (True, False):  # either index may lead (SqliteStore.list_runs)
                    query, params = list_runs_query(prefix_leads=leads,
                                                    **{k: values[k] for k in shape})
                    steps = plan(query, params | {"limit": 100})
                    assert not any(re.fullmatch(r"SCAN durable_runs", s) for s in steps), shape
                    by_range = steps[0].startswith(
                        "SEARCH durable_runs USING INDEX sqlite_autoindex_durable_runs_1")
                    assert by_range is leads, (shape, leads, steps)
                    if not leads:  # the other filters' index, in the sort's order
                        assert not any("TEMP B-TREE" in s for s in steps), (shape, steps)
        timed = [("created_from",), ("created_to",), ("created_from", "created_to")]
        for shape in [(), ("workflow",), ("key",), ("workflow", "key"),
                      *(extra + t for extra in [(), ("workflow",), ("key",)] for t in timed),
                      ("workflow", "key", "created_from", "created_to")]:
            query, params = count_runs_query(**{k: values[k] for k in shape})
            steps = plan(query, params)
            assert all("INDEX" in s for s in steps if s.startswith(("SCAN", "SEARCH"))), steps
            assert not any(re.fullmatch(r"SCAN durable_runs", s) for s in steps), steps
            if "created_from" in shape or "created_to" in shape:
                # each state's range of the window, in an index: no table row, no whole index
                assert steps[0].startswith("SEARCH durable_runs USING"), (shape, steps)
                if "workflow" not in shape or "key" not in shape:
                    assert "COVERING INDEX" in steps[0] and "created_at" in steps[0], steps
    finally:
        conn.close()
