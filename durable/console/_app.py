"""The operator's console: a Starlette app over a store, read-only unless given a token.

Pages (HTML, server-rendered) and a JSON API over the same data:

* ``/runs`` (filters: state, workflow, key, since, until, q = id prefix; ``before`` cursor),
  ``/runs/ID`` (``#step-N`` anchors, the target of recovery links), ``/status``;
* ``/api/runs``, ``/api/runs/ID`` (the shape of ``show ID --json``), ``/api/status``
  (``?workflow=W&key=K`` or ``?id=ID``: ``unknown`` when nothing is found, never done);
* actions, each a POST: ``/runs/ID/cancel``, ``/runs/ID/replay``, ``/runs/ID/signal`` (a
  signal's name, JSON payload and id, for a queued or running run), and for a run waiting for
  approval of its plan ``/runs/ID/approve`` and ``/runs/ID/reject`` (forms: the admin token and
  the CSRF value); ``/api/runs/ID/ACTION`` the same (``Authorization: Bearer TOKEN``).
  Without a configured token the console is read-only and says so. Every
  action is journaled with where it came from (``origin``).

``ID`` is the run id as one percent-encoded path segment (:func:`run_path`), read from the
raw path; the runs list's live view is ``/live/runs``, where no run id can be.

Security: tokens are compared in constant time and never rendered; forms carry a
double-submit CSRF value (a random cookie, ``SameSite=Strict``, echoed in the form) and a
cross-origin ``Origin`` is refused; every response forbids framing and inline scripts.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import secrets
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, unquote, unquote_to_bytes, urlsplit

import attrs
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .._approval import APPROVE, PlanClosedError, approval_view, send_decision
from .._client import Client
from .._errors import (
    ConfigError,
    DurableError,
    InvalidStateError,
    RunConflictError,
    RunNotFoundError,
)
from .._hosts import foreign_name, loopback
from .._logging import get_logger, redact, redact_json
from .._progress import progress
from .._report import (
    RecoveryReport,
    cancel_phrase,
    parse_time,
    paused_phrase,
    resumed_phrase,
    run_path,
    utc,
)
from .._shapes import entry_json, pause_json, run_json, show_json
from .._types import JSON, MAX_JSON_DEPTH, EntryKind, Run, RunState, dumps
from . import _render as render

STATIC = Path(__file__).parent / "static"
CSRF_COOKIE = "durable_csrf"
FLASH_COOKIE = "durable_done"
"""What an action did, for the run's page the action redirects to: once, in a cookie only
the console sets (a ``?done=`` in the URL let any link put a success line on a run's page:
"plan approved" on a run that failed)."""
PAGE_LIMIT_MAX = 500
SIGNAL_TEXT_MAX = 200
"""A signal's name or id from the console: at most this many characters."""
SIGNAL_PAYLOAD_MAX = 65536
"""A signal's payload from the console: at most this many characters of JSON."""
FINAL_HEADER = "X-Durable-Final"


class BadRequest(Exception):
    """A user's mistake in a request: one line, answered with 400."""


