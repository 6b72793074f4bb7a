"""The console's plan and its Approve / Reject buttons, over real HTTP (Hypercorn on a loopback
socket, the real SQLite store, an in-process worker; asyncio and trio).

A run waiting for approval shows its journaled plan and two POST forms that need the admin
token and the CSRF value, exactly like cancel and replay; after the approval the page says
who approved (the signal's origin, journaled).
"""

from __future__ import annotations

import pytest

import durable

from .helpers import poll, running_worker
from .test_console_http import TOKEN, _csrf, console

pytestmark = pytest.mark.anyio


@pytest.fixture
def gated_registry(registry: durable.Registry) -> durable.Registry:
    @durable.activity("t.plan", registry=registry)
    async def plan(ctx: durable.ActivityContext, what: str) -> dict[str, object]:
        return {"title": f"This run will delete {what}:",
                "items": [{"action": "delete", "kind": "database", "id": what,
                           "detail": "postgres, 3 GB"}]}

    @durable.activity("t.delete", registry=registry)
    async def delete(ctx: durable.ActivityContext, what: str) -> str:
        ctx.annotate(f"deleted {what}")
        return what

    @durable.workflow("t.approved", registry=registry)
    async def approved(ctx: durable.WorkflowContext, what: str) -> str:
        await durable.approval_gate(ctx, plan, what)
        return str(await ctx.step(delete, what))

    return registry


async def _waiting(client: durable.Client, run_id: str) -> None:
    async def ready() -> bool:
        return (await client.get(run_id)).waiting_for == "approve"
    await poll(ready, timeout=20)


async def test_approve_needs_the_token_and_the_csrf_value_and_shows_who_approved(
        client: durable.Client, gated_registry: durable.Registry) -> None:
    await client.start("t.approved", "db-42", id="gate-1")
    async with running_worker(client, gated_registry), console(client, token=TOKEN) as http:
        await _waiting(client, "gate-1")
        page = (await http.get("/runs/gate-1")).text
        assert "This run will delete db-42:" in page and "postgres, 3 GB" in page
        assert 'data-decision="waiting"' in page
        assert 'action="/runs/gate-1/approve"' in page
        assert 'action="/runs/gate-1/reject"' in page
        csrf = _csrf(page)
        for data, headers in [({"csrf": csrf}, {}),                    # no token
                              ({"csrf": csrf, "token": "wrong"}, {}),  # wrong token
                              ({"token": TOKEN}, {}),                  # no CSRF value
                              ({"csrf": "forged", "token": TOKEN}, {}),
                              ({"csrf": csrf, "token": TOKEN}, {"Origin": "http://evil.example"})]:
            refused = await http.post("/runs/gate-1/approve", data=data, headers=headers)
            assert refused.status_code == 403, (data, headers)
        refused = await http.post("/api/runs/gate-1/approve", json={})  # no bearer token
        assert refused.status_code == 403
        assert await client.store.list_signals("gate-1") == []  # nothing was sent
        assert (await client.get("gate-1")).waiting_for == "approve"

        done = await http.post("/runs/gate-1/approve",
                               data={"csrf": csrf, "token": TOKEN, "note": "looks right"},
                               headers={"Origin": str(http.base_url).rstrip("/"),
                                        "User-Agent": "pytest-operator"})
        assert done.status_code == 303, done.text
        run = await client.wait("gate-1", timeout=20)
        assert run.state is durable.RunState.COMPLETED, run.error
        assert run.result == "db-42"

        after = (await http.get("/runs/gate-1")).text
        assert 'data-decision="approved"' in after
        assert '<b class="approved-by">127.0.0.1 (console)</b>' in after
        assert "looks right" in after
        assert 'action="/runs/gate-1/approve"' not in after  # decided: no more buttons
        again = await http.post("/api/runs/gate-1/approve", json={},
                                headers={"Authorization": f"Bearer {TOKEN}"})
        assert again.status_code == 409
        api = (await http.get("/api/runs/gate-1")).json()
        assert api["approval"]["decision"] == "approved"
        assert api["approval"]["origin"]["via"] == "console"
        assert api["approval"]["origin"]["user_agent"] == "pytest-operator"


async def test_reject_from_the_api_cancels_the_run_and_nothing_is_done(
        client: durable.Client, gated_registry: durable.Registry) -> None:
    await client.start("t.approved", "db-43", id="gate-2")
    async with running_worker(client, gated_registry), console(client, token=TOKEN) as http:
        await _waiting(client, "gate-2")
        rejected = await http.post("/api/runs/gate-2/reject", json={"reason": "not this one"},
                                   headers={"Authorization": f"Bearer {TOKEN}"})
        assert rejected.status_code == 200, rejected.text
        run = await client.wait("gate-2", timeout=20)
    assert run.state is durable.RunState.CANCELLED
    assert not [e for e in await client.journal("gate-2") if e.name == "t.delete"]
    async with console(client, token=TOKEN) as http:
        page = (await http.get("/runs/gate-2")).text
    assert 'data-decision="rejected"' in page and "not this one" in page


async def test_a_run_without_a_plan_has_no_approve_action(
        client: durable.Client, gated_registry: durable.Registry) -> None:
    await client.start("t.approved", "db-44", id="gate-3", delay=3600)  # no plan yet
    async with console(client, token=TOKEN) as http:
        page = (await http.get("/runs/gate-3")).text
        assert 'action="/runs/gate-3/approve"' not in page
        refused = await http.post("/api/runs/gate-3/approve", json={},
                                  headers={"Authorization": f"Bearer {TOKEN}"})
        assert refused.status_code == 409 and "no plan" in refused.json()["error"]
