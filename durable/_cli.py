"""The command line: ``python -m durable`` (operators) and ``python -m durable.worker``."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

import anyio
import attrs

from ._client import Client, InDoubt
from ._errors import ConfigError, DurableError
from ._logging import configure_logging
from ._registry import default_registry
from ._report import (
    RecoveryReport,
    clip,
    one_line,
    render_timeline,
    terminal_width,
    timeline_rows,
    use_color,
)
from ._types import JournalEntry, Run
from ._version import __version__
from ._worker import Worker
from .store import store_from_url

DEFAULT_DB = "sqlite:///durable.db"


def _fail(message: str, code: int = 2) -> NoReturn:
    print(f"durable: error: {message}", file=sys.stderr)
    raise SystemExit(code)


def import_modules(names: Sequence[str]) -> None:
    """Import the modules (dotted names or .py paths) that declare workflows."""
    for name in names:
        try:
            if name.endswith(".py") or os.sep in name:
                path = Path(name)
                if not path.is_file():
                    raise ConfigError(f"cannot import {name}: no such file")
                spec = importlib.util.spec_from_file_location(path.stem, path)
                if spec is None or spec.loader is None:
                    raise ConfigError(f"cannot import {name}")
                module = importlib.util.module_from_spec(spec)
                sys.modules[path.stem] = module
                spec.loader.exec_module(module)
            else:
                if os.getcwd() not in sys.path:
                    sys.path.insert(0, os.getcwd())
                importlib.import_module(name)
        except ModuleNotFoundError as exc:
            raise ConfigError(f"cannot import {name!r}: {exc}; check --import and PYTHONPATH")\
                from exc


def _imports(args: argparse.Namespace) -> list[str]:
    names = list(args.imports or [])
    env = os.environ.get("DURABLE_IMPORT")
    if env:
        names.extend(n for n in env.split(",") if n.strip())
    return names


def run_json(run: Run) -> dict[str, Any]:
    data = attrs.asdict(run)
    data["state"] = run.state.value
    return data


def entry_json(entry: JournalEntry) -> dict[str, Any]:
    data = attrs.asdict(entry)
    data["kind"] = entry.kind.value
    return data


def _parse_json_arg(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        raise ConfigError(
            f"argument {text!r} is not JSON; quote strings as JSON, e.g. '\"slot-1\"'"
        ) from None


# -- commands -------------------------------------------------------------------------------------
async def _cmd_start(args: argparse.Namespace) -> int:
    import_modules(_imports(args))
    values = [_parse_json_arg(a) for a in args.args]
    default_registry.workflow(args.workflow)
    async with Client.connect(args.db, console_url=args.console_url) as client:
        run = await client.start(args.workflow, *values, id=args.id, key=args.key,
                                 delay=args.delay, timeout=args.timeout)
    if args.json:
        print(json.dumps(run_json(run), indent=2))
    else:
        print(f"{run.id}  {run.workflow}  {run.state.value}")
    return 0


async def _cmd_list(args: argparse.Namespace) -> int:
    async with Client.connect(args.db, create=False) as client:
        runs = await client.list(state=args.state, workflow=args.workflow, key=args.key,
                                 limit=args.limit)
    if args.json:
        print(json.dumps([run_json(r) for r in runs], indent=2))
        return 0
    if not runs:
        print("no runs")
        return 0
    print(f"{'id':<36} {'workflow':<20} {'key':<16} {'state':<10} {'attempt':>7}  error")
    for r in runs:
        print(f"{r.id:<36} {r.workflow:<20} {(r.key or '-'):<16} {r.state.value:<10} "
              f"{r.attempt:>7}  {clip(one_line(r.error or ''), 60)}")
    return 0


async def _cmd_show(args: argparse.Namespace) -> int:
    async with Client.connect(args.db, create=False, console_url=args.console_url) as client:
        run = await client.get(args.id)
        entries = await client.store.journal(args.id)
    if args.json:
        report = RecoveryReport.build(run, entries, args.console_url)
        print(json.dumps({
            "run": run_json(run),
            "steps": [row for row in timeline_rows(run, entries)
                      if args.step is None or row.get("step") == args.step],
            "journal": [entry_json(e) for e in entries
                        if args.step is None or e.step == args.step],
            "report": report.as_dict(),
        }, indent=2))
        return 0
    print(render_timeline(run, entries, step=args.step, console_url=args.console_url,
                          width=terminal_width(sys.stdout),
                          color=use_color(sys.stdout, args.color)))
    return 0


async def _cmd_cancel(args: argparse.Namespace) -> int:
    async with Client.connect(args.db, create=False) as client:
        run = await client.cancel(args.id)
    if run.state.finished:
        print(f"{run.id} cancelled before it started")
    else:
        print(f"{run.id} cancel requested; the worker holding it stops it now")
    return 0


async def _cmd_replay(args: argparse.Namespace) -> int:
    policy: InDoubt | None = (
        "rerun" if args.rerun_in_doubt else "accept" if args.accept_in_doubt else None)
    async with Client.connect(args.db, create=False) as client:
        run = await client.replay(args.id, from_step=args.from_step, in_doubt=policy)
    print(f"{run.id} queued again (completed steps will not run again)")
    return 0


async def _cmd_migrate(args: argparse.Namespace) -> int:
    store = store_from_url(args.db)
    await store.open()
    try:
        version = await store.schema_version()
    finally:
        await store.aclose()
    print(f"{store.url}: schema version {version}")
    return 0


async def _cmd_worker(args: argparse.Namespace) -> int:
    configure_logging(json=args.log_format == "json", level=args.log_level)
    import_modules(_imports(args))
    if not default_registry.workflows:
        raise ConfigError("no workflows registered: pass --import MODULE (or DURABLE_IMPORT)")
    # statements are short: a small pool serves many attempts (10 was as fast as 35 with 32
    # attempts), and several workers must stay under the server's max_connections
    store = store_from_url(args.db, pool_size=min(args.concurrency + 3, 10))
    await store.open()
    try:
        worker = Worker(store, concurrency=args.concurrency, lease=args.lease,
                        grace=args.grace, poll_interval=args.poll, console_url=args.console_url)
        async with anyio.create_task_group() as tg:
            tg.start_soon(_watch_signals, worker)
            await worker.run()
            tg.cancel_scope.cancel()
    finally:
        with anyio.CancelScope(shield=True):
            await store.aclose()
    return 0


async def _watch_signals(worker: Worker) -> None:
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        count = 0
        async for _signum in signals:
            count += 1
            worker.shutdown(grace=None if count == 1 else 0)


# -- parsers ---------------------------------------------------------------------------------------
def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--db", default=os.environ.get("DURABLE_DB", DEFAULT_DB),
                        help="database URL (default: $DURABLE_DB or sqlite:///durable.db)")
    parser.add_argument("--console-url", default=os.environ.get("DURABLE_CONSOLE_URL"),
                        help="base URL of the console, for links in messages")
    parser.add_argument("--backend", choices=("asyncio", "trio"), default="asyncio")


def _worker_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--import", dest="imports", action="append", metavar="MODULE",
                        help="module (or .py file) declaring workflows; repeatable")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--lease", type=float, default=30.0, help="lease in seconds")
    parser.add_argument("--grace", type=float, default=10.0,
                        help="seconds running attempts get on shutdown")
    parser.add_argument("--poll", type=float, default=0.5, help="seconds between claims")
    parser.add_argument("--log-format", choices=("console", "json"), default="console")
    parser.add_argument("--log-level", default="info",
                        choices=("debug", "info", "warning", "error"))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="durable", description=__doc__)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}",
                        help="print the version and exit")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("start", help="queue a run of a workflow")
    _common(p)
    p.add_argument("workflow")
    p.add_argument("args", nargs="*", help="arguments, each a JSON value")
    p.add_argument("--import", dest="imports", action="append", metavar="MODULE")
    p.add_argument("--id", help="run id (idempotent: an existing id returns that run)")
    p.add_argument("--key", help="concurrency key: one running run per key")
    p.add_argument("--delay", type=float, help="start after this many seconds")
    p.add_argument("--timeout", type=float, help="workflow deadline per attempt, seconds")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_cmd_start)

    p = sub.add_parser("list", help="list runs, newest first")
    _common(p)
    p.add_argument("--state")
    p.add_argument("--workflow")
    p.add_argument("--key")
    p.add_argument("--limit", type=int, default=50)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_cmd_list)

    p = sub.add_parser("show", help="a run and its journal as a timeline")
    _common(p)
    p.add_argument("id")
    p.add_argument("--step", type=int, help="only this step")
    p.add_argument("--json", action="store_true")
    p.add_argument("--color", choices=("auto", "always", "never"), default="auto",
                   help="colour the states: auto = on a terminal unless NO_COLOR is set "
                        "(default: auto)")
    p.set_defaults(func=_cmd_show)

    p = sub.add_parser("cancel", help="cancel a queued, delayed or running run")
    _common(p)
    p.add_argument("id")
    p.set_defaults(func=_cmd_cancel)

    p = sub.add_parser("replay", help="run a failed or cancelled run again")
    _common(p)
    p.add_argument("id")
    p.add_argument("--from-step", type=int, help="run this step and later ones again")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--rerun-in-doubt", action="store_true",
                       help="run steps whose outcome is unknown again")
    group.add_argument("--accept-in-doubt", action="store_true",
                       help="count steps whose outcome is unknown as done")
    p.set_defaults(func=_cmd_replay)

    p = sub.add_parser("migrate", help="create or upgrade the database schema")
    _common(p)
    p.set_defaults(func=_cmd_migrate)

    p = sub.add_parser("worker", help="run a worker (same as python -m durable.worker)")
    _common(p)
    _worker_options(p)
    p.set_defaults(func=_cmd_worker)
    return parser


def worker_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m durable.worker",
                                     description="Claim and run durable workflows.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}",
                        help="print the version and exit")
    _common(parser)
    _worker_options(parser)
    parser.set_defaults(func=_cmd_worker)
    return parser


def _dispatch(args: argparse.Namespace) -> int:
    try:
        result: int = anyio.run(args.func, args, backend=args.backend)
        return result
    except DurableError as exc:
        _fail(str(exc))
    except KeyboardInterrupt:
        _fail("interrupted", 130)


def main(argv: Sequence[str] | None = None) -> int:
    configure_logging(level="warning")
    return _dispatch(build_parser().parse_args(argv))


def worker_main(argv: Sequence[str] | None = None) -> int:
    return _dispatch(worker_parser().parse_args(argv))