class Console:
    """The console's state: the client over the store, the token, the base URL."""

    def __init__(self, client: Client, *, token: str | None = None,
                 console_url: str | None = None, poll_timeout: float = 5.0,
                 fail_threshold: int = 2) -> None:
        if token is not None and not token.strip():
            raise ConfigError("the console's admin token is empty")
        self.client = client
        self.token = token
        self.console_url = console_url
        self.poll_timeout_ms = int(poll_timeout * 1000)
        self.fail_threshold = fail_threshold
        self.log = get_logger("durable.console")

    @property
    def read_only(self) -> bool:
        return self.token is None

    @property
    def db(self) -> str:
        return redact(self.client.store.url)

    def chrome(self, request: Request) -> render.Chrome:
        return render.Chrome(read_only=self.read_only, db=self.db,
                             csrf=request.cookies.get(CSRF_COOKIE, "") or
                             request.state.new_csrf,
                             poll_timeout_ms=self.poll_timeout_ms,
                             fail_threshold=self.fail_threshold)

    # -- data ----------------------------------------------------------------------------------
    async def detail(self, run_id: str) -> render.RunDetail | None:
        run = await self.client.find(run_id)
        if run is None:
            return None
        store = self.client.store
        entries = await store.journal(run_id)
        signals = await store.list_signals(run_id)
        written: dict[tuple[str, str], int] = {}
        for e in entries:
            if e.name == "durable.set_records" and e.kind is EntryKind.STEP_COMPLETED:
                for ns, key in e.data.get("records", []):
                    written[(ns, key)] = e.epoch
        records = [(ns, key, await store.get_record(ns, key), epoch)
                   for (ns, key), epoch in written.items()]
        pause = None if run.state.finished else await self.client.pause_of(run.workflow)
        now = await store.now()
        return render.RunDetail(run, entries,
                                RecoveryReport.build(run, entries, self.console_url),
                                progress(run, entries), records, now,
                                approval_view(run, entries, signals, now), signals, pause,
                                (await self.client.gone_holders([run])).get(run.id))

    async def runs(self, query: render.ListQuery, before: str | None
                   ) -> tuple[list[Run], dict[str, int] | None, str | None]:
        """A page of the list, the counts per state of what the filters select (None with
        an id prefix: not counted, docs/list-queries.md) and the next page's cursor."""
        cursor = _parse_cursor(before)
        since, until = _parse_time(query.since, "since"), _parse_time(query.until, "until")
        runs = await self.client.list(
            state=query.state or None, workflow=query.workflow or None, key=query.key or None,
            limit=query.limit + 1, before=cursor, created_from=since, created_to=until,
            id_prefix=query.q or None)
        counts = None if query.q else await self.client.counts(
            workflow=query.workflow or None, key=query.key or None, created_from=since,
            created_to=until)
        more = len(runs) > query.limit
        runs = runs[:query.limit]
        next_cursor = f"{runs[-1].created_at!r}:{runs[-1].id}" if more and runs else None
        return runs, counts, next_cursor

    async def status(self, params: Mapping[str, str]) -> dict[str, JSON]:
        run_id = params.get("id", "").strip()
        workflow = params.get("workflow", "").strip()
        key = params.get("key", "").strip()
        if run_id:
            run = await self.client.find(run_id)
            missing = f"no run with id {run_id!r} in {self.db}"
        elif workflow and key:
            run = await self.client.latest(workflow, key)
            missing = f"no run of {workflow} for key {key!r} in {self.db}"
        else:
            raise BadRequest("give workflow and key, or id")
        pruned = await self.client.pruned(run_id) if run is None and run_id else None
        if pruned is not None:  # its tombstone keeps how it ended
            return {"status": pruned.state.value, "run_id": pruned.id,
                    "workflow": pruned.workflow, "key": pruned.key,
                    "updated_at": pruned.ended_at, "pruned_at": pruned.pruned_at,
                    "reason": f"pruned on {utc(pruned.pruned_at)}; its journal is gone",
                    "link": run_path(pruned.id)}
        if run is None:
            return {"status": "unknown", "run_id": run_id or None, "workflow": workflow or None,
                    "key": key or None, "reason": missing, "link": None}
        return {"status": run.state.value, "run_id": run.id, "workflow": run.workflow,
                "key": run.key, "updated_at": run.updated_at,
                "reason": None if run.state is not RunState.FAILED else redact(
                    render._first_line(run.error)),
                "link": run_path(run.id)}

    # -- actions -------------------------------------------------------------------------------
    def check_token(self, given: str | None) -> None:
        if self.token is None:
            raise PermissionError("this console is read-only: no admin token is configured "
                                  "(set DURABLE_CONSOLE_TOKEN or pass --token-file)")
        if not given or not hmac.compare_digest(given.encode(), self.token.encode()):
            raise PermissionError("refused: the admin token is missing or wrong")

    async def act(self, action: str, run_id: str, fields: Mapping[str, str],
                  origin: dict[str, JSON]) -> str:
        """Do an action (the token is checked); the sentence to show the operator."""
        if action in ("approve", "reject"):
            message = await self.decide(action, run_id, fields, origin)
        elif action == "signal":
            name = fields.get("name", "").strip()
            signal_id = fields.get("signal_id", "").strip() or None
            _, message = await self.signal(run_id, name, _parse_payload(fields.get("payload")),
                                           signal_id, origin)
        elif action in ("pause", "resume"):  # the run's workflow (Client.pause)
            workflow = (await self.client.get(run_id)).workflow
            if action == "pause":
                pause = await self.client.pause(workflow, origin=origin)
                message = (f"{workflow} {paused_phrase(pause)}: no attempt of it starts "
                           "until it is resumed")
            else:
                ended = await self.client.resume(workflow)
                message = resumed_phrase(workflow, ended)
        elif action == "cancel":
            run = await self.client.cancel(run_id, origin=origin)
            entries = await self.client.journal(run_id) if run.state.finished else []
            message = f"{run_id}: {cancel_phrase(run, entries)}"
        else:
            from_step = _parse_step(fields.get("from_step"))
            policy = fields.get("in_doubt") or None
            if policy not in (None, "rerun", "accept"):
                raise BadRequest("in_doubt must be rerun or accept")
            try:
                run = await self.client.replay(run_id, from_step=from_step,
                                               in_doubt=policy,  # type: ignore[arg-type]
                                               origin=origin)
            except PlanClosedError as exc:  # said for this page and its API, not the CLI
                raise InvalidStateError(
                    f"{exc.closed.reason}; replay it from step {exc.closed.plan_step} (its "
                    "plan step) or an earlier one to plan again and ask anew") from None
            message = f"{run_id} queued again (attempt {run.attempt + 1} will resume it)"
        self.log.info("console_action", action=action, workflow_id=run_id,
                      remote=origin.get("remote"))
        return message

    async def signal(self, run_id: str, name: str, payload: JSON, signal_id: str | None,
                     origin: dict[str, JSON]) -> tuple[bool, str]:
        """Send a signal (``Client.signal``: journaled with its origin); whether it was
        recorded now (False: its id was already recorded) and the sentence to show."""
        for what, value in (("signal name", name), ("signal id", signal_id or "")):
            if len(value) > SIGNAL_TEXT_MAX:
                raise BadRequest(f"the {what} is longer than {SIGNAL_TEXT_MAX} characters")
        recorded = await self.client.signal(run_id, name, payload, id=signal_id, origin=origin)
        ident = f" (id {signal_id})" if signal_id else ""
        message = (f"{run_id}: signal {name!r} sent{ident}" if recorded else
                   f"{run_id}: signal {name!r} already recorded{ident}; nothing new was sent")
        return recorded, message

    async def decide(self, action: str, run_id: str, fields: Mapping[str, str],
                     origin: dict[str, JSON]) -> str:
        """Approve or reject the plan of a run waiting for approval, as a signal."""
        text = (fields.get("note") if action == APPROVE else fields.get("reason")) or ""
        payload: dict[str, JSON] = {"note" if action == APPROVE else "reason": text[:300]} \
            if text.strip() else {}
        # one decision per plan from the console: a double click is one signal, and a plan
        # journaled again by a replay takes its own
        await send_decision(self.client, run_id, action, payload, id=f"console-{action}",
                            origin=origin, per_plan=True)
        return (f"{run_id}: plan approved; the run re-checks it and acts" if action == APPROVE
                else f"{run_id}: plan rejected; the run ends without acting")


