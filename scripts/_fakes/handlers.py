"""Request handlers of the four services and of the admin surface."""

from __future__ import annotations

import hashlib
import json
import shutil
import uuid
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from .state import (
    IDEMPOTENCY_HEADER,
    NAME,
    REPLAYED_HEADER,
    STALE_FENCE,
    Fault,
    ServiceState,
    TtsRecord,
    create_repository,
    fake_audio,
    now,
    seed,
)


def _paas_error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"message": message}, status)


def _flag(request: Request, name: str) -> bool:
    return request.query_params.get(name, "true").lower() not in ("false", "0", "no")


class Handlers:
    def __init__(self, state: ServiceState) -> None:
        self.state = state

    # PaaS -------------------------------------------------------------------
    def _app(self, request: Request) -> dict[str, Any] | None:
        return self.state.applications.get(request.path_params["uuid"])

    async def get_application(self, request: Request) -> Response:
        app = self._app(request)
        if app is None:
            return _paas_error(404, "Application not found.")
        return JSONResponse(app["json"])

    async def delete_application(self, request: Request) -> Response:
        app = self.state.applications.pop(request.path_params["uuid"], None)
        if app is None:
            return _paas_error(404, "Application not found.")
        if not _flag(request, "delete_volumes"):
            self.state.orphaned_volumes.extend(app["persistent_storages"].values())
        return JSONResponse({"message": "Application deletion request queued."})

    async def list_envs(self, request: Request) -> Response:
        app = self._app(request)
        if app is None:
            return _paas_error(404, "Application not found.")
        return JSONResponse(list(app["envs"].values()))

    async def delete_env(self, request: Request) -> Response:
        app = self._app(request)
        if app is None:
            return _paas_error(404, "Application not found.")
        if app["envs"].pop(request.path_params["env_uuid"], None) is None:
            return _paas_error(404, "Environment variable not found.")
        return JSONResponse({"message": "Environment variable deleted."})

    async def list_storages(self, request: Request) -> Response:
        app = self._app(request)
        if app is None:
            return _paas_error(404, "Application not found.")
        return JSONResponse(
            {
                "persistent_storages": list(app["persistent_storages"].values()),
                "file_storages": list(app["file_storages"].values()),
            }
        )

    async def delete_storage(self, request: Request) -> Response:
        app = self._app(request)
        if app is None:
            return _paas_error(404, "Application not found.")
        storage_uuid = request.path_params["storage_uuid"]
        for kind in ("persistent_storages", "file_storages"):
            if app[kind].pop(storage_uuid, None) is not None:
                return JSONResponse({"message": "Storage deleted."})
        return _paas_error(404, "Storage not found.")

    async def get_database(self, request: Request) -> Response:
        database = self.state.databases.get(request.path_params["uuid"])
        if database is None:
            return _paas_error(404, "Database not found.")
        return JSONResponse(database)

    async def delete_database(self, request: Request) -> Response:
        if self.state.databases.pop(request.path_params["uuid"], None) is None:
            return _paas_error(404, "Database not found.")
        return JSONResponse({"message": "Database deletion request queued."})

    # Git host ---------------------------------------------------------------
    def _repo_key(self, request: Request) -> tuple[str, str] | None:
        """The repository a path names: by slug, or (as Bitbucket allows) by its uuid in
        braces; a uuid names that one repository, never a later one of the same name."""
        workspace, slug = request.path_params["workspace"], request.path_params["slug"]
        if slug.startswith("{") and slug.endswith("}"):
            return next((key for key, repo in self.state.repositories.items()
                         if key[0] == workspace and repo["uuid"] == slug), None)
        if not (NAME.match(workspace) and NAME.match(slug)) or slug.endswith(".git"):
            return None
        return workspace, slug

    async def get_repository(self, request: Request) -> Response:
        key = self._repo_key(request)
        repo = None if key is None else self.state.repositories.get(key)
        if repo is None:
            return _git_error(
                404,
                f"Repository {request.path_params['workspace']}/"
                f"{request.path_params['slug']} not found",
            )
        return JSONResponse(repo)

    async def create_repository(self, request: Request) -> Response:
        key = self._repo_key(request)
        if key is None or request.path_params["slug"].startswith("{"):
            return _git_error(400, "Invalid workspace or repository slug.")
        if key in self.state.repositories:
            return _git_error(409, "Repository with this Slug and Owner already exists.")
        try:
            body = await request.json() if await request.body() else {}
        except ValueError:
            return _git_error(400, "Malformed JSON.")
        repo = await create_repository(self.state, *key, body if isinstance(body, dict) else {})
        return JSONResponse(repo)

    async def delete_repository(self, request: Request) -> Response:
        key = self._repo_key(request)
        if key is None or self.state.repositories.pop(key, None) is None:
            return _git_error(404, "Repository not found")
        shutil.rmtree(self.state.repo_path(*key), ignore_errors=True)
        return Response(status_code=204)

    # TTS --------------------------------------------------------------------
    async def text_to_speech(self, request: Request) -> Response:
        voice_id = request.path_params["voice_id"]
        try:
            data = await request.json()
        except ValueError:
            data = None
        text = data.get("text") if isinstance(data, dict) else None
        if not isinstance(text, str) or not text:
            return JSONResponse(
                {"detail": [{"loc": ["body", "text"], "type": "missing", "msg": "Field required"}]},
                422,
            )
        model_id = data.get("model_id") if isinstance(data, dict) else None
        fingerprint = hashlib.sha256(json.dumps([voice_id, text, model_id]).encode()).hexdigest()
        key = request.headers.get(IDEMPOTENCY_HEADER)
        record = self.state.tts.get(key) if key else None
        if record is not None:
            if record.fingerprint != fingerprint:
                return JSONResponse(
                    {
                        "detail": {
                            "status": "idempotency_key_reused",
                            "message": "Idempotency-Key was used for a different request.",
                        }
                    },
                    422,
                )
            return _audio(record, replayed=True)
        record = TtsRecord(fingerprint, fake_audio(voice_id, text), uuid.uuid4().hex, len(text))
        self.state.billed_calls += 1
        self.state.billed_characters += len(text)
        request.scope["fake.entry"]["billed"] = True
        if key:
            self.state.tts[key] = record
        return _audio(record, replayed=False)

    # Notifier ---------------------------------------------------------------
    async def hook(self, request: Request) -> Response:
        try:
            body = await request.json()
        except ValueError:
            return JSONResponse({"error": "body must be JSON"}, 400)
        message = {
            "id": self.state.next_id(),
            "hook": request.path_params["name"],
            "body": body,
            "idempotency_key": request.headers.get(IDEMPOTENCY_HEADER),
            "fencing_token": request.scope["fake.entry"]["fencing_token"],
            "received_at": now(),
        }
        self.state.notifications.append(message)
        return JSONResponse({"ok": True, "id": message["id"]})

    # Admin ------------------------------------------------------------------
    async def admin_seed(self, request: Request) -> Response:
        try:
            spec = await request.json()
            await seed(self.state, spec)
        except (ValueError, KeyError, TypeError) as exc:
            return JSONResponse({"error": f"bad seed: {exc}"}, 400)
        except FileExistsError as exc:
            return JSONResponse({"error": str(exc)}, 409)
        return JSONResponse(self.state.snapshot())

    async def admin_add_fault(self, request: Request) -> Response:
        try:
            fault = Fault.from_json(f"f{self.state.next_id()}", await request.json())
        except (ValueError, TypeError) as exc:
            return JSONResponse({"error": str(exc)}, 400)
        self.state.faults.append(fault)
        return JSONResponse(fault.to_json(), 201)

    async def admin_list_faults(self, request: Request) -> Response:
        return JSONResponse({"faults": [f.to_json() for f in self.state.faults]})

    async def admin_clear_faults(self, request: Request) -> Response:
        count = len(self.state.faults)
        self.state.faults.clear()
        return JSONResponse({"cleared": count})

    async def admin_delete_fault(self, request: Request) -> Response:
        before = len(self.state.faults)
        self.state.faults[:] = [
            f for f in self.state.faults if f.id != request.path_params["fault_id"]
        ]
        return JSONResponse({"cleared": before - len(self.state.faults)})

    async def admin_git_push(self, request: Request) -> Response:
        """A push reported by a repository's pre-receive hook (``state._FENCE_HOOK``): in
        the ledger as ``PUSH /git/<repo>/<ref>``, fenced like an API request."""
        report = await request.json()
        token = self.state.parse_token(str(report.get("token", "")))
        if token is None:
            return JSONResponse({"error": "invalid fencing token"}, status_code=400)
        repo, refs = str(report["repo"]), [str(ref) for ref in report.get("refs", [])]
        entry = self.state.record("PUSH", f"/git/{repo}/{','.join(refs)}",
                                  resource=f"repo:{repo}",
                                  idempotency_key=report.get("idempotency_key"),
                                  fencing_scope=report.get("scope"))
        entry.update(fencing_token=token, ended_at=entry["arrived_at"], status=200,
                     handled=True)
        if not self.state.fence(token, entry["fencing_scope"], entry["resource"]):
            entry["refused"], entry["status"] = True, 409
            return JSONResponse(STALE_FENCE, status_code=409)
        return JSONResponse({"accepted": refs})

    async def admin_ledger(self, request: Request) -> Response:
        return JSONResponse({"entries": self.state.ledger})

    async def admin_state(self, request: Request) -> Response:
        return JSONResponse(self.state.snapshot())

    async def admin_notifications(self, request: Request) -> Response:
        return JSONResponse({"notifications": self.state.notifications})

    async def admin_release(self, request: Request) -> Response:
        """Wake every request held by a ``hang`` fault: each is dropped (no answer)."""
        self.state.release_all()
        return JSONResponse({"ok": True})

    async def admin_reset(self, request: Request) -> Response:
        self.state.reset()
        return JSONResponse({"ok": True})

    async def admin_health(self, request: Request) -> Response:
        return JSONResponse({"ok": True})


