"""Values handed to and returned from handlers, and read back by producers.

The outcomes and :class:`Delivery` are shared with stream workers and live in
:mod:`respire_actors.actors.messages`; they are re-exported here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from ..actors.messages import (
    ACK,
    NACK,
    Ack,
    DeadLetter,
    DeadLetterReason,
    Delivery,
    Nack,
    Outcome,
    RetryAfter,
)
from .options import RateLimit


@dataclass(frozen=True, slots=True)
class EnqueueResult:
    """``entry_id`` of the stream entry; ``enqueued`` is False for a deduplicated call, whose
    ``entry_id`` is the original job's."""

    entry_id: str
    enqueued: bool


@dataclass(frozen=True, slots=True)
class JobEvent:
    """One event of a queue's event stream. ``id`` is its cursor for checkpointing."""

    id: str
    kind: Literal["progress", "completed", "dead-letter", "paused", "resumed"] | str
    job_id: str
    entry_id: str
    attempt: int
    percent: int | None = None
    reason: str | None = None
    extra: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class QueueState:
    """A queue's persistent controls (see :meth:`JobQueue.get_state`).

    ``paused``: new deliveries and recovery are refused; ``rate_limit_hits``: cumulative
    admissions denied by the rate limit; ``rate_limit``: the stored policy, if any."""

    paused: bool
    rate_limit_hits: int
    rate_limit: RateLimit | None = None


__all__ = [
    "ACK",
    "NACK",
    "Ack",
    "DeadLetter",
    "DeadLetterReason",
    "Delivery",
    "EnqueueResult",
    "JobEvent",
    "Nack",
    "Outcome",
    "QueueState",
    "RetryAfter",
]
