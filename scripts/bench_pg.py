"""PostgreSQL group commit: the store's fenced writes with and without it, in one run.

Workloads, each on a fresh schema of ``--pg-url`` (all dropped at the end, also on failure),
measured with group commit on and off (``?group_commit=0``) alternately, ``--repeat``
times; the median of each is reported:

- **concurrent**: ``--concurrent N`` runs (default 1,000) of 5 no-op steps, started at once
  and executed by one worker of concurrency N (``scripts/bench.py``'s engine workload:
  every run completed and every step journaled is checked afterwards). Journaled steps/s,
  and for group commit the fenced writes per batch statement.
- **sequential engine**: ``--sequential N`` runs (default 200) of 5 steps, one at a time.
- **sequential append**: ``--appends N`` (default 2,000) fenced ``store.append`` calls of one
  entry, one after the other, on one claimed run: what one fenced write costs alone.
- **a claim with its first entry**: ``--appends / 10`` queued runs each taken with a
  ``step_started`` entry by ``claim_with`` (one statement: a claim riding on the first write,
  as for a run an in-process start hands over), and as many by ``claim`` then ``append``
  (the usual claim, then the write), with a ``claimable`` read (what a read before a riding
  claim adds) before each pair: median ms per call.
- **baseline**: the same number of plain autocommit ``INSERT`` statements, one per ``await``,
  on one async psycopg connection to the same server (a table of ``id bigserial, data
  text``): one round trip and one commit, the floor under any fenced write. The appends
  (both modes) and the INSERTs are timed in alternating blocks of 100 (``BLOCK``), so a
  change of load during the measurement falls on all of them alike.

Targets (issue 10, target 7): concurrent with group commit at least 4x without it; the
sequential fenced append at least 80 % of the plain INSERT rate. The figures are ratios
within the run: the machine is shared. An unreachable server prints one line and exits 0
(``--require-postgres``: exit 2). ``--quick``: a few seconds, for the test.

``--statements``: instead, where a fenced append's time goes against the plain INSERT: the
store's statements and variants of them, each sent by plain psycopg on one dedicated
connection to a claimed run of a fresh store schema, timed in alternating blocks (rate,
share of the plain INSERT, client CPU per statement), and their server side from ``EXPLAIN
(ANALYZE, BUFFERS, WAL)`` (the fastest of 20: execution time, WAL records and bytes).

Run: ``python scripts/bench_pg.py`` (``--json`` for machine-readable output).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import anyio

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import bench  # noqa: E402  (scripts/bench.py: the engine workload and the server helper)

import durable  # noqa: E402
from durable._types import EntryKind, Fence, JournalWrite  # noqa: E402

TARGET_CONCURRENT_GAIN = 4.0
TARGET_SEQUENTIAL_SHARE = 0.8
ISSUE_CONCURRENT = 1450.0
"""Steps/s of 1,000 concurrent runs x 5 on PostgreSQL that issue 10 measured before group
commit (another run, another day): printed beside the same-run ratio, which is the target's."""
MODES = (("on", ""), ("off", "group_commit=0&"))


class BatchCounter:
    """Counts the batch statements of every PostgreSQL store (private API: a benchmark may
    peek) by wrapping ``PostgresStore._flush`` and ``PostgresStore._alone`` (a write that
    found no batch in flight: a batch of one)."""

    def __init__(self) -> None:
        from durable.store._postgres import PostgresStore

        self.batches = 0
        self.writes = 0
        original = PostgresStore._flush
        alone = getattr(PostgresStore, "_alone", None)  # (None: a store before it)
        counter = self

        async def counting_flush(store: Any, batch: list[Any]) -> None:
            counter.batches += 1
            counter.writes += len(batch)
            await original(store, batch)

        async def counting_alone(store: Any, write: Any) -> bool:
            if not store._leading:  # (else it joins the queue: counted by its batch)
                counter.batches += 1
                counter.writes += 1
            assert alone is not None
            return bool(await alone(store, write))

        PostgresStore._flush = counting_flush  # type: ignore[method-assign]
        if alone is not None:
            PostgresStore._alone = counting_alone  # type: ignore[method-assign]

    def take(self) -> tuple[int, int]:
        counts = (self.batches, self.writes)
        self.batches = self.writes = 0
        return counts


