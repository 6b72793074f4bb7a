"""The durable activities: the plain clients, run as journaled steps over ``ctx.http``.

Each activity builds its client at call time from the environment (:mod:`activities.config`)
over the attempt's fenced ``ctx.http``: every request carries ``Idempotency-Key`` and
``Durable-Fencing-Token``, is refused before it is sent once the attempt has lost its lease,
and is aborted in flight when the step times out or the attempt is cancelled. Tokens are
never arguments or results (both are journaled). Git runs as a real process, killed with
everything it started when the step is cancelled.

Errors, translated once here::

    StaleFencingTokenError (409)   -> durable.LeaseLostError: a newer attempt holds the
                                      resource; this one must stop (BaseException)
    401, 403 and other 4xx         -> RefusedError (non-retryable): retrying cannot help
    429, 503 (Retry-After), 5xx,   -> left as they are: retried with backoff, honouring
    no answer                         Retry-After
    missing configuration          -> config.MissingConfigError (non-retryable, nothing sent)

Retry and ``on_doubt`` per activity, and why:

- Deletes treat 404 as done, so sending one twice is harmless: retried, and re-run when an
  earlier attempt left them in doubt.
- Lookups and ``git ls-remote`` only read: retried, re-run.
- Creating a repository is not idempotent (a second create answers 409, which is also what
  someone else's repository looks like): retried only by the engine's policy, and a crash
  mid-call is *in doubt* -> ``on_doubt="fail"``. Its lookup reads the repository back (the
  create marks it with the run and step in its description): found and ours, the step is
  done and its result is the repository (a retry that meets a 409 reads it back the same
  way: its own repository, created by a try whose answer was lost, is no refusal); absent
  or someone else's, it did not happen; no answer, it stays in doubt for an operator, whose
  ``--accept-in-doubt`` asks the lookup again for the result.
- The TTS call is billed. It carries an idempotency key made of the step's own key
  (``<run id>/item-<n>``) and the item, the same on every try and every attempt, so the
  service answers a repeated call from its record instead of billing again. Only because
  of that key is ``on_doubt="retry"`` safe.
- A force push uses ``--force-with-lease`` with the expected commit that an earlier step
  recorded in the journal, and pushes an exact commit (also journaled). A second attempt
  therefore finds the push already done (git answers up to date) or the remote where it
  expected it; if the remote moved, the push is refused: two attempts can never both
  force-push. So it may be retried and re-run; a timeout is not retried (it fails the run
  for a person to look at).
- A notification is never sent twice on purpose: one journaled step per outcome, the same
  idempotency key on every try, a try repeated only when the message surely did not
  arrive, and ``on_doubt="fail"``; see :func:`notify`.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx

import durable

from . import config, git
from ._http import STALE_FENCING_TOKEN
from .errors import ServiceError, StaleFencingTokenError
from .githost import CreateOutcome, GitHostClient, Lookup, LookupResult
from .notify import Notifier
from .outcomes import DeleteOutcome
from .paas import PaasClient
from .tts import TtsClient

__all__ = [
    "AlreadyExistsError",
    "GitTimeoutError",
    "LookupUnknownError",
    "RefusedError",
    "RemoteMovedError",
    "ResourceMissingError",
    "check_config",
    "create_repository",
    "created_repository",
    "delete_application",
    "delete_database",
    "delete_env_vars",
    "delete_repository",
    "delete_volumes",
    "find_repository",
    "force_push",
    "get_application",
    "notify",
    "plan_resources",
    "push",
    "read_resources",
    "remote_head",
    "require_absent",
    "synthesize",
]

Repo = Mapping[str, Any]
"""A repository as journaled: ``{"full_name", "clone_url", "branch"}``."""

READ_RETRY = durable.RetryPolicy(max_tries=3, initial_delay=0.5, max_delay=10)
DELETE_RETRY = durable.RetryPolicy(max_tries=4, initial_delay=0.5, max_delay=10)
HTTP_TIMEOUT = 60.0
TTS_TIMEOUT = 300.0
_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


# -- errors ---------------------------------------------------------------------------------
class RefusedError(durable.NonRetryableError):
    """The service refused the request (401, 403, other 4xx): retrying cannot help."""


class ResourceMissingError(durable.NonRetryableError):
    """Something the operation needs does not exist (a 404 where absence is an error)."""


class AlreadyExistsError(durable.NonRetryableError):
    """The target exists already; the operation never overwrites."""


class LookupUnknownError(Exception):
    """A lookup could not tell found from absent (5xx, 429, no answer): retried."""

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class GitTimeoutError(durable.NonRetryableError):
    """git did not finish within ``DURABLE_GIT_TIMEOUT``; it was killed."""


class RemoteMovedError(durable.NonRetryableError):
    """A push was refused: the remote ref moved, or is not a fast-forward."""


_HINTS = {"paas": "DURABLE_PAAS_TOKEN", "githost": "DURABLE_GITHOST_TOKEN",
          "tts": "DURABLE_TTS_TOKEN", "notify": "DURABLE_NOTIFY_TOKEN"}


def _refusal(exc: ServiceError, service: str) -> RefusedError:
    hint = f" (check {_HINTS[service]})" if exc.status in (401, 403) else ""
    return RefusedError(f"{service} refused the request: {exc}{hint}")


def _retryable_status(status: int | None) -> bool:
    return status is None or status >= 500 or status in (408, 425, 429)


@contextmanager
def boundary(service: str) -> Iterator[None]:
    """Translate the clients' errors for the engine (see the module docstring)."""
    try:
        yield
    except StaleFencingTokenError as exc:
        raise durable.LeaseLostError(
            f"{service} refused a stale fencing token: a newer attempt holds the resource, "
            "this one stops") from exc
    except ServiceError as exc:
        if _retryable_status(exc.status):
            raise
        raise _refusal(exc, service) from exc


