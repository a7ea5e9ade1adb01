"""Scenario 3 (a paused worker resumed after recovery) at its CI sizes."""

from __future__ import annotations

import pytest
from helpers.chaos import PAIRS, chaos_ctx

from respire_actors.chaos.model import ChaosContext
from respire_actors.chaos.scenarios.s3_pause_fencing import PauseFencing

pytestmark = pytest.mark.anyio
__all__ = ["chaos_ctx"]


@PAIRS
async def test_fencing_rejects_every_transition_of_a_resumed_worker(
    chaos_ctx: ChaosContext,
) -> None:
    verdicts = await PauseFencing().run(chaos_ctx)
    assert {v.case for v in verdicts} == {
        f"sigstop:{pause}/{renew}"
        for pause in ("handler-returned", "handler-running")
        for renew in ("renew", "no-renew")
    }
    for verdict in verdicts:
        assert verdict.passed, repr(verdict)
        assert verdict.completed == verdict.accepted > 0 and verdict.duplicates >= 0, verdict
        # the pause outlasted the lease: the stale worker's last renewal (every third of the
        # 1 s visibility timeout) may precede the stop by up to a third of it, so the second
        # worker may take the jobs over as early as two thirds of a second into the pause
        assert verdict.details["paused_s"] > 2 / 3, verdict
        # with renewal the stale worker resumed while the second one held the recovered
        # deliveries (found by review: resumed after everything was acknowledged, the case
        # passed with a fence that only checked that the entry was pending)
        assert verdict.details["resumed_while_recovered_held"] == ("/renew" in verdict.case)
        if "handler-returned" in verdict.case:
            # every outcome the paused worker sent (ack, retry, dead letter) was refused as
            # stale; a handler the pause caught before it returned lost its lease instead
            assert verdict.details["stale_completions"] >= 1, verdict
            assert verdict.details["rejected"] == verdict.accepted, verdict
        else:
            # every resumed handler found its lease lost and was cancelled
            assert verdict.details["leases_lost"] == verdict.accepted, verdict
            assert verdict.details["cancelled_after_resume"] == verdict.accepted, verdict
