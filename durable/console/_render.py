"""The console's pages, rendered on the server from the journal (no template engine).

Every text that comes from a run (arguments, results, summaries, errors, records) is
redacted of credentials and HTML-escaped here, in one place (:func:`text`). Pages hold no
inline script or style (the Content-Security-Policy forbids them): behaviour comes from
``/static/console.js`` through ``data-*`` attributes (see that file's header).
"""

from __future__ import annotations

import hashlib
import html
import json
import secrets
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlencode

import attrs

from .._approval import ApprovalView, closed_plan, origin_text
from .._commands import command
from .._history import History, StepView, tries
from .._logging import redact
from .._progress import Progress
from .._report import (
    LIST_NOTE_COLUMN,
    STEP_OF_THE_DEAD,
    GoneHolder,
    RecoveryReport,
    StepLine,
    _current_epoch,
    duration,
    event_phrase,
    list_note,
    paused_phrase,
    retry_phrase,
    row_text,
    run_path,
    timeline_rows,
    utc,
    visible,
    waiting_phrase,
)
from .._retention import PrunedRun
from .._types import JSON, EntryKind, JournalEntry, PausedWorkflow, Record, Run, RunState, Signal

STATES = [s.value for s in RunState]


def text(value: Any) -> str:
    """Escaped, redacted text of any value (JSON for non-strings): HTML's escaping, and
    ``show``'s rule for text shown to people (:func:`visible`: control characters and bidi
    controls as ``\\u202e``, never raw on a page)."""
    if value is None:
        return ""
    if not isinstance(value, str):
        value = json.dumps(value, separators=(", ", ": "), ensure_ascii=False, default=str)
    return html.escape(visible(redact(value)), quote=True)


def attr(value: Any) -> str:
    return html.escape(str(value), quote=True)


def when(ts: float | None, *, ago: bool = True) -> str:
    """A UTC time, with a relative "ago" the ticker keeps current (not for future times)."""
    if ts is None:
        return "-"
    iso = utc(ts).replace(" UTC", "Z").replace(" ", "T")
    shown = f'<time datetime="{attr(iso)}">{attr(utc(ts))}</time>'
    return shown + (f' <span class="ago" data-ago="{ts:.3f}"></span>' if ago else "")


def countdown(ts: float) -> str:
    return f'<span class="countdown" data-countdown="{ts:.3f}"></span>'


def badge(state: str) -> str:
    """A state's badge: its words for people (``to run``, ``timed out``), never the enum's
    name; the class keeps the name."""
    label = {"started": "in flight"}.get(state, state.replace("_", " "))
    return f'<span class="badge state-{attr(state)}">{attr(label)}</span>'


@attrs.frozen
class Chrome:
    """What every page shows around its content."""

    read_only: bool
    db: str
    csrf: str = ""
    poll_timeout_ms: int = 5000
    fail_threshold: int = 2


def page(title: str, body: str, chrome: Chrome, *, flash: str = "") -> str:
    mode = ('<span class="mode read-only" title="start the console with '
            'DURABLE_CONSOLE_TOKEN (or --token-file) to enable the actions">'
            'read-only</span>' if chrome.read_only
            else '<span class="mode admin">actions enabled (admin token required)</span>')
    notice = f'<div class="flash">{text(flash)}</div>' if flash else ""
    return f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{text(title)} · durable</title>
<link rel="stylesheet" href="/static/console.css">
</head>
<body data-poll-timeout="{chrome.poll_timeout_ms}" data-fail-threshold="{chrome.fail_threshold}">
<header class="top">
<a class="brand" href="/runs">durable</a>
<nav><a href="/runs">runs</a> <a href="/status">status by key</a></nav>
<span class="db" title="database">{text(chrome.db)}</span>
{mode}
<span id="freshness"></span>
</header>
<div id="banner" role="alert" hidden></div>
{notice}
<main>
{body}
</main>
<script src="/static/console.js"></script>
</body>
</html>
"""


# -- the runs list ------------------------------------------------------------------------------
@attrs.frozen
class ListQuery:
    state: str | None = None
    workflow: str | None = None
    key: str | None = None
    since: str | None = None
    until: str | None = None
    q: str | None = None
    limit: int = 50

    def params(self, **extra: Any) -> str:
        values = {k: v for k, v in attrs.asdict(self).items()
                  if v not in (None, "") and not (k == "limit" and v == 50)}
        values.update({k: v for k, v in extra.items() if v is not None})
        return urlencode(values)


def runs_page(query: ListQuery, runs: Sequence[Run], counts: Mapping[str, int] | None,
              next_cursor: str | None, chrome: Chrome, *, before: str | None,
              paused: Sequence[PausedWorkflow] = (), now: float = 0.0,
              gone: Mapping[str, GoneHolder] | None = None) -> str:
    """The runs list; its table refreshes itself in place (the same page: ``before`` kept)."""
    live = "/live/runs?" + query.params(before=before)  # not under /runs/: any id is a run's
    body = f"""<h1>Runs</h1>
{filters_form(query)}
<section class="live" data-poll="{attr(live)}" data-poll-interval="2000" data-poll-name="runs">
{runs_fragment(query, runs, counts, next_cursor, paused, now, gone)}
</section>"""
    return page("Runs", body, chrome)


def filters_form(query: ListQuery) -> str:
    options = "".join(
        f'<option value="{s}"{" selected" if query.state == s else ""}>{s}</option>'
        for s in STATES)
    return f"""<form class="filters" method="get" action="/runs">
