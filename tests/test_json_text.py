"""The journal's JSON text (``durable._types.dumps``): the C encoder made once per thread
writes exactly what the standard library's encoder with the same options writes, refuses
what it refuses, and is not left confused by a failed encoding."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from durable._errors import NotJsonError
from durable._types import UNSTORABLE, dumps

SCALARS = (st.none() | st.booleans() | st.integers()
           | st.floats(allow_nan=False, allow_infinity=False) | st.text())
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20)


def standard(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), allow_nan=False)


@settings(max_examples=300, deadline=None)
@given(VALUES)
def test_the_same_text_as_the_standard_encoder(value: Any) -> None:
    """(Or refused, when a string in it holds a NUL or a lone surrogate: no store can.)"""
    text = standard(value)
    if any(UNSTORABLE.search(string) for string in strings(value)):
        with pytest.raises(NotJsonError, match="no store can hold it"):
            dumps(value)
    else:
        assert dumps(value) == text


def strings(value: Any) -> list[str]:
    """Every string in ``value``, keys too."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [*value, *(s for v in value.values() for s in strings(v))]
    if isinstance(value, list):
        return [s for v in value for s in strings(v)]
    return []


def test_a_nul_or_a_lone_surrogate_is_refused_but_a_pair_is_not() -> None:
    for value in ["a\x00", {"k\x00": 1}, ["\ud800"], {"a": ["\udcff"]}]:
        with pytest.raises(NotJsonError, match="the payload must not hold"):
            dumps(value, "the payload")
    assert dumps(["\U0001f600", "\\u0000"]) == standard(["\U0001f600", "\\u0000"])


@pytest.mark.parametrize("value", [
    float("nan"), {"a": float("inf")}, [1, {"b": -float("inf")}], {"a": object()},
    [1, {2, 3}], {(1, 2): "tuple key"}])
def test_what_is_not_json_is_refused_naming_what_it_was(value: Any) -> None:
    with pytest.raises(NotJsonError, match="the result must be JSON values"):
        dumps(value, "the result")


def test_a_circular_value_is_refused() -> None:
    loop: list[Any] = [1]
    loop.append(loop)
    with pytest.raises(NotJsonError, match="Circular reference"):
        dumps(loop)


def test_a_failed_encoding_leaves_no_container_marked() -> None:
    """The encoder records each container it is inside; an encoding that fails inside
    ``shared`` must not make the next encoding of ``shared`` look circular."""
    shared: dict[str, Any] = {"x": [1, 2]}
    shared["bad"] = object()
    with pytest.raises(NotJsonError, match="not JSON serializable"):
        dumps({"a": [shared]})
    shared["bad"] = float("nan")
    with pytest.raises(NotJsonError, match="Out of range"):
        dumps([shared])
    del shared["bad"]
    assert dumps([shared, {"again": shared}]) == '[{"x":[1,2]},{"again":{"x":[1,2]}}]'