def _git_error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"type": "error", "error": {"message": message}}, status)


def _audio(record: TtsRecord, *, replayed: bool) -> Response:
    return Response(
        record.audio,
        media_type="audio/mpeg",
        headers={
            "request-id": record.request_id,
            "character-cost": str(record.characters),
            REPLAYED_HEADER: "true" if replayed else "false",
        },
    )


def routes(state: ServiceState) -> list[Route]:
    """Every endpoint; the admin ones (``/_admin``) bypass the front."""
    h = Handlers(state)
    return [
        Route("/api/v1/applications/{uuid}", h.get_application, methods=["GET"]),
        Route("/api/v1/applications/{uuid}", h.delete_application, methods=["DELETE"]),
        Route("/api/v1/applications/{uuid}/envs", h.list_envs, methods=["GET"]),
        Route("/api/v1/applications/{uuid}/envs/{env_uuid}", h.delete_env, methods=["DELETE"]),
        Route("/api/v1/applications/{uuid}/storages", h.list_storages, methods=["GET"]),
        Route(
            "/api/v1/applications/{uuid}/storages/{storage_uuid}",
            h.delete_storage,
            methods=["DELETE"],
        ),
        Route("/api/v1/databases/{uuid}", h.get_database, methods=["GET"]),
        Route("/api/v1/databases/{uuid}", h.delete_database, methods=["DELETE"]),
        Route("/2.0/repositories/{workspace}/{slug}", h.get_repository, methods=["GET"]),
        Route("/2.0/repositories/{workspace}/{slug}", h.create_repository, methods=["POST"]),
        Route("/2.0/repositories/{workspace}/{slug}", h.delete_repository, methods=["DELETE"]),
        Route("/v1/text-to-speech/{voice_id}", h.text_to_speech, methods=["POST"]),
        Route("/hooks/{name}", h.hook, methods=["POST"]),
        Route("/_admin/seed", h.admin_seed, methods=["POST"]),
        Route("/_admin/faults", h.admin_add_fault, methods=["POST"]),
        Route("/_admin/faults", h.admin_list_faults, methods=["GET"]),
        Route("/_admin/faults", h.admin_clear_faults, methods=["DELETE"]),
        Route("/_admin/faults/{fault_id}", h.admin_delete_fault, methods=["DELETE"]),
        Route("/_admin/ledger", h.admin_ledger, methods=["GET"]),
        Route("/_admin/git-push", h.admin_git_push, methods=["POST"]),
        Route("/_admin/state", h.admin_state, methods=["GET"]),
        Route("/_admin/notifications", h.admin_notifications, methods=["GET"]),
        Route("/_admin/release", h.admin_release, methods=["POST"]),
        Route("/_admin/reset", h.admin_reset, methods=["POST"]),
        Route("/_admin/health", h.admin_health, methods=["GET"]),
    ]