<label>state <select name="state"><option value="">any</option>{options}</select></label>
<label>workflow <input name="workflow" value="{attr(query.workflow or "")}"></label>
<label>key <input name="key" value="{attr(query.key or "")}"></label>
<label>created from <input name="since" placeholder="2026-12-01T09:00Z"
 value="{attr(query.since or "")}"></label>
<label>to <input name="until" value="{attr(query.until or "")}"></label>
<label>id prefix <input name="q" value="{attr(query.q or "")}"></label>
<button type="submit">filter</button> <a href="/runs">clear</a>
</form>"""


def runs_fragment(query: ListQuery, runs: Sequence[Run], counts: Mapping[str, int] | None,
                  next_cursor: str | None, paused: Sequence[PausedWorkflow] = (),
                  now: float = 0.0, gone: Mapping[str, GoneHolder] | None = None) -> str:
    """The list's counts, table and pager. ``counts`` None: not counted (an id prefix),
    and the chips say so rather than show the counts of runs the list does not select.
    ``gone``: the running runs whose worker died for sure, by id (their detail says so)."""
    gone = gone or {}
    held = {p.workflow for p in paused}
    every_state = attrs.evolve(query, state=None).params()

    def number(n: int) -> str:
        return "" if counts is None else f" <b>{n}</b>"

    total = 0 if counts is None else sum(counts.values())
    chips = [f'<a class="count" href="/runs?{attr(every_state)}">all{number(total)}</a>']
    for state in STATES:
        href = attrs.evolve(query, state=state).params()
        chips.append(f'<a class="count state-{state}" href="/runs?{attr(href)}">'
                     f"{state}{number(0 if counts is None else counts.get(state, 0))}</a>")
    if counts is None:
        chips.append('<span class="counts-note">not counted by id prefix: a prefix can '
                     "span every run, and counting it would read them all at each "
                     "refresh</span>")
    rows = []
    for run in runs:
        rows.append(
            f'<tr class="run state-{run.state.value}" data-run-id="{attr(run.id)}">'
            f'<td class="id"><a href="{attr(run_path(run.id))}">{text(run.id)}</a></td>'
            f"<td>{text(run.workflow)}</td><td>{text(run.key or '-')}</td>"
            f"<td>{badge(run.state.value)}{_held(run, held)}</td><td>{run.attempt}</td>"
            f"<td>{when(run.created_at)}</td><td>{when(run.updated_at)}</td>"
            f'<td class="detail">{text(_first_line(list_note(run, now, gone.get(run.id))))}'
            "</td></tr>")
    table = ("<table class=\"runs\"><thead><tr><th>id</th><th>workflow</th><th>key</th>"
             "<th>state</th><th>attempt</th><th>created</th><th>updated</th>"
             f"<th>{LIST_NOTE_COLUMN}</th>"
             "</tr></thead><tbody>" + "".join(rows) + "</tbody></table>"
             if rows else '<p class="empty">No runs match.</p>')
    more = (f'<p class="pager"><a rel="next" href="/runs?{attr(query.params(before=next_cursor))}">'
            "older runs →</a></p>" if next_cursor else "")
    return f'<p class="counts">{"".join(chips)}</p>{paused_banner(paused)}{table}{more}'


def paused_banner(paused: Sequence[PausedWorkflow]) -> str:
    """Which workflows are paused: no attempt of them starts until they are resumed."""
    if not paused:
        return ""
    items = "".join(f"<li><b>{text(p.workflow)}</b> {text(paused_phrase(p))}: resume with "
                    f"<code>{text(command('resume', p.workflow))}</code></li>" for p in paused)
    return (f'<div class="paused-workflows"><p>Paused: no attempt of these workflows starts '
            f"until it is resumed; their runs stay queued.</p><ul>{items}</ul></div>")


def _held(run: Run, held: set[str]) -> str:
    """A queued run of a paused workflow says so; else a never-started one its start."""
    if run.state is RunState.QUEUED and run.workflow in held:
        return ' <span class="badge paused">paused</span>'
    return _delayed(run)


def _delayed(run: Run) -> str:
    if run.state is RunState.QUEUED and run.attempt == 0:
        return f' <span class="delayed">starts {countdown(run.run_at)}</span>'
    return ""


def _first_line(value: str | None) -> str:
    if not value:
        return ""
    line = value.strip().splitlines()[0] if value.strip() else ""
    return line if len(line) <= 140 else line[:139] + "…"


# -- a run --------------------------------------------------------------------------------------
@attrs.frozen
class RunDetail:
    run: Run
    entries: Sequence[JournalEntry]
    report: RecoveryReport
    progress: Progress | None
    records: Sequence[tuple[str, str, Record | None, int]]
    """(namespace, key, the record now or None, the epoch of the attempt that wrote it)."""
    now: float
    approval: ApprovalView | None = None
    """The run's plan and its decision (None: the run journaled no plan)."""
    signals: Sequence[Signal] = ()
    """Every signal recorded for the run, in order (``Store.list_signals``)."""
    paused: PausedWorkflow | None = None
    """The pause of the run's workflow, if it is paused (and the run not finished)."""
    gone: GoneHolder | None = None
    """The running run's worker, dead for sure (``Client.gone_holders``)."""


