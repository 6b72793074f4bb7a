"""Workflows for the multi-process PostgreSQL tests (default registry), and a worker runner.

``pg.three`` runs three quick activities. Each appends one line ``run step epoch pid`` to a
file of its own process (``effects-<pid>.log`` in the directory given as the workflow's
argument), with one ``write`` on an ``O_APPEND`` descriptor, so a SIGKILL never leaves half
a line and the test can count every real execution of every step across processes.

``pg.call`` makes one HTTP GET through the attempt's fenced client (``ctx.http``).

``python -m tests.pgflows --db URL [--lease S] [--heartbeat S]`` runs a worker with a
heartbeat interval of the test's choosing (the ``durable.worker`` command derives it from
the lease), so a test can tell a cancel delivered by NOTIFY from one found by a renewal.
"""

from __future__ import annotations

import argparse
import os

import anyio

import durable


def _record(ctx: durable.ActivityContext, out_dir: str) -> None:
    line = f"{ctx.workflow_id} {ctx.step} {ctx.fencing_token} {os.getpid()}\n".encode()
    path = os.path.join(out_dir, f"effects-{os.getpid()}.log")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


# All three are idempotent (on_doubt="retry"): a step in flight when its worker died runs
# again on the next attempt, so every run completes.
@durable.activity("pg.reserve", on_doubt="retry")
async def reserve(ctx: durable.ActivityContext, out_dir: str) -> str:
    _record(ctx, out_dir)
    return "reserved"


@durable.activity("pg.charge", on_doubt="retry")
async def charge(ctx: durable.ActivityContext, out_dir: str) -> str:
    _record(ctx, out_dir)
    return "charged"


@durable.activity("pg.confirm", on_doubt="retry")
async def confirm(ctx: durable.ActivityContext, out_dir: str) -> str:
    _record(ctx, out_dir)
    return "confirmed"


@durable.workflow("pg.three")
async def three(ctx: durable.WorkflowContext, out_dir: str) -> list[str]:
    return [await reserve(ctx, out_dir), await charge(ctx, out_dir),
            await confirm(ctx, out_dir)]


@durable.activity("pg.get", on_doubt="fail")
async def get(ctx: durable.ActivityContext, url: str) -> int:
    response = await ctx.http.get(url)
    return response.status_code


@durable.workflow("pg.call")
async def call(ctx: durable.WorkflowContext, url: str) -> int:
    return int(await get(ctx, url))


@durable.workflow("pg.nap")
async def nap(ctx: durable.WorkflowContext, out_dir: str, seconds: float) -> str:
    """A durable sleep, then a step: with a wait threshold below ``seconds`` the attempt
    releases the run, due again ``seconds`` later."""
    await ctx.sleep(seconds)
    return str(await reserve(ctx, out_dir))


@durable.activity("pg.flaky", retry=durable.RetryPolicy(max_tries=2, initial_delay=0.4,
                                                        jitter=0.0))
async def flaky(ctx: durable.ActivityContext, out_dir: str) -> str:
    """Fails its first try: the retry is due 0.4 s later (released, with a lower wait
    threshold)."""
    _record(ctx, out_dir)
    if ctx.try_number == 1:
        raise RuntimeError("the first try fails")
    return "retried"


@durable.workflow("pg.retried")
async def retried(ctx: durable.WorkflowContext, out_dir: str) -> str:
    return str(await flaky(ctx, out_dir))


async def _run_worker(args: argparse.Namespace) -> None:
    from durable.store import store_from_url

    durable_store = store_from_url(args.db)
    await durable_store.open()
    try:
        worker = durable.Worker(durable_store, lease=args.lease,
                                heartbeat_interval=args.heartbeat, poll_interval=args.poll)
        await worker.run()
    finally:
        with anyio.CancelScope(shield=True):
            await durable_store.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.pgflows")
    parser.add_argument("--db", required=True)
    parser.add_argument("--lease", type=float, default=60.0)
    parser.add_argument("--heartbeat", type=float, default=20.0)
    parser.add_argument("--poll", type=float, default=0.05)
    anyio.run(_run_worker, parser.parse_args(), backend="asyncio")


if __name__ == "__main__":
    main()
