"""Scenario 5 (fill and backpressure) at its CI sizes, through the scenario's own code path."""

from __future__ import annotations

from pathlib import Path

import pytest

from respire_actors.chaos.model import ChaosContext
from respire_actors.chaos.scenarios.s5_fill_backpressure import FillAndBackpressure

pytestmark = pytest.mark.anyio

PAIRS = [("valkey", "asyncio"), ("redis", "trio")]


@pytest.mark.parametrize(("server_url", "anyio_backend"), PAIRS, indirect=True)
async def test_fill_and_backpressure(
    server_url: str, anyio_backend: str, unique_name: str, tmp_path: Path
) -> None:
    ctx = ChaosContext(work_dir=tmp_path, redis_url=server_url, backend=anyio_backend)
    ctx.run_id = unique_name
    verdicts = await FillAndBackpressure().run(ctx)
    assert [v.case for v in verdicts] == ["bounded-queue/slow-workers", "outage/expired-leases"]
    for v in verdicts:
        assert v.passed, repr(v)
        assert v.accepted > 0 and v.completed == v.accepted and v.lost == 0
    fill, outage = verdicts
    # not vacuous: the bound refused enqueues, and recovery ran in bounded passes
    assert fill.details["queue_full_raised"] > 0
    assert fill.details["peak_backlog"] <= fill.details["bound"]
    assert outage.details["holder_exit"] == -9
    assert outage.details["leases_held_at_sigkill"] == outage.accepted
    assert outage.details["recovery_passes"] >= outage.accepted // outage.details["pass_bound"]
    assert outage.details["max_claimed_per_pass"] == outage.details["pass_bound"]
