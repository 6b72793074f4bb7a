"""The console's "Send signal" form and ``POST /api/runs/ID/signal``, over real HTTP (Hypercorn
on a loopback socket, the real SQLite store, an in-process worker; asyncio and trio).

The form is guarded exactly like cancel and replay (the admin token, the CSRF value, the same
origin), carries a fresh signal id per render (a resubmit is one signal), refuses a payload
that is not JSON in one line and sends nothing then; the signal is journaled with where it
came from and shown on the run's page, its payload redacted.
"""

from __future__ import annotations

import re

import pytest

import durable

from .helpers import poll, running_worker
from .test_console_http import TOKEN, _csrf, console

pytestmark = pytest.mark.anyio

SECRET = "sk-live-0d9c8b7a6f5e"
BEARER = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def waiting_registry(registry: durable.Registry) -> durable.Registry:
    @durable.workflow("t.waits", registry=registry)
    async def waits(ctx: durable.WorkflowContext) -> object:
        return await ctx.wait_for("go")

    return registry


async def _waiting(client: durable.Client, run_id: str, name: str = "go") -> None:
    async def ready() -> bool:
        return (await client.get(run_id)).waiting_for == name
    await poll(ready, timeout=20)


def _signal_id(page: str) -> str:
    match = re.search(r'name="signal_id" maxlength="200" value="([^"]+)"', page)
    assert match, "the signal form carries a signal id"
    return match.group(1)


async def test_the_form_is_refused_without_the_token_or_the_csrf_value(
        client: durable.Client, waiting_registry: durable.Registry) -> None:
    await client.start("t.waits", id="sig-1", delay=3600)
    async with console(client, token=TOKEN) as http:
        page = (await http.get("/runs/sig-1")).text
        assert 'action="/runs/sig-1/signal"' in page
        csrf = _csrf(page)
        form = {"name": "go", "payload": '{"n": 1}', "signal_id": _signal_id(page)}
        for data, headers in [({"csrf": csrf}, {}),                    # no token
                              ({"csrf": csrf, "token": "wrong"}, {}),  # wrong token
                              ({"token": TOKEN}, {}),                  # no CSRF value
                              ({"csrf": "forged", "token": TOKEN}, {}),
                              ({"csrf": csrf, "token": TOKEN}, {"Origin": "http://evil.example"})]:
            refused = await http.post("/runs/sig-1/signal", data=form | data, headers=headers)
            assert refused.status_code == 403, (data, headers)
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            refused = await http.post("/api/runs/sig-1/signal", json={"name": "go"},
                                      headers=headers)
            assert refused.status_code == 403 and "token" in refused.json()["error"]
        assert await client.store.list_signals("sig-1") == []  # nothing was recorded


async def test_read_only_console_has_no_signal_form_and_refuses(
        client: durable.Client, waiting_registry: durable.Registry) -> None:
    await client.start("t.waits", id="sig-2", delay=3600)
    async with console(client) as http:
        page = (await http.get("/runs/sig-2")).text
        assert 'action="/runs/sig-2/signal"' not in page and "read-only" in page
        refused = await http.post("/runs/sig-2/signal",
                                  data={"csrf": http.cookies.get("durable_csrf") or "",
                                        "token": "x", "name": "go"})
        assert refused.status_code == 403 and "read-only" in refused.text
        api = await http.post("/api/runs/sig-2/signal", json={"name": "go"},
                              headers={"Authorization": "Bearer x"})
        assert api.status_code == 403
    assert await client.store.list_signals("sig-2") == []


