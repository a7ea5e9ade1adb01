"""The reliable message queue: send, receive with a visibility timeout, ack or nack."""

from __future__ import annotations

from collections.abc import Iterable
from contextlib import ExitStack
from typing import TypeVar

from .. import tracing
from ..actors.options import iterate
from ..codecs import Codec, check_codec, encode_with
from ..keys import ReliableQueueKeys
from ..redis.client import RedisClient
from ..redis.scripts import load
from ._consumer import (
    DEFAULT_DEDUP_WINDOW,
    DEFAULT_DELIVERY_LIMIT,
    Consumer,
    check_client,
    check_dedup_id,
    check_keys,
)
from ._durations import Duration, to_ms
from ._types import QueueState

T = TypeVar("T")

QUEUE_GROUP = "respire"
SEND_SPAN = "message send"


async def append(
    client: RedisClient,
    stream: str,
    dedup_key: str | None,
    data: bytes,
    window_ms: int,
    destination: str = "",
) -> str:
    """Append one encoded payload, deduplicated by ``dedup_key`` when given, under a
    ``message send`` producer span whose context is stored with the message (a duplicate keeps
    the first message's)."""
    with tracing.producer_span(SEND_SPAN, destination) as span:
        trace = tracing.context_fields(span)
        if dedup_key is None:
            reply = await client.execute("XADD", stream, "*", "p", data, *trace)
            entry_id = _text(reply)
            tracing.set_attributes(span, {"messaging.message.id": entry_id})
            return entry_id
        entry_id, new = await load("rq_send")(
            client, [stream, dedup_key], [data, window_ms, *trace]
        )
        tracing.set_attributes(
            span,
            {"messaging.message.id": _text(entry_id), "respire.deduplicated": not int(new)},
        )
        return _text(entry_id)


async def append_many(
    client: RedisClient, stream: str, items: list[bytes], destination: str = ""
) -> list[str]:
    """Append many encoded payloads in one pipelined round trip (each append is atomic), each
    under its own producer span."""
    with ExitStack() as stack:
        spans = [stack.enter_context(tracing.producer_span(SEND_SPAN, destination)) for _ in items]
        replies = await client.pipeline(
            [
                ("XADD", stream, "*", "p", data, *tracing.context_fields(span))
                for data, span in zip(items, spans, strict=True)
            ]
        )
        ids: list[str] = []
        for reply, span in zip(replies, spans, strict=True):
            if isinstance(reply, BaseException):
                raise reply
            ids.append(_text(reply))
            tracing.set_attributes(span, {"messaging.message.id": ids[-1]})
        return ids


def _text(value: object) -> str:
    return value.decode("ascii") if isinstance(value, bytes) else str(value)


class ReliableQueue(Consumer[T]):
    """A typed message queue on a Redis stream, with visibility timeouts and receipts.

    ::

        queue = ReliableQueue(client, "notifications", StrCodec())
        await queue.send("order 42 shipped", dedup_id="order-42-shipped")
        for message in await queue.receive(30, max=10):
            try:
                handle(message.payload)          # make this idempotent: delivery is at least once
                await queue.ack(message)         # False: the lease expired or was superseded
            except Exception:
                await queue.nack(message, 10)    # due again in 10 s

    ``client`` stays owned by the caller (enter it before use); its key prefix is honoured.
    ``codec`` must be thread-safe and, like ``delivery_limit`` (default 5), the same for every
    instance sharing the queue. ``dedup_window`` (seconds or timedelta, default one day) bounds
    how long a ``dedup_id`` suppresses duplicate sends. Keys share the hash tag
    ``{respire-queue:<name>}``; see ``docs/reliable-queue.md``.

    Raises :class:`~respire_actors.errors.ValidationError` for a bad name, codec or setting and
    :class:`~respire_actors.errors.ConfigurationError` if the key prefix splits the queue's keys
    across cluster slots; nothing is sent to Redis by the constructor.
    """

    def __init__(
        self,
        client: RedisClient,
        name: str,
        codec: Codec[T],
        *,
        delivery_limit: int = DEFAULT_DELIVERY_LIMIT,
        dedup_window: Duration = DEFAULT_DEDUP_WINDOW,
    ) -> None:
        check_client(client)
        check_codec(codec)
        keys = ReliableQueueKeys(name, client.key_prefix, "queue")
        self._keys = keys
        self._name = name
        self._dedup_window_ms = to_ms(dedup_window, "dedup_window")
        super().__init__(
            client,
            codec,
            stream=keys.stream,
            deadlines=keys.deadlines,
            receipts=keys.receipts,
            dead=keys.dead,
            group=QUEUE_GROUP,
            mode="queue",
            delivery_limit=delivery_limit,
            destination=name,
        )
        check_keys(keys.stream, keys.deadlines, keys.receipts, keys.dead, keys.dedup("x"))

    @property
    def name(self) -> str:
        return self._name

    @property
    def keys(self) -> ReliableQueueKeys:
        """Every key name of this queue (with the client's key prefix)."""
        return self._keys

    async def send(self, payload: T, *, dedup_id: str | None = None) -> str:
        """Append ``payload`` and return its message id.

        With ``dedup_id``, a send repeated within the dedup window appends nothing and returns
        the first send's id (its payload is kept, even after it was acknowledged or
        dead-lettered; the window is not extended). Reuse the id when retrying a send whose
        outcome is unknown. Without it, every call appends a new message.

        Raises :class:`~respire_actors.codecs.EncodeError` or :class:`ValidationError` before
        anything is sent. If cancelled, or the reply is lost, the message may have been
        appended: retry with the same ``dedup_id`` to be sure of exactly one.
        """
        data = encode_with(self._codec, payload, limit=self._client.settings.max_payload_bytes)
        dedup_key = self._keys.dedup(check_dedup_id(dedup_id)) if dedup_id is not None else None
        return await append(
            self._client, self._stream, dedup_key, data, self._dedup_window_ms, self._name
        )

    async def send_many(self, payloads: Iterable[T]) -> list[str]:
        """Append many payloads (no deduplication) in one pipelined round trip; their ids in
        order. Every payload is encoded before anything is sent.

        Each append is atomic, the batch is not: if the call fails midway or its reply is lost,
        some may have been appended. The pipeline is shielded from cancellation once sent.
        """
        limit = self._client.settings.max_payload_bytes
        items = [
            encode_with(self._codec, p, limit=limit) for p in iterate(payloads, what="payloads")
        ]
        if not items:
            return []
        return await append_many(self._client, self._stream, items, self._name)

    async def inspect(self) -> QueueState:
        """Count messages, in-flight deliveries and dead letters (read-only, one round trip).

        The counts are read together but not atomically. Read-only: cancelling it leaves
        nothing behind.
        """
        length, in_flight, dead = await self._client.pipeline(
            [("XLEN", self._stream), ("ZCARD", self._deadlines), ("XLEN", self._dead)]
        )
        for value in (length, in_flight, dead):
            if isinstance(value, BaseException):
                raise value
        return QueueState(messages=int(length), in_flight=int(in_flight), dead_letters=int(dead))

    def __repr__(self) -> str:
        return f"ReliableQueue({self._name!r}, codec={self._codec!r})"
