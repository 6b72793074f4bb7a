"""A declaration the engine could not honour is refused when it is made, naming what is wrong:
a retry policy, an activity's or a workflow's options, a second declaration under one name."""

from __future__ import annotations

import random
from typing import Any

import httpx
import pytest

import durable


async def _act(ctx: durable.ActivityContext) -> None: ...


async def _other_act(ctx: durable.ActivityContext) -> None: ...


async def _flow(ctx: durable.WorkflowContext) -> None: ...


async def _other_flow(ctx: durable.WorkflowContext) -> None: ...


@pytest.mark.parametrize(("options", "says"), [
    ({"max_tries": 0}, r"^RetryPolicy\.max_tries must be at least 1$"),
    ({"max_tries": -3}, r"^RetryPolicy\.max_tries must be at least 1$"),
    ({"backoff": 0.5}, r"^RetryPolicy\.backoff must be a finite number >= 1, not 0\.5$"),
    ({"backoff": 0}, r"^RetryPolicy\.backoff must be a finite number >= 1, not 0$"),
    ({"jitter": 1.5}, r"^RetryPolicy\.jitter must be between 0 and 1, not 1\.5$"),
    ({"jitter": -0.1}, r"^RetryPolicy\.jitter must be between 0 and 1, not -0\.1$"),
    ({"initial_delay": -1}, r"^RetryPolicy\.initial_delay must be 0 or more seconds, not -1$"),
    ({"max_delay": -1}, r"^RetryPolicy\.max_delay must be 0 or more seconds, not -1$"),
])
def test_a_retry_policy_out_of_range_is_refused_naming_the_field(
        options: dict[str, Any], says: str) -> None:
    """No try at all, a backoff that shrinks the delays, a jitter that makes them
    negative, a negative delay: each a ConfigError naming the field and the value."""
    with pytest.raises(durable.ConfigError, match=says):
        durable.RetryPolicy(**options)


def test_a_retry_policy_at_its_bounds_is_accepted() -> None:
    policy = durable.RetryPolicy(max_tries=1, initial_delay=0, backoff=1, max_delay=0,
                                 jitter=1)
    assert policy.delay(1, rng=random.Random(0)) == 0.0
    assert durable.RetryPolicy(jitter=0).delay(2) == 1.0


@pytest.mark.parametrize("on_doubt", ["maybe", "RETRY", "", None])
def test_an_on_doubt_other_than_retry_or_fail_is_refused(on_doubt: Any) -> None:
    registry = durable.Registry()
    with pytest.raises(durable.ConfigError,
                       match=rf"^on_doubt must be 'retry' or 'fail', not {on_doubt!r}$"):
        durable.activity("doubtful", on_doubt=on_doubt, registry=registry)(_act)
    assert registry.activities == {}


@pytest.mark.parametrize("timeout", [0, -1, True, "5"])
def test_an_activity_timeout_that_is_not_positive_seconds_is_refused(timeout: Any) -> None:
    registry = durable.Registry()
    with pytest.raises(durable.ConfigError,
                       match=r"^an activity timeout must be positive seconds, not "):
        durable.activity("timed", timeout=timeout, registry=registry)(_act)
    assert registry.activities == {}


@pytest.mark.parametrize("timeout", [0, -1, True, "5"])
def test_a_workflow_timeout_that_is_not_positive_seconds_is_refused(timeout: Any) -> None:
    registry = durable.Registry()
    with pytest.raises(durable.ConfigError,
                       match=r"^a workflow timeout must be positive seconds, not "):
        durable.workflow("timed", timeout=timeout, registry=registry)(_flow)
    assert registry.workflows == {}


def test_two_activities_of_one_name_are_refused_and_the_first_is_kept() -> None:
    """A second function under a taken name would run in place of the first for steps the
    first journaled; the same function declared again (a module imported twice) is fine."""
    registry = durable.Registry()
    first = durable.activity("charge", registry=registry)(_act)
    with pytest.raises(durable.ConfigError, match=r"^two activities are named 'charge'$"):
        durable.activity("charge", registry=registry)(_other_act)
    assert registry.activities["charge"] is first
    durable.activity("charge", registry=registry)(_act)  # the same function again


def test_two_workflows_of_one_name_are_refused_even_across_a_parent() -> None:
    parent = durable.Registry()
    durable.workflow("pay", registry=parent)(_flow)
    child = durable.Registry(parent)
    with pytest.raises(durable.ConfigError, match=r"^two workflows are named 'pay'$"):
        durable.workflow("pay", registry=child)(_other_flow)
    with pytest.raises(durable.ConfigError, match=r"^two workflows are named 'pay'$"):
        durable.workflow("pay", registry=parent)(_other_flow)
    assert child.workflow("pay").fn is _flow
    durable.workflow("pay", registry=child)(_flow)  # the same function again


def test_two_schedules_of_one_name_and_different_definitions_are_refused() -> None:
    registry = durable.Registry()
    flow = durable.workflow("nightly.flow", registry=registry)(_flow)
    durable.schedule("nightly", flow, cron="0 3 * * *", registry=registry)
    with pytest.raises(durable.ConfigError, match=r"^two schedules are named 'nightly'$"):
        durable.schedule("nightly", flow, cron="0 4 * * *", registry=registry)
    assert registry.schedules["nightly"].cron == "0 3 * * *"
    durable.schedule("nightly", flow, cron="0 3 * * *", registry=registry)  # the same again


@pytest.mark.parametrize(("status", "honoured"), [(429, True), (503, True), (500, False),
                                                  (404, False)])
def test_retry_after_is_honoured_only_on_429_and_503(status: int, honoured: bool) -> None:
    """A server asking to wait (429, 503) is waited for; another status's Retry-After is
    not a request to wait and the policy's own backoff applies."""
    request = httpx.Request("GET", "https://api.example/charge")
    response = httpx.Response(status, headers={"Retry-After": "7"}, request=request)
    exc = httpx.HTTPStatusError("failed", request=request, response=response)
    policy = durable.RetryPolicy(initial_delay=1, jitter=0, max_delay=30)
    assert policy.delay(1, exc) == (7.0 if honoured else 1.0)