def server_cpu() -> float | None:
    """CPU seconds (user + system, with reaped children) of every process named
    ``postgres`` on this host: the whole server, other clients' work included. None when
    there is none to read (a server on another host)."""
    total, found, tick = 0, False, os.sysconf("SC_CLK_TCK")
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if (entry / "comm").read_text().strip() != "postgres":
                continue
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        found = True
        total += sum(int(f) for f in fields[11:15])
    return total / tick if found else None


BLOCK = 100
"""Sequential appends and plain INSERTs are timed in alternating blocks of this many, so a
change of the machine's load during the measurement falls on all three alike."""


class PlainInserts:
    """One autocommit INSERT per await on one async psycopg connection (a table of ``id
    bigserial, data text``, ``bench.psycopg_commits``)."""

    def __init__(self, pg: bench.PgServer) -> None:
        self.pg = pg

    async def __aenter__(self) -> PlainInserts:
        import psycopg
        from psycopg import sql

        schema = self.pg.new_schema()
        table = sql.Identifier(schema, "t")
        self.conn = await psycopg.AsyncConnection.connect(self.pg.url, autocommit=True)
        await self.conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
        await self.conn.execute(sql.SQL("CREATE TABLE {} (id bigserial PRIMARY KEY, "
                                        "data text NOT NULL)").format(table))
        self.insert = sql.SQL("INSERT INTO {} (data) VALUES (%s)").format(table)
        await self.block(10)  # warm up (psycopg prepares a statement after 5 uses)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.conn.close()

    async def block(self, n: int) -> tuple[float, float]:
        """(seconds, CPU seconds of this process) for ``n`` INSERTs."""
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(n):
            await self.conn.execute(self.insert, (bench.PAYLOAD,))
        return time.perf_counter() - t0, time.process_time() - c0


class FencedAppends:
    """One entry per ``store.append``, one after the other, on one claimed run."""

    def __init__(self, url: str) -> None:
        self.store = durable.store_from_url(url)

    async def __aenter__(self) -> FencedAppends:
        await self.store.open()
        client = durable.Client(self.store, registry=bench.REGISTRY)
        run_id = f"append-{uuid.uuid4().hex[:8]}"
        await client.start(bench.steps_workflow, 1, False, id=run_id)
        claimed = await self.store.claim("bench", 600.0, 1, run_id=run_id)
        self.fence = Fence(claimed[0].id, claimed[0].epoch)
        self.entry = [JournalWrite(EntryKind.VALUE, data={"x": bench.PAYLOAD})]
        await self.block(10)  # warm up (psycopg prepares a statement after 5 uses)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.store.aclose()

    async def block(self, n: int) -> tuple[float, float]:
        """(seconds, CPU seconds of this process) for ``n`` appends."""
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(n):
            if not await self.store.append(self.fence, self.entry):
                raise SystemExit("a fenced append was refused")
        return time.perf_counter() - t0, time.process_time() - c0


async def sequential_appends(pg: bench.PgServer, n: int
                             ) -> tuple[dict[str, float], dict[str, float]]:
    """Per second, and this process's CPU us per call: plain INSERTs, fenced appends with
    group commit and without, ``n`` of each, timed in alternating blocks of BLOCK."""
    async with PlainInserts(pg) as plain, \
            FencedAppends(with_option(pg.new_url(), "")) as on, \
            FencedAppends(with_option(pg.new_url(), "group_commit=0&")) as off:
        kinds: dict[str, PlainInserts | FencedAppends] = {"plain": plain, "on": on,
                                                          "off": off}
        seconds = dict.fromkeys(kinds, 0.0)
        cpu = dict.fromkeys(kinds, 0.0)
        done = 0
        while done < n:
            size = min(BLOCK, n - done)
            for name, kind in kinds.items():
                spent, used = await kind.block(size)
                seconds[name] += spent
                cpu[name] += used
            done += size
        return ({name: bench.rate(n, spent) for name, spent in seconds.items()},
                {name: 1e6 * used / n for name, used in cpu.items()})