def run_page(detail: RunDetail, chrome: Chrome, *, flash: str = "") -> str:
    run = detail.run
    body = f"""<p class="crumbs"><a href="/runs">runs</a> / {text(run.id)}</p>
<h1>{text(run.workflow)} <small>{text(run.id)}</small></h1>
<section class="live" data-poll="{attr(run_path(run.id))}/live" data-poll-interval="1000"
 data-poll-name="run">
{run_fragment(detail)}
</section>
<div id="actions" data-key="{actions_key(detail, chrome)}">{actions(detail, chrome)}</div>"""
    return page(f"{run.workflow} {run.id}", body, chrome, flash=flash)


def run_fragment(detail: RunDetail, chrome: Chrome | None = None) -> str:
    """The run's live view. With ``chrome`` (the live fragment), the actions its state
    allows now, in a template the page swaps into ``#actions`` only when their key
    changes: forms re-rendered at every poll would wipe what the operator is typing, and
    forms never re-rendered offered a cancel of a run that had completed (console.js)."""
    swap = "" if chrome is None else (
        f'<template data-update="actions" data-key="{actions_key(detail, chrome)}">'
        f"{actions(detail, chrome)}</template>")
    return (header(detail) + approval_block(detail) + progress_bar(detail.progress)
            + report_block(detail) + steps_block(detail) + signals_block(detail)
            + attempts_block(detail)
            + records_block(detail) + journal_block(detail) + swap)


def header(d: RunDetail) -> str:
    run = d.run
    started = next((e.at for e in d.entries if e.kind is EntryKind.RUN_CLAIMED), None)
    ended = run.updated_at if run.state.finished else None
    lease = "-"
    if run.state is RunState.RUNNING and run.lease_expires_at is not None:
        lease = (f"{when(run.lease_expires_at, ago=False)} "
                 f"({countdown(run.lease_expires_at)})")
    delayed = ""
    waiting = waiting_phrase(run, d.entries)  # released to wait (durable waiting)
    if waiting:
        said = ("Sleeping" + waiting.removeprefix("sleeping") if waiting.startswith("sleeping")
                else "Waiting to " + retry_phrase(waiting)
                if waiting.startswith("retry") else "Waiting " + waiting)
        delayed = (f'<p class="delayed-start">{text(said)}; it holds no lease and can be '
                   "cancelled meanwhile.</p>")
    elif run.state is RunState.QUEUED and run.run_at > d.now:
        delayed = (f'<p class="delayed-start">Starts {countdown(run.run_at)} '
                   f"(at {when(run.run_at, ago=False)}); it can be cancelled until then.</p>")
    if d.gone is not None and run.state is RunState.RUNNING:
        delayed += f'<p class="worker-gone">{text(d.gone.phrase())}.</p>'
    cancel = (' <span class="badge cancel-requested">cancel requested</span>'
              if run.cancel_requested and not run.state.finished else "")
    rows = [
        ("state", badge(run.state.value) + cancel),
        ("workflow", text(run.workflow)),
        ("key", text(run.key or "-")),
        ("arguments", f"<code>{text(run.args)}</code>"),
        ("attempt", str(run.attempt)),
        ("epoch (fencing token)", f"{run.epoch} <small>scope {text(run.fencing_scope)}</small>"),
        ("worker", text(run.worker or "-")),
        ("lease expires", lease),
        ("created", when(run.created_at)),
        ("started", when(started)),
        ("ended", when(ended)),
    ]
    if run.recoveries:
        rows.append(("recoveries", str(run.recoveries)))
    if run.timeout is not None:  # counted from the first claim since its last replay
        since = History.fold(d.entries).started_at
        ends = ("" if since is None or run.state.finished
                else f", runs out {when(since + run.timeout, ago=False)}")
        rows.append(("timeout", f"{duration(run.timeout)} from its first attempt{ends}"))
    if d.paused is not None:
        resume = text(command("resume", run.workflow))
        rows.append(("paused", f"its workflow is {text(paused_phrase(d.paused))}: no attempt "
                               f"starts until <code>{resume}</code>"))
    if run.start_by is not None and run.start_within is not None:  # at the first claim
        by = (f", by {when(run.start_by, ago=False)}, or it fails without running"
              if run.attempt == 0 and run.state is RunState.QUEUED else "")
        rows.append(("start within", f"{duration(run.start_within)} of being due{by}"))
    if run.state is RunState.COMPLETED:
        rows.append(("result", f"<code>{text(run.result)}</code>"))
    dl = "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in rows)
    error = (f'<pre class="run-error">{text(run.error)}</pre>' if run.error else "")
    return (f'<section class="header"><dl class="fields" data-state="{run.state.value}">{dl}'
            f"</dl>{delayed}{error}</section>")


