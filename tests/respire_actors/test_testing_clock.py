"""The public test clocks (issue 12): FakeClock wakes sleepers on advance/set without real
sleeping, on both anyio backends; LoopClock follows the loop clock; SystemClock is UTC."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import anyio
import anyio.lowlevel
import pytest

from respire_actors import Clock, SystemClock
from respire_actors.errors import ValidationError
from respire_actors.testing import FakeClock, LoopClock

pytestmark = pytest.mark.anyio

T0 = datetime(2030, 1, 1, tzinfo=UTC)


async def test_fake_clock_wakes_sleepers_when_advanced_past_their_time() -> None:
    clock = FakeClock(T0)
    woke: list[datetime] = []

    async def sleeper(delta: timedelta) -> None:
        await clock.sleep_until(T0 + delta)
        woke.append(clock.now())

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(sleeper, timedelta(hours=1))
            tg.start_soon(sleeper, timedelta(hours=3))
            await clock.wait_for_sleepers(2)
            clock.advance(timedelta(minutes=59))
            await anyio.sleep(0.01)
            assert woke == [] and clock.sleepers == 2
            clock.advance(timedelta(minutes=1))
            await clock.wait_for_sleepers(1)
            while not woke:
                await anyio.lowlevel.checkpoint()
            assert woke == [T0 + timedelta(hours=1)] and clock.sleepers == 1
            clock.set(T0 + timedelta(days=1))  # a jump wakes the rest
    assert woke == [T0 + timedelta(hours=1), T0 + timedelta(days=1)]


async def test_fake_clock_jumps_back_and_refuses_bad_input() -> None:
    clock = FakeClock(T0)
    assert isinstance(clock, Clock) and clock.now() == T0
    clock.set(T0 - timedelta(days=1))
    assert clock.now() == T0 - timedelta(days=1)
    clock.advance(2.5)
    assert clock.now() == T0 - timedelta(days=1) + timedelta(seconds=2.5)
    with pytest.raises(ValidationError):
        clock.advance(timedelta(seconds=-1))
    with pytest.raises(ValidationError):
        clock.advance("1s")  # type: ignore[arg-type]
    with pytest.raises(ValidationError):
        clock.set(datetime(2030, 1, 1))  # naive
    with pytest.raises(ValidationError):
        FakeClock(datetime(2030, 1, 1))
    with anyio.fail_after(1):
        await clock.sleep_until(T0 - timedelta(days=2))  # already past: returns at once
    assert FakeClock().now().tzinfo is not None


async def test_loop_clock_and_system_clock() -> None:
    loop = LoopClock(T0)
    first = loop.now()
    assert first - T0 < timedelta(seconds=1)
    with anyio.fail_after(5):
        await loop.sleep_until(first + timedelta(milliseconds=20))
    assert loop.now() >= first + timedelta(milliseconds=20)
    system = SystemClock()
    assert system.now().tzinfo is not None
    assert abs(system.now() - datetime.now(UTC)) < timedelta(seconds=5)
    with anyio.fail_after(5):
        await system.sleep_until(system.now() - timedelta(hours=1))  # past: no sleep