def _unknown(result: LookupResult, full_name: str) -> Exception:
    error = result.error
    text = f"could not tell whether repository {full_name} exists ({result.detail}); " \
           "not proceeding"
    if error is not None and not _retryable_status(error.status):
        return RefusedError(text + (" (check DURABLE_GITHOST_TOKEN)"
                                    if error.status in (401, 403) else ""))
    return LookupUnknownError(text, getattr(error, "retry_after", None))


def _split(full_name: str) -> tuple[str, str]:
    workspace, _, slug = full_name.partition("/")
    if not workspace or not slug or "/" in slug:
        raise durable.NonRetryableError(f"a repository is 'workspace/slug', not {full_name!r}")
    return workspace, slug


def _paas(ctx: durable.ActivityContext) -> PaasClient:
    cfg = config.service("paas")
    return PaasClient(ctx.http, cfg.url, cfg.token)


def _githost(ctx: durable.ActivityContext) -> GitHostClient:
    cfg = config.service("githost")
    return GitHostClient(ctx.http, cfg.url, cfg.token)


def _annotated(ctx: durable.ActivityContext, what: str, outcome: DeleteOutcome) -> str:
    """A delete's summary and result: the phrase of :func:`_gone` (``"deleted"``,
    ``"already gone"``, or gone after a lost answer), the same in the journal's summary
    and in what the workflow reports (slot.teardown's ``deleted`` list)."""
    phrase = _gone(ctx, outcome)
    ctx.annotate(f"{what}: {phrase}")
    return phrase


def _gone(ctx: durable.ActivityContext, outcome: DeleteOutcome) -> str:
    """What a delete's outcome says. A 404 on a later try does not mean "gone before this
    step": an earlier try whose answer was lost (or an earlier attempt's) may have deleted
    it, and a summary is what the recovery report lists as done."""
    if outcome is DeleteOutcome.DELETED:
        return "deleted"
    if ctx.try_number > 1:
        return ("gone: deleted by an earlier try of this step whose answer was lost, or by "
                "someone else")
    return "already gone"


def _earlier_tries(ctx: durable.ActivityContext) -> str:
    """For the summary of a step that deletes what it lists: a later try lists only what
    is left, so what an earlier try deleted (its answer lost) is not in its list."""
    if ctx.try_number == 1:
        return ""
    return "; an earlier try of this step, whose answer was lost, may have deleted more"


# -- configuration --------------------------------------------------------------------------
@durable.activity("config.check", timeout=5, retry=durable.RetryPolicy(max_tries=1))
async def check_config(ctx: durable.ActivityContext, services: list[str]) -> dict[str, str]:
    """Fail the run before it touches anything if a service it needs is not configured."""
    urls = config.check(services)
    ctx.annotate("configured: " + ", ".join(services))
    return urls