def awaiting_approval(d: RunDetail) -> bool:
    """A plan is journaled, no decision yet, and the run can still act on one."""
    return (d.approval is not None and d.approval.decision == "waiting"
            and not d.run.state.finished)


def approval_block(d: RunDetail) -> str:
    """The plan the run journaled, item by item, and its decision with who made it."""
    gate = d.approval
    if gate is None:
        return ""
    items = gate.items
    if items is None:
        listing = f"<pre>{text(gate.plan)}</pre>"
    else:
        rows = "".join(
            f'<tr class="plan-item"><td>{text(i.get("action"))}</td><td>{text(i.get("kind"))}'
            f'</td><td><code>{text(i.get("id"))}</code></td><td>{text(i.get("detail"))}</td>'
            "</tr>" for i in items)
        listing = ('<table class="plan"><tr><th>action</th><th>kind</th><th>id</th>'
                   f"<th>as read from the service</th></tr>{rows}</table>")
    if gate.decision == "waiting" and gate.ran_out is not None:
        status = (f'<p class="decision none">The wait for a decision ran out '
                  f"{when(gate.ran_out)}: an approval would not reach it; the run gives up on "
                  "its plan without acting when a worker takes it.</p>")
    elif gate.decision == "waiting":
        status = ('<p class="decision waiting">Waiting for approval: nothing is done until an '
                  "operator approves (the forms below). The plan is read again right before "
                  "acting; if anything changed, the run stops and deletes nothing.</p>"
                  if not d.run.state.finished else
                  '<p class="decision none">The run ended before a decision.</p>')
    else:
        payload = gate.payload if isinstance(gate.payload, Mapping) else {}
        note = payload.get("note") or payload.get("reason")
        status = (f'<p class="decision {attr(gate.decision)}">{badge(gate.decision)} by '
                  f'<b class="approved-by">{text(gate.by)}</b> {when(gate.at)}'
                  + (' <span class="early">(sent before the plan was journaled)</span>'
                     if gate.early else "")
                  + (f": {text(note)}" if note else "") + "</p>")
    return (f'<section class="approval" data-decision="{attr(gate.decision)}"><h2>Plan '
            f'<small><a href="#step-{gate.plan_step}">step {gate.plan_step}</a></small></h2>'
            f"<p>{text(gate.title)}</p>{listing}{status}</section>")


def progress_bar(p: Progress | None) -> str:
    if p is None:
        return ""
    total = max(p.total, 1)
    parts = [("done", p.done), ("failed", p.failed), ("in_flight", p.in_flight)]
    if p.in_doubt:
        parts.append(("in_doubt", p.in_doubt))
    # an SVG bar: its geometry is attributes, not inline styles (the CSP forbids those)
    bars, x = [], 0.0
    for name, count in parts:
        if count:
            width = 100 * count / total
            bars.append(f'<rect class="{name}" x="{x:.2f}" y="0" width="{width:.2f}" '
                        'height="6"></rect>')
            x += width
    svg = ('<svg class="progressbar" viewBox="0 0 100 6" preserveAspectRatio="none" '
           f'role="img" aria-label="{p.done} of {p.total} items done">'
           '<rect class="track" x="0" y="0" width="100" height="6"></rect>'
           + "".join(bars) + "</svg>")
    labels = " · ".join(f"{count} {name.replace('_', ' ')}" for name, count in parts
                        if name != "done")
    return (f'<section class="progress"><h2>Items</h2>'
            f"{svg}"
            f'<p class="progress-text"><b>{p.done} of {p.total} done</b> · {labels} · '
            f"{p.pending} pending</p></section>")


