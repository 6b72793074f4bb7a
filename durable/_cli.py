"""The command line: ``python -m durable`` (operators) and ``python -m durable.worker``."""

from __future__ import annotations

import argparse
import contextlib
import getpass
import importlib
import importlib.util
import json
import os
import signal
import socket
import sys
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

import anyio
import anyio.abc
from anyio.abc import TaskStatus

from ._approval import APPROVE, REJECT, send_decision
from ._client import Client, InDoubt, check_step, describe_replay
from ._commands import command
from ._errors import ConfigError, DurableError, InvalidStateError, RunNotFoundError
from ._follow import Follower
from ._logging import configure_logging, redact
from ._pool import MIN_HTTP_CONNECTIONS
from ._registry import default_registry, parameters_text
from ._report import (
    LIST_NOTE_COLUMN,
    _isatty,
    cancel_phrase,
    clip,
    escaped_line,
    list_note,
    one_line,
    parse_time,
    paused_phrase,
    render_timeline,
    resumed_phrase,
    shown_json,
    started_phrase,
    terminal_width,
    use_color,
)
from ._retention import PrunedRun, parse_duration, parse_states, prune
from ._schedules import SKIP_GRACE, ScheduleSpec, catchup_text, iso
from ._shapes import pause_json, run_json, show_json
from ._types import UNSTORABLE, Run, RunState, check_key, check_printable, check_seconds
from ._version import __version__
from ._worker import Worker
from .store import Store, store_from_url

DEFAULT_DB = "sqlite:///durable.db"


def _existing(args: argparse.Namespace,
              console_url: str | None = None) -> contextlib.AbstractAsyncContextManager[Client]:
    """A client on ``--db`` as it is, for the commands that read or steer runs: a missing
    database, or a schema older than this durable's, is an error (one line; ``durable
    migrate`` upgrades it), never created or upgraded under the workers that use it. Only
    ``start``, ``schedule add``, ``worker`` and ``migrate`` create or upgrade."""
    return Client.connect(args.db, create=False, upgrade=False, console_url=console_url)


def _fail(message: str, code: int = 2) -> NoReturn:
    print(f"durable: error: {message}", file=sys.stderr)
    raise SystemExit(code)


def import_modules(names: Sequence[str]) -> None:
    """Import the modules (dotted names or .py paths) that declare workflows.

    A module that cannot be found, or that raises while it is imported (a syntax error
    included), is a :class:`ConfigError` naming the module, its error and where; the
    original exception is its cause (``--traceback`` prints it).
    """
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
                try:
                    spec.loader.exec_module(module)
                except BaseException:
                    sys.modules.pop(path.stem, None)
                    raise
            else:
                if os.getcwd() not in sys.path:
                    sys.path.insert(0, os.getcwd())
                importlib.import_module(name)
        except ConfigError:
            raise
        except ModuleNotFoundError as exc:
            if exc.name is not None and (name == exc.name or name.startswith(exc.name + ".")):
                raise ConfigError(
                    f"cannot import {name!r}: {exc}; check --import and PYTHONPATH") from exc
            raise ConfigError(_import_failure(name, exc)) from exc
        except Exception as exc:
            raise ConfigError(_import_failure(name, exc)) from exc


def _import_failure(name: str, exc: Exception) -> str:
    """``cannot import 'mymod': ZeroDivisionError: division by zero (mymod.py line 3)``."""
    if isinstance(exc, SyntaxError):
        text, filename, line = exc.msg, exc.filename, exc.lineno
    else:
        text = str(exc)
        frames = traceback.extract_tb(exc.__traceback__)
        user = [f for f in frames if not f.filename.startswith("<frozen ")]
        shown_frames = user or frames
        filename, line = ((shown_frames[-1].filename, shown_frames[-1].lineno)
                          if shown_frames else (None, None))
    error = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    where = ""
    if filename:
        shown = filename
        with contextlib.suppress(ValueError):
            relative = os.path.relpath(filename)
            if not relative.startswith(os.pardir):
                shown = relative
        where = f" ({shown} line {line})" if line else f" ({shown})"
    return (f"cannot import {name!r}: {error}{where}; run with --traceback for the full "
            "traceback")


def _imports(args: argparse.Namespace) -> list[str]:
    names = list(args.imports or [])
    env = os.environ.get("DURABLE_IMPORT")
    if env:
        names.extend(n for n in env.split(",") if n.strip())
    return names


