"""What an operator is told to look for at the service for a step in doubt: the request the
try in doubt actually sent (its ``Idempotency-Key``, fencing token and scope), as a real
loopback server received it, in ``show`` (a subprocess), the recovery report and the console
(over HTTP). A replay ``--from-step`` that re-runs a completed step changes the key it sends
(``~1``): the help must name that key, not the step's first one."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

import durable
from durable import RunState
from durable._report import RecoveryReport

from .helpers import durable_output, running_worker
from .httpserver import Rule, loopback_server
from .test_console_http import console

pytestmark = pytest.mark.anyio


async def test_a_rerun_step_in_doubt_names_the_key_its_try_sent(tmp_path: Path) -> None:
    db_url = f"sqlite:///{tmp_path / 'doubt.db'}"
    registry = durable.Registry()
    async with loopback_server() as server:
        server.on("/delete", Rule(times=1))  # the first delete is answered; the rerun hangs
        server.on("/delete", Rule(hang=True))

        @durable.activity("vol.delete", registry=registry, on_doubt="fail")
        async def delete(ctx: durable.ActivityContext) -> str:
            (await ctx.http.post(f"{server.url}/delete")).raise_for_status()
            return "deleted"

        @durable.activity("vol.check", registry=registry, retry=durable.RetryPolicy(max_tries=1))
        async def check(ctx: durable.ActivityContext) -> None:
            raise RuntimeError("check failed")

        @durable.workflow("vol", registry=registry)
        async def vol(ctx: durable.WorkflowContext) -> None:
            await delete(ctx)
            await check(ctx)

        async with durable.Client.connect(db_url, registry=registry) as client:
            async with running_worker(client, registry):
                await client.start("vol", id="v-1", key="vol é 1")
                assert (await client.wait("v-1")).state is RunState.FAILED
            await client.replay("v-1", from_step=1)  # step 1 completed: it runs again
            async with running_worker(client, registry) as worker:
                await server.wait_for(lambda: len(server.seen("/delete")) == 2)
                worker.shutdown(grace=0)  # the rerun's request is in flight: in doubt
            async with running_worker(client, registry):
                failed = await client.wait("v-1")
            assert failed.state is RunState.FAILED
            first, sent = server.seen("/delete")
            key = sent.headers["idempotency-key"]
            token = sent.headers["durable-fencing-token"]
            scope = sent.headers["durable-fencing-scope"]
            assert key == "v-1/1~1" != first.headers["idempotency-key"]
            named = f"idempotency key {key}, fencing token {token}, scope {scope}"

            shown = await anyio.to_thread.run_sync(lambda: durable_output(db_url, "show", "v-1"))
            assert named in " ".join(shown.split()), shown
            report = RecoveryReport.build(failed, await client.journal("v-1"))
            assert named in report.text()
            async with console(client) as http:
                page = (await http.get("/runs/v-1")).text
            assert (f"idempotency key <code>{key}</code> (fencing token {token}, scope "
                    f"<code>{scope}</code>)") in page, page