def report_block(d: RunDetail) -> str:
    r = d.report
    if d.run.state not in (RunState.FAILED, RunState.CANCELLED) and not r.in_doubt:
        return ""  # a report is what to do after a run stopped short
    items = []
    for s in r.failed:
        items.append(f'<li>Failed: <a href="#step-{s.number}">step {s.number}</a> '
                     f"{text(s.activity)} after {tries(s.tries)}: {text(_first_line(s.error))}"
                     "</li>")
    if r.completed:
        done = ", ".join(f'<a href="#step-{s.number}">step {s.number}</a> {text(s.activity)}'
                         + (" (accepted by operator)" if s.accepted else "")
                         for s in r.completed)
        items.append(f"<li>Already done (will not be repeated): {done}</li>")
    else:
        items.append("<li>Already done: nothing.</li>")
    for s in r.in_doubt:
        items.append(f'<li class="doubt">In doubt: <a href="#step-{s.number}">step {s.number}'
                     f"</a> {text(s.activity)}: started, outcome unknown; {text(s.advice)}."
                     "</li>")
    return (f'<section class="report"><h2>Recovery report</h2><ul>{"".join(items)}</ul>'
            f'<details><summary>as text</summary><pre>{text(r.text())}</pre></details>'
            "</section>")


def steps_block(d: RunDetail) -> str:
    history = History.fold(d.entries)
    current = _current_epoch(d.run)
    rows: dict[int, list[dict[str, JSON]]] = {}  # each step's rows in show's timeline
    for row in timeline_rows(d.run, d.entries):
        if "event" not in row and isinstance(row["step"], int):
            rows.setdefault(row["step"], []).append(row)
    gone = d.gone is not None and d.run.state is RunState.RUNNING
    doubts = {s.number: s for s in d.report.in_doubt}
    items = [step_item(step, current, d.run, rows.get(step.number, []),
                       doubts.get(step.number), gone=gone) for step in history.ordered()]
    if not items:
        return ('<section class="steps"><h2>Steps</h2><p class="empty">No steps yet.</p>'
                "</section>")
    return (f'<section class="steps"><h2>Steps</h2><ol class="timeline">{"".join(items)}</ol>'
            "</section>")


def _waited(step: StepView, row: Mapping[str, JSON] | None) -> bool:
    """A durable sleep or wait the step holds now (a replay that runs it again clears it):
    said as ``show``'s timeline says it (sleeping, waiting, received, timed out)."""
    return row is not None and (step.wake_at is not None or step.wait_started)


def _step_state(step: StepView, current: int, row: Mapping[str, JSON] | None = None) -> str:
    if step.in_doubt(current):
        return "in_doubt"
    if _waited(step, row):
        assert row is not None
        return str(row["state"])
    if step.state is None:
        return "to_run"
    return step.state.value


def step_item(step: StepView, current: int, run: Run,
              rows: Sequence[Mapping[str, JSON]] = (), doubt: StepLine | None = None, *,
              gone: bool = False) -> str:
    """A step and its tries, each try as a row of ``show``'s timeline says it (its state,
    epoch, start, duration and summary, error or note); in doubt, ``doubt``, the recovery
    report's line: what to check (the request its try sent, :func:`sent_request`: the key,
    the token of the epoch it started under, the scope) and what to do (:func:`doubt_advice`).
    ``gone``: the running run's
    worker died for sure, so a step in flight is said to have lost it (not "in flight")."""
    row = rows[-1] if rows else None
    state = _step_state(step, current, row)
    shown_gone = gone and state == "started"  # not "in flight": its worker is dead
    shown = ('<span class="badge state-started">worker died</span>' if shown_gone
             else badge(state))
    took = ""
    if (step.started_at is not None and step.ended_at is not None and state != "in_doubt"
            and not step.name.startswith("durable.")):
        took = f" · took {duration(float(step.ended_at) - float(step.started_at))}"
    accepted = " · accepted by operator" if step.accepted else ""
    # durable.* steps are the engine's journaled values and record writes, not tries
    what = ("journaled by the engine" if step.name.startswith("durable.")
            else tries(step.tries))
    lines = [f'<li class="step state-{state}" id="step-{step.number}">'
             f'<a class="anchor" href="#step-{step.number}">#{step.number}</a> '
             f'<b class="activity">{text(step.name)}</b> {shown} '
             f'<small>key {text(step.key)} · {what}{took}{accepted}</small>']
    if shown_gone:
        lines.append(f'<div class="worker-gone">{text(STEP_OF_THE_DEAD)}</div>')
    if step.summary is not None:
        lines.append(f'<div class="summary">{text(step.summary)}</div>')
    elif _waited(step, row):
        assert row is not None
        note = f" ({row['note']})" if row.get("note") else ""
        lines.append(f'<div class="summary">{text(row["summary"])}{text(note)}</div>')
    if step.error and state != "completed":
        lines.append(f'<pre class="error">{text(step.error)}</pre>')
    if state == "in_doubt" and doubt is not None and doubt.request is not None:
        sent = doubt.request
        lines.append(
            '<div class="doubt-help"><b>In doubt</b>: this step started under epoch '
            f"{sent.token} and its attempt ended with no outcome recorded, so the request may "
            "or may not have taken effect: the target service knows it by its idempotency "
            f"key <code>{text(sent.key)}</code> (fencing token {sent.token}, scope "
            f"<code>{text(sent.scope)}</code>); {text(doubt.advice)}.</div>")
    tries_rows = []
    for r in rows:
        at = r["start"] or r.get("noticed_at") or r["end"]
        took = r["took"]
        took_text = ("unknown" if r["state"] == "in_doubt" else
                     duration(took) if isinstance(took, float) else "")
        said = " · ".join(str(part) for part in (row_text(run, r, gone), r["error"]) if part)
        state_shown = (shown if shown_gone and r["state"] == "started" and r is rows[-1]
                       else badge(str(r["state"])))
        tries_rows.append(f"<tr><td>{r['try'] or ''}</td><td>{state_shown}</td>"
                          f"<td>{r['epoch']}</td>"
                          f"<td>{when(at if isinstance(at, float) else None)}</td>"
                          f"<td>{took_text}</td><td>{text(said)}</td></tr>")
    if tries_rows:
        lines.append('<details class="tries"><summary>tries</summary><table>'
                     "<tr><th>try</th><th>state</th><th>epoch</th><th>at</th><th>took</th>"
                     "<th></th></tr>" + "".join(tries_rows) + "</table></details>")
    lines.append("</li>")
    return "".join(lines)


