"""What flows between the actors and the handlers they run: deliveries claimed from a stream,
the outcomes handlers return, and the completions the completer commits.

Shared by every consumer (job workers, stream workers), so it lives with the actors.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum


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


@dataclass(frozen=True, slots=True)
class Completion:
    """An outcome on its way to the completer."""

    delivery: Delivery
    kind: str  # 'ack' | 'dead' | 'expired' | 'retry'
    reason: str = ""
    delay_ms: int = 0  # 'retry': stage the new entry due this long after the transition