def _parse_payload(value: str | None) -> JSON:
    """A signal's payload typed into the form: JSON, or nothing (None) when left empty."""
    if value is None or not value.strip():
        return None
    if len(value) > SIGNAL_PAYLOAD_MAX:
        raise BadRequest(f"the payload is longer than {SIGNAL_PAYLOAD_MAX} characters; "
                         "nothing was sent")
    return _json(value, "the payload", "nothing was sent")


def _signal_body(data: Mapping[str, Any]) -> tuple[str, JSON, str | None]:
    """``{"name", "payload", "id"}`` of ``POST /api/runs/ID/signal``."""
    name, signal_id = data.get("name"), data.get("id")
    if not isinstance(name, str):
        raise BadRequest('the body needs the signal\'s "name" (a string)')
    if signal_id is not None and not isinstance(signal_id, str):
        raise BadRequest('the signal\'s "id" is a string (or null)')
    unknown = sorted(set(data) - {"name", "payload", "id"})
    if unknown:
        raise BadRequest(f"unknown field {unknown[0]!r}: a signal is name, payload and id")
    payload = data.get("payload")
    if len(dumps(payload, "a signal's payload")) > SIGNAL_PAYLOAD_MAX:  # as the form's
        raise BadRequest(f"the payload is longer than {SIGNAL_PAYLOAD_MAX} characters of "
                         "JSON; nothing was sent")
    return name.strip(), payload, signal_id