def signals_block(d: RunDetail) -> str:
    """The signals sent to the run: who sent each, its payload (redacted, as every text
    here), and whether a ``wait_for`` of the run has received it."""
    if not d.signals:
        return ""
    received = {e.data.get("seq"): e.step for e in d.entries
                if e.kind is EntryKind.SIGNAL_RECEIVED}
    rows = []
    for s in d.signals:
        if s.seq in received:
            status = (f'received by <a href="#step-{received[s.seq]}">step '
                      f"{received[s.seq]}</a>")
        elif d.run.state.finished:
            status = "never received (the run ended)"
        else:
            status = "not received yet"
        rows.append(f'<tr class="signal" data-signal-seq="{s.seq}"><td>{s.seq}</td>'
                    f"<td>{text(s.name)}</td><td>{text(s.signal_id or '-')}</td>"
                    f"<td>{when(s.created_at)}</td><td>{text(origin_text(s.origin))}</td>"
                    f"<td><code>{text(s.payload)}</code></td>"
                    f'<td class="signal-status">{status}</td></tr>')
    return ('<section class="signals"><h2>Signals</h2><table>'
            "<tr><th>seq</th><th>name</th><th>id</th><th>sent</th><th>from</th>"
            "<th>payload</th><th></th></tr>" + "".join(rows) + "</table></section>")


_ACTIONS = frozenset({"run_claimed", "run_interrupted", "run_recovered", "run_replayed",
                      "run_cancel_requested", "run_cancelled", "run_failed", "run_completed",
                      "signal_sent"})


def attempts_block(d: RunDetail) -> str:
    """The run's attempts and the operators' actions, each said as ``show``'s timeline says
    it (:func:`event_phrase`), with where an action came from."""
    rows = []
    for row in timeline_rows(d.run, d.entries):
        if row.get("event") not in _ACTIONS:
            continue
        what = text(event_phrase(row))
        detail = row["detail"]
        origin = detail.get("origin") if isinstance(detail, Mapping) else None
        if isinstance(origin, Mapping):
            what += "; from " + ", ".join(f"{text(k)} {text(v)}" for k, v in origin.items())
        at = row["at"]
        rows.append(f"<tr><td>{when(at if isinstance(at, float) else None)}</td>"
                    f"<td>{row['epoch']}</td><td>{what}</td></tr>")
    if not rows:
        return ""
    return ('<section class="attempts"><h2>Attempts and operator actions</h2><table>'
            "<tr><th>at</th><th>epoch</th><th>event</th></tr>"
            + "".join(rows) + "</table></section>")


def records_block(d: RunDetail) -> str:
    if not d.records:
        return ""
    rows = []
    for ns, key, record, epoch in d.records:
        if record is None:
            now = '<span class="badge state-unknown">absent now</span>'
            value = ""
        else:
            mine = record.epoch == epoch
            now = ("written by this run" if mine else
                   f"since rewritten (epoch {record.epoch}, version {record.version})")
            value = f"<code>{text(record.value)}</code>"
        rows.append(f"<tr><td>{text(ns)}</td><td>{text(key)}</td><td>{epoch}</td>"
                    f"<td>{value}</td><td>{now}</td></tr>")
    return ('<section class="records"><h2>Records this run wrote</h2><table>'
            "<tr><th>namespace</th><th>key</th><th>written under epoch</th><th>value now</th>"
            "<th>since</th></tr>" + "".join(rows) + "</table></section>")