async def test_a_signal_from_the_form_reaches_the_waiting_workflow(
        client: durable.Client, waiting_registry: durable.Registry) -> None:
    await client.start("t.waits", id="sig-3")
    async with running_worker(client, waiting_registry), console(client, token=TOKEN) as http:
        await _waiting(client, "sig-3")
        page = (await http.get("/runs/sig-3")).text
        assert 'name="name" required maxlength="200" value="go"' in page  # what it waits for
        signal_id = _signal_id(page)
        assert signal_id.startswith("console-")
        form = {"csrf": _csrf(page), "token": TOKEN, "name": "go",
                "payload": f'{{"answer": 42, "auth": "Authorization: Bearer {SECRET}"}}',
                "signal_id": signal_id}
        headers = {"Origin": str(http.base_url).rstrip("/"), "User-Agent": "pytest-operator"}
        sent = await http.post("/runs/sig-3/signal", data=form, headers=headers)
        assert sent.status_code == 303, sent.text
        run = await client.wait("sig-3", timeout=20)
        assert run.state is durable.RunState.COMPLETED, run.error
        assert run.result == {"answer": 42, "auth": f"Authorization: Bearer {SECRET}"}

        [signal] = await client.store.list_signals("sig-3")
        assert signal.name == "go" and signal.signal_id == signal_id
        entry = [e for e in await client.journal("sig-3") if e.kind.value == "signal_sent"][-1]
        assert entry.data["origin"] == {"via": "console", "remote": "127.0.0.1",
                                        "user_agent": "pytest-operator"}
        after = (await http.get(sent.headers["location"])).text
        assert f"sig-3: signal &#x27;go&#x27; sent (id {signal_id})" in after  # the flash
        assert 'data-signal-seq="1"' in after and "received by" in after
        assert "127.0.0.1 (console)" in after
        actions = re.search(r'<section class="attempts">.*?</section>', after, re.S)
        assert actions and "signal &#x27;go&#x27; sent (seq 1, id" in actions.group(0)
        assert "user_agent pytest-operator" in actions.group(0)
        assert 'action="/runs/sig-3/signal"' not in after  # finished: no more form
        api = (await http.get("/api/runs/sig-3")).json()
        assert api["signals"][0]["signal_id"] == signal_id
        for body in (after, (await http.get("/runs/sig-3/live")).text, str(api)):
            assert SECRET not in body and "[redacted]" in body

        again = await http.post("/api/runs/sig-3/signal", json={"name": "go"}, headers=BEARER)
        assert again.status_code == 409 and "already completed" in again.json()["error"]


async def test_a_resubmitted_form_is_one_signal(
        client: durable.Client, waiting_registry: durable.Registry) -> None:
    await client.start("t.waits", id="sig-4", delay=3600)
    async with console(client, token=TOKEN) as http:
        page = (await http.get("/runs/sig-4")).text
        form = {"csrf": _csrf(page), "token": TOKEN, "name": "go", "payload": "[1, 2]",
                "signal_id": _signal_id(page)}
        first = await http.post("/runs/sig-4/signal", data=form)
        second = await http.post("/runs/sig-4/signal", data=form)  # a double click
        assert first.status_code == second.status_code == 303
        shown = (await http.get(second.headers["location"])).text
        assert "already recorded" in shown
        assert shown.count('<tr class="signal"') == 1 and "not received yet" in shown
        signals = await client.store.list_signals("sig-4")
        assert [(s.name, s.payload) for s in signals] == [("go", [1, 2])]
        # another render: another id, so an intended second signal is one more
        fresh = _signal_id((await http.get("/runs/sig-4")).text)
        assert fresh != form["signal_id"]
        assert (await http.post("/runs/sig-4/signal", data=form | {"signal_id": fresh})
                ).status_code == 303
        assert len(await client.store.list_signals("sig-4")) == 2


async def test_a_signal_id_sent_again_with_another_payload_is_refused_409(
        client: durable.Client, waiting_registry: durable.Registry) -> None:
    await client.start("t.waits", id="sig-7", delay=3600)
    async with console(client, token=TOKEN) as http:
        first = await http.post("/api/runs/sig-7/signal", headers=BEARER,
                                json={"name": "go", "payload": [1], "id": "s1"})
        assert first.status_code == 200 and first.json()["recorded"] is True, first.text
        same = await http.post("/api/runs/sig-7/signal", headers=BEARER,
                               json={"name": "go", "payload": [1], "id": "s1"})
        assert same.status_code == 200 and same.json()["recorded"] is False, same.text
        other = await http.post("/api/runs/sig-7/signal", headers=BEARER,
                                json={"name": "go", "payload": [2], "id": "s1"})
        assert other.status_code == 409, other.text
        assert "signal id 's1' of run sig-7 was already used for signal 'go' with payload " \
            "[1] (asked for: 'go' with [2])" in other.json()["error"]
    assert [s.payload for s in await client.store.list_signals("sig-7")] == [[1]]


