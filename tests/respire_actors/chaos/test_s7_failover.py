"""Scenario 7 (failover) at its CI sizes, through the scenario's own code path."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.servers import CHAOS_PAIRS, server_binary

from respire_actors.chaos.model import ChaosContext
from respire_actors.chaos.scenarios.s7_failover import Failover

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize(("anyio_backend", "server"), CHAOS_PAIRS)
async def test_failover_loses_only_the_lag_and_the_outbox_repairs_it(
    anyio_backend: str, server: str, tmp_path: Path
) -> None:
    ctx = ChaosContext(
        work_dir=tmp_path, server_binary=server_binary(server), backend=anyio_backend
    )
    verdicts = {v.case: v for v in await Failover().run(ctx)}
    assert set(verdicts) == {
        "replicaof-no-one:graceful",
        "replicaof-no-one:sigkill-lagging",
        "cluster-failover:graceful",
        "cluster-failover:force-after-sigkill",
    }
    for verdict in verdicts.values():
        assert verdict.passed, repr(verdict)
        assert verdict.accepted > 0 and verdict.completed == verdict.accepted, verdict
        assert verdict.details["switched_at"] > 0  # the fault happened
    # graceful promotions lose nothing
    assert verdicts["replicaof-no-one:graceful"].lost == 0
    assert verdicts["cluster-failover:graceful"].lost == 0
    assert verdicts["cluster-failover:graceful"].details["promotion_ms"] > 0
    # the partitioned replica really lagged, lost what it never got, and the outbox re-sent it
    lagging = verdicts["replicaof-no-one:sigkill-lagging"]
    assert lagging.details["lag_bytes"] > 0 and lagging.details["stream_dropped_bytes"] > 0
    assert lagging.lost > 0 and lagging.details["outbox_reenqueued"] == lagging.lost
    killed = verdicts["cluster-failover:force-after-sigkill"]
    assert killed.details["failover_mode"] in ("FORCE", "TAKEOVER")
