"""Scenario 2 (kill points) at its CI sizes, through the scenario's own code path."""

from __future__ import annotations

import pytest
from helpers.chaos import PAIRS, chaos_ctx

from respire_actors.chaos.model import ChaosContext
from respire_actors.chaos.scenarios.s2_kill_points import (
    KILL_POINTS,
    KINDS,
    RELIABLE_KILL_POINTS,
    KillPoints,
    cases,
)

pytestmark = pytest.mark.anyio
__all__ = ["chaos_ctx"]


def test_the_ci_subset_kills_every_point_and_every_kind() -> None:
    selected = cases(full=False)
    assert {c.point for c in selected if c.workload == "plain"} == set(KILL_POINTS)
    assert {c.point for c in selected if c.workload == "reliable"} == set(RELIABLE_KILL_POINTS)
    assert "after-promotion" in {c.point for c in selected}
    assert {c.point for c in selected if c.workload == "stream"} >= {
        "before-commit",
        "after-commit",
    }
    assert {c.point for c in cases(full=True) if c.workload == "stream"} == set(KILL_POINTS)
    assert {kind for c in selected for kind in c.kinds} == set(KINDS)
    assert all(set(c.kinds) == set(KINDS) for c in cases(full=True) if c.kinds)


@PAIRS
async def test_every_job_completes_once_after_each_kill(chaos_ctx: ChaosContext) -> None:
    verdicts = await KillPoints().run(chaos_ctx)
    assert len(verdicts) == len(cases(full=False))
    for verdict in verdicts:
        assert verdict.passed, repr(verdict)
        # not vacuous: every kill job killed a process with SIGKILL, every job completed
        assert verdict.details["kills"] == len(verdict.details["killed_by"]) >= 1, verdict
        assert verdict.details["exit_signals"] == [9], verdict
        assert verdict.completed == verdict.accepted > 0 and verdict.lost == 0, verdict
    by_case = {v.case: v for v in verdicts}
    # A kill after the effect and before the commit re-executes the killed job; after the
    # commit it must not (the scenario makes that a violation: "delivered again after its
    # commit ran"). With one handler at a time the next job may already have started in the
    # killed process (its permit is free once the handler returned, before the commit), so at
    # most one more re-execution is allowed: that job was not committed either.
    for case in ("mid-handler/plain", "before-commit/plain", "before-commit/stream"):
        assert 1 <= by_case[f"sigkill:{case}"].duplicates <= 2, by_case[f"sigkill:{case}"]
    for case in ("after-commit/plain", "after-commit/stream"):
        assert by_case[f"sigkill:{case}"].duplicates <= 1, by_case[f"sigkill:{case}"]
    # a reliable queue's ack is a call of its own: a kill before it re-executes, after it not
    assert by_case["sigkill:before-ack/reliable"].duplicates == 1
    assert by_case["sigkill:after-ack/reliable"].duplicates == 0