# -- PaaS -----------------------------------------------------------------------------------
@durable.activity("paas.get_application", timeout=HTTP_TIMEOUT, retry=READ_RETRY)
async def get_application(ctx: durable.ActivityContext, app_uuid: str) -> dict[str, Any]:
    """The application, which must exist (404: :class:`ResourceMissingError`)."""
    with boundary("paas"):
        app = await _paas(ctx).get_application(app_uuid)
    if app is None:
        raise ResourceMissingError(f"application {app_uuid} does not exist on the PaaS")
    ctx.annotate(f"application {app.uuid}: {app.status or 'found'}")
    return {"uuid": app.uuid, "name": app.name, "status": app.status}


@durable.activity("paas.delete_database", timeout=HTTP_TIMEOUT, retry=DELETE_RETRY)
async def delete_database(ctx: durable.ActivityContext, db_uuid: str) -> str:
    """Delete a database; 404 means already gone, which counts as done. Answers what
    happened, as a phrase (:func:`_gone`)."""
    with boundary("paas"):
        outcome = await _paas(ctx).delete_database(db_uuid)
    return _annotated(ctx, f"database {db_uuid}", outcome)


@durable.activity("paas.delete_env_vars", timeout=HTTP_TIMEOUT, retry=DELETE_RETRY)
async def delete_env_vars(ctx: durable.ActivityContext, app_uuid: str) -> dict[str, Any]:
    """Delete every env var of an application (names journaled, values never)."""
    client = _paas(ctx)
    deleted: list[str] = []
    gone: list[str] = []
    with boundary("paas"):
        try:
            envs = await client.list_envs(app_uuid)
        except ServiceError as exc:
            if exc.status != 404:
                raise
            ctx.annotate(f"application {app_uuid} is gone: no env vars left")
            return {"deleted": [], "already_gone": [], "app_gone": True}
        for env in envs:
            outcome = await client.delete_env(app_uuid, env.uuid)
            (deleted if outcome is DeleteOutcome.DELETED else gone).append(env.key)
            ctx.annotate(f"env vars of {app_uuid}: deleted {', '.join(deleted) or 'none'}")
    ctx.annotate(f"env vars of {app_uuid}: "
                 + (f"deleted {', '.join(deleted)}" if deleted else "none left")
                 + _earlier_tries(ctx))
    return {"deleted": deleted, "already_gone": gone, "app_gone": False}


@durable.activity("paas.delete_volumes", timeout=HTTP_TIMEOUT, retry=DELETE_RETRY)
async def delete_volumes(ctx: durable.ActivityContext, app_uuid: str) -> dict[str, Any]:
    """Delete the application's persistent volumes (file mounts are configuration: kept)."""
    client = _paas(ctx)
    deleted: list[str] = []
    with boundary("paas"):
        try:
            storages = await client.list_storages(app_uuid)
        except ServiceError as exc:
            if exc.status != 404:
                raise
            ctx.annotate(f"application {app_uuid} is gone: no volumes left")
            return {"deleted": [], "app_gone": True}
        for storage in storages:
            if storage.kind != "persistent":
                continue
            if await client.delete_storage(app_uuid, storage.uuid) is DeleteOutcome.DELETED:
                deleted.append(storage.name or storage.uuid)
            ctx.annotate(f"volumes of {app_uuid}: deleted {', '.join(deleted) or 'none'}")
    ctx.annotate(f"volumes of {app_uuid}: "
                 + (f"deleted {', '.join(deleted)}" if deleted else "none left")
                 + _earlier_tries(ctx))
    return {"deleted": deleted, "app_gone": False}


@durable.activity("paas.delete_application", timeout=HTTP_TIMEOUT, retry=DELETE_RETRY)
async def delete_application(ctx: durable.ActivityContext, app_uuid: str) -> str:
    """Delete an application with its volumes; 404 counts as done."""
    with boundary("paas"):
        outcome = await _paas(ctx).delete_application(app_uuid)
    return _annotated(ctx, f"application {app_uuid}", outcome)


# -- reading what an operation would touch (plans and their re-check) ----------------------
@durable.activity("inventory.read", timeout=HTTP_TIMEOUT, retry=READ_RETRY)
async def read_resources(ctx: durable.ActivityContext,
                         targets: dict[str, str | None]) -> dict[str, Any]:
    return await _read_resources(ctx, targets)


