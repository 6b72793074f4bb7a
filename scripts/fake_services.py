#!/usr/bin/env python3
"""Fake external services on one loopback HTTP server, for tests and the demo.

Four services, each shaped after a real API, plus an admin surface:

* PaaS (after the Coolify v4 REST API), under ``/api/v1``::

      GET    /api/v1/applications/{uuid}                     200 app JSON / 404
      DELETE /api/v1/applications/{uuid}                     200 / 404
             ?delete_configurations=&delete_volumes=&docker_cleanup=&delete_connected_networks=
             (all default true, as in Coolify; with delete_volumes=false the app's
             persistent storages survive as "orphaned_volumes" in /_admin/state)
      GET    /api/v1/applications/{uuid}/envs                200 [env, ...] / 404
      DELETE /api/v1/applications/{uuid}/envs/{env_uuid}     200 / 404
      GET    /api/v1/applications/{uuid}/storages            200 {"persistent_storages": [...],
                                                                  "file_storages": [...]} / 404
      DELETE /api/v1/applications/{uuid}/storages/{storage_uuid}   200 / 404
      GET    /api/v1/databases/{uuid}                        200 / 404
      DELETE /api/v1/databases/{uuid}                        200 / 404 (same query flags)

  Coolify answers deletes with 200 ``{"message": ...}`` and queues the work; here the
  deletion is immediate. Errors are ``{"message": ...}`` like Coolify's.

* Git host (after Bitbucket Cloud 2.0)::

      GET    /2.0/repositories/{workspace}/{slug}   200 repo JSON / 404
      POST   /2.0/repositories/{workspace}/{slug}   200 repo JSON / 409 already exists
      DELETE /2.0/repositories/{workspace}/{slug}   204 / 404

  As on Bitbucket, GET and DELETE also take the repository's uuid in braces in place of
  the slug (``/2.0/repositories/slots/{1b2c...}``): it names that one repository, so a
  repository created again under the same slug answers 404 there.

  Every repository is a real bare repository at ``GIT_ROOT/workspace/slug.git``; its
  ``links.clone`` list holds ``{"name": "file", "href": "<absolute path>"}``, usable by
  ``git clone`` and ``git push``. Its pre-receive hook fences pushes: a push whose
  environment carries ``DURABLE_FENCING_TOKEN`` (with ``DURABLE_FENCING_SCOPE`` and
  ``DURABLE_IDEMPOTENCY_KEY``: what durable's git steps set) is reported to
  ``POST /_admin/git-push``, recorded in the ledger as ``PUSH /git/<ws>/<slug>/<ref>`` and
  refused (the hook declines, saying "stale fencing token") like an API request with a
  stale token; other pushes pass. (Bitbucket answers an existing slug with 400; this fake
  uses 409 so that "already exists" cannot be confused with a malformed request.)
  Errors are ``{"type": "error", "error": {"message": ...}}``.

* Text to speech (after ElevenLabs): ``POST /v1/text-to-speech/{voice_id}`` with JSON
  ``{"text": ..., "model_id": ...}`` answers ``audio/mpeg`` bytes derived from voice and
  text. Every call is billed, except that a request whose ``Idempotency-Key`` was already
  served gets the same bytes back with ``Idempotent-Replayed: true`` and is not billed
  again (a reused key with a different request is 422). Real ElevenLabs has no idempotency
  keys: this is the behaviour of a well-behaved paid API.

* Notifier: ``POST /hooks/{name}`` with any JSON body stores the message (no dedupe, like a
  chat webhook: a double send shows up twice); ``GET /_admin/notifications`` lists them.

Every API request needs ``Authorization: Bearer <token>`` (else 401) and is recorded in the
ledger. A request may carry ``Idempotency-Key``, ``Durable-Fencing-Token`` (an integer) and
``Durable-Fencing-Scope`` (where the token is compared: durable sends ``key:<concurrency
key>``, or ``run:<id>`` for a run without a key; see docs/design.md). The highest token
seen is kept per scope, whatever resource a request touches, and a request with a lower
one in the same scope is refused with 409 ``{"error": "stale fencing token"}``: a
superseded attempt is refused everywhere, and runs of different scopes (two slots' resets
sharing the template repository and the hook) never fence each other. A token without a
scope is compared per resource (``app:<uuid>``, ``db:<uuid>``, ``repo:<ws>/<slug>``,
``tts:<voice>[:<key>]``, ``hook:<name>``).

Faults act like a misbehaving proxy in front of the services: phase ``before`` hits the
request before the service sees it, phase ``after`` lets the service act (delete, bill)
and then mangles the answer -- the ambiguous outcomes a durable engine must survive.

Admin (no auth): ``POST /_admin/seed``, ``POST|GET|DELETE /_admin/faults``,
``DELETE /_admin/faults/{id}``, ``GET /_admin/ledger``, ``GET /_admin/state``,
``GET /_admin/notifications``, ``POST /_admin/release`` (drop the requests held by ``hang``
faults), ``POST /_admin/reset``, ``GET /_admin/health``, ``POST /_admin/git-push`` (the
repositories' hooks).

Run: ``python scripts/fake_services.py --port 0 --git-root DIR --ready-file FILE``. The
token comes from ``--token``, else ``$FAKE_SERVICES_TOKEN``, else ``test-token``; it is
never logged. SIGTERM shuts down cleanly with exit status 0.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
from pathlib import Path
from types import FrameType

import uvicorn
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.types import Receive, Scope, Send

if __package__:  # imported as scripts.fake_services
    from ._fakes.front import Front
    from ._fakes.handlers import routes
    from ._fakes.state import ServiceState
else:  # run as a script: its directory is on sys.path
    from _fakes.front import Front
    from _fakes.handlers import routes
    from _fakes.state import ServiceState

DEFAULT_TOKEN = "test-token"
TOKEN_ENV = "FAKE_SERVICES_TOKEN"


# ---------------------------------------------------------------------------- app


class FakeServicesApp(Starlette):
    """The Starlette app; it hands the connection's transport to the drop fault."""

    fake_state: ServiceState

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # uvicorn's h11 ``send`` is a bound method of the request cycle, which holds the
        # transport: the only way for an ASGI app to drop a connection without a response.
        transport = getattr(getattr(send, "__self__", None), "transport", None)
        scope["fake.transport"] = transport
        sock = None if transport is None else transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            # Without it, Nagle and the client's delayed ACK add 40 ms to every request.
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        await super().__call__(scope, receive, send)


