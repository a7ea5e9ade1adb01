"""Per-minute completion counters kept in Redis (``QueueOptions.metrics_retention_minutes``).

The completion scripts count, in the same execution as each terminal event and
acknowledgement, acknowledged successes as *completed* and terminal dead letters as *failed*
(retries, expiries, cancelled batch members and flow parents failed without running are not
counted) in one hash per queue, ``<ready>:metrics``, with one reused slot per minute of the
Redis clock. See docs/observability.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from ..actors.options import MAX_METRICS_MINUTES
from ..errors import ValidationError
from ..keys import JobQueueKeys
from ..redis.client import RedisClient
from ..redis.scripts import load

_READ = load("metrics_read")


@dataclass(frozen=True, slots=True)
class MinuteMetrics:
    """One minute of a queue's completions: ``minute`` is its start (UTC, Redis clock)."""

    minute: datetime
    completed: int
    failed: int


async def read_metrics(
    client: RedisClient, keys: JobQueueKeys, minutes: int = 60
) -> list[MinuteMetrics]:
    """The last ``minutes`` minutes (1-1440, at most the stored retention), oldest first and
    ending with the current, partial minute; minutes without completions read as zeros. An
    empty list when the queue records no metrics (never enabled, or the history expired).
    Raises :class:`ValidationError` for a bad ``minutes`` before anything is sent."""
    if isinstance(minutes, bool) or not isinstance(minutes, int):
        raise ValidationError(f"minutes must be an integer, got {type(minutes).__name__}")
    if not 1 <= minutes <= MAX_METRICS_MINUTES:
        raise ValidationError(f"minutes must be from 1 to {MAX_METRICS_MINUTES}, got {minutes}")
    reply: Any = await _READ(client, (keys.metrics,), (minutes,))
    return [
        MinuteMetrics(datetime.fromtimestamp(int(m) * 60, UTC), int(c), int(f)) for m, c, f in reply
    ]


__all__ = ["MinuteMetrics", "read_metrics"]
