"""Validation of durations and batch sizes, done before anything is sent to Redis."""

from __future__ import annotations

from datetime import timedelta

from ..actors.options import MIN_VISIBILITY_MS, duration_ms
from ..errors import ValidationError

MAX_MS = 2**31 - 1
MAX_BATCH = 1000

Duration = float | int | timedelta


def to_ms(value: object, what: str, *, allow_zero: bool = False) -> int:
    """A duration (seconds as int/float, or a timedelta) rounded up to whole milliseconds, as
    every duration of the library is (:func:`~respire_actors.actors.options.duration_ms`).

    Raises :class:`ValidationError` unless it is finite, positive (or zero when allowed) and at
    most 2**31-1 ms.
    """
    return duration_ms(value, what=what, allow_zero=allow_zero)  # type: ignore[arg-type]


def to_visibility_ms(value: object, what: str = "visibility") -> int:
    """:func:`to_ms` for a visibility timeout: at least ``MIN_VISIBILITY_MS`` (10 ms), the same
    minimum job and stream workers apply."""
    ms = to_ms(value, what)
    if ms < MIN_VISIBILITY_MS:
        raise ValidationError(f"{what} must be at least {MIN_VISIBILITY_MS} ms, got {value!r}")
    return ms


def check_batch(value: object, what: str = "max") -> int:
    """A batch size in 1..1000."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValidationError(f"{what} must be an int, got {type(value).__name__}")
    if not 1 <= value <= MAX_BATCH:
        raise ValidationError(f"{what} must be between 1 and {MAX_BATCH}, got {value}")
    return value


def check_limit(value: object, what: str) -> int:
    """A positive int up to 2**31-1 (delivery limits, held-message bounds)."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValidationError(f"{what} must be an int, got {type(value).__name__}")
    if not 1 <= value <= MAX_MS:
        raise ValidationError(f"{what} must be between 1 and {MAX_MS}, got {value}")
    return value
