"""Validation of durations and batch sizes, done before anything is sent to Redis."""

from __future__ import annotations

import math
from datetime import timedelta

from ..actors.options import MIN_VISIBILITY_MS
from ..errors import ValidationError

MAX_MS = 2**31 - 1
MAX_BATCH = 1000

Duration = float | int | timedelta


def to_ms(value: object, what: str, *, allow_zero: bool = False) -> int:
    """A duration (seconds as int/float, or a timedelta) rounded up to whole milliseconds.

    Raises :class:`ValidationError` unless it is finite, positive (or zero when allowed) and at
    most 2**31-1 ms.
    """
    if isinstance(value, timedelta):
        micros = value // timedelta(microseconds=1)
    elif isinstance(value, int | float) and not isinstance(value, bool):
        if isinstance(value, int) and abs(value) > MAX_MS:
            # math.isfinite(10**400) would raise OverflowError; it is out of range anyway
            raise ValidationError(f"{what} must be at most {MAX_MS} ms, got {value!r} s")
        if not math.isfinite(value):
            raise ValidationError(f"{what} must be finite, got {value!r}")
        if value * 1000 > MAX_MS:
            raise ValidationError(f"{what} must be at most {MAX_MS} ms, got {value!r} s")
        # microsecond precision first, so 0.2 s is 200 ms and not 201
        micros = round(value * 1_000_000)
    else:
        raise ValidationError(
            f"{what} must be seconds (int or float) or a timedelta, got {type(value).__name__}"
        )
    if micros < 0 or (micros == 0 and not allow_zero):
        bound = "zero or positive" if allow_zero else "positive"
        raise ValidationError(f"{what} must be {bound}, got {value!r}")
    ms = -(-micros // 1000)
    if ms > MAX_MS:
        raise ValidationError(f"{what} must be at most {MAX_MS} ms, got {value!r}")
    return ms


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