async def _read_resources(ctx: durable.ActivityContext,
                          targets: Mapping[str, str | None]) -> dict[str, Any]:
    """What exists now of ``targets`` (``{"database": uuid, "application": uuid,
    "repository": "workspace/slug"}``, each may be None), read from the services.

    Each answers None when absent (404, and only 404) or not asked for, else its current
    identity: the database's and application's uuid, name and status, the application's
    persistent volumes and env vars (uuids with names or keys; never a value), the
    repository's uuid and main branch. A service that cannot answer fails the step (retried:
    "could not look" is never "absent"). The same step journals a plan and, later, its
    re-check (:mod:`workflows._plan` compares the two)."""
    found: dict[str, Any] = {"database": None, "application": None, "repository": None}
    client = _paas(ctx) if targets.get("database") or targets.get("application") else None
    with boundary("paas"):
        db_uuid = targets.get("database")
        if client is not None and db_uuid:
            db = await client.get_database(db_uuid)
            if db is not None:
                found["database"] = {"id": db.uuid, "name": db.name, "status": db.status,
                                     "type": db.raw.get("database_type")}
        app_uuid = targets.get("application")
        if client is not None and app_uuid:
            app = await client.get_application(app_uuid)
            if app is not None:
                try:
                    storages = await client.list_storages(app.uuid)
                    envs = await client.list_envs(app.uuid)
                except ServiceError as exc:  # deleted between the two reads: gone
                    if exc.status != 404:
                        raise
                else:
                    found["application"] = {
                        "id": app.uuid, "name": app.name, "status": app.status,
                        "volumes": [{"id": s.uuid, "name": s.name or s.uuid,
                                     "mount_path": s.mount_path}
                                    for s in storages if s.kind == "persistent"],
                        "env_vars": [{"id": e.uuid, "name": e.key} for e in envs]}
    full_name = targets.get("repository")
    if full_name:
        result = await _githost_lookup(ctx, full_name)
        if result.outcome is Lookup.UNKNOWN or (result.outcome is Lookup.FOUND
                                                and result.repository is None):
            raise _unknown(result, full_name)
        repo = result.repository
        if repo is not None:
            found["repository"] = {"id": repo.full_name, "uuid": repo.uuid,
                                   "branch": repo.mainbranch or "main"}
    ctx.annotate("found: " + (", ".join(f"{kind} {value['id']}" for kind, value in found.items()
                                        if value is not None) or "nothing"))
    return found


PLAN_KINDS = ("database", "application", "volume", "env_var", "repository")


@durable.activity("inventory.plan", timeout=HTTP_TIMEOUT, retry=READ_RETRY)
async def plan_resources(ctx: durable.ActivityContext, title: str,
                         targets: dict[str, str | None],
                         actions: dict[str, str]) -> dict[str, Any]:
    """A plan: what exists now of ``targets`` (as :func:`read_resources` reads it) and what
    the operation will do to each, in the shape the engine presents (``show``, the console;
    ``docs/design.md``, "Plan, then approve")::

        {"title": ..., "items": [{"action", "kind", "id", "detail"}, ...], "reading": {...}}

    ``actions`` maps a kind (:data:`PLAN_KINDS`) to what is done to it ("delete"); kinds it
    does not name are read (and re-checked) but not listed. A target that is absent is listed
    as ``"nothing: already gone"``."""
    unknown = set(actions) - set(PLAN_KINDS)
    if unknown:
        raise durable.NonRetryableError(f"no plan kind {sorted(unknown)}: one of {PLAN_KINDS}")
    found = await _read_resources(ctx, targets)
    items: list[dict[str, Any]] = []

    def item(kind: str, ident: Any, detail: str, action: str | None = None) -> None:
        if kind in actions:
            items.append({"action": action or actions[kind], "kind": kind, "id": ident,
                          "detail": detail})

    for kind in ("database", "application", "repository"):
        wanted, now = targets.get(kind), found.get(kind)
        if not wanted:
            continue
        if now is None:
            item(kind, wanted, "absent on the service", "nothing: already gone")
            continue
        if kind == "database":
            item(kind, now["id"], f"{now['name']} ({now['type'] or 'database'}, "
                                  f"{now['status'] or 'status unknown'})")
        elif kind == "repository":
            item(kind, now["id"], f"uuid {now['uuid']}, main branch {now['branch']}")
        else:
            item(kind, now["id"], f"{now['name']} ({now['status'] or 'status unknown'})")
            for volume in now["volumes"]:
                item("volume", volume["id"], f"{volume['name']} at {volume['mount_path']} "
                                             f"(application {now['id']})")
            for env in now["env_vars"]:
                item("env_var", env["id"], f"{env['name']} (application {now['id']})")
    listed = [i for i in items if not i["action"].startswith("nothing")]
    ctx.annotate(f"plan: {len(listed)} to act on" + (
        ": " + ", ".join(f"{i['kind']} {i['id']}" for i in listed) if listed else ""))
    return {"title": title, "items": items, "reading": found}


