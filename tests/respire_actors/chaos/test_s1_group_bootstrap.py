"""Scenario 1 (consumer-group bootstrap) at its CI size."""

from __future__ import annotations

import pytest
from helpers.chaos import PAIRS, chaos_ctx

from respire_actors.chaos.model import ChaosContext
from respire_actors.chaos.scenarios.s1_group_bootstrap import GroupBootstrapScenario

pytestmark = pytest.mark.anyio
__all__ = ["chaos_ctx"]


@PAIRS
async def test_group_bootstrap_and_deletion_follow_the_contract(chaos_ctx: ChaosContext) -> None:
    verdicts = {v.case: v for v in await GroupBootstrapScenario().run(chaos_ctx)}
    assert list(verdicts) == [
        "concurrent-deploy+backlog/job-queue",
        "start-$/stream-worker",
        "migrate-from-0-0/stream-worker",
        "group-deleted:fail/job-queue",
        "group-deleted:recreate-$/stream-worker-0-0",
        "group-deleted-mid-run:recreate-$/job-queue",
        "group-deleted:recreate-0/reliable-queue",
    ]
    for case, v in verdicts.items():
        assert v.passed, repr(v)
        assert v.accepted > 0 and v.duplicates == 0, v
        if case != "group-deleted-mid-run:recreate-$/job-queue":
            assert v.completed == v.accepted and v.lost == 0, v
        if case.startswith("group-deleted") and "reliable" not in case:
            assert v.details["first-wave re-executions"] == 0, v
    deploy = verdicts["concurrent-deploy+backlog/job-queue"].details
    assert deploy["groups"] == ["respire"] and deploy["backlog completed"] == 30
    assert verdicts["start-$/stream-worker"].details["history executed"] == 0
    assert verdicts["migrate-from-0-0/stream-worker"].details["history executed"] == 30
    failed = verdicts["group-deleted:fail/job-queue"].details
    assert failed["worker exits"] == [1, 1] and failed["worker started after the deletion"] == 1
    mid_run = verdicts["group-deleted-mid-run:recreate-$/job-queue"]
    # the skipped jobs are exactly the measured ones the deleted group owed, never more
    assert mid_run.details["owed by the deleted group (skipped, documented)"] > 0
    assert mid_run.lost <= mid_run.details["owed by the deleted group (skipped, documented)"]
    reliable = verdicts["group-deleted:recreate-0/reliable-queue"].details
    assert reliable["acknowledged redelivered"] == 0
    assert reliable["late acks accepted"] == reliable["leased at the deletion"] > 0
