"""Shared pieces of the chaos scenario tests: the (server, backend) pairs and a context."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

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


def check_trim_verdicts(results: list[dict[str, Any]]) -> None:
    """What every run of the trim scenario must show (verdicts as in results.json)."""
    verdicts = {v["case"]: v for v in results}
    assert list(verdicts) == [
        "sigkill:oldest-pending/ready",
        "lagging-second-group/ready",
        "staged:durable-retries/ready",
        "staged:delayed/ready",
        "staged:job-groups/ready",
    ]
    for v in verdicts.values():
        assert v["scenario"] == "trim" and v["passed"] and not v["violations"], v
        assert v["accepted"] > 0 and v["completed"] == v["accepted"] and v["lost"] == 0, v
        assert v["details"]["entries removed"] > 0, v
        assert v["details"]["pending payloads checked"] > 0, v
    killed = verdicts["sigkill:oldest-pending/ready"]["details"]
    assert killed["worker exit"] == "SIGKILL" and killed["pending at the trim"] >= 1
    assert killed["plan cutoff = oldest pending"] is True
    lagging = verdicts["lagging-second-group/ready"]["details"]
    assert lagging["aborted: group moved back"] and lagging["aborted: new group"]
