"""The operations' git steps against a git host over git's smart HTTP protocol (the real
``git http-backend``, ``tests/githttp.py``): what each of git's requests carries."""

from __future__ import annotations

from pathlib import Path

import pytest

import durable
from activities import steps
from durable import RunState

from .githttp import commit, git, git_http_server
from .helpers import running_worker

pytestmark = pytest.mark.anyio


async def test_every_request_of_a_force_push_carries_the_steps_fencing_token(
        client: durable.Client, registry: durable.Registry, tmp_path: Path) -> None:
    """git does not go through ``ctx.http``, yet its requests are the step's as much as any:
    the clone of the template, the remote's refs and the push each carry the attempt's
    fencing token and scope and the step's idempotency key (``ctx.fencing_headers``, as
    ``http.extraHeader``), so a git host or proxy that compares tokens can refuse a stale
    attempt's push as a service refuses its DELETE."""
    with git_http_server(tmp_path / "host") as host:
        template_url = host.repository("templates/starter.git")
        slot_url = host.repository("slots/slot-1.git")
        work = tmp_path / "work"
        commit(work, {"README": "slot content\n"}, "slot")
        git("push", "--quiet", slot_url, "HEAD:refs/heads/main", cwd=work)
        template_sha = commit(work, {"README": "template\n"}, "template")
        git("push", "--quiet", template_url, "HEAD:refs/heads/main", cwd=work)
        template = {"clone_url": template_url, "branch": "main",
                    "full_name": "templates/starter"}
        slot = {"clone_url": slot_url, "branch": "main", "full_name": "slots/slot-1"}
        before = len(host.requests)

        @durable.workflow("git.reset", registry=registry)
        async def reset(ctx: durable.WorkflowContext) -> str:
            expected = await steps.remote_head(ctx, slot)
            pushed = await steps.force_push(ctx, template, template_sha, slot, expected)
            return str(pushed["sha"])

        async with running_worker(client, registry):
            await client.start(reset, id="reset-1", key="slot-1")
            run = await client.wait("reset-1", timeout=30)
        assert (run.state, run.result) == (RunState.COMPLETED, template_sha), run.error
        assert git("rev-parse", "main", cwd=tmp_path / "host" / "slots" / "slot-1.git") \
            == template_sha
        journal = await client.journal("reset-1")
        keys = {entry.name: f"reset-1/{entry.step_key}" for entry in journal
                if entry.name in ("git.remote_head", "git.force_push_with_lease")}
        sent = [(method, target.split("?")[0], headers)
                for method, target, headers in host.requests[before:]]
    # ls-remote of the slot, then the clone of the template and the push to the slot
    paths = [(method, target) for method, target, _ in sent]
    pushing = paths.index(("GET", "/templates/starter.git/info/refs"))
    assert set(paths[:pushing]) == {("GET", "/slots/slot-1.git/info/refs"),
                                    ("POST", "/slots/slot-1.git/git-upload-pack")}, paths
    assert paths[-1] == ("POST", "/slots/slot-1.git/git-receive-pack"), paths
    for i, (_, _, headers) in enumerate(sent):
        step = "git.remote_head" if i < pushing else "git.force_push_with_lease"
        assert (headers.get("durable-fencing-token"), headers.get("durable-fencing-scope"),
                headers.get("idempotency-key")) == (str(run.epoch), "key:slot-1", keys[step])