def _parse_json_arg(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        raise ConfigError(
            f"argument {text!r} is not JSON; quote strings as JSON, e.g. '\"slot-1\"'"
        ) from None


def _say_created(store: Store) -> None:
    """One line on stderr when the command created the database: a mistyped --db shows."""
    if store.created is not None:
        print(f"durable: created a new database at {store.created}", file=sys.stderr)


def _check_start(name: str, values: Sequence[Any]) -> None:
    """The imported workflow ``name`` could take ``values``: else one line naming what it
    takes, before anything is written."""
    workflow = default_registry.workflow(name)
    try:
        workflow.arguments(tuple(values), {})
    except TypeError as exc:
        raise ConfigError(
            f"cannot start {name}: {str(exc).removeprefix(f'workflow {name}: ')}; it takes "
            f"{parameters_text(workflow.fn)}") from None


# -- commands -------------------------------------------------------------------------------------
async def _cmd_start(args: argparse.Namespace) -> int:
    import_modules(_imports(args))
    values = [_parse_json_arg(a) for a in args.args]
    _check_start(args.workflow, values)
    # before the database is opened, naming the options
    for value, option in ((args.timeout, "--timeout"), (args.delay, "--delay"),
                          (args.start_within, "--start-within")):
        if value is not None:
            check_seconds(value, option, zero=option == "--delay")
    check_key(args.key)
    if args.id is not None:
        check_printable(args.id, "--id")
    async with Client.connect(args.db) as client:
        _say_created(client.store)
        run = await client.start(args.workflow, *values, id=args.id, key=args.key,
                                 delay=args.delay, timeout=args.timeout,
                                 start_within=args.start_within)
        pause = await client.pause_of(run.workflow)
    if pause is not None and run.state is RunState.QUEUED:
        print(f"durable: note: {run.workflow} is {paused_phrase(pause)}: the run waits until "
              f"{command('resume', run.workflow)}", file=sys.stderr)
    if args.json:
        print(json.dumps(run_json(run), indent=2))
    else:
        print(started_phrase(run))
    return 0


async def _cmd_list(args: argparse.Namespace) -> int:
    since, until = parse_time(args.since, "--since"), parse_time(args.until, "--until")
    if since is not None and until is not None and since > until:
        raise ConfigError("--since must not be after --until")
    async with _existing(args) as client:
        runs = await client.list(state=args.state, workflow=args.workflow, key=args.key,
                                 limit=args.limit, created_from=since, created_to=until,
                                 id_prefix=args.prefix)
        now = await client.store.now()
        held = {p.workflow for p in await client.paused()}
        gone = await client.gone_holders(runs)
    if args.json:
        print(json.dumps([run_json(r, gone.get(r.id)) for r in runs], indent=2))
        return 0
    if not runs:
        print("no runs")
        return 0
    print(f"{'id':<36} {'workflow':<20} {'key':<16} {'state':<10} {'attempt':>7}  "
          f"{LIST_NOTE_COLUMN}")
    for r in runs:
        # a run released to wait says what for (durable waiting) where an error would be;
        # a queued run of a paused workflow, that it waits for the resume
        note = list_note(r, now, gone.get(r.id))
        if r.state is RunState.QUEUED and r.workflow in held:
            note = f"paused ({command('resume', r.workflow)}){'; ' + note if note else ''}"
        print(escaped_line(f"{r.id:<36} {r.workflow:<20} {(r.key or '-'):<16} "
                           f"{r.state.value:<10} {r.attempt:>7}  {clip(one_line(note), 60)}"))
    return 0


async def _cmd_show(args: argparse.Namespace) -> int:
    if args.follow:
        if args.json or args.step is not None:
            raise ConfigError("--follow prints the timeline as it grows; it cannot be combined "
                              f"with {'--json' if args.json else '--step'} (run show without "
                              "--follow for that)")
        return await _follow_run(args)
    async with _existing(args, console_url=args.console_url) as client:
        run = await client.get(args.id)
        entries = await client.store.journal(args.id)
        signals = await client.store.list_signals(args.id)
        paused = None if run.state.finished else await client.pause_of(run.workflow)
        gone = (await client.gone_holders([run])).get(run.id)
        now = await client.store.now()
    if args.step is not None:
        check_step(run.id, entries, args.step, "--step")
    if args.json:
        print(json.dumps(show_json(run, entries, args.console_url, args.step, signals,
                                   gone), indent=2))
        return 0
    print(render_timeline(run, entries, step=args.step, console_url=args.console_url,
                          width=terminal_width(sys.stdout),
                          color=use_color(sys.stdout, args.color), signals=signals,
                          paused=paused, gone=gone, now=now))
    return 0


async def _follow_run(args: argparse.Namespace) -> int:
    """``show ID --follow``: 0 once the run has ended, 130 on Ctrl-C (SIGINT)."""
    interrupted = False
    async with _existing(args, console_url=args.console_url) as client:
        follower = Follower(client, args.id, sys.stdout, width=terminal_width(sys.stdout),
                            color=use_color(sys.stdout, args.color), tty=_isatty(sys.stdout),
                            console_url=args.console_url)
        try:
            async with anyio.create_task_group() as tg:

                async def stop_on_signal(*, task_status: TaskStatus[None]) -> None:
                    nonlocal interrupted
                    with anyio.open_signal_receiver(signal.SIGINT) as signals:
                        task_status.started()
                        async for _signum in signals:
                            interrupted = True
                            tg.cancel_scope.cancel()
                            return

                await tg.start(stop_on_signal)
                try:
                    await follower.run()
                finally:
                    tg.cancel_scope.cancel()
        except BaseExceptionGroup as group:  # the follower's own error, as show raises it
            error: BaseException = group
            while isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
                error = error.exceptions[0]
            if isinstance(error, BrokenPipeError):  # piped into a reader that left (| head)
                with contextlib.suppress(OSError):
                    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
                return 0
            raise error from None
    if interrupted:
        follower.stop()
        print(f"durable: stopped following {args.id}; the run itself goes on (cancel it with "
              f"{command('cancel', args.id, python=True)})", file=sys.stderr)
        return 130
    return 0


def _cli_origin() -> dict[str, Any]:
    """Where an operator action from the command line came from, journaled with it."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (a container)
        user = str(os.getuid())
    return {"via": "cli", "user": user, "host": socket.gethostname(), "pid": os.getpid()}


async def _cmd_cancel(args: argparse.Namespace) -> int:
    filters = {"workflow": args.workflow, "key": args.key, "state": args.state}
    chosen = {k: v for k, v in filters.items() if v is not None}
    if args.all and chosen:
        raise ConfigError("--all cancels every queued and running run; it takes no "
                          f"--{next(iter(chosen))}")
    by_filter = bool(chosen) or args.all
    if by_filter and args.ids:
        raise ConfigError("give run ids or a filter (--workflow, --key, --state, --all), "
                          "not both")
    if not by_filter and not args.ids:
        raise ConfigError("name the runs to cancel: their ids, or a filter (--workflow, "
                          "--key, --state, --all)")
    if not by_filter and args.dry_run:
        raise ConfigError("--dry-run lists what a filter matches; it takes no ids")
    if not by_filter and len(args.ids) == 1:
        async with _existing(args) as client:
            run = await client.cancel(args.ids[0], origin=_cli_origin())
            said = await _cancel_phrase(client, run)
        print(f"{run.id} {said}")
        return 0
    if by_filter and not (args.yes or args.dry_run):
        raise ConfigError("cancelling by filter needs --yes (or --dry-run, to list what it "
                          "would cancel and write nothing)")
    check_key(args.key)
    origin = _cli_origin()
    async with _existing(args) as client:
        if by_filter:
            ids = await _unfinished(client, args.workflow, args.key, args.state)
            print(f"{len(ids)} run{'' if len(ids) == 1 else 's'} matched" if ids
                  else "no queued or running run matched", f"({_filter_text(chosen)})")
            if args.dry_run:
                for run_id, workflow, state in ids:
                    print(f"{run_id}  {workflow}  {state}: would be cancelled")
                return 0
            origin["filter"] = _filter_text(chosen)
            targets = [run_id for run_id, _, _ in ids]
        else:
            targets = list(dict.fromkeys(args.ids))  # each once, in the order given
        missed = 0
        for run_id in targets:
            try:
                run = await client.cancel(run_id, origin=origin)
            except RunNotFoundError:
                missed += 1
                print(f"{run_id} no such run")
                continue
            except InvalidStateError:
                run = await client.get(run_id)
                missed += not by_filter  # a filter's run that ended meanwhile is no mistake
                print(f"{run_id} had already ended ({run.state.value}); nothing to cancel")
                continue
            print(f"{run_id} {await _cancel_phrase(client, run)}")
    return 1 if missed else 0


async def _cancel_phrase(client: Client, run: Run) -> str:
    """What the cancel did (:func:`durable._report.cancel_phrase`), from the journal."""
    entries = await client.journal(run.id) if run.state.finished and run.attempt else []
    return cancel_phrase(run, entries)


def _filter_text(chosen: Mapping[str, str]) -> str:
    return " ".join(f"--{k} {v}" for k, v in chosen.items()) or "--all"


CANCEL_PAGE = 500
"""Runs read per page by a filtered cancel."""


async def _unfinished(client: Client, workflow: str | None, key: str | None,
                      state: str | None) -> list[tuple[str, str, str]]:
    """The queued and running runs a filter matches as the command begins (``(id,
    workflow, state)``), read page by page and taken whole before anything is cancelled,
    so runs started after it began are not cancelled.

    Both states are read together (:meth:`Client.list_unfinished`: one statement per page,
    so each page is one snapshot, and a run's page is fixed by its creation): a run that
    moves between them while the pages are read (claimed; released by a worker's shutdown;
    recovered after its worker died) is read once, and cancelled. ``--state`` keeps the
    runs in that state at the read. A run that ends meanwhile (its recovery by this read
    included) is listed and said to have ended."""
    found: list[tuple[str, str, str]] = []
    cursor: tuple[float, str] | None = None
    while True:
        page = await client.list_unfinished(workflow, key, limit=CANCEL_PAGE, before=cursor)
        found.extend((r.id, r.workflow, r.state.value) for r in page
                     if state is None or r.state.value == state)
        if len(page) < CANCEL_PAGE:
            return found
        cursor = (page[-1].created_at, page[-1].id)


async def _cmd_pause(args: argparse.Namespace) -> int:
    async with _existing(args) as client:
        pause = await client.pause(args.workflow, origin=_cli_origin())
        queued = (await client.counts(workflow=args.workflow))["queued"]
    if not pause.known:  # a typo pauses nothing that exists; a new one may be paused first
        print(f"durable: note: no run of {args.workflow!r} was ever started in this "
              "database (paused all the same; durable resume undoes it)", file=sys.stderr)
    print(f"{pause.workflow} {paused_phrase(pause)}: no attempt of it starts until "
          f"`{command('resume', pause.workflow)}` ({queued} queued run"
          f"{' waits' if queued == 1 else 's wait'}; running ones go on)")
    return 0


async def _cmd_resume(args: argparse.Namespace) -> int:
    async with _existing(args) as client:
        ended = await client.resume(args.workflow)
    print(resumed_phrase(args.workflow, ended))
    return 0


async def _cmd_paused(args: argparse.Namespace) -> int:
    async with _existing(args) as client:
        paused = await client.paused()
        counts = {p.workflow: (await client.counts(workflow=p.workflow))["queued"]
                  for p in paused}
    if args.json:
        print(json.dumps([{**pause_json(p), "queued": counts[p.workflow]} for p in paused],
                         indent=2))
        return 0
    if not paused:
        print("no paused workflow")
    for p in paused:
        print(f"{p.workflow}  {paused_phrase(p)}  ({counts[p.workflow]} queued)")
    return 0


async def _cmd_signal(args: argparse.Namespace) -> int:
    payload = None if args.payload is None else _parse_json_arg(args.payload)
    async with _existing(args) as client:
        recorded = await client.signal(args.id, args.name, payload, id=args.signal_id,
                                       origin=_cli_origin())
    if recorded:
        print(f"{args.id}: signal {args.name!r} recorded")
    else:
        print(f"{args.id}: signal id {args.signal_id!r} was already recorded with this name "
              "and payload; nothing new written")
    return 0


async def _cmd_replay(args: argparse.Namespace) -> int:
    policy: InDoubt | None = (
        "rerun" if args.rerun_in_doubt else "accept" if args.accept_in_doubt else None)
    async with _existing(args) as client:
        entries = await client.journal(args.id)
        try:
            run = await client.replay(args.id, from_step=args.from_step, in_doubt=policy,
                                      origin=_cli_origin())
        except ConfigError as exc:
            raise ConfigError(str(exc).replace("from_step", "--from-step").replace(
                "in_doubt='accept'", "--accept-in-doubt")) from exc
    print(describe_replay(run.id, entries, args.from_step, policy))
    return 0


async def _cmd_schedule_add(args: argparse.Namespace) -> int:
    import_modules(_imports(args))
    spec = ScheduleSpec(name=args.name, workflow=args.workflow,
                        args=[_parse_json_arg(a) for a in args.args], cron=args.cron,
                        timezone=args.timezone, key=args.key, catchup=args.catchup)
    _check_start(spec.workflow, spec.args)  # before the database is opened
    async with Client.connect(args.db) as client:
        _say_created(client.store)
        found = await client.add_schedule(spec)
    if args.json:
        print(json.dumps(found.to_json(), indent=2))
    else:
        print(f"schedule {found.name}: {found.spec.workflow} at {found.spec.cron!r} "
              f"({found.spec.timezone}); next fire {iso(found.next_fire())}")
    return 0


async def _cmd_schedule_list(args: argparse.Namespace) -> int:
    async with _existing(args) as client:
        found = await client.schedules()
    if args.json:
        print(json.dumps([s.to_json() for s in found], indent=2))
        return 0
    if not found:
        print("no schedules")
        return 0
    print(f"{'name':<24} {'workflow':<20} {'cron':<18} {'timezone':<16} {'next fire':<21} "
          "last run")
    unfireable = []
    for sched in found:
        when, why = sched.next_fire_or_why()
        nxt = "paused" if sched.paused else iso(when) or "cannot fire"
        if why is not None:
            unfireable.append(f"{sched.name}: cannot fire: {why}")
        print(f"{sched.name:<24} {sched.spec.workflow:<20} {sched.spec.cron:<18} "
              f"{sched.spec.timezone:<16} {nxt:<21} {sched.last_run_id or '-'}")
    for line in unfireable:
        print(line)
    return 0


async def _cmd_schedule_show(args: argparse.Namespace) -> int:
    async with _existing(args) as client:
        found = await client.get_schedule(args.name)
    shown = found.to_json()
    if args.json:
        print(json.dumps(shown, indent=2))
        return 0
    shown["catchup"] = catchup_text(found.spec.catchup)
    shown["args"] = shown_json(found.spec.args)
    if shown["cannot_fire"] is None:
        del shown["cannot_fire"]
    for name, value in shown.items():
        print(f"{name + ':':<14} {'-' if value is None else value}")
    return 0


async def _cmd_schedule_pause(args: argparse.Namespace) -> int:
    paused = args.schedule_command == "pause"
    async with _existing(args) as client:
        found = await client.pause_schedule(args.name, paused=paused)
    if paused:
        print(f"schedule {found.name} paused: it starts nothing until resumed")
    else:
        when, why = found.next_fire_or_why()
        print(f"schedule {found.name} resumed; " + (
            f"next fire {iso(when)}" if why is None else f"it cannot fire: {why}"))
    return 0


async def _cmd_schedule_delete(args: argparse.Namespace) -> int:
    async with _existing(args) as client:
        await client.delete_schedule(args.name)
    print(f"schedule {args.name} deleted (the runs it started stay)")
    return 0


async def _cmd_prune(args: argparse.Namespace) -> int:
    older_than = parse_duration(args.older_than)
    states = parse_states(args.state)
    counts = dict.fromkeys(states, 0)

    def seen(item: Run | PrunedRun) -> None:
        counts[item.state] += 1
        if args.dry_run and isinstance(item, Run):
            print(f"{item.id:<36} {item.workflow:<20} {item.state.value:<10} ended "
                  f"{iso(item.updated_at)}")

    doubts: dict[RunState, int] = {}

    def unanswered(state: RunState, batch: int) -> None:
        doubts[state] = doubts.get(state, 0) + batch

    async with _existing(args) as client:
        cutoff = await client.store.now() - older_than
        total = await prune(client.store, older_than, states, dry_run=args.dry_run,
                            seen=seen, unanswered=unanswered)
    detail = ", ".join(f"{state.value} {n}" for state, n in counts.items())
    verb = "would prune" if args.dry_run else "pruned"
    doubt = ", ".join(f"{state.value} {n}" for state, n in doubts.items())
    print(f"{verb} {total} run{'s' if total != 1 else ''} ({detail}) that ended before "
          f"{iso(cutoff)}{'; nothing was deleted (dry run)' if args.dry_run else ''}"
          + (f"; up to {sum(doubts.values())} more ({doubt}) may have been pruned by a "
             "batch whose answer was lost: not counted (a pruned run's tombstone says so: "
             "durable show ID)" if doubts else ""))
    return 0


async def _cmd_decide(args: argparse.Namespace) -> int:
    """``approve ID [--note]`` / ``reject ID [--reason]``: a signal to a run's plan gate."""
    text = args.note if args.decision == APPROVE else args.reason
    payload = {"note" if args.decision == APPROVE else "reason": text} if text else {}
    async with _existing(args) as client:
        await send_decision(client, args.id, args.decision, payload, id=args.signal_id,
                            origin=_cli_origin())
    print(f"{args.id}: plan approved; the run re-checks it, then acts" if args.decision
          == APPROVE else f"{args.id}: plan rejected; the run ends without acting")
    return 0


async def _cmd_migrate(args: argparse.Namespace) -> int:
    store = store_from_url(args.db)
    await store.open()
    try:
        _say_created(store)
        version = await store.schema_version()
    finally:
        await store.aclose()
    print(f"{store.url}: schema version {version}")
    return 0


_WORKER_FLAGS = {"concurrency": "--concurrency", "lease": "--lease", "grace": "--grace",
                 "poll_interval": "--poll", "http_connections": "--http-connections",
                 "durable_wait_threshold": "--wait-threshold"}
"""The :class:`Worker` parameters the command line sets, by their flags."""


async def _cmd_worker(args: argparse.Namespace) -> int:
    configure_logging(json=args.log_format == "json", level=args.log_level)
    prune_age = (None if args.prune_older_than is None
                 else parse_duration(args.prune_older_than, "--prune-older-than"))
    prune_every = parse_duration(args.prune_every, "--prune-every")
    if prune_every <= 0:
        raise ConfigError("--prune-every must be more than 0s")
    import_modules(_imports(args))
    if not default_registry.workflows:
        raise ConfigError("no workflows registered: pass --import MODULE (or DURABLE_IMPORT)")
    console_sock, token, allow_hosts = None, None, []
    console_url = args.console_url
    if args.console:  # bound before anything else, so a taken port is one line and no work
        from .console import _command as console_command
        from .console import bind_socket, parse_bind, url_of

        console_command.check_installed()
        token = console_command.read_token(args.token_file)
        allow_hosts = console_command.allowed_hosts(args.allow_hosts)
        console_sock = bind_socket(*parse_bind(args.console))
        console_url = console_url or url_of(console_sock)
    metrics: Any = None
    metrics_listener: Any = None
    if args.metrics:  # bound before any work too; the extra's absence is one line
        from .console._command import parse_bind as parse_metrics_bind

        host, port = parse_metrics_bind(args.metrics, "--metrics", DEFAULT_METRICS)
        prometheus = _metrics_extra()
        try:
            metrics_listener = await anyio.create_tcp_listener(local_host=host,
                                                               local_port=port)
        except OSError as exc:
            raise ConfigError(f"cannot serve the metrics on {host}:{port}: "
                              f"{exc.strerror or exc}") from exc
        metrics = prometheus.MetricsInterceptor()
        bound = metrics_listener.extra(anyio.abc.SocketAttribute.local_address)
        shown = f"[{bound[0]}]" if ":" in bound[0] else bound[0]
        metrics_url = f"http://{shown}:{bound[1]}/metrics"
    # statements are short: a small pool serves many attempts (10 was as fast as 35 with 32
    # attempts), and several workers must stay under the server's max_connections
    store = store_from_url(args.db, pool_size=min(args.concurrency + 3, 10))
    try:  # made before the store opens: options it refuses are one line, and no database
        worker = Worker(store, concurrency=args.concurrency, lease=args.lease,
                        grace=args.grace, poll_interval=args.poll, console_url=console_url,
                        http_connections=args.http_connections,
                        schedules=not args.no_schedules,
                        prune_older_than=prune_age, prune_interval=prune_every,
                        interceptors=[] if metrics is None else [metrics],
                        durable_wait_threshold=args.wait_threshold)
    except BaseException as exc:
        if console_sock is not None:
            console_sock.close()
        if metrics_listener is not None:
            await metrics_listener.aclose()
        if isinstance(exc, ConfigError):  # said with the option's flag, not its parameter
            said = str(exc)
            for parameter, flag in _WORKER_FLAGS.items():
                if said.startswith(parameter + " "):
                    raise ConfigError(flag + said[len(parameter):]) from None
        raise
    await store.open()
    try:
        if store.created is not None:  # a log line like the worker's others (JSON with
            # --log-format json): a mistyped --db shows
            worker.log.warning("database_created", at=store.created)
        async with anyio.create_task_group() as tg:
            await tg.start(_watch_signals, worker)  # handlers in place before worker_started
            if metrics_listener is not None:
                from .prometheus import serve_metrics

                await tg.start(serve_metrics, metrics, store, metrics_listener)
                metrics_listener = None  # served: closed by serve_metrics
                print(f"durable: metrics at {metrics_url}", file=sys.stderr, flush=True)
            if console_sock is not None:
                from .console import create_app, serve

                app = create_app(Client(store, console_url=console_url), token=token,
                                 console_url=console_url, allow_hosts=allow_hosts)
                await tg.start(serve, app, console_sock)
                print(f"durable: console at {console_url}/runs", file=sys.stderr, flush=True)
            await worker.run()
            tg.cancel_scope.cancel()
    finally:
        with anyio.CancelScope(shield=True):
            await store.aclose()
        if console_sock is not None:
            console_sock.close()
        if metrics_listener is not None:
            with anyio.CancelScope(shield=True):
                await metrics_listener.aclose()
    return 0


DEFAULT_METRICS = "127.0.0.1:9464"


def _metrics_extra() -> Any:
    """``durable.prometheus``, or one line naming the extra it needs."""
    try:
        import prometheus_client  # noqa: F401
    except ImportError as exc:
        raise ConfigError(
            f"--metrics needs the prometheus extra ({exc.name} is not installed): pip "
            "install 'durable-fenced[prometheus]' (from a checkout: pip install -e "
            "'.[prometheus]')") from exc
    from . import prometheus

    return prometheus


async def _cmd_console(args: argparse.Namespace) -> int:
    from .console import _command as console_command

    console_command.check_installed()
    from .console import bind_socket, parse_bind

    token = console_command.read_token(args.token_file)
    allow_hosts = console_command.allowed_hosts(args.allow_hosts)
    sock = bind_socket(*parse_bind(args.bind, "--bind"))  # a taken port: one line, nothing
    with sock:
        async with _existing(args, console_url=args.console_url) as client:
            async with anyio.create_task_group() as tg:
                await tg.start(_cancel_on_signal, tg.cancel_scope)
                await console_command.serve_client(client, sock, token, allow_hosts)
    return 0


async def _cancel_on_signal(scope: anyio.CancelScope, *,
                            task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
    """SIGTERM or SIGINT ends the block (every later signal too: no KeyboardInterrupt)."""
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        task_status.started()
        async for _signum in signals:
            scope.cancel()


async def _watch_signals(worker: Worker, *,
                         task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        task_status.started()
        count = 0
        async for _signum in signals:
            count += 1
            worker.shutdown(grace=None if count == 1 else 0)


# -- parsers ---------------------------------------------------------------------------------------
DESCRIPTION = """\
durable: durable workflows of journaled activities.

Start runs of workflows, list and show runs with their journals, cancel and replay them,
send them signals, create or upgrade the database, and run workers that claim and execute
runs.
"""

EPILOG = """\
The database is --db, else $DURABLE_DB, else sqlite:///durable.db (a relative SQLite path is
relative to the current folder). A user's mistake prints one line and exits 2; add
--traceback (or set DURABLE_TRACEBACK=1) for the full Python traceback.
Run "python -m durable COMMAND --help" for a command's options.
"""


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """Every option's help ends with its default, unless it has none or says it already."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if (not action.option_strings or default is None or default is False
                or default is argparse.SUPPRESS or "(default:" in text):
            return text
        return f"{text} (default: %(default)s)"


class _Parser(argparse.ArgumentParser):
    """Errors in the command line are one line: what is wrong and where to look."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _Formatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: error: {message} (see: {self.prog} --help)", file=sys.stderr)
        raise SystemExit(2)

    def parse_command_line(self, argv: Sequence[str] | None) -> argparse.Namespace:
        """``parse_args``, but an unknown option is reported by the command it was given to,
        and a word that is not valid UTF-8 (Python hands such bytes over as lone surrogates,
        which no store can hold or look up) is refused before anything is read or written."""
        words = list(sys.argv[1:] if argv is None else argv)
        for word in words:
            if UNSTORABLE.search(word) is not None:
                self.error(f"argument {word!a} is not valid UTF-8: no run id, key or name "
                           "can hold it")
        args, extra = self.parse_known_args(words)
        if extra:
            target: argparse.ArgumentParser = getattr(args, "command_parser", self)
            target.error(f"unrecognized arguments: {' '.join(extra)}")
        return args


def _common(parser: argparse.ArgumentParser, *, console: bool = False) -> None:
    parser.add_argument(
        "--db", metavar="URL", default=os.environ.get("DURABLE_DB", DEFAULT_DB),
        help="database: sqlite:///FILE (relative to the current folder; sqlite:////ABS/PATH "
             "for an absolute path) or postgresql://USER@HOST:PORT/DB "
             "(default: $DURABLE_DB, else sqlite:///durable.db)")
    if console:
        parser.add_argument(
            "--console-url", metavar="URL", default=os.environ.get("DURABLE_CONSOLE_URL"),
            help="base URL of the operator console, for links in recovery reports "
                 "(default: $DURABLE_CONSOLE_URL, else no links)")
    parser.add_argument(
        "--traceback", action="store_true",
        help="on an error, print the full Python traceback too (or set DURABLE_TRACEBACK=1)")
    parser.add_argument("--backend", choices=("asyncio", "trio"), default="asyncio",
                        help="event loop to run on (on trio, the PostgreSQL store runs on "
                        "an asyncio loop of its own, in a thread)")


def _import_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--import", dest="imports", action="append", metavar="MODULE",
        help="module (dotted name, found from the current folder and PYTHONPATH) or .py file "
             "that declares the workflows; repeatable (also $DURABLE_IMPORT, comma-separated)")


def _at_least_one(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def _worker_options(parser: argparse.ArgumentParser) -> None:
    _common(parser, console=True)
    _import_option(parser)
    parser.add_argument("--concurrency", type=int, default=16, metavar="N",
                        help="runs executed at the same time")
    parser.add_argument("--http-connections", type=_at_least_one, metavar="N",
                        help="requests in flight at once through ctx.http, per host (scheme, "
                             "host, port); a request beyond them waits for a connection and "
                             "the wait is logged (http_pool_wait) (default: the concurrency, "
                             f"at least {MIN_HTTP_CONNECTIONS})")
    parser.add_argument("--lease", type=float, default=30.0, metavar="SECONDS",
                        help="lease on each claimed run, renewed every second; a crashed "
                             "worker's runs are recovered once it expires")
    parser.add_argument("--grace", type=float, default=10.0, metavar="SECONDS",
                        help="on SIGTERM or SIGINT, time running attempts get to finish "
                             "before they are cancelled (a second signal cancels at once)")
    parser.add_argument("--poll", type=float, default=0.5, metavar="SECONDS",
                        help="when idle, time between looks for due runs")
    parser.add_argument("--no-schedules", action="store_true",
                        help="do not run the scheduler here (by default every worker fires "
                             "due schedules; a fire starts one run however many do)")
    parser.add_argument("--prune-older-than", metavar="AGE",
                        help="prune finished runs older than AGE (30d, 12h, 0s: as durable "
                             "prune --older-than) at start and every --prune-every "
                             "(default: off, nothing is pruned)")
    parser.add_argument("--prune-every", default="1h", metavar="AGE",
                        help="with --prune-older-than, time between two prunes")
    parser.add_argument("--wait-threshold", type=float, default=2.0, metavar="SECONDS",
                        help="durable waits (ctx.sleep, ctx.wait_for, retry delays) of this "
                             "long or longer end the attempt and release the run until it "
                             "is due; shorter ones wait in the attempt")
    parser.add_argument("--log-format", choices=("console", "json"), default="console",
                        help="log lines on stderr: console (for people) or json (one object "
                             "a line)")
    parser.add_argument("--log-level", default="info",
                        choices=("debug", "info", "warning", "error"),
                        help="the least severe log lines shown")
    parser.add_argument(
        "--metrics", metavar="HOST:PORT",
        help=f"serve Prometheus metrics at http://HOST:PORT/metrics ({DEFAULT_METRICS} for "
             "this machine only; needs the prometheus extra) (default: no metrics)")
    from .console._command import add_options as console_options

    console_options(parser, worker=True)
    parser.set_defaults(func=_cmd_worker)


def build_parser() -> _Parser:
    parser = _Parser(prog="durable", description=DESCRIPTION, epilog=EPILOG)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}",
                        help="print the version and exit")
    sub = parser.add_subparsers(dest="command", required=True, title="commands",
                                metavar="COMMAND")

    p = sub.add_parser("start", help="queue a run of a workflow", description=(
        "Queue a run of a workflow. Starting the same --id again returns the existing run."))
    _common(p)
    p.add_argument("workflow", help="the workflow's registered name, e.g. slot.reset")
    p.add_argument("args", nargs="*", metavar="JSON_ARG",
                   help="the workflow's arguments, each a JSON value (quote strings: "
                        "\'\"slot-1\"\')")
    _import_option(p)
    p.add_argument("--id", help="run id (default: WORKFLOW-<random hex>)")
    p.add_argument("--key", help="concurrency key: at most one run per key runs at a time "
                                 "(default: no key)")
    p.add_argument("--delay", type=float, metavar="SECONDS",
                   help="start after this many seconds; cancellable until then "
                        "(default: at once)")
    p.add_argument("--timeout", type=float, metavar="SECONDS",
                   help="the run's timeout, in place of its workflow's: counted from its "
                        "first attempt, across attempts (default: the workflow's, else none)")
    p.add_argument("--start-within", type=float, metavar="SECONDS",
                   help="its first attempt must be claimed within this many seconds of the "
                        "run being due, or it fails the run without running any of its code "
                        "(a deletion queued while no worker ran does not happen hours later; "
                        "default: the workflow's, else no limit)")
    p.add_argument("--json", action="store_true", help="print the run as JSON")
    p.set_defaults(func=_cmd_start)

    p = sub.add_parser("list", help="list runs, newest first",
                       description="List runs, newest first.")
    _common(p)
    p.add_argument("--state", choices=[s.value for s in RunState],
                   help="only runs in this state (default: any)")
    p.add_argument("--workflow", help="only runs of this workflow (default: any)")
    p.add_argument("--key", help="only runs with this concurrency key (default: any)")
    p.add_argument("--since", metavar="TIME",
                   help="only runs created at or after TIME: ISO 8601 (2026-12-01T09:00Z; UTC "
                        "unless it says otherwise) or epoch seconds (default: any)")
    p.add_argument("--until", metavar="TIME",
                   help="only runs created before TIME (default: any)")
    p.add_argument("--prefix", metavar="ID_PREFIX",
                   help="only runs whose id starts with this (default: any)")
    p.add_argument("--limit", type=int, default=50, metavar="N", help="at most N runs")
    p.add_argument("--json", action="store_true", help="print the runs as JSON")
    p.set_defaults(func=_cmd_list)

    p = sub.add_parser("show", help="a run and its journal as a timeline",
                       description="Print a run and its journal as a timeline.")
    _common(p, console=True)
    p.add_argument("id", help="the run's id")
    p.add_argument("--step", type=int, metavar="N", help="only step N (default: every step)")
    p.add_argument("--json", action="store_true",
                   help="print the run, its steps, its journal and its recovery report as "
                        "JSON")
    p.add_argument("--color", choices=("auto", "always", "never"), default="auto",
                   help="colour the states: auto = on a terminal unless NO_COLOR is set "
                        "(default: auto)")
    p.add_argument("--follow", action="store_true",
                   help="then follow the run live: print each step as it starts and ends, "
                        "and a batch run's items done / total (on a terminal a progress bar "
                        "redrawn in place, piped a line per change), until the run ends. Exits "
                        "0 once the run has ended, whatever its state (following worked; the "
                        "final line says how the run ended, and show ID --json tells a script), "
                        "130 on Ctrl-C, which stops following, not the run. A store that "
                        "cannot be read (a server restarting) is read again until it "
                        "answers; a line says so, and one more when it answers")
    p.set_defaults(func=_cmd_show)

    p = sub.add_parser("cancel", help="cancel queued, delayed or running runs",
                       description="Cancel a queued or delayed run at once, or ask the worker "
                                   "holding a running run to stop it: the runs named by id, or "
                                   "every queued and running run a filter matches as the "
                                   "command begins (an incident's stop: --workflow "
                                   "slot.teardown --yes). Each cancel is journaled with who "
                                   "sent it (and the filter); a run prints one line. One id "
                                   "that does not exist or had already ended is an error "
                                   "(exit 2); of several ids, such a one is a line, and the "
                                   "command exits 1.")
    _common(p)
    p.add_argument("ids", nargs="*", metavar="ID", help="the runs' ids")
    p.add_argument("--workflow", help="every queued and running run of this workflow")
    p.add_argument("--key", help="every queued and running run of this concurrency key")
    p.add_argument("--state", choices=["queued", "running"],
                   help="only the runs in this state (default: both)")
    p.add_argument("--all", action="store_true", help="every queued and running run")
    p.add_argument("--yes", action="store_true",
                   help="cancel what the filter matches (a filter needs it, or --dry-run)")
    p.add_argument("--dry-run", action="store_true",
                   help="list what the filter matches; cancel nothing")
    p.set_defaults(func=_cmd_cancel)

    p = sub.add_parser("signal", help="send a signal to a run (ctx.wait_for receives it)",
                       description="Send the signal NAME, with an optional JSON payload, to a "
                                   "queued or running run: its ctx.wait_for(NAME) receives it "
                                   "(each signal once, in order; one sent before the workflow "
                                   "waits is kept). --id makes the send idempotent.")
    _common(p)
    p.add_argument("id", help="the run's id")
    p.add_argument("name", help="the signal's name, e.g. approve")
    p.add_argument("payload", nargs="?", metavar="JSON",
                   help="the payload, a JSON value (quote strings: \'\"yes\"\'; "
                        "default: null)")
    p.add_argument("--id", dest="signal_id", metavar="SIGNAL_ID",
                   help="an id for this signal: sending it again with the same name and "
                        "payload records nothing, with another is refused (default: none, "
                        "every send is a new signal)")
    p.set_defaults(func=_cmd_signal)

    p = sub.add_parser("pause", help="pause a workflow: no attempt of it starts until resumed",
                       description="Pause a workflow: from now no worker claims a run of it "
                                   "(a new attempt, or one resuming after a durable wait), "
                                   "until `durable resume WORKFLOW`. Its queued runs keep their "
                                   "place and a start queues more; attempts running now go on "
                                   "(cancel them with `durable cancel --workflow W --yes`). The "
                                   "pause is kept in the database, for every worker, with who "
                                   "paused it; pausing it again changes nothing.")
    _common(p)
    p.add_argument("workflow", help="the workflow's registered name, e.g. slot.teardown")
    p.set_defaults(func=_cmd_pause)

    p = sub.add_parser("resume", help="resume a paused workflow",
                       description="Resume a paused workflow: its runs are claimed again, "
                                   "oldest first (idle workers are woken). A run whose "
                                   "start_within or timeout ran out meanwhile fails when "
                                   "claimed, as it would have after any wait.")
    _common(p)
    p.add_argument("workflow", help="the workflow's registered name")
    p.set_defaults(func=_cmd_resume)

    p = sub.add_parser("paused", help="list the paused workflows",
                       description="List the paused workflows: since when, by whom, and how "
                                   "many runs of each are queued.")
    _common(p)
    p.add_argument("--json", action="store_true", help="print them as JSON")
    p.set_defaults(func=_cmd_paused)

    p = sub.add_parser("replay", help="run a failed or cancelled run again",
                       description="Queue a failed or cancelled run again. Completed steps "
                                   "keep their journaled results unless --from-step says "
                                   "otherwise; the journal keeps every earlier attempt.")
    _common(p)
    p.add_argument("id", help="the run's id")
    p.add_argument("--from-step", type=int, metavar="N",
                   help="run step N and every later step again, completed ones included "
                        "(default: only steps without a result run)")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--rerun-in-doubt", action="store_true",
                       help="run steps whose outcome is unknown (in doubt) again")
    group.add_argument("--accept-in-doubt", action="store_true",
                       help="count steps whose outcome is unknown (in doubt) as done")
    p.set_defaults(func=_cmd_replay)

    for decision, what in ((APPROVE, "approve"), (REJECT, "reject")):
        p = sub.add_parser(decision, help=f"{what} the plan of a run waiting for approval",
                           description=f"Send the {decision!r} signal to a run that journaled "
                                       "its plan and waits for a decision (show ID prints the "
                                       "plan). Who sent it is journaled with it."
                                       + (" The run re-reads its plan right before acting "
                                          "and stops if anything changed." if decision ==
                                          APPROVE else " The run ends without acting."))
        _common(p)
        p.add_argument("id", help="the run's id")
        if decision == APPROVE:
            p.add_argument("--note", help="a note journaled with the approval")
        else:
            p.add_argument("--reason", help="why, journaled with the rejection")
        p.add_argument("--id", dest="signal_id", metavar="SIGNAL_ID",
                       help="the signal's id: sending the same id twice is one signal")
        p.set_defaults(func=_cmd_decide, decision=decision, note=None, reason=None)

    schedule_actions = _schedule_parser(sub)

    p = sub.add_parser("prune", help="delete finished runs older than an age, with their "
                                     "journals", description=PRUNE_DESCRIPTION)
    _common(p)
    p.add_argument("--older-than", required=True, metavar="AGE",
                   help="prune runs that ended more than AGE ago: a whole number and a unit, "
                        "w d h m s, largest first (30d, 12h, 1d12h, 90m, 0s: every finished "
                        "run)")
    p.add_argument("--state", default="completed,failed,cancelled", metavar="STATES",
                   help="only runs that ended in these states, comma-separated")
    p.add_argument("--dry-run", action="store_true",
                   help="print each run it would delete, and how many; delete nothing")
    p.set_defaults(func=_cmd_prune)

    p = sub.add_parser("migrate", help="create or upgrade the database schema",
                       description="Create the database (or PostgreSQL schema) or upgrade it "
                                   "to this version's schema, then print its version.")
    _common(p)
    p.set_defaults(func=_cmd_migrate)

    p = sub.add_parser("console", help="serve the operator console (web pages and JSON API)",
                       description=CONSOLE_DESCRIPTION)
    _common(p, console=True)
    from .console._command import add_options as console_options

    console_options(p, worker=False)
    p.set_defaults(func=_cmd_console)

    p = sub.add_parser("worker", help="run a worker (same as python -m durable.worker)",
                       description=WORKER_DESCRIPTION)
    _worker_options(p)
    for each in sub.choices.values():
        each.set_defaults(command_parser=each)
    for nested in schedule_actions:
        nested.set_defaults(command_parser=nested)
    return parser