ACTION_FIELDS: dict[str, tuple[str, ...]] = {
    "cancel": (), "pause": (), "resume": (), "replay": ("from_step", "in_doubt"),
    "approve": ("note",), "reject": ("reason",)}
"""The fields of each action's JSON body (``signal``'s: :func:`_signal_body`)."""


def _action_fields(action: str, data: Mapping[str, Any]) -> dict[str, str]:
    """An action's JSON body as the form's fields: an unknown field (a typo such as
    ``from-step``, which would replay from the first step) is refused, and each field must
    be a string, or a whole number for ``from_step`` (null: not given)."""
    known = ACTION_FIELDS[action]
    unknown = sorted(set(data) - set(known))
    if unknown:
        takes = ", ".join(known) if known else "no fields"
        raise BadRequest(f"unknown field {unknown[0]!r}: {action} takes {takes}; nothing "
                         "was done")
    fields: dict[str, str] = {}
    for name, value in data.items():
        if value is None:
            fields[name] = ""
        elif name == "from_step" and type(value) is int:
            fields[name] = str(value)
        elif isinstance(value, str) and name != "from_step":
            fields[name] = value
        else:
            kind = "a step number" if name == "from_step" else "a string"
            raise BadRequest(f"{name} is {kind}, not {json.dumps(value)[:40]}; nothing was "
                             "done")
    return fields


def _parse_step(value: str | None) -> int | None:
    if value is None or value == "":
        return None
    try:
        number = int(value)
    except ValueError:
        raise BadRequest(f"from_step is a step number, not {value!r}") from None
    return number


def _parse_time(value: str | None, name: str) -> float | None:
    return parse_time(value, f"{name}=")


def _parse_cursor(value: str | None) -> tuple[float, str] | None:
    if not value:
        return None
    created, sep, run_id = value.partition(":")
    try:
        if not sep:
            raise ValueError
        return float(created), run_id
    except ValueError:
        raise BadRequest(f"before={value!r} is not a cursor from a runs page") from None


def _run_target(request: Request, suffixes: Collection[str] | None
                ) -> tuple[str, str | None]:
    """The run id and the suffix (``live``, ``journal``, an action) of a request under
    ``/runs/`` or ``/api/runs/``, read from the raw path: an id is any string, sent as one
    encoded segment (:func:`run_path`), and the decoded path cannot tell a ``%2F`` in it
    from a ``/``. A last segment in ``suffixes`` (None: any, a POST always names its
    action) is the suffix and the rest the id, so a ``/`` typed by hand in an id still
    reaches its run unless what follows it is a suffix (``/runs/job/live``: the live view
    of ``job``)."""
    raw = request.scope.get("raw_path") or quote(request.scope["path"]).encode()
    depth = 3 if request.url.path.startswith("/api/") else 2  # before the id: "", (api,) runs
    parts = raw.partition(b"?")[0].split(b"/", depth)
    rest = parts[depth] if len(parts) > depth else b""
    head, sep, last = rest.rpartition(b"/")
    if sep and (suffixes is None or last.decode("latin-1") in suffixes):
        return _segment(head), _segment(last)
    return _segment(rest), None


def _segment(raw: bytes) -> str:
    return unquote_to_bytes(raw).decode("utf-8", "replace")