async def claim_statements(pg: bench.PgServer, n: int) -> dict[str, float]:
    """Median ms per call of the ways a worker takes one queued run and journals its first
    entry, ``n`` runs each, alternating: ``claim_with`` (the claim and the entry in one
    statement: a claim riding on the first write, as for a run a start in this process
    handed over), ``claim`` then ``append`` (the usual claim, then the write), and the read
    ``claimable`` (what a claim after a read adds)."""
    store = durable.store_from_url(pg.new_url())
    await store.open()
    try:
        client = durable.Client(store, registry=bench.REGISTRY)
        prefix = f"claims-{uuid.uuid4().hex[:6]}"
        for i in range(2 * n + 10):
            await client.start(bench.steps_workflow, 1, False, id=f"{prefix}-{i:05}")
        workflows = [bench.steps_workflow.name]
        entry = [JournalWrite(EntryKind.STEP_STARTED, step=1, step_key="1", name="noop",
                              try_number=1, data={"args": [0]})]
        times: dict[str, list[float]] = {"claim_with": [], "claim": [], "append": [],
                                         "claimable": []}
        for i in range(n + 5):  # the first five prepare the statements (not counted)
            kept = i >= 5
            t0 = time.perf_counter()
            await store.claimable("bench", 1, workflows=workflows)
            t1 = time.perf_counter()
            claimed = await store.claim("bench", 600.0, 1, workflows=workflows)  # the oldest
            t2 = time.perf_counter()
            appended = len(claimed) == 1 and await store.append(
                Fence(claimed[0].id, claimed[0].epoch), entry)
            t3 = time.perf_counter()
            rode = await store.claim_with("bench", 600.0, f"{prefix}-{2 * i + 1:05}", 1,
                                          entry, workflows=workflows)
            t4 = time.perf_counter()
            if not appended or rode.run is None or not rode.appended:
                raise SystemExit("a claim of a queued run did not hold")
            if kept:
                for name, spent in (("claimable", t1 - t0), ("claim", t2 - t1),
                                    ("append", t3 - t2), ("claim_with", t4 - t3)):
                    times[name].append(spent)
        return {name: 1000 * statistics.median(values) for name, values in times.items()}
    finally:
        await store.aclose()


def statement_variants() -> dict[str, tuple[str, bool]]:
    """``--statements``: name -> (SQL, whether it takes the append's parameters). Only
    ``append_entry`` and ``append_entries`` are the store's; the others take one part away
    to show what that part costs (never a way to write: they are not fenced alike)."""
    from durable.store import _postgres

    one = _postgres.Q_ONE_ENTRY["append_entries"]
    return {
        "plain INSERT (t: bigserial, text)": ("INSERT INTO t (data) VALUES (%(d)s)", False),
        "journal INSERT, no fence": (
            "INSERT INTO durable_journal (run_id, epoch, kind, step, step_key, name, "
            "attempt, at, data) VALUES (%(run_id)s, %(epoch)s, %(kinds)s, %(steps)s, "
            "%(step_keys)s, %(names)s, %(attempts)s, extract(epoch from "
            "statement_timestamp()), %(datas)s)", True),
        "append_entry (the store's)": (one, True),
        "  without the row lock": (one.replace("FOR NO KEY UPDATE", ""), True),
        "  FOR SHARE": (one.replace("FOR NO KEY UPDATE", "FOR SHARE"), True),
        "  into a journal with 1 index": (
            one.replace("INTO durable_journal", "INTO journal_one_index"), True),
        "append_entries, CTE + unnest (before)": (
            _postgres._BINARY_ARRAY.sub(r"ARRAY[%(\1)s\2]",
                                        _postgres.Q["append_entries"]), True),
    }


