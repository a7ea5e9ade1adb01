"""Pure decisions: whether to restart, which children, how many restarts, how long to wait.

Nothing here awaits or reads a clock of its own: time comes in through an injected ``clock``
(a callable returning seconds) and randomness through an injected ``random`` (a callable
returning a float in ``[0, 1)``), so tests drive every decision directly.
"""

from __future__ import annotations

import collections
import math
import random as _random
from collections.abc import Callable
from dataclasses import dataclass

from ._spec import Restart, Strategy, _check_seconds

__all__ = ["Backoff", "BackoffTracker", "RestartIntensity", "restart_range", "should_restart"]

Clock = Callable[[], float]
RandomSource = Callable[[], float]


def should_restart(restart: Restart, error: BaseException | None) -> bool:
    """Whether a child that exited (``error`` is ``None`` for a normal return) is restarted."""
    if restart is Restart.PERMANENT:
        return True
    if restart is Restart.TRANSIENT:
        return error is not None
    return False


def restart_range(strategy: Strategy, index: int, count: int) -> range:
    """Indices (in start order) of the children restarted when child ``index`` of ``count`` is.

    The supervisor stops these (except ``index`` itself, which already exited) in reverse order
    and starts them again in order.
    """
    if not 0 <= index < count:
        raise IndexError(f"child index {index} out of range for {count} children")
    if strategy is Strategy.ONE_FOR_ONE:
        return range(index, index + 1)
    if strategy is Strategy.REST_FOR_ONE:
        return range(index, count)
    return range(count)


class RestartIntensity:
    """Counts a supervisor's restarts (of all its children together) in a sliding window.

    :meth:`record` is called once per restart the supervisor is about to make; when it returns
    ``False``, more than ``max_restarts`` restarts would have happened within ``period`` seconds
    and the supervisor gives up. A restart made at time ``t`` stops counting once
    ``clock() - t >= period``.

    Args:
        max_restarts: restarts allowed within the window (``0``: the first restart is refused).
        period: window length in seconds.
        clock: returns the current time in seconds (monotonic).

    Raises:
        TypeError, ValueError: ``max_restarts`` is not an int >= 0, or ``period`` is not > 0.
    """

    def __init__(self, max_restarts: int, period: float, *, clock: Clock) -> None:
        if isinstance(max_restarts, bool) or not isinstance(max_restarts, int):
            raise TypeError(f"max_restarts must be an int, got {max_restarts!r}")
        if max_restarts < 0:
            raise ValueError(f"max_restarts must be >= 0, got {max_restarts}")
        seconds = _check_seconds("restart intensity", "period", period, allow_inf=False)
        if seconds <= 0:
            raise ValueError(f"period must be > 0 seconds, got {period!r}")
        self.max_restarts = max_restarts
        self.period = seconds
        self._clock = clock
        # Only the newest max_restarts + 1 timestamps can ever decide the outcome, so the
        # window is bounded however long the supervisor runs.
        self._restarts: collections.deque[float] = collections.deque(maxlen=max_restarts + 1)

    def _expire(self, now: float) -> None:
        while self._restarts and now - self._restarts[0] >= self.period:
            self._restarts.popleft()

    def record(self) -> bool:
        """Record one restart now; return ``False`` if that exceeds the intensity."""
        now = self._clock()
        self._expire(now)
        self._restarts.append(now)
        return len(self._restarts) <= self.max_restarts

    @property
    def restarts_in_period(self) -> int:
        """Restarts recorded within the last ``period`` seconds (including a refused one)."""
        self._expire(self._clock())
        return len(self._restarts)

    def __repr__(self) -> str:
        return (
            f"RestartIntensity(max_restarts={self.max_restarts}, period={self.period:g}, "
            f"restarts_in_period={self.restarts_in_period})"
        )