# -- git host -------------------------------------------------------------------------------
def _repo_json(full_name: str, clone_url: str, branch: str | None) -> dict[str, Any]:
    return {"full_name": full_name, "clone_url": clone_url, "branch": branch or "main"}


@durable.activity("githost.find_repository", timeout=HTTP_TIMEOUT, retry=READ_RETRY)
async def find_repository(ctx: durable.ActivityContext, full_name: str) -> dict[str, Any]:
    """A repository that must exist: found, or fail (absent, or *unknown*: never guessed)."""
    result = await _githost_lookup(ctx, full_name)
    if result.outcome is Lookup.ABSENT:
        raise ResourceMissingError(f"repository {full_name} does not exist on the git host")
    if result.outcome is Lookup.UNKNOWN or result.repository is None:
        raise _unknown(result, full_name)
    repo = result.repository
    ctx.annotate(f"repository {full_name}: found")
    return _repo_json(repo.full_name, repo.clone_url(), repo.mainbranch)


async def _githost_lookup(ctx: durable.ActivityContext, full_name: str) -> LookupResult:
    workspace, slug = _split(full_name)
    with boundary("githost"):
        return await _githost(ctx).lookup(workspace, slug)


@durable.activity("githost.require_absent", timeout=HTTP_TIMEOUT, retry=READ_RETRY)
async def require_absent(ctx: durable.ActivityContext, full_name: str) -> str:
    """Go on only if the repository is *absent* (404): found or unknown fail the step."""
    result = await _githost_lookup(ctx, full_name)
    if result.outcome is Lookup.FOUND:
        raise AlreadyExistsError(f"repository {full_name} already exists; nothing was changed")
    if result.outcome is Lookup.UNKNOWN:
        raise _unknown(result, full_name)
    ctx.annotate(f"repository {full_name}: absent")
    return "absent"


def _creation_mark(ctx: durable.ActivityContext) -> str:
    """What a repository created by this step says of itself (its description): the run and
    the step, the same on every try, attempt and operator re-run of the step."""
    return f"created by durable run {ctx.workflow_id} step {ctx.step_key}"


@durable.activity("githost.create_repository", timeout=HTTP_TIMEOUT, retry=READ_RETRY,
                  on_doubt="fail")
async def create_repository(ctx: durable.ActivityContext, full_name: str) -> dict[str, Any]:
    """Create a private repository; 409 (already existed) fails the step, unless the
    repository is this step's own (a try whose answer was lost created it).

    Not idempotent: a crash mid-call leaves the step in doubt. The repository's description
    names the run and step that created it, so the step's lookup
    (:func:`created_repository`), and a try that meets a 409, can tell this step's
    repository from anyone else's.
    """
    workspace, slug = _split(full_name)
    with boundary("githost"):
        result = await _githost(ctx).create(workspace, slug, is_private=True,
                                            description=_creation_mark(ctx))
    if result.outcome is CreateOutcome.ALREADY_EXISTED or result.repository is None:
        # an earlier try (or attempt) of this very step may have created it, its answer
        # lost: its mark says so, and then the create is done, not refused
        ours = await _created_by_this_step(ctx, full_name)
        if ours is None:
            raise AlreadyExistsError(f"repository {full_name} already existed (409), and not "
                                     "created by this run: nothing was changed")
        ctx.annotate(f"repository {full_name}: created by an earlier try of this step "
                     "(its answer was lost)")
        return ours
    repo = result.repository
    ctx.annotate(f"repository {full_name}: created")
    return _repo_json(repo.full_name, repo.clone_url(), repo.mainbranch)