SCHEDULE_DESCRIPTION = """\
Schedules start a run of a workflow at each fire of a cron expression. Every worker runs the
scheduler; a fire starts one run, with the id NAME@<fire time, ISO UTC> (for example
nightly@2026-12-02T03:00:00Z), however many workers see it. Schedules are declared in code
(durable.schedule(...), written by each worker at start) or added here.
"""


def _schedule_parser(sub: Any) -> list[argparse.ArgumentParser]:
    """The ``schedule`` command and its actions (returned: each reports its own errors)."""
    actions_seen: list[argparse.ArgumentParser] = []
    p = sub.add_parser("schedule", help="add, list, show, pause, resume or delete schedules",
                       description=SCHEDULE_DESCRIPTION)
    actions = p.add_subparsers(dest="schedule_command", required=True, title="actions",
                               metavar="ACTION")
    a = actions.add_parser(
        "add", help="add a schedule",
        description="Add a schedule: start WORKFLOW with the JSON arguments at every fire of "
                    "--cron, read in --timezone. Its first fire is the first after now. "
                    "Adding the same definition again changes nothing; another definition "
                    "under a name in use is refused.")
    _common(a)
    a.add_argument("name", help="the schedule's name (no spaces, no '@'); its runs' ids are "
                               "NAME@<fire time>")
    a.add_argument("workflow", help="the workflow's registered name, e.g. slot.reset")
    a.add_argument("args", nargs="*", metavar="JSON_ARG",
                   help="the workflow's arguments, each a JSON value")
    _import_option(a)
    a.add_argument("--cron", required=True,
                   help="when: 5 fields (minute hour day month weekday, e.g. "
                        "'0 3 * * *', 03:00 daily) or 6, the sixth being seconds "
                        "('* * * * * */10': every 10 s), as croniter reads them")
    a.add_argument("--timezone", default="UTC", metavar="TZ",
                   help="IANA timezone the cron expression is read in, e.g. Europe/Paris")
    a.add_argument("--key", help="concurrency key of the runs it starts (default: none)")
    a.add_argument("--catchup", default="skip", metavar="skip|N",
                   help="fires missed while no worker ran (found more than "
                        f"{SKIP_GRACE:g} s late; every fire found sooner starts): skip (not "
                        "started) or N (start up to the N latest missed fires, oldest first)")
    a.add_argument("--json", action="store_true", help="print the schedule as JSON")
    a.set_defaults(func=_cmd_schedule_add)
    actions_seen.append(a)

    a = actions.add_parser("list", help="every schedule: next fire, paused, last run",
                           description="List the schedules: workflow, cron, timezone, next "
                                       "fire time (or paused) and the last run started.")
    _common(a)
    a.add_argument("--json", action="store_true", help="print the schedules as JSON")
    a.set_defaults(func=_cmd_schedule_list)
    actions_seen.append(a)

    a = actions.add_parser("show", help="one schedule in full",
                           description="Print a schedule: its definition, next fire time, "
                                       "paused or not, and its last run.")
    _common(a)
    a.add_argument("name", help="the schedule's name")
    a.add_argument("--json", action="store_true", help="print the schedule as JSON")
    a.set_defaults(func=_cmd_schedule_show)
    actions_seen.append(a)

    for action, text in (("pause", "pause a schedule: it starts nothing until resumed"),
                         ("resume", "resume a paused schedule; fires while it was paused "
                                    "are never started")):
        a = actions.add_parser(action, help=text, description=text[0].upper() + text[1:] + ".")
        _common(a)
        a.add_argument("name", help="the schedule's name")
        a.set_defaults(func=_cmd_schedule_pause)
        actions_seen.append(a)

    a = actions.add_parser("delete", help="delete a schedule (its runs stay)",
                           description="Delete a schedule; the runs it started stay. A "
                                       "schedule declared in code comes back when a worker "
                                       "with that code starts: remove it from the code.")
    _common(a)
    a.add_argument("name", help="the schedule's name")
    a.set_defaults(func=_cmd_schedule_delete)
    actions_seen.append(a)
    return actions_seen