@dataclass(frozen=True)
class Backoff:
    """Exponential restart delay with jitter and a cap.

    The delay before restart number ``attempt`` (0 for the first restart after a healthy run) is
    ``min(maximum, initial * factor ** attempt)``, multiplied by a random factor drawn uniformly
    from ``[1 - jitter, 1 + jitter]``, and finally capped at ``maximum`` again (so jitter never
    pushes a delay past the cap).

    Reset rule: a child that ran for at least ``reset_after`` seconds after reporting ready is
    considered healthy; when it next exits its attempt count starts again at 0. A child that
    fails during start never ran, so its count keeps growing.

    Args:
        initial: delay before the first restart, seconds (``0`` disables waiting).
        factor: growth per consecutive restart (>= 1).
        maximum: cap on any delay, seconds (>= ``initial``).
        jitter: relative spread of the random factor, in ``[0, 1]``.
        reset_after: healthy run time, seconds, after which the attempt count resets (> 0).

    Raises:
        TypeError, ValueError: with the field name and the rule it broke.
    """

    initial: float = 0.05
    factor: float = 2.0
    maximum: float = 5.0
    jitter: float = 0.1
    reset_after: float = 10.0

    def __post_init__(self) -> None:
        for field in ("initial", "factor", "maximum", "jitter", "reset_after"):
            object.__setattr__(
                self, field, _check_seconds("Backoff", field, getattr(self, field), allow_inf=False)
            )
        if self.initial < 0:
            raise ValueError(f"Backoff initial must be >= 0, got {self.initial!r}")
        if self.factor < 1:
            raise ValueError(f"Backoff factor must be >= 1, got {self.factor!r}")
        if self.maximum < self.initial:
            raise ValueError(
                f"Backoff maximum must be >= initial ({self.initial!r}), got {self.maximum!r}"
            )
        if not 0 <= self.jitter <= 1:
            raise ValueError(f"Backoff jitter must be within [0, 1], got {self.jitter!r}")
        if self.reset_after <= 0:
            raise ValueError(f"Backoff reset_after must be > 0, got {self.reset_after!r}")

    def base_delay(self, attempt: int) -> float:
        """The delay before restart ``attempt`` without jitter."""
        if attempt < 0:
            raise ValueError(f"attempt must be >= 0, got {attempt}")
        if self.initial == 0:
            return 0.0
        # Compare exponents rather than computing factor ** attempt, which overflows a float
        # for a child that has been failing for a long time.
        if self.factor > 1 and attempt > math.log(self.maximum / self.initial, self.factor):
            return self.maximum
        return min(self.maximum, self.initial * self.factor**attempt)

    def delay(self, attempt: int, *, random: RandomSource = _random.random) -> float:
        """The delay before restart ``attempt``, jittered with one draw from ``random``."""
        base = self.base_delay(attempt)
        spread = self.jitter * (2.0 * random() - 1.0)
        return min(self.maximum, max(0.0, base * (1.0 + spread)))


class BackoffTracker:
    """The restart delays of one child: :class:`Backoff` plus its attempt count.

    The supervisor calls :meth:`started` when the child reports ready and :meth:`next_delay`
    when it must restart the child; see :class:`Backoff` for the reset rule.

    Args:
        backoff: the delay schedule.
        clock: returns the current time in seconds (monotonic).
        random: returns a float in ``[0, 1)`` for the jitter.
    """

    def __init__(
        self, backoff: Backoff, *, clock: Clock, random: RandomSource = _random.random
    ) -> None:
        self.backoff = backoff
        self._clock = clock
        self._random = random
        self._ready_at: float | None = None
        self.attempt = 0
        """Consecutive restarts so far (the next delay uses this value)."""

    def started(self) -> None:
        """The child reported ready now."""
        self._ready_at = self._clock()

    def next_delay(self) -> float:
        """Decide the delay before restarting the child, which has just exited or failed."""
        if (
            self._ready_at is not None
            and self._clock() - self._ready_at >= self.backoff.reset_after
        ):
            self.attempt = 0
        self._ready_at = None
        delay = self.backoff.delay(self.attempt, random=self._random)
        self.attempt += 1
        return delay
