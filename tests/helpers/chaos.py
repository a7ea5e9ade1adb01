"""Shared pieces of the chaos scenario tests: the (server, backend) pairs and a context."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from respire_actors.chaos.model import ChaosContext
from respire_actors.redis.client import connect

from .keyspace import delete_matching

# Process-heavy scenarios run on two of the four (server, anyio backend) combinations.
PAIRS = pytest.mark.parametrize(
    ("server", "anyio_backend"), [("valkey", "asyncio"), ("redis", "trio")]
)


@pytest.fixture
async def chaos_ctx(
    server: str, anyio_backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[ChaosContext]:
    """A context on ``server`` whose worker processes run on the test's backend; the run's
    keys are deleted afterwards."""
    url = str(request.getfixturevalue(f"{server}_url"))
    ctx = ChaosContext(work_dir=tmp_path, redis_url=url, backend=anyio_backend)
    yield ctx
    async with connect(url) as client:
        await delete_matching(client, f"*chaos-{ctx.run_id}*")
