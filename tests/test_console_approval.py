"""The console's plan and its Approve / Reject buttons, over real HTTP (Hypercorn on a loopback
socket, the real SQLite store, an in-process worker; asyncio and trio).

A run waiting for approval shows its journaled plan and two POST forms that need the admin
token and the CSRF value, exactly like cancel and replay; after the approval the page says
who approved (the signal's origin, journaled).
"""

from __future__ import annotations

import anyio
import httpx
import pytest

import durable
from durable._types import Signal

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


@pytest.mark.parametrize("notes", [("go", "go"), ("go", "wait for the backup")])
async def test_two_approve_clicks_at_once_are_one_decision(
        client: durable.Client, gated_registry: durable.Registry,
        notes: tuple[str, str]) -> None:
    """Two approvals of the same plan sent at once from the console (a double click, two
    tabs) both find the plan waiting; the console's decision id makes them one signal, so
    no spare approval is left behind for a plan asked again later. With another note, the
    second is refused as already decided (409, the first's sender named), not as a clash
    of signal ids (before the ids were checked: "plan approved", its note dropped)."""
    await client.start("t.approved", "db-44", id="gate-4")
    async with running_worker(client, gated_registry):
        await _waiting(client, "gate-4")
    store = client.store
    read_signals = store.list_signals
    arrived: list[str] = []
    both = anyio.Event()

    async def list_signals(run_id: str) -> list[Signal]:
        found = await read_signals(run_id)
        arrived.append(run_id)
        if len(arrived) == 2:
            both.set()
        with anyio.fail_after(10):
            await both.wait()  # each has seen the plan waiting before either sends
        return found

    answers: list[tuple[str, httpx.Response]] = []
    async with console(client, token=TOKEN) as http:
        async def approve(note: str) -> None:
            answers.append((note, await http.post(
                "/api/runs/gate-4/approve", json={"note": note},
                headers={"Authorization": f"Bearer {TOKEN}"})))

        store.list_signals = list_signals  # type: ignore[method-assign]
        try:
            async with anyio.create_task_group() as tg:
                for note in notes:
                    tg.start_soon(approve, note)
        finally:
            del store.list_signals  # type: ignore[method-assign]
    assert arrived[:2] == ["gate-4", "gate-4"]  # (then the re-send's look at its id)
    approvals = [s for s in await store.list_signals("gate-4") if s.name == "approve"]
    assert len(approvals) == 1 and approvals[0].signal_id.startswith("console-approve-")
    codes = {(note == approvals[0].payload["note"], answer.status_code)
             for note, answer in answers}
    assert codes == ({(True, 200)} if notes[0] == notes[1] else {(True, 200), (False, 409)})
    if notes[0] == notes[1]:
        return
    [refused] = [answer for _, answer in answers if answer.status_code == 409]
    assert refused.json()["error"] == "gate-4: its plan was already approved by 127.0.0.1 " \
        "(console)", refused.text


