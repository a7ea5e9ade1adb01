"""Exact timing under trio's MockClock (autojump): backoff, reset rule, deadlines, intensity.

These tests are trio-only on purpose: virtual time makes the delays exact and the tests
instant. The same behaviour is checked with real time on both backends elsewhere.
"""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable

import anyio
import pytest
import trio.testing
from anyio.abc import TaskStatus

from supervisors import (
    Backoff,
    ChildSpec,
    Restart,
    RestartIntensityExceeded,
    Supervisor,
    current_child,
)

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["trio-mockclock"])
def anyio_backend() -> tuple[str, dict[str, object]]:
    return ("trio", {"clock": trio.testing.MockClock(autojump_threshold=0)})


def crasher(
    starts: list[float], runs: list[float], done: anyio.Event, crashes: int
) -> Callable[..., Awaitable[None]]:
    """A child that runs ``runs[n]`` seconds on run ``n`` then crashes, ``crashes`` times."""

    async def child(*, task_status: TaskStatus[None]) -> None:
        ctx = current_child()
        starts.append(anyio.current_time())
        task_status.started()
        if ctx.restart_count >= crashes:
            done.set()
            await ctx.wait_stop_requested()
            return
        await anyio.sleep(runs[ctx.restart_count])
        raise RuntimeError(f"crash {ctx.restart_count}")

    return child


async def test_backoff_delays_are_exact_with_jitter_from_the_random_source() -> None:
    starts: list[float] = []
    done = anyio.Event()
    child = crasher(starts, [0.0] * 6, done, 6)
    sup = Supervisor(
        "sup",
        [ChildSpec("c", child)],
        backoff=Backoff(initial=0.05, factor=2, maximum=0.5, jitter=0.2),
        random=lambda: 0.75,  # +10 %
        max_restarts=100,
    )
    async with anyio.create_task_group() as tg:
        await tg.start(sup.run)
        await done.wait()
        await sup.stop()
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    assert gaps == pytest.approx([0.055, 0.11, 0.22, 0.44, 0.5, 0.5])


async def test_backoff_resets_after_a_healthy_run() -> None:
    starts: list[float] = []
    done = anyio.Event()
    # Runs: short, short, long (healthy: >= reset_after), short.
    child = crasher(starts, [0.0, 0.0, 20.0, 0.0], done, 4)
    sup = Supervisor(
        "sup",
        [ChildSpec("c", child)],
        backoff=Backoff(initial=1, factor=2, maximum=60, jitter=0, reset_after=10),
        max_restarts=100,
    )
    async with anyio.create_task_group() as tg:
        await tg.start(sup.run)
        await done.wait()
        await sup.stop()
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    runs = [0.0, 0.0, 20.0, 0.0]
    delays = [gap - run for gap, run in zip(gaps, runs, strict=True)]
    assert delays == pytest.approx([1, 2, 1, 2])


async def test_shutdown_deadline_is_exact() -> None:
    async def stubborn(*, task_status: TaskStatus[None]) -> None:
        task_status.started()
        await anyio.sleep_forever()

    sup = Supervisor("sup", [ChildSpec("s", stubborn, shutdown=7)])
    async with anyio.create_task_group() as tg:
        await tg.start(sup.run)
        before = anyio.current_time()
        await sup.stop()
        assert anyio.current_time() - before == pytest.approx(7.0)


async def test_intensity_uses_the_event_loop_clock_by_default() -> None:
    starts: list[float] = []
    done = anyio.Event()
    # Crashes 6 s apart never put 2 restarts within a 5 s period.
    child = crasher(starts, [6.0] * 5, done, 5)
    sup = Supervisor("sup", [ChildSpec("c", child)], max_restarts=1, period=5, backoff=None)
    async with anyio.create_task_group() as tg:
        await tg.start(sup.run)
        await done.wait()
        await sup.stop()
    assert len(starts) == 6

    # Crashes 2 s apart do.
    starts.clear()
    fast = crasher(starts, [2.0] * 5, anyio.Event(), 5)
    sup = Supervisor("sup", [ChildSpec("c", fast)], max_restarts=1, period=5, backoff=None)
    with pytest.raises(RestartIntensityExceeded):
        await sup.run()
    assert len(starts) == 2


async def test_transient_restart_after_failures_only() -> None:
    starts: list[float] = []

    async def fails_then_returns(*, task_status: TaskStatus[None]) -> None:
        starts.append(anyio.current_time())
        task_status.started()
        await anyio.sleep(1)
        if current_child().restart_count == 0:
            raise RuntimeError("once")

    sup = Supervisor(
        "sup",
        [ChildSpec("t", fails_then_returns, restart=Restart.TRANSIENT)],
        backoff=Backoff(initial=3, jitter=0),
    )
    async with anyio.create_task_group() as tg:
        await tg.start(sup.run)
        await anyio.sleep(100)
        assert starts == pytest.approx([starts[0], starts[0] + 1 + 3])
        await sup.stop()