async def statements(pg: bench.PgServer, n: int, repeat: int) -> dict[str, Any]:
    """``--statements``: see the module's docstring."""
    import psycopg
    from psycopg.rows import dict_row

    from durable.store import _postgres

    url = pg.new_url()
    schema = url.rpartition("schema=")[2]
    async with FencedAppends(url) as appends:
        entry = _postgres._entry_rows(appends.entry)[0]
        params: dict[str, Any] = dict(zip(_postgres._ENTRY_COLUMNS, entry, strict=True))
        params.update(run_id=appends.fence.run_id, epoch=appends.fence.epoch, now=None)
        conn = await psycopg.AsyncConnection.connect(
            pg.url, autocommit=True, row_factory=dict_row,
            options=f"-c search_path={schema}")
        try:
            await conn.execute("CREATE TABLE t (id bigserial PRIMARY KEY, data text NOT NULL)")
            await conn.execute("CREATE TABLE journal_one_index (LIKE durable_journal "
                               "INCLUDING DEFAULTS INCLUDING IDENTITY)")
            await conn.execute("CREATE INDEX ON journal_one_index (run_id, seq)")
            variants = {name: (sql, params if fenced else {"d": bench.PAYLOAD})
                        for name, (sql, fenced) in statement_variants().items()}
            spent = {name: [0.0, 0.0] for name in variants}  # wall, CPU

            async def block(sql: str, args: dict[str, Any], size: int) -> None:
                for _ in range(size):
                    cur = await conn.execute(sql, args)
                    if cur.rowcount != 1:
                        raise SystemExit(f"a statement wrote {cur.rowcount} rows: {sql}")

            for sql, args in variants.values():  # warm up (prepared after 5 uses)
                await block(sql, args, 10)
            for _ in range(repeat):
                done = 0
                while done < n:
                    size = min(BLOCK, n - done)
                    for name, (sql, args) in variants.items():
                        t0, cpu = time.perf_counter(), time.process_time()
                        await block(sql, args, size)
                        spent[name][0] += time.perf_counter() - t0
                        spent[name][1] += time.process_time() - cpu
                    done += size
            plain = spent["plain INSERT (t: bigserial, text)"][0]
            results: dict[str, Any] = {}
            for name, (sql, args) in variants.items():
                wall, cpu = spent[name]
                best: tuple[float, list[str]] | None = None
                for _ in range(20):
                    cur = await conn.execute(
                        "EXPLAIN (ANALYZE, BUFFERS, WAL, SUMMARY) " + sql, args)
                    lines = [str(row["QUERY PLAN"]) for row in await cur.fetchall()]
                    took = next(float(line.split()[2]) for line in lines
                                if line.startswith("Execution Time"))
                    if best is None or took < best[0]:
                        best = (took, lines)
                assert best is not None
                wal = next(line.split()[1:] for line in best[1] if "WAL:" in line)
                results[name] = {
                    "per_s": bench.rate(n * repeat, wall),
                    "share": plain / wall if wall else None,
                    "client_cpu_us": 1e6 * cpu / (n * repeat),
                    "execution_ms": best[0],
                    "wal": " ".join(wal),
                }
            return results
        finally:
            await conn.close()


def print_statements(report: dict[str, Any]) -> None:
    print(f"durable PostgreSQL: a fenced append's statement against a plain INSERT, "
          f"{report['appends']} x {report['repeat']} each in alternating blocks of {BLOCK}")
    print(f"{report['cpus']} CPUs, load {report['load_before']} before / "
          f"{report['load_after']} after, Python {report['python']}, PostgreSQL "
          f"{report['server_version']}, psycopg {report['psycopg']}, commit {report['commit']}")
    print()
    print(f"{'':40}{'/s':>8}{'share':>7}{'client CPU':>12}{'server exec':>13}  WAL (EXPLAIN)")
    for name, r in report["results"].items():
        print(f"{name:40}{r['per_s']:>8,.0f}{r['share']:>7.0%}{r['client_cpu_us']:>9.0f} us"
              f"{1000 * r['execution_ms']:>10.0f} us  {r['wal']}")