async def _created_by_this_step(ctx: durable.ActivityContext,
                                full_name: str) -> dict[str, Any] | None:
    """The repository ``full_name`` if this step created it (it carries the step's mark),
    else None (absent, or someone else's); a lookup that cannot tell raises."""
    result = await _githost_lookup(ctx, full_name)
    if result.outcome is Lookup.UNKNOWN or (
            result.outcome is Lookup.FOUND and result.repository is None):
        raise _unknown(result, full_name)
    repo = result.repository
    if repo is None or repo.description != _creation_mark(ctx):
        return None
    return _repo_json(repo.full_name, repo.clone_url(), repo.mainbranch)


@create_repository.lookup
async def created_repository(ctx: durable.ActivityContext, full_name: str) -> Any:
    """What became of a create in doubt, or accepted by an operator: read the repository.

    Found and marked as created by this step: the step took effect, and its result is the
    repository (so ``slot.promote`` goes on to push). Absent, or found but someone else's:
    this step's create did not happen (``durable.NOT_DONE``; run again, it creates the
    repository or fails on the 409 as any create would). A lookup that cannot tell (5xx,
    401, no answer) raises: the step stays in doubt.
    """
    ours = await _created_by_this_step(ctx, full_name)
    return durable.NOT_DONE if ours is None else ours


@durable.activity("githost.delete_repository", timeout=HTTP_TIMEOUT, retry=DELETE_RETRY)
async def delete_repository(ctx: durable.ActivityContext, full_name: str,
                            uuid: str | None) -> str:
    """Delete repository ``full_name`` whose uuid is ``uuid`` (as an earlier step read and
    journaled it); 404 counts as done.

    Addressed by the uuid, not the name: if it was deleted (by a try whose answer was lost,
    or by anyone) and a repository was created again under the name, that one is another
    repository, and is not touched. Without a uuid nothing is sent."""
    workspace, _ = _split(full_name)
    if not uuid:
        raise durable.NonRetryableError(
            f"the git host gave no uuid for repository {full_name}; not deleting it by its "
            "name, which a repository created again under it would answer to")
    with boundary("githost"):
        outcome = await _githost(ctx).delete(workspace, uuid)
    return _annotated(ctx, f"repository {full_name} {uuid}", outcome)


# -- git ------------------------------------------------------------------------------------
def _git_env(url: str, ctx: durable.ActivityContext) -> dict[str, str]:
    """For an HTTP(S) remote, headers on each of git's requests through git's environment:
    the step's fencing token, scope and idempotency key, as on every ``ctx.http`` request (a
    fencing git host or proxy compares them; others ignore them), and for https the git
    host's token. For a local remote, the same three as ``DURABLE_FENCING_TOKEN``,
    ``DURABLE_FENCING_SCOPE`` and ``DURABLE_IDEMPOTENCY_KEY`` in the environment, which its
    hooks inherit (the fake git host's pre-receive hook fences pushes with them)."""
    if not url.startswith(("https://", "http://")):
        # a local remote (a path, file://): its hooks run in the pushing git's environment
        fencing = ctx.fencing_headers
        if not fencing:
            return {}
        return {"DURABLE_FENCING_TOKEN": fencing[durable.FENCING_HEADER],
                "DURABLE_FENCING_SCOPE": fencing[durable.FENCING_SCOPE_HEADER],
                "DURABLE_IDEMPOTENCY_KEY": fencing[durable.IDEMPOTENCY_HEADER]}
    headers = [f"{name}: {value}" for name, value in ctx.fencing_headers.items()]
    if url.startswith("https://"):
        headers.append(f"Authorization: Bearer {config.service('githost').token}")
    env = {"GIT_CONFIG_COUNT": str(len(headers))}
    for i, header in enumerate(headers):
        env[f"GIT_CONFIG_KEY_{i}"] = "http.extraHeader"
        env[f"GIT_CONFIG_VALUE_{i}"] = header
    return env


@contextmanager
def _git_deadline(what: str) -> Iterator[None]:
    seconds = config.git_timeout()
    try:
        with anyio.fail_after(seconds):
            yield
    except TimeoutError as exc:
        raise GitTimeoutError(
            f"{what} did not finish within {seconds:g} s (DURABLE_GIT_TIMEOUT): git and the "
            "processes it started were killed") from exc