def _list_query(request: Request) -> render.ListQuery:
    p = request.query_params
    state = p.get("state") or None
    if state is not None and state not in render.STATES:
        raise BadRequest(f"unknown state {state!r}; one of: {', '.join(render.STATES)}")
    limit_text = p.get("limit") or "50"
    try:
        limit = int(limit_text)
    except ValueError:
        raise BadRequest(f"limit={limit_text!r} is not a number") from None
    if not 1 <= limit <= PAGE_LIMIT_MAX:
        raise BadRequest(f"limit must be between 1 and {PAGE_LIMIT_MAX}")
    query = render.ListQuery(state=state, workflow=p.get("workflow") or None,
                             key=p.get("key") or None, since=p.get("since") or None,
                             until=p.get("until") or None, q=p.get("q") or None, limit=limit)
    _parse_time(query.since, "since")
    _parse_time(query.until, "until")
    return query


def _origin(request: Request) -> dict[str, JSON]:
    client = request.client
    return {"via": "console", "remote": client.host if client else None,
            "user_agent": (request.headers.get("user-agent") or "")[:200]}


def _same_origin(request: Request) -> bool:
    """A browser's cross-site POST carries its page's Origin: refuse one that is not ours."""
    origin = request.headers.get("origin")
    if origin is None or origin == "null":
        referer = request.headers.get("referer")
        if referer is None:
            return origin is None  # not a browser form post (curl, scripts): token decides
        origin = referer
    return urlsplit(origin).netloc == request.headers.get("host", "")


BODY_MAX = 4 * SIGNAL_PAYLOAD_MAX
"""An action's request body (a form, the API's JSON): at most this many bytes, read no
further (a larger one is refused before it is all in memory)."""


async def _body(request: Request) -> bytes:
    """The request body, refused (400, nothing done) once it passes :data:`BODY_MAX`."""
    chunks: list[bytes] = []
    size = 0
    async with contextlib.aclosing(request.stream()) as stream:
        async for chunk in stream:
            size += len(chunk)
            if size > BODY_MAX:
                raise BadRequest(f"the request body is larger than {BODY_MAX} bytes; "
                                 "nothing was done")
            chunks.append(chunk)
    return b"".join(chunks)


def _json(text: str | bytes, what: str, nothing: str = "nothing was done") -> JSON:
    """``text`` parsed as JSON, or a one-line :class:`BadRequest` naming ``what``."""
    try:
        return json.loads(text)
    except RecursionError:  # the parser recurses per level: far deeper than journaled
        raise BadRequest(f"{what} nests deeper than {MAX_JSON_DEPTH} levels; "
                         f"{nothing}") from None
    except ValueError as exc:
        where = (f" ({exc.msg} at line {exc.lineno} column {exc.colno})"
                 if isinstance(exc, json.JSONDecodeError) else "")
        raise BadRequest(f"{what} is not JSON{where}; {nothing}") from None


def _flash_for(request: Request, run_id: str) -> str:
    """The line an action left for ``run_id``'s page (:data:`FLASH_COOKIE`), or ""."""
    try:
        found = json.loads(unquote(request.cookies.get(FLASH_COOKIE, "")))
    except ValueError:
        return ""
    if (isinstance(found, list) and len(found) == 2 and found[0] == run_id
            and isinstance(found[1], str)):
        return found[1]
    return ""


async def _form(request: Request) -> dict[str, str]:
    """An urlencoded form, parsed without python-multipart."""
    body = (await _body(request)).decode("utf-8", "replace")
    return {k: v[-1] for k, v in parse_qs(body, keep_blank_values=True).items()}


