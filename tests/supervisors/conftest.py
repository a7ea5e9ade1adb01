"""Fixtures for the supervisors tests: both anyio backends, a recorder and a fake clock."""

from __future__ import annotations

from pathlib import Path

import pytest
from supervisors_helpers import FakeClock, Recorder

HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test here finishes in well under a second: fail a stuck one after 10 s."""
    for item in items:
        if HERE in item.path.parents:
            item.add_marker(pytest.mark.timeout(10))


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    """Every async test runs on asyncio and on trio."""
    return str(request.param)


@pytest.fixture
def rec() -> Recorder:
    return Recorder()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()