def _scratch() -> Path:
    workdir = config.git_workdir()
    if workdir is not None:
        workdir.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix="durable-git-", dir=workdir))


def _fenced_out(exc: git.PushRejectedError, target: Repo) -> None:
    """A push the git host refused for a stale fencing token (its hook, or a fencing proxy,
    says so) means what a service's 409 means: a newer attempt holds the slot, this one
    stops (:func:`boundary`)."""
    if STALE_FENCING_TOKEN in exc.stderr:
        raise durable.LeaseLostError(
            f"the git host refused a push to {target['full_name']} with a stale fencing "
            "token: a newer attempt holds the resource, this one stops") from exc


async def _clone_at(ctx: durable.ActivityContext, source: Repo, sha: str, into: Path
                    ) -> None:
    url = str(source["clone_url"])
    await git.run_git("clone", "--quiet", "--bare", "--", url, str(into),
                      env=_git_env(url, ctx), ctx=ctx)
    await git.rev_parse(into, sha)  # the exact commit the journal names must be there


def _short(sha: str | None) -> str:
    return sha[:12] if sha else "(none)"


@durable.activity("git.remote_head", retry=READ_RETRY)
async def remote_head(ctx: durable.ActivityContext, repo: Repo) -> str | None:
    """The commit the repository's main branch is at (``git ls-remote``), or None."""
    url, branch = str(repo["clone_url"]), str(repo["branch"])
    with _git_deadline(f"git ls-remote {repo['full_name']}"):
        sha = await git.remote_sha(url, branch, env=_git_env(url, ctx), ctx=ctx)
    ctx.annotate(f"{repo['full_name']} {branch}: at {_short(sha)}")
    return sha


@durable.activity("git.force_push_with_lease",
                  retry=durable.RetryPolicy(max_tries=2, non_retryable=(git.GitError,)))
async def force_push(ctx: durable.ActivityContext, source: Repo, sha: str, target: Repo,
                     expected_sha: str | None) -> dict[str, Any]:
    """Force-push commit ``sha`` of ``source`` to ``target``'s branch, only if that branch is
    still at ``expected_sha`` (recorded in the journal by an earlier step)."""
    target_url, branch = str(target["clone_url"]), str(target["branch"])
    work = _scratch()
    try:
        with _git_deadline(f"force push to {target['full_name']}"):
            await _clone_at(ctx, source, sha, work)
            await ctx.assert_still_mine()  # git does not go through ctx.http: check here
            try:
                result = await git.force_push_with_lease(
                    work, target_url, branch, expected_sha=expected_sha, src=sha,
                    env=_git_env(target_url, ctx), ctx=ctx)
            except git.StaleLeaseError as exc:
                _fenced_out(exc, target)
                raise RemoteMovedError(
                    f"refusing to force-push: {target['full_name']} {branch} is no longer at "
                    f"{_short(expected_sha)}, the commit this run recorded; someone else "
                    "pushed meanwhile. A replay is refused the same way (it pushes against "
                    "that recorded commit): look at the new commits, and to push over them "
                    "start a new reset, which records the branch's commit anew") from exc
            except git.PushRejectedError as exc:
                _fenced_out(exc, target)
                raise RemoteMovedError(str(exc)) from exc
    finally:
        shutil.rmtree(work, ignore_errors=True)
    ctx.annotate(f"{target['full_name']} {branch}: forced to {_short(result.sha)} "
                 f"(was {_short(expected_sha)}; {result.status.value})")
    return {"ref": result.ref, "status": result.status.value, "sha": result.sha,
            "previous": expected_sha}


@durable.activity("git.push", retry=durable.RetryPolicy(max_tries=2,
                                                        non_retryable=(git.GitError,)))
async def push(ctx: durable.ActivityContext, source: Repo, sha: str,
               target: Repo) -> dict[str, Any]:
    """Push commit ``sha`` of ``source`` to ``target``'s branch without force."""
    target_url, branch = str(target["clone_url"]), str(target["branch"])
    work = _scratch()
    try:
        with _git_deadline(f"push to {target['full_name']}"):
            await _clone_at(ctx, source, sha, work)
            await ctx.assert_still_mine()
            try:
                result = await git.push(work, target_url, branch, src=sha,
                                        env=_git_env(target_url, ctx), ctx=ctx)
            except git.PushRejectedError as exc:
                _fenced_out(exc, target)
                raise RemoteMovedError(str(exc)) from exc
    finally:
        shutil.rmtree(work, ignore_errors=True)
    ctx.annotate(f"{target['full_name']} {branch}: {result.status.value} at "
                 f"{_short(result.sha)}")
    return {"ref": result.ref, "status": result.status.value, "sha": result.sha}


