"""Reliable message queues and topics on Redis Streams, without a hosted worker.

* :class:`ReliableQueue` — send, then receive batches with a visibility timeout and
  ``ack`` / ``nack`` each delivery by its receipt; a delivery limit moves poison messages to a
  dead-letter stream; optional deduplication of sends.
* :class:`ReliableTopic` — every named :class:`Subscription` receives each retained
  publication independently, with the same contract; retention never trims what a
  subscription still needs.

Delivery is at least once. Receive calls do the recovery and dead-letter work themselves, so
nothing else needs to run. See ``docs/reliable-queue.md`` and ``docs/topics.md``.
"""

from ._consumer import Consumer
from ._durations import Duration
from ._types import (
    ConsumerStatistics,
    DeadLetter,
    Message,
    QueueState,
    SubscriptionInfo,
    TrimResult,
)
from .errors import MessageDecodeError, SubscriptionNotFound
from .iterator import MessageIterator
from .queue import ReliableQueue
from .topic import ReliableTopic, Start, Subscription

__all__ = [
    "Consumer",
    "ConsumerStatistics",
    "DeadLetter",
    "Duration",
    "Message",
    "MessageDecodeError",
    "MessageIterator",
    "QueueState",
    "ReliableQueue",
    "ReliableTopic",
    "Start",
    "Subscription",
    "SubscriptionNotFound",
    "SubscriptionInfo",
    "TrimResult",
]