def journal_block(d: RunDetail) -> str:
    rows = "".join(
        f"<tr><td>{e.seq}</td><td>{when(e.at)}</td><td>{e.kind.value}</td><td>{e.epoch}</td>"
        f"<td>{'' if e.step is None else e.step}</td><td>{text(e.name)}</td>"
        f"<td>{'' if e.try_number is None else e.try_number}</td>"
        f"<td><code>{text(dict(e.data)) if e.data else ''}</code></td></tr>"
        for e in d.entries)
    return (f'<details class="journal"><summary>Journal ({len(d.entries)} entries)</summary>'
            "<table><tr><th>seq</th><th>at</th><th>kind</th><th>epoch</th><th>step</th>"
            f"<th>name</th><th>try</th><th>data</th></tr>{rows}</table></details>")


def actions_key(d: RunDetail, chrome: Chrome) -> str:
    """What the actions offer, as a digest of their markup (the signal id left out: it is
    fresh at each render): the page swaps its forms only when this changes."""
    return hashlib.sha256(actions(d, chrome, signal_id="").encode()).hexdigest()[:16]


def actions(d: RunDetail, chrome: Chrome, *, signal_id: str | None = None) -> str:
    run = d.run
    if chrome.read_only:
        return ('<section class="actions read-only"><h2>Actions</h2><p>This console is '
                "<b>read-only</b>: no admin token is configured. Start it with "
                "<code>DURABLE_CONSOLE_TOKEN</code> set (or <code>--token-file</code>) to "
                "cancel, replay, signal, approve and reject runs and pause their workflows "
                "here, or use <code>python -m durable cancel</code> / <code>replay</code> / "
                "<code>signal</code> / <code>approve</code> / <code>reject</code> / "
                "<code>pause</code>.</p></section>")
    token = ('<label>admin token <input type="password" name="token" autocomplete="off" '
             'required></label>')
    csrf = f'<input type="hidden" name="csrf" value="{attr(chrome.csrf)}">'
    forms = []
    if awaiting_approval(d):
        forms.append(f'<form class="action approve" method="post" '
                     f'action="{attr(run_path(run.id))}/approve">{csrf}'
                     '<label>note <input name="note" maxlength="300"></label>'
                     f'{token}<button type="submit">approve plan</button></form>')
        forms.append(f'<form class="action reject" method="post" '
                     f'action="{attr(run_path(run.id))}/reject">{csrf}'
                     '<label>reason <input name="reason" maxlength="300"></label>'
                     f'{token}<button type="submit" class="danger">reject plan</button></form>')
    if not run.state.finished:
        forms.append(signal_form(d, csrf, token, signal_id))
        forms.append(f'<form class="action cancel" method="post" '
                     f'action="{attr(run_path(run.id))}/cancel">{csrf}{token}'
                     '<button type="submit" class="danger">cancel run</button></form>')
        pausing = "resume" if d.paused is not None else "pause"
        forms.append(f'<form class="action {pausing}" method="post" '
                     f'action="{attr(run_path(run.id))}/{pausing}">{csrf}{token}'
                     f'<button type="submit">{pausing} workflow {text(run.workflow)}</button>'
                     "</form>")
    if run.state in (RunState.FAILED, RunState.CANCELLED):
        history = History.fold(d.entries)
        # a plan rejected, or whose decision timed out: only a replay from its step (or an
        # earlier one) can act, so the form offers only those, the plan step chosen
        closed = closed_plan(run, d.entries, None)
        steps = "".join(
            f'<option value="{s.number}"'
            f'{" selected" if closed and s.number == closed.plan_step else ""}>'
            f"step {s.number} {text(s.name)}</option>"
            for s in history.ordered() if closed is None or s.number <= closed.plan_step)
        first = ('<option value="">the first step without a result</option>' if closed is None
                 else "")
        why = ("" if closed is None else
               f'<p class="hint">{text(closed.reason)}: a replay plans again from step '
               f"{closed.plan_step} (or an earlier one) and asks anew.</p>")
        doubt = bool(history.in_doubt(_current_epoch(run)))
        choice = ('<fieldset><legend>steps in doubt</legend>'
                  '<label><input type="radio" name="in_doubt" value="" checked> decide by the '
                  "activity's on_doubt</label> "
                  '<label><input type="radio" name="in_doubt" value="rerun"> re-run them</label> '
                  '<label><input type="radio" name="in_doubt" value="accept"> accept them as '
                  "done</label></fieldset>" if doubt else "")
        forms.append(f'<form class="action replay" method="post" '
                     f'action="{attr(run_path(run.id))}/replay">{csrf}{why}'
                     f'<label>from <select name="from_step">{first}{steps}</select></label>'
                     f"{choice}{token}"
                     '<button type="submit">replay run</button></form>')
    if not forms:
        return ""
    return f'<section class="actions"><h2>Actions</h2>{"".join(forms)}</section>'


