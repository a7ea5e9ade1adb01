"""Values handed to and returned from handlers, and read back by producers."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Literal

from .options import RateLimit


class DeadLetterReason(StrEnum):
    """Why a job ended in the dead-letter stream."""

    EXPLICIT = "explicit"
    NACK = "nack"
    PROCESSING_FAILED = "processing-failed"
    DELIVERY_LIMIT = "delivery-limit"


@dataclass(frozen=True, slots=True)
class Ack:
    """Success: publish a completed event and acknowledge, atomically."""


@dataclass(frozen=True, slots=True)
class Nack:
    """Failure: leave the delivery for visibility recovery, or dead-letter it at the limit."""


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """Give up now: copy the job to the dead-letter stream with a reason, and acknowledge."""

    reason: str = DeadLetterReason.EXPLICIT.value


@dataclass(frozen=True, slots=True)
class RetryAfter:
    """Failure with an explicit retry delay (from :meth:`Job.retry_after`): a durable retry due
    ``delay_ms`` after the retry transition commits, overriding the queue's backoff (and its
    cap) but never the delivery limit or the job's TTL. Needs :class:`QueueOptions` on the
    registration; without them it behaves as :class:`Nack`."""

    delay_ms: int


Outcome = Ack | Nack | DeadLetter | RetryAfter

ACK = Ack()
NACK = Nack()


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


@dataclass(slots=True)
class Delivery:
    """A claimed stream entry, before decoding. ``attempt`` is its delivery count;
    ``received_at`` the local monotonic time the claiming read returned (lease start)."""

    entry_id: str
    fields: Mapping[bytes, bytes]
    attempt: int
    received_at: float = 0.0

    @property
    def job_id(self) -> str:
        return self.fields.get(b"_respire.job.id", b"").decode("utf-8", "replace")

    @property
    def prior_attempts(self) -> int:
        raw = self.fields.get(b"_respire.job.attempts")
        return int(raw) if raw else 0

    @property
    def expires_at(self) -> int | None:
        """Absolute expiry in unix ms (server clock), or None."""
        raw = self.fields.get(b"_respire.job.expires_at")
        return int(raw) if raw else None

    @property
    def priority(self) -> int:
        raw = self.fields.get(b"_respire.job.priority")
        return int(raw) if raw else 0

    @property
    def payload(self) -> bytes:
        return self.fields.get(b"_respire.job.payload", b"")
