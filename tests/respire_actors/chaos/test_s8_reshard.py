"""Scenario 8 (reshard + credential rotation) at its CI sizes, through the scenario's code."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from helpers.servers import CHAOS_PAIRS, server_binary

from respire_actors.chaos.model import ChaosContext
from respire_actors.chaos.scenarios.s8_reshard import Reshard

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize(("anyio_backend", "server"), CHAOS_PAIRS)
async def test_reshard_and_rotation_lose_and_duplicate_no_completion(
    anyio_backend: str, server: str, tmp_path: Path
) -> None:
    ctx = ChaosContext(
        work_dir=tmp_path, server_binary=server_binary(server), backend=anyio_backend
    )
    verdicts = {v.case: v for v in await Reshard().run(ctx)}
    assert set(verdicts) == {"reshard:migrate-slot", "credentials:password-rotation"}
    for verdict in verdicts.values():
        assert verdict.passed, repr(verdict)
        assert verdict.lost == 0 and verdict.completed == verdict.accepted > 0, verdict
    move = verdicts["reshard:migrate-slot"].details
    assert move["keys_moved"] > 0 and move["client_cluster_retries"] > 0  # the move was felt
    assert move["killed_worker_exit"] == -signal.SIGKILL
    assert move["graceful_exit_mid_move"] == 0
    rotation = verdicts["credentials:password-rotation"]
    assert rotation.details["killed_overlapping"] > 0 and rotation.details["auth_refusals"] > 0
    assert rotation.duplicates == 0  # leases outlive the refused window: nothing re-run
    assert rotation.details["worker_passwords_at_end"] == 1  # the old passwords are gone
