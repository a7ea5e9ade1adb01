"""The restart delay as the running supervisor applies it (real time, both backends)."""

from __future__ import annotations

import itertools

import anyio
import pytest
from anyio.abc import TaskStatus

from supervisors import Backoff, ChildSpec, Restart, Supervisor, current_child

pytestmark = pytest.mark.anyio


async def test_restart_delay_grows_and_is_capped() -> None:
    starts: list[float] = []
    healthy = anyio.Event()

    async def crashes_three_times(*, task_status: TaskStatus[None]) -> None:
        starts.append(anyio.current_time())
        task_status.started()
        if current_child().restart_count < 3:
            raise RuntimeError("crash")
        healthy.set()

    sup = Supervisor(
        "sup",
        [ChildSpec("c", crashes_three_times, restart=Restart.TRANSIENT)],
        backoff=Backoff(initial=0.02, factor=2, maximum=0.04, jitter=0),
        max_restarts=10,
    )
    with anyio.fail_after(2):
        async with anyio.create_task_group() as tg:
            await tg.start(sup.run)
            await healthy.wait()
            await sup.stop()
    gaps = [later - earlier for earlier, later in itertools.pairwise(starts)]
    tolerance = 0.005  # asyncio may wake a timer slightly early
    for gap, delay in zip(gaps, [0.02, 0.04, 0.04], strict=True):
        assert gap >= delay - tolerance, gaps
    assert sum(gaps) < 1.0