def create_app(client: Client, *, token: str | None = None, console_url: str | None = None,
               allow_hosts: Sequence[str] = (), poll_timeout: float = 5.0,
               fail_threshold: int = 2) -> Starlette:
    """The console over ``client``'s store. ``token``: the admin token (None: read-only).
    It answers requests that name an address, ``localhost``, the host of ``console_url``
    or one of ``allow_hosts`` (``"*"``: any name); others get 403 (DNS rebinding)."""
    console = Console(client, token=token, console_url=console_url,
                      poll_timeout=poll_timeout, fail_threshold=fail_threshold)

    def html(request: Request, body: str, status: int = 200,
             headers: Mapping[str, str] | None = None) -> HTMLResponse:
        response = HTMLResponse(body, status, headers=dict(headers or {}))
        if CSRF_COOKIE not in request.cookies:
            response.set_cookie(CSRF_COOKIE, request.state.new_csrf, httponly=True,
                                samesite="strict", path="/")
        return response

    def problem(request: Request, message: str, status: int) -> Response:
        if request.url.path.startswith("/api/"):
            return JSONResponse({"error": message}, status)
        return html(request, render.refused_page(message, console.chrome(request)), status)

    def guarded(handler: Callable[[Request], Awaitable[Response]]
                ) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            request.state.new_csrf = secrets.token_urlsafe(32)
            try:
                return await handler(request)
            except BadRequest as exc:
                return problem(request, str(exc), 400)
            except RunConflictError as exc:  # an id already used for something else
                return problem(request, redact(str(exc)), 409)
            except ConfigError as exc:
                return problem(request, redact(str(exc)), 400)
            except PermissionError as exc:
                return problem(request, str(exc), 403)
            except RunNotFoundError as exc:
                return problem(request, redact(str(exc)), 404)
            except InvalidStateError as exc:
                return problem(request, redact(str(exc)), 409)
            except DurableError as exc:
                console.log.warning("console_error", path=request.url.path, error=str(exc))
                return problem(request, redact(str(exc)), 503)
            except Exception as exc:  # the console's own fault: logged, one line for the user
                console.log.exception("console_failed", path=request.url.path,
                                      error=f"{type(exc).__name__}: {exc}")
                return problem(request, "the console failed on this request (logged as "
                               "console_failed); nothing more was done", 500)
        return endpoint

    # -- pages ---------------------------------------------------------------------------------
    async def home(request: Request) -> Response:
        return RedirectResponse("/runs", 302)

    async def runs_page(request: Request) -> Response:
        query = _list_query(request)
        before = request.query_params.get("before") or None
        runs, counts, cursor = await console.runs(query, before)
        return html(request, render.runs_page(query, runs, counts, cursor,
                                              console.chrome(request), before=before,
                                              paused=await console.client.paused(),
                                              now=await console.client.store.now(),
                                              gone=await console.client.gone_holders(runs)))

    async def runs_live(request: Request) -> Response:
        query = _list_query(request)
        runs, counts, cursor = await console.runs(query, request.query_params.get("before"))
        return HTMLResponse(render.runs_fragment(query, runs, counts, cursor,
                                                 await console.client.paused(),
                                                 await console.client.store.now(),
                                                 await console.client.gone_holders(runs)))

    async def run_get(request: Request) -> Response:
        run_id, live = _run_target(request, ("live",))
        return await (run_live(request, run_id) if live else run_page(request, run_id))

    async def run_page(request: Request, run_id: str) -> Response:
        detail = await console.detail(run_id)
        if detail is None:
            pruned = await console.client.pruned(run_id)
            if pruned is not None:
                return html(request, render.pruned_page(pruned, console.chrome(request)), 410)
            return html(request, render.not_found_page(run_id, console.chrome(request)), 404)
        flash = _flash_for(request, run_id)
        response = html(request, render.run_page(detail, console.chrome(request),
                                                 flash=flash))
        if flash:  # shown: once (another run's page leaves it)
            response.delete_cookie(FLASH_COOKIE, path="/", httponly=True, samesite="strict")
        return response

    async def run_live(request: Request, run_id: str) -> Response:
        detail = await console.detail(run_id)
        if detail is None:
            pruned = await console.client.pruned(run_id)
            if pruned is not None:
                return HTMLResponse(render.pruned_fragment(pruned), 410,
                                    headers={FINAL_HEADER: "1"})
            return HTMLResponse("<p>cannot confirm: no such run</p>", 404)
        headers = {FINAL_HEADER: "1"} if detail.run.state.finished else {}
        # the actions come with it (their forms carry this browser's CSRF value)
        return html(request, render.run_fragment(detail, console.chrome(request)),
                    headers=headers)

    async def status_page(request: Request) -> Response:
        p = request.query_params
        return html(request, render.status_page(p.get("workflow", ""), p.get("key", ""),
                                                p.get("id", ""), console.chrome(request)))

    async def form_action(request: Request) -> Response:
        run_id, action = _run_target(request, None)
        if action not in ACTIONS:
            return problem(request, f"no action {(action or '')!r}: one of "
                           f"{', '.join(ACTIONS)}", 404)
        fields = await _form(request)
        cookie = request.cookies.get(CSRF_COOKIE, "")
        given = fields.get("csrf", "")
        if not _same_origin(request):
            raise PermissionError("refused: the request came from another site")
        if not cookie or not given or not hmac.compare_digest(cookie.encode(), given.encode()):
            raise PermissionError("refused: the form's CSRF value is missing or stale; "
                                  "reload the page and try again")
        console.check_token(fields.get("token"))
        message = await console.act(action, run_id, fields, _origin(request))
        response = RedirectResponse(run_path(run_id), 303)
        response.set_cookie(FLASH_COOKIE, quote(json.dumps([run_id, message[:300]])),
                            max_age=60, path="/", httponly=True, samesite="strict")
        return response

    # -- the JSON API --------------------------------------------------------------------------
    async def api_runs(request: Request) -> Response:
        query = _list_query(request)
        runs, counts, cursor = await console.runs(query, request.query_params.get("before"))
        paused = [pause_json(p) for p in await console.client.paused()]
        gone = await console.client.gone_holders(runs)
        return JSONResponse(_safe({"runs": [run_json(r, gone.get(r.id)) for r in runs],
                                   "next": cursor,
                                   "counts": counts, "paused": paused}))

    async def api_get(request: Request) -> Response:
        run_id, journal = _run_target(request, ("journal",))
        return await (api_journal(request, run_id) if journal else api_run(run_id))

    async def api_run(run_id: str) -> Response:
        detail = await console.detail(run_id)
        if detail is None:
            pruned = await console.client.pruned(run_id)
            if pruned is not None:
                return JSONResponse({"status": "pruned", **pruned.to_json()}, 410)
            return JSONResponse({"status": "unknown",
                                 "error": f"no run with id {run_id!r} in {console.db}"}, 404)
        data = show_json(detail.run, detail.entries, console.console_url, gone=detail.gone)
        data["approval"] = None if detail.approval is None else detail.approval.as_dict()
        data["signals"] = [attrs.asdict(s) for s in detail.signals]
        data["progress"] = None if detail.progress is None else detail.progress.as_dict()
        data["records"] = [{"namespace": ns, "key": key, "epoch": epoch,
                            "value": None if rec is None else rec.value,
                            "exists": rec is not None,
                            "version": None if rec is None else rec.version}
                           for ns, key, rec, epoch in detail.records]
        return JSONResponse(_safe(data))

    async def api_journal(request: Request, run_id: str) -> Response:
        after_text = request.query_params.get("after", "0")
        try:
            after = int(after_text)
        except ValueError:
            raise BadRequest(f"after={after_text!r} is not a journal sequence number") from None
        entries = await console.client.journal(run_id)
        return JSONResponse(_safe({"journal": [entry_json(e) for e in entries
                                               if e.seq > after]}))

    async def api_status(request: Request) -> Response:
        return JSONResponse(_safe(await console.status(request.query_params)))

    async def api_action(request: Request) -> Response:
        run_id, action = _run_target(request, None)
        if action not in ACTIONS:
            return problem(request, f"no action {(action or '')!r}: one of "
                           f"{', '.join(ACTIONS)}", 404)
        auth = request.headers.get("authorization", "")
        scheme, _, given = auth.partition(" ")
        console.check_token(given.strip() if scheme.lower() == "bearer" else None)
        data: dict[str, Any] = {}
        body = await _body(request)
        if body:
            parsed = _json(body, "the request body")
            if not isinstance(parsed, dict):
                raise BadRequest("the request body must be a JSON object")
            data = parsed
        answer: dict[str, JSON] = {}
        if action == "signal":
            name, payload, signal_id = _signal_body(data)
            recorded, message = await console.signal(run_id, name, payload, signal_id,
                                                     _origin(request))
            console.log.info("console_action", action=action, workflow_id=run_id,
                             remote=request.client.host if request.client else None)
            answer["recorded"] = recorded
        else:
            message = await console.act(action, run_id, _action_fields(action, data),
                                        _origin(request))
        run = await console.client.get(run_id)
        return JSONResponse(_safe({**answer, "message": message, "run": run_json(run)}))

    async def healthz(request: Request) -> Response:
        await console.client.store.now()
        return JSONResponse({"ok": True})

    routes = [
        Route("/", guarded(home)),
        Route("/runs", guarded(runs_page)),
        Route("/live/runs", guarded(runs_live)),
        # the id and what follows it are read from the raw path (_run_target)
        Route("/runs/{rest:path}", guarded(run_get), methods=["GET"]),
        Route("/runs/{rest:path}", guarded(form_action), methods=["POST"]),
        Route("/status", guarded(status_page)),
        Route("/api/runs", guarded(api_runs)),
        Route("/api/status", guarded(api_status)),
        Route("/api/runs/{rest:path}", guarded(api_get), methods=["GET"]),
        Route("/api/runs/{rest:path}", guarded(api_action), methods=["POST"]),
        Route("/healthz", guarded(healthz)),
        Mount("/static", app=StaticFiles(directory=STATIC), name="static"),
    ]
    app = Starlette(routes=routes)
    app.state.console = console
    named = [urlsplit(console_url).hostname or ""] if console_url else []
    return _Headers(_KnownNames(app, [*named, *allow_hosts]))  # type: ignore[return-value]