PRUNE_DESCRIPTION = """\
Delete the runs that finished (completed, failed or cancelled) more than --older-than ago,
with their journals, in batches of 500 runs, one short transaction each (other writers go
on between batches). Each pruned run leaves a tombstone: show ID says when it was pruned
and how it ended. Queued and running runs are never pruned, and their journals cannot be
deleted (the database refuses). Records (durable.set_records) are not a run's: they stay.
"""

CONSOLE_DESCRIPTION = """\
Serve the operator console until SIGTERM or SIGINT (Ctrl-C): runs, their journals as
timelines (/runs/ID#step-N, the target of recovery links), status by key, and a JSON API
(/api/...). Read-only unless an admin token is configured ($DURABLE_CONSOLE_TOKEN or
--token-file); cancel and replay then need it. Needs the console extra
(pip install 'durable-fenced[console]').
"""

WORKER_DESCRIPTION = """\
Claim and run durable workflows until SIGTERM or SIGINT (Ctrl-C): on the first signal,
stop claiming and give running attempts --grace seconds; a second signal cancels at once.
"""


def worker_parser() -> _Parser:
    parser = _Parser(prog="python -m durable.worker", description=WORKER_DESCRIPTION,
                     epilog=EPILOG)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}",
                        help="print the version and exit")
    _worker_options(parser)
    return parser


