"""Scenario 4 (failures through retry and dead-letter limits) at its CI size."""

from __future__ import annotations

import pytest
from helpers.chaos import PAIRS, chaos_ctx

from respire_actors.chaos.model import ChaosContext
from respire_actors.chaos.scenarios.s4_failures import KINDS, MODES, FailuresScenario

pytestmark = pytest.mark.anyio
__all__ = ["chaos_ctx"]


@PAIRS
async def test_every_failure_kind_settles_as_the_contract_says(chaos_ctx: ChaosContext) -> None:
    verdicts = await FailuresScenario().run(chaos_ctx)
    assert [v.case for v in verdicts] == [f"{k}/{m}" for m in MODES for k in KINDS]
    for v in verdicts:
        assert v.passed, repr(v)
        assert v.accepted > 0 and v.lost == 0, v
        kind = v.case.split("/")[0]
        if kind in ("transient", "ambiguous"):
            assert v.completed == v.accepted and v.dead_lettered == 0, v
            # the ambiguous job's effect ran twice: the re-execution the contract allows
            assert v.duplicates == (v.accepted if kind == "ambiguous" else 0), v
        else:
            assert v.dead_lettered == v.accepted and v.completed == 0, v
        if kind == "hang":
            assert v.details["budget cancellations logged"] >= 4 * v.accepted, v
