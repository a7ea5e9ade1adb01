"""Child specifications: what to run, when to restart it, how long it gets to stop."""

from __future__ import annotations

import enum
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["ChildSpec", "Restart", "Strategy"]


class Restart(enum.Enum):
    """When a supervisor restarts a child that exited (OTP's restart types)."""

    PERMANENT = "permanent"
    """Always restarted, whether it returned or raised."""

    TRANSIENT = "transient"
    """Restarted only if it exited with an exception; returning normally ends it for good."""

    TEMPORARY = "temporary"
    """Never restarted; once it exits it is removed from the supervisor."""


class Strategy(enum.Enum):
    """Which children a supervisor restarts when one of them must be restarted."""

    ONE_FOR_ONE = "one_for_one"
    """Only the child that exited."""

    ONE_FOR_ALL = "one_for_all"
    """Every child: the others are stopped (reverse order) and all are started again in order."""

    REST_FOR_ONE = "rest_for_one"
    """The child that exited and every child after it in start order."""


def _check_seconds(owner: str, field: str, value: object, *, allow_inf: bool) -> float:
    """Return ``value`` as a float of seconds, or raise a precise TypeError/ValueError."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{owner} {field} must be a number of seconds, got {value!r}")
    seconds = float(value)
    if math.isnan(seconds):
        raise ValueError(f"{owner} {field} must be a number of seconds, got nan")
    if not allow_inf and math.isinf(seconds):
        raise ValueError(f"{owner} {field} must be finite, got {value!r}")
    return seconds


@dataclass(frozen=True, init=False)
class ChildSpec:
    """How a supervisor runs one child.

    ``ChildSpec(name, fn, *args, restart=Restart.PERMANENT, shutdown=5.0)``

    The supervisor starts the child as ``await fn(*args, task_status=...)`` with the semantics of
    ``TaskGroup.start``: the child calls ``task_status.started(value)`` once it is ready, and the
    supervisor waits for that before starting the next child. A child that raises (or returns)
    before calling ``started`` has failed to start. Pass keyword arguments with
    :func:`functools.partial`.

    Args:
        name: unique name of the child within its supervisor (used in logs and snapshots).
        fn: async callable accepting ``*args`` and a ``task_status`` keyword argument.
        *args: positional arguments for ``fn``.
        restart: when the child is restarted after it exits (see :class:`Restart`).
        shutdown: seconds the child gets, after the graceful stop request, before its cancel
            scope is cancelled. ``0`` cancels it at once; ``math.inf`` waits for it however long
            it takes (the usual choice for a nested supervisor).

    Raises:
        TypeError: a field has the wrong type.
        ValueError: ``name`` is empty or ``shutdown`` is negative or NaN.
    """

    name: str
    fn: Callable[..., Awaitable[Any]]
    args: tuple[Any, ...]
    restart: Restart
    shutdown: float

    def __init__(
        self,
        name: str,
        fn: Callable[..., Awaitable[Any]],
        *args: Any,
        restart: Restart = Restart.PERMANENT,
        shutdown: float = 5.0,
    ) -> None:
        if not isinstance(name, str):
            raise TypeError(f"ChildSpec name must be a str, got {name!r}")
        if not name:
            raise ValueError("ChildSpec name must not be empty")
        if not callable(fn):
            raise TypeError(f"ChildSpec {name!r}: fn must be an async callable, got {fn!r}")
        if not isinstance(restart, Restart):
            raise TypeError(
                f"ChildSpec {name!r}: restart must be a supervisors.Restart, got {restart!r}"
            )
        seconds = _check_seconds(f"ChildSpec {name!r}:", "shutdown", shutdown, allow_inf=True)
        if seconds < 0:
            raise ValueError(f"ChildSpec {name!r}: shutdown must be >= 0 seconds, got {shutdown!r}")
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "fn", fn)
        object.__setattr__(self, "args", args)
        object.__setattr__(self, "restart", restart)
        object.__setattr__(self, "shutdown", seconds)
