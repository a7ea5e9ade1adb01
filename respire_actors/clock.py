"""The UTC clock recurring scheduling reads, and the timers its hosted ticker sleeps on.

Recurring schedules decide what is due from the application's clock (the seed's
``TimeProvider``), not from Redis ``TIME``: delayed jobs, TTLs and rate limits keep using Redis
server time. A clock is anything with ``now()`` (an aware UTC :class:`~datetime.datetime`) and
``await sleep_until(when)``. :class:`SystemClock` is the real one;
:class:`respire_actors.testing.FakeClock` is a manual one for tests.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Protocol, runtime_checkable

import anyio

from .errors import ValidationError

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
MAX_UNIX_MS = (datetime(9999, 12, 31, 23, 59, 59, 999000, tzinfo=UTC) - EPOCH) // timedelta(
    milliseconds=1
)
"""The last representable instant (end of year 9999), in unix milliseconds."""


@runtime_checkable
class Clock(Protocol):
    """A UTC clock with timers. ``now()`` must return an aware datetime; ``sleep_until`` returns
    once ``now()`` has reached ``when`` (it may return early only when cancelled)."""

    def now(self) -> datetime: ...

    async def sleep_until(self, when: datetime) -> None: ...


class SystemClock:
    """The system's UTC wall clock; timers sleep on the event loop (``anyio.sleep``).

    A wall clock that jumps while a timer sleeps does not move that timer: it wakes after the
    duration it computed, and the next pass reads the new time.
    """

    def now(self) -> datetime:
        return datetime.now(UTC)

    async def sleep_until(self, when: datetime) -> None:
        await anyio.sleep(max(0.0, (when - self.now()).total_seconds()))

    def __repr__(self) -> str:
        return "SystemClock()"


def check_clock(clock: object) -> Clock:
    """Raise :class:`ValidationError` unless ``clock`` has ``now`` and ``sleep_until``."""
    if not isinstance(clock, Clock):
        raise ValidationError(
            f"clock must have now() and async sleep_until(), got {type(clock).__name__}"
        )
    return clock


def utc_now_ms(clock: Clock) -> int:
    """``clock.now()`` in unix milliseconds (floored); raises :class:`ValidationError` for a
    naive datetime or one outside the representable range."""
    now = clock.now()
    if not isinstance(now, datetime) or now.tzinfo is None or now.utcoffset() is None:
        raise ValidationError(f"clock.now() must return an aware datetime, got {now!r}")
    return to_unix_ms(now)


def to_unix_ms(when: datetime) -> int:
    """An aware datetime as unix milliseconds (floored)."""
    return (when - EPOCH) // timedelta(milliseconds=1)


def from_unix_ms(ms: int) -> datetime:
    """Unix milliseconds as an aware UTC datetime."""
    return EPOCH + timedelta(milliseconds=ms)