def signal_form(d: RunDetail, csrf: str, token: str, signal_id: str | None = None) -> str:
    """Send a signal to a queued or running run: its name (what the run waits for, when it
    waits), a JSON payload, and a signal id made fresh for each render, so a resubmit of this
    form (a double click, the browser's back and again) records one signal."""
    run = d.run
    # a plan's approve goes through its own form (it names the plan it approves)
    name = "" if awaiting_approval(d) else run.waiting_for or ""
    if signal_id is None:
        signal_id = "console-" + secrets.token_urlsafe(12)
    waits = ('<p class="hint"><b>Send a signal</b> (what a <code>ctx.wait_for</code> of the run '
             "receives)" + (f"; it waits for <code>{text(name)}</code> now" if name else "")
             + ".</p>")
    return (f'<form class="action signal" method="post" action="{attr(run_path(run.id))}/signal">'
            f"{csrf}{waits}"
            f'<label>signal <input name="name" required maxlength="200" '
            f'value="{attr(name)}"></label>'
            '<label>payload (JSON, optional) <textarea name="payload" rows="3" cols="40" '
            "placeholder='{\"note\": \"...\"}'></textarea></label>"
            f'<label>signal id <input name="signal_id" maxlength="200" '
            f'value="{attr(signal_id)}"></label>'
            f'{token}<button type="submit">send signal</button></form>')


def not_found_page(run_id: str, chrome: Chrome) -> str:
    status_url = "/api/status?" + urlencode({"id": run_id})
    body = f"""<p class="crumbs"><a href="/runs">runs</a> / {text(run_id)}</p>
<h1>Run {text(run_id)}</h1>
<p class="unknown-run">Status: <span class="status" data-status="{attr(status_url)}"
 data-poll-interval="2000" data-state="unknown" data-found="reload">cannot confirm</span></p>
<p>No run with id <code>{text(run_id)}</code> is in this console's database
(<code>{text(chrome.db)}</code>). This does <b>not</b> mean the work is done: the id may be
mistyped, the run may live in another database, or it may not have been started yet. This
page keeps looking, and becomes the run's page once the run is there.</p>"""
    return page(f"run {run_id}", body, chrome)


def pruned_fragment(pruned: PrunedRun) -> str:
    """What the console knows of a run that was pruned: its tombstone."""
    key = "" if pruned.key is None else f", key <code>{text(pruned.key)}</code>"
    return (f'<p class="pruned-run">This run ({text(pruned.workflow)}{key}) ended '
            f'<span class="state state-{attr(pruned.state.value)}">'
            f'{text(pruned.state.value)}</span> at {text(utc(pruned.ended_at))} and was '
            f'<b>pruned on {text(utc(pruned.pruned_at))}</b>: its journal is gone (retention, '
            '<code>python -m durable prune</code>).</p>')


def pruned_page(pruned: PrunedRun, chrome: Chrome) -> str:
    body = f"""<p class="crumbs"><a href="/runs">runs</a> / {text(pruned.id)}</p>
<h1>Run {text(pruned.id)}</h1>
{pruned_fragment(pruned)}"""
    return page(f"run {pruned.id}", body, chrome)


def status_page(workflow: str, key: str, run_id: str, chrome: Chrome) -> str:
    form = f"""<form class="filters" method="get" action="/status">
<label>workflow <input name="workflow" value="{attr(workflow)}"></label>
<label>key <input name="key" value="{attr(key)}"></label>
<label>or run id <input name="id" value="{attr(run_id)}"></label>
<button type="submit">look up</button></form>"""
    widget = ""
    params = {"id": run_id} if run_id else {"workflow": workflow, "key": key}
    if run_id or (workflow and key):
        widget = (f'<p class="status-line">Status: <span class="status" '
                  f'data-status="/api/status?{attr(urlencode(params))}" '
                  'data-poll-interval="2000" data-state="unknown">cannot confirm</span></p>'
                  '<p class="hint">Answered from a direct query of the newest run for this '
                  "key. An id or key that cannot be found is <i>unknown</i>, shown as "
                  "“cannot confirm” — never as done.</p>")
    return page("Status", f"<h1>Status by key</h1>{form}{widget}", chrome)


def refused_page(message: str, chrome: Chrome) -> str:
    return page("Refused", f'<h1>Refused</h1><p class="refused">{text(message)}</p>'
                '<p><a href="/runs">back to the runs</a></p>', chrome)
