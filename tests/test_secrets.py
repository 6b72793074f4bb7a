"""Secrets never reach the journal or the logs."""

from __future__ import annotations

import json

import pytest

import durable
import durable.testing
from durable._logging import redact

from .helpers import running_worker
from .httpserver import Rule, loopback_server

pytestmark = pytest.mark.anyio
TOKEN = "s3cr3t-t0ken-value"


async def test_tokens_stay_out_of_journal_and_logs(client: durable.Client,
                                                   registry: durable.Registry) -> None:
    async with loopback_server() as server:
        server.on("/api", Rule(status=500))

        @durable.activity(registry=registry, retry=durable.RetryPolicy(max_tries=1))
        async def call(ctx: durable.ActivityContext) -> None:
            response = await ctx.http.get(f"{server.url}/api?token={TOKEN}",
                                          headers={"Authorization": f"Bearer {TOKEN}"})
            if response.status_code >= 500:
                raise RuntimeError(
                    f"server failed for Authorization: Bearer {TOKEN} at {response.url}")

        @durable.workflow("secretive", registry=registry)
        async def secretive(ctx: durable.WorkflowContext) -> None:
            await call(ctx)

        with durable.testing.capture_logs() as logs:
            async with running_worker(client, registry):
                await client.start("secretive", id="s")
                done = await client.wait("s")
        [seen] = server.seen("/api")
    assert seen.headers["authorization"] == f"Bearer {TOKEN}"  # it was really sent
    assert done.state is durable.RunState.FAILED
    journal = json.dumps([e.data for e in await client.journal("s")])
    assert TOKEN not in journal and TOKEN not in (done.error or "")
    assert "[redacted]" in (done.error or "")
    assert TOKEN not in json.dumps(logs, default=str)


def test_redact_patterns() -> None:
    assert "abc123" not in redact("Authorization: Bearer abc123")
    assert "pw" not in redact("postgresql://user:pw@host/db")
    assert "k3y" not in redact("https://x/y?api_key=k3y&z=1")
    assert redact("nothing secret here") == "nothing secret here"