# -- text to speech -------------------------------------------------------------------------
@durable.activity("tts.synthesize", timeout=TTS_TIMEOUT,
                  retry=durable.RetryPolicy(max_tries=4, initial_delay=1, max_delay=30),
                  on_doubt="retry")
async def synthesize(ctx: durable.ActivityContext, job: str, item: int, voice: str,
                     text: str) -> dict[str, Any]:
    """Generate item ``item`` of ``job``: one billed TTS call, written to the audio dir.

    The idempotency key is the step's key (``<run id>/item-<n>``, the same on every try and
    attempt) plus the item: a repeated call is answered from the service's record and not
    billed again. That is what makes ``on_doubt="retry"`` safe for a paid call.
    """
    if not _SAFE_NAME.match(job):
        raise durable.NonRetryableError(f"job id {job!r} is not a safe file name")
    cfg = config.service("tts")
    folder = config.audio_dir() / job
    key = f"{ctx.idempotency_key}#{item}"
    with boundary("tts"):
        speech = await TtsClient(ctx.http, cfg.url, cfg.token).synthesize(
            voice, text, idempotency_key=key)
    path = folder / f"{item:04d}.mp3"
    await _write_atomically(path, speech.audio)
    ctx.annotate(f"item {item}: {len(speech.audio)} bytes"
                 + (" (not billed again: answered from the idempotency record)"
                    if speech.replayed else ""))
    return {"item": item, "path": str(path), "bytes": len(speech.audio),
            "sha256": hashlib.sha256(speech.audio).hexdigest(), "replayed": speech.replayed}


async def _write_atomically(path: Path, data: bytes) -> None:
    folder = anyio.Path(path.parent)
    await folder.mkdir(parents=True, exist_ok=True)
    tmp = anyio.Path(f"{path}.{os.getpid()}.tmp")
    await tmp.write_bytes(data)
    await tmp.replace(path)


# -- notifications --------------------------------------------------------------------------
def _delivery_unknown(exc: ServiceError) -> bool:
    """True when the message may have arrived although the call failed."""
    if exc.status is None:  # no answer: only a connection never made surely did not deliver
        return not isinstance(exc.__cause__, httpx.ConnectError | httpx.ConnectTimeout
                              | httpx.PoolTimeout)
    return exc.status not in (429, 503) and exc.status >= 500


@durable.activity("notify.send", timeout=HTTP_TIMEOUT,
                  retry=durable.RetryPolicy(max_tries=3, initial_delay=0.5, max_delay=10,
                                            non_retryable=(TimeoutError,)),
                  on_doubt="fail")
async def notify(ctx: durable.ActivityContext, message: dict[str, Any]) -> dict[str, str]:
    """Post ``message`` to the configured hook (``DURABLE_NOTIFY_HOOK``).

    Once per outcome: the workflow sends each outcome from one journaled step, so a replay
    or a recovered attempt never sends a completed notification again. Within the step,
    every try carries the same idempotency key, and a try is repeated only when the message
    surely did not arrive (connection refused, 429, 503); when it may have arrived (a 5xx,
    a read timeout, this activity's own timeout, a dropped connection) the step fails
    instead of risking a duplicate (``TimeoutError`` is ``non_retryable``), and a send cut
    off by a crash is in doubt (``on_doubt="fail"``): an operator checks the hook and
    replays with ``--accept-in-doubt`` or ``--rerun-in-doubt``.
    """
    cfg = config.service("notify")
    hook = config.notify_hook()
    try:
        with boundary("notify"):
            await Notifier(ctx.http, cfg.url, cfg.token).send(
                hook, message, idempotency_key=ctx.idempotency_key)
    except ServiceError as exc:
        if _delivery_unknown(exc):
            raise durable.NonRetryableError(
                f"notification may or may not have been delivered ({exc}); not sent again "
                "to avoid a duplicate") from exc
        raise
    ctx.annotate(f"notified {hook}: {message.get('outcome', 'message')}")
    return {"hook": hook, "outcome": str(message.get("outcome", ""))}
