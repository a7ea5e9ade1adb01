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
    Complete,
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
    flow_id: str | None = None
    """The flow of a flow node's event (events of different flows may share job ids)."""
    batch_id: str | None = None
    """The batch of a batch member's event, or of a ``batch-completed`` event."""


@dataclass(frozen=True, slots=True)
class QueueState:
    """A queue's persistent controls (see :meth:`JobQueue.get_state`).

    ``paused``: new deliveries and recovery are refused; ``rate_limit_hits``: cumulative
    admissions denied by the rate limit; ``rate_limit``: the stored policy, if any;
    ``max_backlog``: the stored backlog bound, if any (:meth:`JobQueue.set_max_backlog`)."""

    paused: bool
    rate_limit_hits: int
    rate_limit: RateLimit | None = None
    max_backlog: int | None = None


@dataclass(frozen=True, slots=True)
class JobStatus:
    """What a queue can tell reliably about one job id (see :meth:`JobQueue.status`).

    ``state`` is ``"completed"`` or ``"dead-lettered"`` while the worker's retained record
    lives (``WorkerOptions(keep_results=...)``), else ``"unknown"``: never enqueued, still
    waiting or running, retrying, expired, completed by a worker that keeps no records, or
    its record expired. ``result_state`` says what happened to the return value of a
    completed job: ``"value"`` (kept: read it with :meth:`JobQueue.result`),
    ``"result-too-large"``, ``"result-unencodable"`` or ``""``. ``reason`` / ``detail`` are
    the dead-letter reason and the handler's detail; ``finished_at`` is the server time of the
    outcome in unix ms.
    """

    job_id: str
    state: Literal["completed", "dead-lettered", "unknown"]
    entry_id: str | None = None
    attempt: int | None = None
    reason: str | None = None
    detail: str | None = None
    result_state: str = ""
    finished_at: int | None = None


__all__ = [
    "ACK",
    "NACK",
    "Ack",
    "Complete",
    "DeadLetter",
    "DeadLetterReason",
    "Delivery",
    "EnqueueResult",
    "JobEvent",
    "JobStatus",
    "Nack",
    "Outcome",
    "QueueState",
    "RetryAfter",
]