def _safe(data: Any) -> Any:
    """JSON with every string redacted (no credential leaves through the API, whatever an
    older journal holds)."""
    return redact_json(data)


_SECURITY_HEADERS = [
    (b"content-security-policy",
     b"default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
     b"frame-ancestors 'none'; form-action 'self'; base-uri 'none'"),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
    (b"cache-control", b"no-store"),
]


class _KnownNames:
    """A request must name an address, ``localhost``, the host of ``--console-url`` or a
    name given with ``--allow-host``, on whatever address it reached. A page of any site
    the operator visits can have its name resolve to 127.0.0.1, or to the address the
    console serves on in the operator's network (DNS rebinding): the browser then treats
    the console as that site's own, and its scripts read every page (runs, journals,
    errors). Such a request carries that site's name in ``Host``: it is refused (403),
    before any page is built, with one line saying how to open the console or name it.
    (Before, a console on another address than loopback answered any name, as exposed on
    purpose; ``--allow-host '*'`` still does.)"""

    def __init__(self, app: ASGIApp, names: Sequence[str]) -> None:
        self.app = app
        self.names = tuple(names)  # foreign_name compares them without case
        self.state = getattr(app, "state", None)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        server = scope.get("server") if scope["type"] == "http" else None
        if server is not None:
            host = dict(scope.get("headers") or []).get(b"host", b"").decode("latin-1")
            address, port = str(server[0]), server[1]
            if foreign_name(address, host, self.names, anywhere=True):
                shown = f"[{address}]" if ":" in address else address
                name = (urlsplit(f"//{host}").hostname or host).rstrip(".")
                where = ("a loopback address (another site's page, by DNS rebinding)"
                         if loopback(address) else
                         f"{shown}, a name this console was not told to answer (another "
                         f"site's page could reach it by DNS rebinding)")
                response = Response(
                    f"durable console: refused a request for host {host!r} that reached "
                    f"{where}; open http://{shown}:{port}/runs, or name this host in "
                    f"--console-url or --allow-host {name}\n",
                    403, media_type="text/plain")
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


class _Headers:
    """Adds the security headers to every response."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.state = getattr(app, "state", None)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                names = {name for name, _ in message.get("headers", [])}
                message["headers"] = list(message.get("headers", [])) + [
                    (k, v) for k, v in _SECURITY_HEADERS if k not in names]
            await send(message)

        await self.app(scope, receive, send_with_headers)


ACTIONS = ("cancel", "replay", "signal", "approve", "reject", "pause", "resume")