def with_option(url: str, option: str) -> str:
    """The store URL with ``option`` before its ``schema=`` (bench.verify reads the schema
    from the URL's end)."""
    head, _, schema = url.rpartition("schema=")
    return f"{head}{option}schema={schema}"



def median_of(rows: list[dict[str, Any]], key: str) -> dict[str, Any]:
    rows = sorted(rows, key=lambda r: r[key])
    chosen = dict(rows[len(rows) // 2])
    chosen[f"repeats_{key}"] = [r[key] for r in rows]
    return chosen


async def measure(args: argparse.Namespace, pg: bench.PgServer) -> dict[str, Any]:
    counter = BatchCounter()
    bench.configure_logging()
    await bench.run_engine(pg.new_url(), 5, concurrency=1, start_at_once=False,
                           label="pg-warmup")
    concurrent: dict[str, list[dict[str, Any]]] = {"on": [], "off": []}
    sequential: dict[str, list[dict[str, Any]]] = {"on": [], "off": []}
    appends: dict[str, list[float]] = {"on": [], "off": [], "plain": []}
    appends_cpu: dict[str, list[float]] = {"on": [], "off": [], "plain": []}
    claims: dict[str, list[float]] = {}
    for i in range(args.repeat):
        for mode, option in MODES:
            counter.take()
            cpu, server = time.process_time(), server_cpu()
            result = await bench.run_engine(
                with_option(pg.new_url(), option), args.concurrent,
                concurrency=args.concurrent,
                start_at_once=True, label=f"pg-con-{mode}{i}")
            steps = args.concurrent * 5
            # CPU per journaled step, starts included: this process (client and worker)
            # and the server's processes (which other clients of the server add to)
            result["client_cpu_us_per_step"] = 1e6 * (time.process_time() - cpu) / steps
            after = server_cpu()
            result["server_cpu_us_per_step"] = (
                None if server is None or after is None else 1e6 * (after - server) / steps)
            batches, writes = counter.take()
            result["batches"] = batches
            result["writes_per_batch"] = writes / batches if batches else None
            concurrent[mode].append(result)
            print(f"bench_pg: concurrent {mode} #{i + 1}: {result['steps_per_s']:,.0f} "
                  "steps/s", file=sys.stderr)
        for mode, option in MODES:
            cpu = time.process_time()
            result = await bench.run_engine(
                with_option(pg.new_url(), option), args.sequential, concurrency=1,
                start_at_once=False, label=f"pg-seq-{mode}{i}")
            result["client_cpu_us_per_step"] = (
                1e6 * (time.process_time() - cpu) / (args.sequential * 5))
            sequential[mode].append(result)
        claim_ms = await claim_statements(pg, args.appends // 10)
        for name, value in claim_ms.items():
            claims.setdefault(name, []).append(value)
        rates, cpus = await sequential_appends(pg, args.appends)
        for name, value in rates.items():
            appends[name].append(value)
            appends_cpu[name].append(cpus[name])
        print(f"bench_pg: appends #{i + 1}: plain {appends['plain'][-1]:,.0f}/s, fenced "
              f"{appends['on'][-1]:,.0f}/s (group commit on), {appends['off'][-1]:,.0f}/s "
              "(off)", file=sys.stderr)
    con = {mode: median_of(rows, "steps_per_s") for mode, rows in concurrent.items()}
    seq = {mode: median_of(rows, "steps_per_s") for mode, rows in sequential.items()}
    app = {mode: statistics.median(values) for mode, values in appends.items()}
    gain = con["on"]["steps_per_s"] / con["off"]["steps_per_s"]
    share = app["on"] / app["plain"]
    return {
        "issue_concurrent": ISSUE_CONCURRENT,
        "issue_gain": con["on"]["steps_per_s"] / ISSUE_CONCURRENT,
        "concurrent": con,
        "sequential": seq,
        "appends_per_s": app,
        "appends_repeats": appends,
        "appends_cpu_us": {mode: statistics.median(v) for mode, v in appends_cpu.items()},
        "claim_ms": {name: statistics.median(v) for name, v in claims.items()},
        "concurrent_gain": gain,
        "sequential_share": share,
        "targets": {
            "concurrent_gain": {"target": TARGET_CONCURRENT_GAIN, "value": gain,
                                "met": gain >= TARGET_CONCURRENT_GAIN},
            "sequential_share": {"target": TARGET_SEQUENTIAL_SHARE, "value": share,
                                 "met": share >= TARGET_SEQUENTIAL_SHARE},
        },
    }


def print_report(report: dict[str, Any]) -> None:
    r = report["results"]
    print(f"durable PostgreSQL group commit: {report['repeat']} repetition(s), medians")
    print(f"{report['cpus']} CPUs, load {report['load_before']} before / "
          f"{report['load_after']} after, Python {report['python']}, PostgreSQL "
          f"{report['server_version']}, psycopg {report['psycopg']}, commit {report['commit']}")
    print()
    print(f"{'':44}{'group commit':>14}{'without':>12}{'ratio':>8}")
    con_on, con_off = r["concurrent"]["on"], r["concurrent"]["off"]
    seq_on, seq_off = r["sequential"]["on"], r["sequential"]["off"]
    label = f"concurrent {report['concurrent']} x 5, steps/s"
    print(f"{label:44}{con_on['steps_per_s']:>14,.0f}{con_off['steps_per_s']:>12,.0f}"
          f"{r['concurrent_gain']:>7.2f}x")
    per_batch = con_on["writes_per_batch"]
    print(f"{'  fenced writes per batch statement':44}"
          f"{per_batch if per_batch is None else f'{per_batch:.1f}':>14}{'1':>12}")
    print(f"{'  store checkouts per step':44}{con_on['db_jobs_per_step']:>14.2f}"
          f"{con_off['db_jobs_per_step']:>12.2f}")
    for key, text in (("client_cpu_us_per_step", "  CPU us per step, this process"),
                      ("server_cpu_us_per_step", "  CPU us per step, the server")):
        on, off = con_on.get(key), con_off.get(key)
        print(f"{text:44}{'n/a' if on is None else f'{on:.0f}':>14}"
              f"{'n/a' if off is None else f'{off:.0f}':>12}")
    label = f"sequential {report['sequential']} x 5, steps/s"
    print(f"{label:44}{seq_on['steps_per_s']:>14,.0f}{seq_off['steps_per_s']:>12,.0f}"
          f"{seq_on['steps_per_s'] / seq_off['steps_per_s']:>7.2f}x")
    on, off = seq_on.get("client_cpu_us_per_step"), seq_off.get("client_cpu_us_per_step")
    if on is not None and off is not None:
        print(f"{'  CPU us per step, this process':44}{on:>14.0f}{off:>12.0f}")
    app = r["appends_per_s"]
    label = f"sequential fenced append x {report['appends']}, /s"
    print(f"{label:44}{app['on']:>14,.0f}{app['off']:>12,.0f}")
    print(f"{'plain psycopg autocommit INSERT, /s':44}{app['plain']:>14,.0f}")
    cpu = r.get("appends_cpu_us")
    if cpu:
        print(f"{'  CPU us per append, this process':44}{cpu['on']:>14.0f}{cpu['off']:>12.0f}")
        print(f"{'  CPU us per plain INSERT, this process':44}{cpu['plain']:>14.0f}")
    claim = r.get("claim_ms")
    if claim:
        print(f"a queued run claimed with its first entry, ms: claim_with "
              f"{claim['claim_with']:.2f}; claim + append {claim['claim']:.2f} + "
              f"{claim['append']:.2f}; a read first (claimable) {claim['claimable']:.2f}")
    print()
    for name, text in (("concurrent_gain", "concurrent with group commit >= 4x without"),
                       ("sequential_share",
                        "sequential fenced append >= 80 % of the plain INSERT rate")):
        t = r["targets"][name]
        value = f"{t['value']:.2f}x" if name == "concurrent_gain" else f"{t['value']:.0%}"
        print(f"target: {text}: {value}: {'MET' if t['met'] else 'MISSED'}")
    print(f"concurrent with group commit against issue 10's {r['issue_concurrent']:,.0f} "
          f"steps/s (measured before group commit, not in this run): {r['issue_gain']:.2f}x")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Benchmark the PostgreSQL store's group commit against itself without "
        "it, and a fenced append against a plain psycopg INSERT, in one run.")
    parser.add_argument("--pg-url", default=bench.PG_URL,
                        help=f"PostgreSQL server (default {bench.PG_URL})")
    parser.add_argument("--concurrent", type=int, metavar="N", default=None,
                        help="runs started at once (default 1000, --quick 50)")
    parser.add_argument("--sequential", type=int, metavar="N", default=None,
                        help="runs one at a time (default 200, --quick 5)")
    parser.add_argument("--appends", type=int, metavar="N", default=None,
                        help="sequential fenced appends and plain INSERTs (default 2000, "
                        "--quick 50)")
    parser.add_argument("--repeat", type=int, metavar="N", default=None,
                        help="repetitions, alternating the modes (default 3, --quick 1)")
    parser.add_argument("--require-postgres", action="store_true",
                        help="exit 2 when the server is unreachable (default: skip, exit 0)")
    parser.add_argument("--statements", action="store_true",
                        help="instead: the fenced append's statement and variants of it "
                        "against the plain INSERT, on one dedicated connection")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument("--quick", action="store_true", help="small numbers: a smoke run")
    args = parser.parse_args(argv)
    defaults = {"concurrent": (1000, 50), "sequential": (200, 5), "appends": (2000, 50),
                "repeat": (3, 1)}
    for name, (full, quick) in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        pg = bench.PgServer(args.pg_url)
    except ImportError:
        why: str | None = "psycopg is not installed (pip install 'durable-fenced[postgres]')"
    else:
        why = pg.unreachable()
        if why:
            why = f"no PostgreSQL server reachable at {bench.redact(pg.url)}: {why}"
    if why:
        if args.require_postgres:
            print(f"bench_pg: error: {why}", file=sys.stderr)
            return 2
        print(json.dumps({"skipped": why}) if args.json else f"PostgreSQL skipped: {why}")
        return 0
    import psycopg

    load_before = os.getloadavg()[0]
    try:
        if args.statements:
            results = anyio.run(statements, pg, args.appends, args.repeat, backend="asyncio")
        else:
            results = anyio.run(measure, args, pg, backend="asyncio")
    finally:
        pg.close()
    report = {
        "skipped": None,
        "commit": bench_commit(),
        "cpus": os.cpu_count(),
        "load_before": round(load_before, 1),
        "load_after": round(os.getloadavg()[0], 1),
        "python": sys.version.split()[0],
        "server_version": bench.PgServer(args.pg_url).version(),
        "psycopg": psycopg.__version__,
        "concurrent": args.concurrent,
        "sequential": args.sequential,
        "appends": args.appends,
        "repeat": args.repeat,
        "results": results,
    }
    if args.json:
        print(json.dumps(report, indent=2, default=str))
    elif args.statements:
        print_statements(report)
    else:
        print_report(report)
    return 0


def bench_commit() -> str:
    import subprocess

    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE.parent,
                             capture_output=True, text=True, timeout=10, check=False)
    except OSError:
        return "?"
    return out.stdout.strip() or "?"


if __name__ == "__main__":
    sys.exit(main())