async def test_a_rejected_plan_is_replayed_from_the_console_by_planning_again(
        client: durable.Client, gated_registry: durable.Registry) -> None:
    """A rejected run can be replayed only from its plan step (a replay that keeps the
    rejected plan would wait for ever). Its page offers exactly that: a replay form whose
    steps stop at the plan step, chosen, and which says why; a replay that keeps the plan
    (the API, or a stale page) is refused in the console's words, not the command line's
    (before: the form was hidden, and the refusal named `--from-step`). From the plan step
    the run plans again and waits for a new decision."""
    await client.start("t.approved", "db-44", id="gate-4")
    async with running_worker(client, gated_registry), console(client, token=TOKEN) as http:
        await _waiting(client, "gate-4")
        auth = {"Authorization": f"Bearer {TOKEN}"}
        rejected = await http.post("/api/runs/gate-4/reject", json={"reason": "wrong db"},
                                   headers=auth)
        assert rejected.status_code == 200, rejected.text
        await client.wait("gate-4", timeout=20)
        [plan_step] = [e.step for e in await client.journal("gate-4")
                       if e.name == "t.plan" and e.kind is durable.EntryKind.STEP_COMPLETED]
        page = (await http.get("/runs/gate-4")).text
        assert 'action="/runs/gate-4/replay"' in page
        form = page[page.index('action="/runs/gate-4/replay"'):]
        form = form[:form.index("</form>")]
        assert "was rejected by 127.0.0.1 (console); a replay that keeps that plan would " \
               "wait for an approval that can no longer be given: a replay plans again " \
               f"from step {plan_step} (or an earlier one) and asks anew." in form
        assert f'<option value="{plan_step}" selected>' in form
        assert "the first step without a result" not in form
        assert [int(v) for v in _options(form)] == list(range(1, plan_step + 1))

        before = await client.journal("gate-4")
        kept = await http.post("/api/runs/gate-4/replay", json={}, headers=auth)
        assert kept.status_code == 409
        said = kept.json()["error"]
        assert said.endswith(f"replay it from step {plan_step} (its plan step) or an earlier "
                             "one to plan again and ask anew"), said
        assert "--from-step" not in said
        assert await client.journal("gate-4") == before  # nothing written

        replayed = await http.post("/runs/gate-4/replay",
                                   data={"csrf": _csrf(page), "token": TOKEN,
                                         "from_step": str(plan_step)})
        assert replayed.status_code == 303, replayed.text
        await _waiting(client, "gate-4")
    plans = [e for e in await client.journal("gate-4")
             if e.name == "t.plan" and e.kind is durable.EntryKind.STEP_COMPLETED]
    assert len(plans) == 2  # it planned again, and waits for a decision on the new plan


def _options(form: str) -> list[str]:
    """The values of a form's ``<option>`` elements, in order."""
    import re

    return re.findall(r'<option value="([^"]*)"', form)


async def test_a_plan_made_again_by_a_replay_is_approved_from_the_console(
        client: durable.Client, registry: durable.Registry) -> None:
    """Approved, then failed after its approval, replayed from its plan step: the new plan
    waits for a new decision, and the console's approve of it goes through. With one
    decision id per run (``console-approve``), it was refused as a reuse of the first."""
    failures = ["once"]

    @durable.activity("t.plan2", registry=registry)
    async def plan(ctx: durable.ActivityContext, what: str) -> dict[str, object]:
        return {"title": f"delete {what}", "items": [{"action": "delete", "id": what}]}

    @durable.activity("t.delete2", registry=registry)
    async def delete(ctx: durable.ActivityContext, what: str) -> str:
        if failures:
            failures.pop()
            raise durable.NonRetryableError("the service said no")
        return what

    @durable.workflow("t.approved2", registry=registry)
    async def approved(ctx: durable.WorkflowContext, what: str) -> str:
        await durable.approval_gate(ctx, plan, what)
        return str(await ctx.step(delete, what))

    auth = {"Authorization": f"Bearer {TOKEN}"}
    await client.start("t.approved2", "db-45", id="gate-5")
    async with running_worker(client, registry), console(client, token=TOKEN) as http:
        await _waiting(client, "gate-5")
        first = await http.post("/api/runs/gate-5/approve", json={}, headers=auth)
        assert first.status_code == 200, first.text
        assert (await client.wait("gate-5", timeout=20)).state is durable.RunState.FAILED
        [plan_step] = [e.step for e in await client.journal("gate-5")
                       if e.name == "t.plan2" and e.kind is durable.EntryKind.STEP_COMPLETED]
        await client.replay("gate-5", from_step=plan_step)
        await _waiting(client, "gate-5")
        again = await http.post("/api/runs/gate-5/approve", json={}, headers=auth)
        assert again.status_code == 200, again.text
        done = await client.wait("gate-5", timeout=20)
    assert done.state is durable.RunState.COMPLETED, done.error
    assert done.result == "db-45"
