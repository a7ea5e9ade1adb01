"""The delivery contract shared by a reliable queue and a topic subscription.

Both are an *endpoint*: a stream, one consumer group on it, and the endpoint's own deadline
index, receipts hash and dead-letter stream, all in one cluster slot. The Lua scripts
``rq_receive``, ``rq_ack`` and ``rq_nack`` implement the contract for both; the only difference
is the mode: a queue deletes completed entries, a topic only acknowledges them (other
subscriptions still need them).
"""

from __future__ import annotations

import logging
import re
import time
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any, Generic, Literal, TypeVar

from .. import faults, tracing
from ..actors.options import is_entry_id, iterate
from ..codecs import Codec, DecodeError, check_codec
from ..errors import ConfigurationError, ScriptError, ValidationError
from ..keys import hash_tag, same_slot
from ..redis.client import RedisClient
from ..redis.scripts import load
from ._durations import Duration, check_batch, check_limit, to_ms, to_visibility_ms
from ._types import ConsumerStatistics, DeadLetter, Message
from .errors import MessageDecodeError, SubscriptionNotFound
from .iterator import MessageIterator

log = logging.getLogger("respire_actors.reliable")

T = TypeVar("T")

DEFAULT_DELIVERY_LIMIT = 5
DEFAULT_DEDUP_WINDOW = 86_400.0
CONSUMER_NAME = "respire"
MAX_DEDUP_ID_BYTES = 1024
"""Longest dedup id, in UTF-8 bytes (the same bound as a job id)."""

RECEIVE_SPAN = "message receive"
_RECEIPT = re.compile(r"([0-9]+-[0-9]+):([0-9]+):([0-9]+)")
_MAX_DELIVERIES = 2**31 - 1

Mode = Literal["queue", "topic"]


def check_client(client: object) -> RedisClient:
    if not isinstance(client, RedisClient):
        raise ValidationError(f"client must be a RedisClient, got {type(client).__name__}")
    return client


def check_keys(*keys: str) -> None:
    """Every key of an endpoint must be distinct and hash to one cluster slot."""
    if len(set(keys)) != len(keys):
        raise ConfigurationError(f"queue keys collide: {keys}")
    if not same_slot(*keys):
        tags = sorted({hash_tag(k) for k in keys})
        raise ConfigurationError(
            f"queue keys would span several cluster slots (hash tags {tags}); "
            "check the client key prefix for an empty or unbalanced hash tag"
        )


def check_dedup_id(dedup_id: object) -> str:
    if not isinstance(dedup_id, str):
        raise ValidationError(f"dedup_id must be a str, got {type(dedup_id).__name__}")
    if not dedup_id.strip():
        raise ValidationError("dedup_id must not be blank")
    try:
        size = len(dedup_id.encode("utf-8"))
    except UnicodeEncodeError:
        raise ValidationError("dedup_id is not valid Unicode") from None
    if size > MAX_DEDUP_ID_BYTES:
        raise ValidationError(f"dedup_id is {size} bytes; the limit is {MAX_DEDUP_ID_BYTES}")
    return dedup_id


def parse_receipt(target: object) -> tuple[str, str, str]:
    """(entry id, delivery count, stamp) of a :class:`Message` or a receipt string."""
    receipt = target.receipt if isinstance(target, Message) else target
    if not isinstance(receipt, str):
        raise ValidationError(
            f"expected a Message or its receipt string, got {type(target).__name__}"
        )
    match = _RECEIPT.fullmatch(receipt)
    if (
        match is None
        or not is_entry_id(match.group(1))
        or not 1 <= int(match.group(2)) <= _MAX_DELIVERIES
    ):
        raise ValidationError(
            f"malformed receipt {receipt!r}: expected '<entry id>:<delivery count>:<stamp>' "
            "as Message.receipt gives it"
        )
    return match.group(1), match.group(2), match.group(3)


def _text(value: Any) -> str:
    return value.decode("ascii") if isinstance(value, bytes) else str(value)


