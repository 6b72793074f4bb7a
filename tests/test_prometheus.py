"""durable.prometheus: the metrics of a worker, served on its event loop and scraped over HTTP."""

from __future__ import annotations

import subprocess
import sys

import anyio
import httpx
import pytest

pytest.importorskip("prometheus_client")

from prometheus_client.parser import text_string_to_metric_families

import durable
from durable import FakeClock
from durable.prometheus import MetricsInterceptor, serve_metrics

from .conftest import ROOT, subprocess_env
from .helpers import died_in_step_one, given_away, poll, running_worker

pytestmark = pytest.mark.anyio


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a metrics page, by (name, sorted labels)."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(page: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str,
          **labels: str) -> float:
    return page.get((name, tuple(sorted(labels.items()))), 0.0)


async def test_recoveries_steps_in_doubt_renewals_and_the_queue_in_process(
        fclient: durable.Client, registry: durable.Registry, clock: FakeClock) -> None:
    @durable.activity(registry=registry)
    async def wipe(ctx: durable.ActivityContext) -> str:
        return "wiped"

    @durable.workflow("wiper", registry=registry)
    async def wiper(ctx: durable.WorkflowContext) -> str:
        return str(await wipe(ctx))

    entered, gate = anyio.Event(), anyio.Event()

    @durable.activity(registry=registry)
    async def hold(ctx: durable.ActivityContext) -> None:
        entered.set()
        await gate.wait()

    @durable.workflow("holder", registry=registry)
    async def holder(ctx: durable.WorkflowContext) -> None:
        await hold(ctx)

    await died_in_step_one(fclient, "wiper", "w", wipe.name)
    clock.advance(31.0)
    await fclient.start("wiper", id="later", delay=600)  # not due: not in the queue depth
    metrics = MetricsInterceptor()
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    async with anyio.create_task_group() as tg:
        await tg.start(serve_metrics, metrics, fclient.store, listener)
        async with httpx.AsyncClient() as http:
            before = samples((await http.get(f"http://127.0.0.1:{port}/metrics")).text)
            async with running_worker(fclient, registry, interceptors=[metrics], lease=30.0,
                                      heartbeat_interval=20.0,
                                      sweep_interval=0.02) as worker:
                # the worker's sweep recovers it (a client's read would too: wait after)
                await poll(lambda: metrics.registry.get_sample_value(
                    "durable_recoveries_total", {"by": "sweep"}) == 1)
                assert (await fclient.wait("w")).result == "wiped"
                await worker.renew_now()  # nothing held: no statement
                await fclient.start("holder", id="h")
                await entered.wait()
                await worker.renew_now()  # one lease renewed
                clock.advance(31.0)  # then the store gives it away: the next one is lost
                [held] = [a for a in worker.active.values() if a.run.id == "h"]
                await poll(lambda: given_away(fclient.store, "h", held.fence.epoch))
                # the sweep may have requeued "h" and this worker claimed it again: that
                # attempt's lease is renewed by the same statement (renew_now takes the
                # attempts held when it is called, before its first await)
                again = sum(1 for a in worker.active.values()
                            if a.run.id == "h" and a is not held and not a.concluding)
                await worker.renew_now()
                gate.set()
            after = samples((await http.get(f"http://127.0.0.1:{port}/metrics")).text)
            missing = await http.get(f"http://127.0.0.1:{port}/other")
            head = await http.head(f"http://127.0.0.1:{port}/metrics")
        tg.cancel_scope.cancel()
    assert missing.status_code == 404 and head.status_code == 200 and head.content == b""
    assert value(before, "durable_queue_depth", workflow="wiper") == 0  # running, not queued
    assert value(before, "durable_recoveries_total", by="sweep") == 0
    assert value(after, "durable_recoveries_total", by="sweep") >= 1  # "h" may be one too
    assert value(after, "durable_steps_in_doubt_total", workflow="wiper",
                 activity=wipe.name) == 1
    assert value(after, "durable_runs_started_total", workflow="wiper") == 0  # attempt 2
    assert value(after, "durable_attempts_started_total", workflow="wiper") == 1
    assert value(after, "durable_queue_depth", workflow="wiper") == 0
    assert value(after, "durable_lease_renewals_total") == 1 + again
    assert value(after, "durable_lease_renewal_duration_seconds_count") == 2
    assert value(after, "durable_lease_losses_total", workflow="holder") == 1
    assert value(after, "durable_attempts_ended_total", workflow="holder",
                 outcome="abandoned") == 1


def test_the_module_without_prometheus_client_names_the_extra() -> None:
    code = ("import sys\n"
            "sys.modules['prometheus_client'] = None\n"
            "import durable\n"
            "try:\n"
            "    import durable.prometheus\n"
            "except ImportError as exc:\n"
            "    print(exc)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=subprocess_env(),
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "durable-fenced[prometheus]" in out.stdout and out.stdout.count("\n") == 1


async def test_a_scrape_that_names_another_host_on_loopback_is_refused() -> None:
    """DNS rebinding, as for the console (docs/console.md): another site's name that
    resolves to 127.0.0.1 gets a 403 and no metric (workflow names, queue depths); an
    address or ``localhost`` is served. Before, every name was served."""
    metrics = MetricsInterceptor()
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    async with anyio.create_task_group() as tg:
        await tg.start(serve_metrics, metrics, None, listener)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
            refused = await http.get("/metrics", headers={"Host": f"rebind.example:{port}"})
            assert refused.status_code == 403, refused.text
            assert "DNS rebinding" in refused.text and "durable_" not in refused.text
            for host in (f"127.0.0.1:{port}", f"localhost:{port}", "[::1]"):
                served = await http.get("/metrics", headers={"Host": host})
                assert served.status_code == 200 and "durable_" in served.text, host
        tg.cancel_scope.cancel()