async def test_a_payload_that_is_not_json_is_refused_and_nothing_is_sent(
        client: durable.Client, waiting_registry: durable.Registry) -> None:
    await client.start("t.waits", id="sig-5", delay=3600)
    async with console(client, token=TOKEN) as http:
        page = (await http.get("/runs/sig-5")).text
        form = {"csrf": _csrf(page), "token": TOKEN, "name": "go",
                "payload": "{'note': 'single quotes'}", "signal_id": _signal_id(page)}
        bad = await http.post("/runs/sig-5/signal", data=form)
        assert bad.status_code == 400
        [line] = re.findall(r'<p class="refused">([^<]*)</p>', bad.text)
        assert line.startswith("the payload is not JSON (") and "nothing was sent" in line
        assert await client.store.list_signals("sig-5") == []
        empty = await http.post("/runs/sig-5/signal", data=form | {"payload": " "})
        assert empty.status_code == 303  # no payload at all is a signal without one
        assert [s.payload for s in await client.store.list_signals("sig-5")] == [None]


async def test_the_api_sends_once_per_id_and_answers_4xx_for_what_it_cannot_send(
        client: durable.Client, waiting_registry: durable.Registry) -> None:
    await client.start("t.waits", id="sig-6")
    async with running_worker(client, waiting_registry), console(client, token=TOKEN) as http:
        await _waiting(client, "sig-6")
        body = {"name": "go", "payload": {"n": 7}, "id": "ticket-7"}
        first = await http.post("/api/runs/sig-6/signal", json=body, headers=BEARER)
        assert first.status_code == 200, first.text
        assert first.json()["recorded"] is True
        second = await http.post("/api/runs/sig-6/signal", json=body, headers=BEARER)
        if second.status_code == 200:  # still queued or running: the id was recorded
            assert second.json()["recorded"] is False
        else:  # the run already received it and completed
            assert second.status_code == 409
        run = await client.wait("sig-6", timeout=20)
        assert run.result == {"n": 7}
        assert len(await client.store.list_signals("sig-6")) == 1
        [entry] = [e for e in await client.journal("sig-6") if e.kind.value == "signal_sent"]
        assert entry.data["origin"]["via"] == "console"

        finished = await http.post("/api/runs/sig-6/signal", json={"name": "go"},
                                   headers=BEARER)
        assert finished.status_code == 409 and "completed" in finished.json()["error"]
        unknown = await http.post("/api/runs/nope/signal", json={"name": "go"},
                                  headers=BEARER)
        assert unknown.status_code == 404 and "nope" in unknown.json()["error"]
    await client.start("t.waits", id="sig-7", delay=3600)
    async with console(client, token=TOKEN) as http:
        for bad in ({}, {"name": 3}, {"name": "go", "id": 5}, {"name": "go", "extra": 1},
                    {"name": " "}):
            refused = await http.post("/api/runs/sig-7/signal", json=bad, headers=BEARER)
            assert refused.status_code == 400, (bad, refused.text)
            assert "\n" not in refused.json()["error"]
        not_json = await http.post("/api/runs/sig-7/signal", content=b"{name: go}",
                                   headers=BEARER)
        assert not_json.status_code == 400
        assert await client.store.list_signals("sig-7") == []
        twice = [await http.post("/api/runs/sig-7/signal", headers=BEARER,
                                 json={"name": "go", "id": "one"}) for _ in range(2)]
        assert [r.json()["recorded"] for r in twice] == [True, False]
        assert len(await client.store.list_signals("sig-7")) == 1