class Consumer(Generic[T]):
    """Receive, acknowledge and reject messages of one queue or topic subscription.

    Not constructed directly: use :class:`~respire_actors.reliable.ReliableQueue` or
    :meth:`ReliableTopic.subscription <respire_actors.reliable.ReliableTopic.subscription>`.
    Instances are cheap and hold no connection; the client stays owned by the caller.
    """

    def __init__(
        self,
        client: RedisClient,
        codec: Codec[T],
        *,
        stream: str,
        deadlines: str,
        receipts: str,
        dead: str,
        group: str,
        mode: Mode,
        delivery_limit: int,
        destination: str = "",
    ) -> None:
        check_client(client)
        check_codec(codec)
        self._client = client
        self._codec = codec
        self._stream = stream
        self._deadlines = deadlines
        self._receipts = receipts
        self._dead = dead
        self._group = group
        self._mode: Mode = mode
        self._destination = destination
        self._delivery_limit = check_limit(delivery_limit, "delivery_limit")
        self._iterators: weakref.WeakSet[MessageIterator[T]] = weakref.WeakSet()
        self._stats = ConsumerStatistics()
        check_keys(stream, deadlines, receipts, dead)

    # -- properties ---------------------------------------------------------------------------
    @property
    def client(self) -> RedisClient:
        """The caller-owned client this instance sends commands through."""
        return self._client

    @property
    def codec(self) -> Codec[T]:
        return self._codec

    @property
    def delivery_limit(self) -> int:
        """Deliveries allowed before the next due encounter moves a message to dead letters."""
        return self._delivery_limit

    @property
    def stream_key(self) -> str:
        """The stream holding the payloads."""
        return self._stream

    @property
    def dead_letter_stream_key(self) -> str:
        """The dead-letter stream (fields ``payload``, ``source_id``, ``delivery_count``)."""
        return self._dead

    def statistics(self) -> ConsumerStatistics:
        """Counters of this instance (this process only)."""
        return self._stats

    # -- the contract ---------------------------------------------------------------------------
    async def receive(self, visibility: Duration, *, max: int = 1) -> list[Message[T]]:
        """Lease up to ``max`` (1-1000) messages for ``visibility`` and return them at once.

        Never blocks waiting for messages: an empty list means nothing was due or new. Each call
        first does bounded recovery work on the server: due entries (expired leases, due NACKs)
        are redelivered before new ones, and those already delivered ``delivery_limit`` times are
        moved to the dead-letter stream instead (so a batch can be empty while messages move;
        keep polling). The lease deadline is set by the server's clock; receivers may use
        different durations.

        Raises :class:`ValidationError` for a bad argument (nothing sent),
        :class:`MessageDecodeError` if the codec rejects a payload,
        :class:`~respire_actors.errors.WrongKeyType` /
        :class:`~respire_actors.errors.PermissionDenied` when a key has the wrong type or the
        ACL user lacks a command (checked before the queue changes),
        :class:`~respire_actors.errors.RedisUnavailable` when the connection fails.

        If cancelled, or the reply is lost, or decoding fails, the script may have run and the
        whole batch stays leased: it is redelivered after the visibility timeout and counts
        toward the delivery limit.
        """
        return await self._receive_ms(to_visibility_ms(visibility), check_batch(max))

    async def _receive_ms(self, visibility_ms: int, count: int) -> list[Message[T]]:
        started = time.time_ns()
        try:
            reply = await load("rq_receive")(
                self._client,
                [self._stream, self._deadlines, self._receipts, self._dead],
                [
                    self._group,
                    CONSUMER_NAME,
                    count,
                    visibility_ms,
                    self._delivery_limit,
                    self._mode,
                ],
            )
        except ScriptError as exc:
            if exc.code == "RESPIRE_NOSUBSCRIPTION":
                raise SubscriptionNotFound(str(exc)) from None
            raise
        now = int(reply[0])
        moved = int(reply[1])
        lost = int(reply[2])
        deadline = now + visibility_ms
        raw = reply[3:]
        batch: list[tuple[str, bytes, int, str, str, str]] = [
            (
                _text(raw[i]),
                bytes(raw[i + 1]),
                int(raw[i + 2]),
                _text(raw[i + 3]),
                _text(raw[i + 4]),
                _text(raw[i + 5]),
            )
            for i in range(0, len(raw), 6)
        ]
        if batch and tracing.enabled():
            self._trace_receive(batch, started)
        self._stats = replace(
            self._stats,
            received=self._stats.received + len(batch),
            dead_lettered=self._stats.dead_lettered + moved,
            lost_payloads=self._stats.lost_payloads + lost,
        )
        if lost:
            log.warning(
                "%d leased or handed-back message(s) of %s were gone from the stream (trimmed "
                "or deleted outside this library) and could not be redelivered; their delivery "
                "records were dropped. Never XTRIM or XDEL it by hand: a queue deletes what is "
                "acknowledged and a topic has its own trim (docs/reliable-queue.md)",
                lost,
                self._stream,
            )
        messages: list[Message[T]] = []
        for entry_id, payload, count_, stamp, parent, state in batch:
            try:
                value = self._codec.decode(payload)
            except Exception as exc:
                detail = str(exc)
                if not isinstance(exc, DecodeError):
                    detail = f"{type(exc).__name__}: {detail}"
                raise MessageDecodeError(
                    f"message {entry_id} (delivery {count_}) could not be decoded: {detail}; "
                    f"the batch of {len(batch)} stays leased until it expires",
                    message_id=entry_id,
                    batch_ids=tuple(b[0] for b in batch),
                ) from exc
            messages.append(
                Message(
                    id=entry_id,
                    payload=value,
                    delivery_count=count_,
                    receipt=f"{entry_id}:{count_}:{stamp}",
                    lease_deadline_ms=deadline,
                    traceparent=parent,
                    tracestate=state,
                )
            )
        return messages

    def _trace_receive(
        self, batch: Sequence[tuple[str, bytes, int, str, str, str]], started: int
    ) -> None:
        """A ``message receive`` CONSUMER span for a non-empty batch, linked to each message's
        send."""
        links = [link for b in batch if (link := tracing.link_to(b[4], b[5])) is not None]
        span = tracing.receive_span(
            RECEIVE_SPAN,
            links,
            {
                "messaging.system": tracing.SYSTEM,
                "messaging.destination.name": self._destination,
                "messaging.consumer.group.name": self._group,
                "messaging.operation.type": "receive",
                "messaging.operation.name": "receive",
                "messaging.batch.message_count": len(batch),
            },
            started,
        )
        tracing.end(span)

    async def ack(self, message: Message[Any] | str) -> bool:
        """Complete a delivery: the message and its delivery metadata are removed.

        Returns False if the receipt expired, was revoked by a NACK, was superseded by a
        redelivery or was already completed; a stale receiver never completes a newer delivery.
        Raises :class:`ValidationError` for something that is not a message or receipt.

        If cancelled, or the reply is lost, the outcome is unknown: it may have completed.
        Calling ``ack`` again is safe, but returns False once the first call took effect.
        """
        return (await self.ack_many([message]))[0]

    async def ack_many(self, messages: Iterable[Message[Any] | str]) -> list[bool]:
        """Acknowledge many deliveries in one atomic script; one result per message (see
        :meth:`ack`). Cancellation leaves the same uncertainty as :meth:`ack`."""
        receipts = [parse_receipt(m) for m in iterate(messages, what="messages")]
        if not receipts:
            return []
        faults.point("reliable.before-ack")
        reply = await load("rq_ack")(
            self._client,
            [self._stream, self._deadlines, self._receipts],
            [self._group, self._mode, *[part for r in receipts for part in r]],
        )
        faults.point("reliable.after-ack")
        results = [bool(int(r)) for r in reply]
        self._release(receipts)
        done = sum(results)
        self._stats = replace(
            self._stats,
            acked=self._stats.acked + done,
            rejected_receipts=self._stats.rejected_receipts + len(results) - done,
        )
        return results

    async def nack(self, message: Message[Any] | str, delay: Duration = 0) -> bool:
        """Reject a delivery: its receipt is revoked now and the message is due again after
        ``delay`` (zero: immediately) on the server clock. A positive delay replaces what is
        left of the visibility timeout.

        Returns False for an expired, revoked, superseded or completed receipt (nothing
        changes). Raises :class:`ValidationError` for a negative or unbounded delay.

        If cancelled, or the reply is lost, the outcome is unknown; repeating it is safe.
        """
        return (await self.nack_many([message], delay))[0]

    async def nack_many(
        self, messages: Iterable[Message[Any] | str], delay: Duration = 0
    ) -> list[bool]:
        """Reject many deliveries with one delay, atomically; one result per message (see
        :meth:`nack`). Cancellation leaves the same uncertainty as :meth:`nack`."""
        delay_ms = to_ms(delay, "delay", allow_zero=True)
        receipts = [parse_receipt(m) for m in iterate(messages, what="messages")]
        if not receipts:
            return []
        reply = await load("rq_nack")(
            self._client,
            [self._stream, self._deadlines, self._receipts],
            [delay_ms, *[part for r in receipts for part in r]],
        )
        results = [bool(int(r)) for r in reply]
        self._release(receipts)
        done = sum(results)
        self._stats = replace(
            self._stats,
            nacked=self._stats.nacked + done,
            rejected_receipts=self._stats.rejected_receipts + len(results) - done,
        )
        return results

    async def _release_unseen(self, messages: Iterable[Message[Any]]) -> list[bool]:
        """Hand back leased messages the application never saw (an iterator's buffer): due
        again at once, and their delivery not counted (the next one has the same count).
        One result per message, as :meth:`nack` gives. If cancelled, or the reply is lost,
        some may have been handed back; the others stay leased until their visibility ends."""
        receipts = [parse_receipt(m) for m in messages]
        if not receipts:
            return []
        reply = await load("rq_nack")(
            self._client,
            [self._stream, self._deadlines, self._receipts],
            ["release", *[part for r in receipts for part in r]],
        )
        self._release(receipts)
        return [bool(int(r)) for r in reply]

    def iter_messages(
        self,
        visibility: Duration,
        *,
        batch_size: int = 10,
        max_leased: int | None = None,
        poll_interval: Duration = 0.1,
        max_poll_interval: Duration = 2.0,
    ) -> MessageIterator[T]:
        """An async iterator that polls :meth:`receive` and yields messages one at a time.

        At most ``max_leased`` messages (default ``batch_size``) are held at once: those
        buffered plus those yielded and not yet completed through *this* instance (``ack`` /
        ``nack``); a yielded message also stops counting once its visibility has elapsed. When
        the queue is empty it sleeps ``poll_interval``, doubling up to ``max_poll_interval``,
        and resets after a non-empty batch. A buffered message is yielded only while at least
        a tenth of the visibility timeout (at most 1 s) surely remains of its lease; one with
        less is handed back unseen (its delivery not counted) and received again.

        Raises :class:`ValidationError` (nothing sent) for a visibility under 10 ms,
        ``max_leased < batch_size`` or ``max_poll_interval < poll_interval``. Use
        ``async with`` (or call ``aclose()``) to hand buffered, not yet yielded messages back
        at once (NACK with no delay).

        If the iteration is cancelled, messages buffered but not yielded stay leased until
        their visibility timeout (unless ``aclose`` runs). A receive cancelled in flight may
        have leased a batch the iterator never saw: those also come back after the timeout,
        and are not counted against ``max_leased``.
        """

        lease_ms = to_visibility_ms(visibility)
        batch = check_batch(batch_size, "batch_size")
        held = check_limit(max_leased if max_leased is not None else batch, "max_leased")
        if held < batch:
            raise ValidationError(f"max_leased ({held}) must be at least batch_size ({batch})")
        poll_ms = to_ms(poll_interval, "poll_interval")
        max_poll_ms = to_ms(max_poll_interval, "max_poll_interval")
        if max_poll_ms < poll_ms:
            raise ValidationError(
                f"max_poll_interval ({max_poll_ms} ms) must be at least poll_interval "
                f"({poll_ms} ms)"
            )
        iterator: MessageIterator[T] = MessageIterator(
            self,
            lease_ms,
            batch_size=batch,
            max_leased=held,
            poll_interval=poll_ms / 1000,
            max_poll_interval=max_poll_ms / 1000,
        )
        self._iterators.add(iterator)
        return iterator

    def _release(self, receipts: Sequence[tuple[str, str, str]]) -> None:
        if not self._iterators:
            return
        tokens = [f"{i}:{c}:{s}" for i, c, s in receipts]
        for iterator in list(self._iterators):
            iterator._release(tokens)

    # -- dead letters -----------------------------------------------------------------------------
    async def dead_letters(self, count: int = 100, *, after: str | None = None) -> list[DeadLetter]:
        """Read up to ``count`` dead letters, oldest first, after the entry id ``after``.

        They stay in the stream until your application trims or deletes them. To replay one,
        decode its payload with the codec and send it again (a new dedup id, or after the old
        window). Read-only: cancelling it leaves nothing behind.
        """
        count = check_batch(count, "count")
        start = "-"
        if after is not None:
            if not isinstance(after, str) or not is_entry_id(after):
                raise ValidationError(f"after must be a stream id like '1-0', got {after!r}")
            start = "(" + after
        reply = await self._client.execute("XRANGE", self._dead, start, "+", "COUNT", count)
        letters: list[DeadLetter] = []
        for entry_id, fields in reply or []:
            data = {_text(fields[i]): fields[i + 1] for i in range(0, len(fields), 2)}
            letters.append(
                DeadLetter(
                    id=_text(entry_id),
                    payload=bytes(data.get("payload", b"")),
                    source_id=_text(data.get("source_id", b"")),
                    delivery_count=int(data.get("delivery_count", 0)),
                )
            )
        return letters


__all__ = ["Consumer"]
