"""The fake external services as pytest fixtures (a pytest plugin module).

Use it with ``pytest_plugins = ["tests.services"]``; the ``fake_services`` fixture then
gives a :class:`FakeServices` handle on a server shared by the session and reset before
each test. The handle itself lives in ``scripts/_fakes/harness.py`` (the demo uses it too).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from scripts._fakes.harness import FakeServices, running_fake_services

__all__ = ["FakeServices", "fake_services", "fake_services_session", "running_fake_services"]


@pytest.fixture(scope="session")
def fake_services_session() -> Iterator[FakeServices]:
    """One server for the whole session (starting one costs about half a second)."""
    with running_fake_services() as services:
        yield services


@pytest.fixture
def fake_services(fake_services_session: FakeServices) -> FakeServices:
    """The session's fake services, reset to empty for this test."""
    if fake_services_session.process.poll() is not None:
        raise RuntimeError("the fake services process has died")
    fake_services_session.reset()
    return fake_services_session
