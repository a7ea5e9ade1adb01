"""Value types returned by reliable queues and topics."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Message(Generic[T]):
    """One delivery of a message.

    ``id`` is the message's stream id, stable across redeliveries. ``delivery_count`` starts at
    1 and grows with every redelivery. ``receipt`` is an opaque token fencing this delivery:
    pass the message (or the receipt) to ``ack``/``nack`` on any instance sharing the queue.
    ``lease_deadline_ms`` is the server-clock time (Redis ``TIME``, ms) at which the lease
    ends unless the message is acknowledged or rejected first. ``traceparent`` and
    ``tracestate`` are the W3C context of the send that created the message ('' when none; see
    ``respire_actors.tracing.link_to``).
    """

    id: str
    payload: T
    delivery_count: int
    receipt: str
    lease_deadline_ms: int
    traceparent: str = ""
    tracestate: str = ""


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """An entry of a dead-letter stream: the undecoded payload, where it came from and how
    many deliveries it had when it was moved."""

    id: str
    payload: bytes
    source_id: str
    delivery_count: int


@dataclass(frozen=True, slots=True)
class QueueState:
    """A snapshot of a queue's size, read with one round trip (not atomic across fields).

    ``messages`` counts every message not yet acknowledged or dead-lettered; ``in_flight`` those
    delivered at least once and not completed (leased, or waiting after a NACK or an expired
    lease); ``dead_letters`` the entries of the dead-letter stream.
    """

    messages: int
    in_flight: int
    dead_letters: int

    @property
    def never_delivered(self) -> int:
        return max(self.messages - self.in_flight, 0)


@dataclass(frozen=True, slots=True)
class SubscriptionInfo:
    """One subscription of a topic, as the server reports it.

    ``pending`` counts publications delivered to this subscription and not yet acknowledged or
    dead-lettered; ``lag`` the retained publications not yet delivered to it (``None`` when the
    server cannot tell, e.g. after deletions). ``last_delivered_id`` is its read position.
    """

    name: str
    pending: int
    lag: int | None
    last_delivered_id: str


@dataclass(frozen=True, slots=True)
class TrimResult:
    """What :meth:`ReliableTopic.trim` did.

    ``removed`` entries were deleted below ``cutoff`` (the exact MINID used). ``policy_cutoff``
    is where the retention policy alone would have cut (with ``max_length`` and a subscription
    holding the cut, an id past every subscription's boundary: the length cutoff is not looked
    for further than that); ``held_by`` names the subscriptions whose pending or undelivered
    publications kept the cutoff below it.
    """

    removed: int
    cutoff: str | None
    policy_cutoff: str | None
    held_by: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ConsumerStatistics:
    """Counters of one queue or subscription instance (this process only, since creation)."""

    received: int = 0
    dead_lettered: int = 0
    acked: int = 0
    nacked: int = 0
    rejected_receipts: int = 0
    lost_payloads: int = 0
    """Due messages (expired leases, handed-back NACKs) whose stream entry was gone when they
    came due (trimmed or deleted outside this library): dropped, each logged as a warning."""
