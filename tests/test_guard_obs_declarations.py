"""A declaration the engine could not honour is refused when it is made, naming what is wrong:
a retry policy, an activity's or a workflow's options, a second declaration under one name."""

from __future__ import annotations

import functools
import random
import re
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


def _sync_act(ctx: durable.ActivityContext, db: str) -> str:
    CALLED.append(db)  # a delete that has happened by the time the engine awaits it
    return db


async def _generator(ctx: durable.ActivityContext) -> Any:
    yield 1


async def _no_context() -> None: ...


async def _keyword_only(ctx: durable.ActivityContext, *, db: str) -> None: ...


CALLED: list[str] = []


@pytest.mark.parametrize(("fn", "says"), [
    (_sync_act, r"must be declared with async def: _sync_act is a plain function "),
    (_generator, r"must be declared with async def returning its result: _generator is "
                 r"an async generator"),
    (_no_context, r"must take the context as its first argument: async def "
                  r"_no_context\(ctx, \.\.\.\)"),
    (_keyword_only, r"takes keyword-only arguments without defaults \(db\); the journal "
                    r"keeps arguments as a list: make them positional"),
    (42, r"must be declared with async def: 42 is not a function"),
])
def test_an_activity_or_workflow_the_engine_cannot_call_is_refused_when_declared(
        fn: Any, says: str) -> None:
    """A plain function declared an activity ran at the worker, its effect (a delete) done
    before the engine awaited its result; that await failed with a TypeError, which the
    retry policy retried: the delete ran max_tries times and the run failed. A function
    with no context, or with keyword-only arguments the journal cannot keep, failed only at
    the worker too. Each is refused by the decorator, naming it, and nothing registered."""
    registry = durable.Registry()
    with pytest.raises(durable.ConfigError, match=rf"^activity 'act' {says}"):
        durable.activity("act", registry=registry)(fn)
    with pytest.raises(durable.ConfigError, match=rf"^workflow 'flow' {says}"):
        durable.workflow("flow", registry=registry)(fn)
    with pytest.raises(durable.ConfigError, match=rf"^the lookup of activity 'looked' {says}"):
        durable.activity("looked", registry=registry, lookup=fn)(_act)
    looked = durable.activity("looked.later", registry=registry)(_act)
    with pytest.raises(durable.ConfigError,
                       match=rf"^the lookup of activity 'looked.later' {says}"):
        looked.lookup(fn)
    assert looked.lookup_fn is None
    assert registry.workflows == {} and set(registry.activities) == {"looked.later"}
    assert CALLED == []


class _Callable:
    async def __call__(self, ctx: durable.ActivityContext, db: str) -> str:
        return db


def _wrapper(fn: Any) -> Any:
    @functools.wraps(fn)
    def wrapped(*args: Any) -> Any:  # a plain function handing back fn's coroutine
        return fn(*args)
    return wrapped


async def _optional(ctx: durable.ActivityContext, db: str = "a", *more: str,
                    dry_run: bool = False) -> str:
    return db


@pytest.mark.parametrize("fn", [
    _Callable(), functools.partial(_optional, dry_run=True), _wrapper(_optional), _optional,
])
def test_coroutine_functions_however_wrapped_are_declared(fn: Any) -> None:
    """An object with an async __call__, a partial, a decorator's plain wrapper of an
    async def (functools.wraps), keyword-only arguments with defaults: all are called the
    way the engine calls, and each is accepted."""
    registry = durable.Registry()
    assert durable.activity("act", registry=registry, lookup=fn)(fn).fn is fn
    assert durable.workflow("flow", registry=registry)(fn).fn is fn


@pytest.mark.parametrize(("options", "says"), [
    ({"max_tries": 1.5}, r"^RetryPolicy\.max_tries must be a whole number, not 1\.5$"),
    ({"max_tries": float("nan")}, r"^RetryPolicy\.max_tries must be a whole number, not nan$"),
    ({"max_tries": float("inf")}, r"^RetryPolicy\.max_tries must be a whole number, not inf$"),
    ({"max_tries": "3"}, r"^RetryPolicy\.max_tries must be a whole number, not '3'$"),
    ({"max_tries": True}, r"^RetryPolicy\.max_tries must be a whole number, not True$"),
    ({"non_retryable": ("ValueError",)},
     r"^RetryPolicy\.non_retryable must be exception classes, not \('ValueError',\)$"),
    ({"non_retryable": (int,)},
     r"^RetryPolicy\.non_retryable must be exception classes, not \(<class 'int'>,\)$"),
    ({"non_retryable": ValueError("x")},
     r"^RetryPolicy\.non_retryable must be exception classes, not ValueError\('x'\)$"),
])
def test_a_retry_policy_of_the_wrong_type_is_refused_naming_the_field(
        options: dict[str, Any], says: str) -> None:
    """A max_tries of NaN compared false with every count: the step was never retried. A
    non_retryable that isinstance() cannot take raised a TypeError at the worker, inside
    the step's failure handling: the step was left in doubt and the run failed with
    ``isinstance() arg 2 must be a type``. Each is refused when the policy is made."""
    with pytest.raises(durable.ConfigError, match=says):
        durable.RetryPolicy(**options)


def test_non_retryable_given_as_a_list_or_one_class_is_taken_as_a_tuple() -> None:
    assert durable.RetryPolicy(non_retryable=[KeyError]).non_retryable == (KeyError,)
    policy = durable.RetryPolicy(non_retryable=PermissionError)
    assert policy.non_retryable == (PermissionError,)
    assert not policy.retryable(PermissionError("403")) and policy.retryable(KeyError("x"))
    assert hash(policy) == hash(durable.RetryPolicy(non_retryable=(PermissionError,)))


@pytest.mark.parametrize("retry", [3, {"max_tries": 3}, durable.RetryPolicy])
def test_a_retry_that_is_not_a_retry_policy_is_refused(retry: Any) -> None:
    """``retry=3`` was taken, and every step of the activity failed at the worker with
    ``'int' object has no attribute 'max_tries'``."""
    registry = durable.Registry()
    with pytest.raises(durable.ConfigError,
                       match=rf"^activity 'charge': retry must be a durable\.RetryPolicy, "
                             rf"not {re.escape(repr(retry))}$"):
        durable.activity("charge", retry=retry, registry=registry)(_act)
    assert registry.activities == {}


@pytest.mark.parametrize("name", ["", "  ", 123, "a\nb"])
def test_a_name_that_is_not_a_printable_string_is_refused(name: Any) -> None:
    """An empty name was replaced by the function's, silently; a number was registered
    under a name no start could give."""
    registry = durable.Registry()
    with pytest.raises(durable.ConfigError, match=r"^an activity's name must "):
        durable.activity(name, registry=registry)(_act)
    with pytest.raises(durable.ConfigError, match=r"^a workflow's name must "):
        durable.workflow(name, registry=registry)(_flow)
    assert registry.activities == {} and registry.workflows == {}