def _want_traceback(args: argparse.Namespace) -> bool:
    return bool(getattr(args, "traceback", False)) or os.environ.get(
        "DURABLE_TRACEBACK", "").strip().lower() not in ("", "0", "false", "no")


def _dispatch(args: argparse.Namespace) -> int:
    try:
        result: int = anyio.run(args.func, args, backend=args.backend)
        sys.stdout.flush()  # here, where a reader gone away is caught (below)
        return result
    except DurableError as exc:
        if _want_traceback(args):  # redacted like every other output (secrets never shown)
            print(redact("".join(traceback.format_exception(exc))), end="", file=sys.stderr)
        _fail(redact(str(exc)))
    except KeyboardInterrupt:
        _fail("interrupted", 130)
    except (BrokenPipeError, BaseExceptionGroup) as exc:
        if isinstance(exc, BaseExceptionGroup) and exc.split(BrokenPipeError)[1] is not None:
            raise
        # the reader went away (`durable list | head`): stop quietly, as a pipe's writer
        # killed by SIGPIPE does; what is left to flush goes nowhere, not to a traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE


def main(argv: Sequence[str] | None = None) -> int:
    configure_logging(level="warning")
    return _dispatch(build_parser().parse_command_line(argv))


def worker_main(argv: Sequence[str] | None = None) -> int:
    return _dispatch(worker_parser().parse_command_line(argv))
