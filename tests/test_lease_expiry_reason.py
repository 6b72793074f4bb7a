"""Why an attempt says its lease expired locally: ``attempt_abandoned`` said "renewals
failed" even when none had (a worker frozen with SIGSTOP past its lease and thawed, a
renewal that hung). It now says what the worker knows: renewals that failed since the last
that held, or none that failed. A real worker and SQLite file; the renewals fail or hang
through the worker's own renew interceptor (asyncio and trio)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio
import pytest

import durable
import durable.testing
from durable._interceptors import Interceptor, RenewInfo
from durable._types import Renewal

from .helpers import poll, running_worker

pytestmark = pytest.mark.anyio


class Renewals(Interceptor):
    def __init__(self, fail: bool) -> None:
        self.fail = fail

    async def intercept_renew(self, info: RenewInfo,
                              call_next: Callable[[], Awaitable[list[Renewal]]]
                              ) -> list[Renewal]:
        if self.fail:
            raise durable.StoreUnavailableError("the renewal failed (test)")
        await anyio.sleep_forever()  # sent, never answered: nothing failed
        raise AssertionError  # pragma: no cover


@pytest.mark.parametrize(("fail", "said"), [
    (True, "lease expired locally (renewals failed: "),
    (False, "lease expired locally: no renewal succeeded in time and none failed")])
async def test_the_reason_says_whether_renewals_failed(
        client: durable.Client, registry: durable.Registry, fail: bool, said: str) -> None:
    @durable.activity("t.blocks", registry=registry)
    async def blocks(ctx: durable.ActivityContext) -> None:
        await anyio.sleep_forever()

    @durable.workflow("t.holds", registry=registry)
    async def holds(ctx: durable.WorkflowContext) -> None:
        await blocks(ctx)

    with durable.testing.capture_logs() as logs:
        async with running_worker(client, registry, lease=1.0,
                                  interceptors=[Renewals(fail)]):
            await client.start("t.holds", id="r1")
            await poll(lambda: any(e["event"] == "attempt_abandoned" for e in logs),
                       timeout=20)
    [abandoned] = [e for e in logs if e["event"] == "attempt_abandoned"]
    assert str(abandoned["reason"]).startswith(said), abandoned