def create_app(git_root: Path, *, token: str = DEFAULT_TOKEN) -> Starlette:
    state = ServiceState(git_root.resolve(), token)
    app = FakeServicesApp(routes=routes(state), middleware=[Middleware(Front, state=state)])
    app.fake_state = state
    return app


# ---------------------------------------------------------------------------- CLI


class _Server(uvicorn.Server):
    def __init__(
        self, config: uvicorn.Config, state: ServiceState, url: str, ready_file: Path | None
    ) -> None:
        super().__init__(config)
        self._state, self._url, self._ready_file = state, url, ready_file

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        if self.started and self._ready_file is not None:
            tmp = self._ready_file.with_name(self._ready_file.name + ".tmp")
            tmp.write_text(json.dumps({"url": self._url, "pid": os.getpid()}))
            os.replace(tmp, self._ready_file)  # readers never see a partial file

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self._state.release_all()  # hanging requests would hold up the shutdown
        await super().shutdown(sockets=sockets)


def _exit_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--git-root", type=Path, required=True)
    parser.add_argument("--ready-file", type=Path)
    parser.add_argument("--token", help=f"default: ${TOKEN_ENV} or {DEFAULT_TOKEN!r}")
    parser.add_argument("--log-level", default="warning")
    args = parser.parse_args(argv)
    token = args.token or os.environ.get(TOKEN_ENV) or DEFAULT_TOKEN
    args.git_root.mkdir(parents=True, exist_ok=True)

    # uvicorn re-raises a captured SIGTERM after its graceful shutdown; this turns it
    # (and one arriving before or after serving) into a clean exit.
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", args.port))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    app = create_app(args.git_root, token=token)
    config = uvicorn.Config(
        app,
        http="h11",
        ws="none",
        lifespan="off",
        log_level=args.log_level,
        access_log=False,
        proxy_headers=False,
        server_header=False,
        timeout_graceful_shutdown=2,
    )
    assert isinstance(app, FakeServicesApp)
    app.fake_state.url = url  # the repositories' hooks report pushes here
    server = _Server(config, app.fake_state, url, args.ready_file)
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
