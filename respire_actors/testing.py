"""Helpers for testing applications built on respire_actors.

:class:`FakeClock` is a UTC clock that moves only when the test says so. Pass it to
``queue.scheduler(clock=...)`` or ``RecurringOptions(clock=...)``: the scheduler reads it to
decide what is due, and the hosted recurring ticker sleeps on it, so ``clock.advance(...)``
makes the ticker run its next pass at once, without real sleeping, on trio and asyncio::

    clock = FakeClock()
    scheduler = queue.scheduler(clock=clock)
    await scheduler.upsert("hourly", payload, interval=timedelta(hours=1))
    clock.advance(timedelta(hours=1))
    assert await scheduler.run_due() == 1

:class:`LoopClock` follows the event loop's clock instead, from a fixed start: under trio with
``trio.testing.MockClock``, ``mock_clock.jump(3600)`` moves it (and wakes the ticker) an hour.

Only recurring scheduling reads these clocks. Redis server time still governs delayed jobs,
TTLs, visibility timeouts and rate limits; a fake clock does not move them.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import anyio
import anyio.lowlevel

from .errors import ValidationError

__all__ = ["FakeClock", "LoopClock"]

_DEFAULT_START = datetime(2030, 1, 1, tzinfo=UTC)


def _aware(when: object, what: str) -> datetime:
    if not isinstance(when, datetime) or when.tzinfo is None or when.utcoffset() is None:
        raise ValidationError(f"{what} must be an aware datetime, got {when!r}")
    return when.astimezone(UTC)


class FakeClock:
    """A manual UTC clock with timers, usable from any anyio backend.

    ``now()`` returns the current fake time (default start 2030-01-01T00:00Z).
    :meth:`advance` moves it forward and wakes every :meth:`sleep_until` whose time has come;
    :meth:`set` jumps to any instant, backwards too (to test clock jumps). Not thread-safe: call
    it from the event loop that runs the code under test.
    """

    def __init__(self, start: datetime | None = None) -> None:
        self._now = _aware(start, "start") if start is not None else _DEFAULT_START
        self._moved: anyio.Event | None = None
        self._deadlines: list[datetime] = []  # of the tasks blocked in sleep_until
        self._sleepers_changed: anyio.Event | None = None

    def now(self) -> datetime:
        return self._now

    def advance(self, delta: timedelta | float) -> None:
        """Move the clock forward by ``delta`` (a timedelta or seconds, not negative)."""
        if isinstance(delta, bool) or not isinstance(delta, timedelta | int | float):
            raise ValidationError("delta must be a timedelta or a number of seconds")
        step = delta if isinstance(delta, timedelta) else timedelta(seconds=delta)
        if step < timedelta(0):
            raise ValidationError("advance() moves forward only; use set() to jump back")
        self.set(self._now + step)

    def set(self, when: datetime) -> None:
        """Jump to ``when`` (an aware datetime, earlier or later) and wake due sleepers."""
        self._now = _aware(when, "when")
        moved, self._moved = self._moved, None
        if moved is not None:
            moved.set()
        self._changed()

    async def sleep_until(self, when: datetime) -> None:
        """Return once the fake time has reached ``when``; the real time it takes is however
        long the test takes to advance the clock."""
        deadline = _aware(when, "when")
        if self._now >= deadline:
            await anyio.lowlevel.checkpoint()  # a loop of past deadlines must still yield
            return
        self._deadlines.append(deadline)
        self._changed()
        try:
            while self._now < deadline:
                if self._moved is None:
                    self._moved = anyio.Event()
                await self._moved.wait()
        finally:
            self._deadlines.remove(deadline)
            self._changed()

    async def sleep(self, delta: timedelta | float) -> None:
        """Sleep ``delta`` of fake time (see :meth:`sleep_until`)."""
        step = delta if isinstance(delta, timedelta) else timedelta(seconds=delta)
        await self.sleep_until(self._now + step)

    @property
    def sleepers(self) -> int:
        """How many tasks sleep on this clock until a time still to come (a task that
        :meth:`advance` woke no longer counts, although it may not have run yet)."""
        return sum(1 for deadline in self._deadlines if deadline > self._now)

    async def wait_for_sleepers(self, count: int = 1) -> None:
        """Wait until at least ``count`` tasks sleep on this clock until a time still to come:
        right after :meth:`advance`, that is once the hosted ticker has run the pass the
        advance made due and sleeps again. Bound it with ``anyio.fail_after``."""
        while self.sleepers < count:
            if self._sleepers_changed is None:
                self._sleepers_changed = anyio.Event()
            await self._sleepers_changed.wait()

    def _changed(self) -> None:
        changed, self._sleepers_changed = self._sleepers_changed, None
        if changed is not None:
            changed.set()

    def __repr__(self) -> str:
        return f"FakeClock({self._now.isoformat()})"


class LoopClock:
    """A UTC clock that follows the running event loop's clock from ``start``.

    ``now()`` is ``start`` plus the loop time elapsed since the first call; timers are
    ``anyio.sleep``. With trio's ``MockClock`` (``anyio.run(..., backend_options={"clock":
    MockClock(rate=1)})``), ``mock_clock.jump(seconds)`` moves this clock and wakes the hosted
    ticker without real sleeping. Under a real loop clock it runs at real speed.
    """

    def __init__(self, start: datetime | None = None) -> None:
        self._start = _aware(start, "start") if start is not None else _DEFAULT_START
        self._origin: float | None = None

    def now(self) -> datetime:
        loop_now = anyio.current_time()
        if self._origin is None:
            self._origin = loop_now
        return self._start + timedelta(seconds=loop_now - self._origin)

    async def sleep_until(self, when: datetime) -> None:
        await anyio.sleep(max(0.0, (_aware(when, "when") - self.now()).total_seconds()))

    def __repr__(self) -> str:
        return f"LoopClock(start={self._start.isoformat()})"
