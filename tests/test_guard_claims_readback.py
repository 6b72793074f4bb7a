"""A claim that got no answer is read back (durable/_claims.py, ``PendingClaim._told``): it
is taken as committed only when the run is running under this worker as the attempt the
claim made. Anything else (another worker holds the run, or this worker at another attempt)
is no claim of ours: the attempt is dropped, and nobody runs the run twice.

Real stores (a SQLite file, PostgreSQL); the claim's statement "gets no answer" after the
store really changed the run, as a lost connection leaves it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, cast

import pytest

from durable._claims import PendingClaim
from durable._errors import StoreUnavailableError
from durable._types import EntryKind, Fence, JournalWrite, NewRun, RunState
from durable.store import Store
from tests.pg import pg_url, postgres_server
from tests.test_store_contract import clock, store, store_url

__all__ = ["clock", "pg_url", "postgres_server", "store", "store_url"]  # test_store_contract.py

pytestmark = pytest.mark.anyio

LEASE = 30.0
STEP = JournalWrite(EntryKind.STEP_STARTED, step=1, step_key="1:charge", name="charge",
                    try_number=1)


def unanswered(store: Store, meanwhile: Callable[[], Awaitable[None]]) -> None:
    """The store's next ``claim_with`` gets no answer; before, ``meanwhile`` changes the
    run as other claims would have."""
    async def claim_with(*args: Any, **kwargs: Any) -> Any:
        await meanwhile()
        raise StoreUnavailableError("the connection was lost before the answer came")
    store.claim_with = claim_with  # type: ignore[method-assign]


async def commit_unanswered(store: Store, run_id: str) -> PendingClaim:
    [read] = await store.claimable("me", 1)
    assert read.id == run_id and read.attempt == 0
    claim = PendingClaim(store, "me", LEASE, read, cast(Any, None), (), None,
                         lambda claim: None)
    await claim.commit([STEP])
    return claim


async def test_an_unanswered_claim_is_not_taken_as_ours_when_another_worker_holds_the_run(
        store: Store) -> None:
    await store.create_run(NewRun("r1", "wf", [], None, None))

    async def other_claims() -> None:
        [run] = await store.claim("other", LEASE, 1, run_id="r1")
        assert run.attempt == 1  # the attempt number our claim would have made

    unanswered(store, other_claims)
    claim = await commit_unanswered(store, "r1")
    assert claim.error is not None and claim.outcome is None
    run = await store.get_run("r1")
    assert run is not None and (run.state, run.worker) == (RunState.RUNNING, "other")


async def test_an_unanswered_claim_is_not_taken_as_committed_when_the_run_is_at_another_attempt(
        store: Store) -> None:
    await store.create_run(NewRun("r2", "wf", [], None, None))

    async def claimed_twice_since() -> None:  # claimed, given back, claimed again: attempt 2
        [first] = await store.claim("me", LEASE, 1, run_id="r2")
        assert await store.release(Fence(first.id, first.epoch))
        [second] = await store.claim("me", LEASE, 1, run_id="r2")
        assert second.attempt == 2

    unanswered(store, claimed_twice_since)
    claim = await commit_unanswered(store, "r2")
    assert claim.error is not None and claim.outcome is None
