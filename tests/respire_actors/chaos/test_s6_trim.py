"""Scenario 6 (trim near the oldest pending entry) at its CI size."""

from __future__ import annotations

import pytest
from helpers.chaos import PAIRS, chaos_ctx

from respire_actors.chaos.model import ChaosContext
from respire_actors.chaos.scenarios.s6_trim import TrimScenario

pytestmark = pytest.mark.anyio
__all__ = ["chaos_ctx"]


@PAIRS
async def test_the_safe_trim_never_removes_a_needed_payload(chaos_ctx: ChaosContext) -> None:
    verdicts = {v.case: v for v in await TrimScenario().run(chaos_ctx)}
    assert list(verdicts) == [
        "sigkill:oldest-pending/ready",
        "lagging-second-group/ready",
        "staged:durable-retries/ready",
        "staged:delayed/ready",
        "staged:job-groups/ready",
    ]
    for v in verdicts.values():
        assert v.passed, v
        assert v.accepted > 0 and v.completed == v.accepted and v.lost == 0, v
        assert v.details["entries removed"] > 0 and v.details["pending payloads checked"] > 0, v
    killed = verdicts["sigkill:oldest-pending/ready"].details
    assert killed["worker exit"] == "SIGKILL" and killed["pending at the trim"] >= 1
    assert killed["plan cutoff = oldest pending"] is True
    lagging = verdicts["lagging-second-group/ready"].details
    assert lagging["aborted: group moved back"] and lagging["aborted: new group"]
