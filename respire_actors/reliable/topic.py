"""The reliable topic: one stream, one consumer group per named subscription.

Every subscription receives each retained publication independently, with the same
receive / ack / nack / visibility / delivery-limit / dead-letter contract as a reliable queue,
and its own deadline index, receipts and dead-letter stream under the topic's hash tag.
Publications are deleted only by :meth:`ReliableTopic.trim`, which never removes one that a
subscription still needs.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta
from typing import Any, Generic, Literal, TypeVar

from ..actors.options import is_entry_id, iterate, retention_age_ms, validate_max_length
from ..codecs import Codec, check_codec, encode_with
from ..errors import ValidationError
from ..keys import ReliableQueueKeys, validate_name
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
from ._types import SubscriptionInfo, TrimResult
from .queue import append, append_many

T = TypeVar("T")

Start = Literal["beginning", "tail"]


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


class Subscription(Consumer[T]):
    """One named subscription of a :class:`ReliableTopic`: receive, ack and nack exactly as on
    a :class:`~respire_actors.reliable.ReliableQueue`.

    Obtain it with :meth:`ReliableTopic.subscription`. Acknowledging only completes the
    publication for this subscription; the entry stays for the others until trimmed. Receiving
    from a subscription that was never created (or was removed) raises
    :class:`~respire_actors.reliable.SubscriptionNotFound`.
    """

    def __init__(self, topic: ReliableTopic[T], name: str, *, delivery_limit: int) -> None:
        validate_name(name, what="subscription name")
        keys = topic.keys
        self._topic = topic
        self._name = name
        super().__init__(
            topic.client,
            topic.codec,
            stream=keys.stream,
            deadlines=keys.subscription(name, "deadlines"),
            receipts=keys.subscription(name, "receipts"),
            dead=keys.subscription(name, "dead"),
            group=name,
            mode="topic",
            delivery_limit=delivery_limit,
            destination=topic.name,
        )

    @property
    def name(self) -> str:
        return self._name

    @property
    def topic(self) -> ReliableTopic[T]:
        return self._topic

    def __repr__(self) -> str:
        return f"Subscription({self._topic.name!r}, {self._name!r})"


class ReliableTopic(Generic[T]):
    """A publish/subscribe topic with durable, independently acknowledged subscriptions.

    ::

        topic = ReliableTopic(client, "orders", JsonCodec(OrderPlaced))
        await topic.create_subscription("billing", start="beginning")
        await topic.publish(OrderPlaced(42))
        billing = topic.subscription("billing")
        for message in await billing.receive(30, max=10):
            ...
            await billing.ack(message)
        await topic.trim(max_age=7 * 86400)   # never removes what a subscription still needs

    ``client`` stays owned by the caller; its key prefix is honoured. ``codec`` must be
    thread-safe and the same for every instance of the topic. ``dedup_window`` bounds how long
    a ``dedup_id`` suppresses duplicate publications. Keys share the hash tag
    ``{respire-topic:<name>}``. The constructor sends nothing; it raises
    :class:`~respire_actors.errors.ValidationError` for bad arguments and
    :class:`~respire_actors.errors.ConfigurationError` if the key prefix splits the slot.
    """

    def __init__(
        self,
        client: RedisClient,
        name: str,
        codec: Codec[T],
        *,
        dedup_window: Duration = DEFAULT_DEDUP_WINDOW,
    ) -> None:
        check_client(client)
        check_codec(codec)
        self._client = client
        self._codec = codec
        self._name = name
        self._keys = ReliableQueueKeys(name, client.key_prefix, "topic")
        self._dedup_window_ms = to_ms(dedup_window, "dedup_window")
        check_keys(self._keys.stream, self._keys.dedup("x"))

    @property
    def name(self) -> str:
        return self._name

    @property
    def client(self) -> RedisClient:
        return self._client

    @property
    def codec(self) -> Codec[T]:
        return self._codec

    @property
    def keys(self) -> ReliableQueueKeys:
        return self._keys

    @property
    def stream_key(self) -> str:
        """The stream holding every retained publication."""
        return self._keys.stream

    # -- publishing -----------------------------------------------------------------------------
    async def publish(self, payload: T, *, dedup_id: str | None = None) -> str:
        """Append a publication for every subscription; returns its id.

        ``dedup_id`` suppresses duplicates within the dedup window exactly as
        :meth:`ReliableQueue.send` does. Raises before sending anything when the payload cannot
        be encoded. If cancelled, or the reply is lost, it may have been published: retry with
        the same ``dedup_id``.
        """
        data = encode_with(self._codec, payload, limit=self._client.settings.max_payload_bytes)
        dedup_key = self._keys.dedup(check_dedup_id(dedup_id)) if dedup_id is not None else None
        return await append(
            self._client, self._keys.stream, dedup_key, data, self._dedup_window_ms, self._name
        )

    async def publish_many(self, payloads: Iterable[T]) -> list[str]:
        """Publish many payloads in one pipelined round trip; their ids in order. Every payload
        is encoded before anything is sent. Each append is atomic, the batch is not: if the call
        fails midway or its reply is lost, some may have been published. The pipeline is
        shielded from cancellation once sent."""
        limit = self._client.settings.max_payload_bytes
        items = [
            encode_with(self._codec, p, limit=limit) for p in iterate(payloads, what="payloads")
        ]
        if not items:
            return []
        return await append_many(self._client, self._keys.stream, items, self._name)

    # -- subscriptions ------------------------------------------------------------------------
    def subscription(
        self, name: str, *, delivery_limit: int = DEFAULT_DELIVERY_LIMIT
    ) -> Subscription[T]:
        """A handle on subscription ``name`` (sends nothing; create it first).

        Every instance of one subscription must use the same ``delivery_limit``.
        """
        return Subscription(self, name, delivery_limit=delivery_limit)

    async def create_subscription(self, name: str, *, start: Start) -> bool:
        """Create subscription ``name``; False (and no change) if it already exists.

        ``start="beginning"`` delivers every publication still retained; ``"tail"`` only those
        published afterwards. Creation is atomic with respect to :meth:`trim`. If cancelled, it
        may have been created; calling again is safe.
        """
        validate_name(name, what="subscription name")
        if start not in ("beginning", "tail"):
            raise ValidationError(f"start must be 'beginning' or 'tail', got {start!r}")
        keys = self._keys
        reply = await load("topic_subscribe")(
            self._client,
            [
                keys.stream,
                keys.subscription(name, "deadlines"),
                keys.subscription(name, "receipts"),
            ],
            [name, start],
        )
        return bool(int(reply))

    async def remove_subscription(self, name: str, *, delete_dead_letters: bool = False) -> bool:
        """Remove subscription ``name``: its group and delivery metadata go, so outstanding
        receipts can no longer complete and its pending publications stop holding back
        :meth:`trim`. Its dead letters are kept unless ``delete_dead_letters``.

        Returns False if it did not exist. If cancelled, it may have been removed; calling
        again is safe.
        """
        validate_name(name, what="subscription name")
        keys = self._keys
        reply = await load("topic_unsubscribe")(
            self._client,
            [
                keys.stream,
                keys.subscription(name, "deadlines"),
                keys.subscription(name, "receipts"),
                keys.subscription(name, "dead"),
            ],
            [name, "1" if delete_dead_letters else "0"],
        )
        return bool(int(reply))

    async def subscriptions(self) -> list[SubscriptionInfo]:
        """Every subscription with its pending count, lag and read position, sorted by name.

        Read-only: cancelling it leaves nothing behind.
        """
        exists = await self._client.execute("EXISTS", self._keys.stream)
        if not int(exists):
            return []
        reply = await self._client.execute("XINFO", "GROUPS", self._keys.stream)
        infos: list[SubscriptionInfo] = []
        for group in reply or []:
            if isinstance(group, dict):  # RESP3 map
                fields = {_text(k): v for k, v in group.items()}
            else:
                fields = {_text(group[i]): group[i + 1] for i in range(0, len(group), 2)}
            lag = fields.get("lag")
            infos.append(
                SubscriptionInfo(
                    name=_text(fields["name"]),
                    pending=int(fields.get("pending", 0)),
                    lag=int(lag) if lag is not None else None,
                    last_delivered_id=_text(fields.get("last-delivered-id", b"0-0")),
                )
            )
        return sorted(infos, key=lambda info: info.name)

    # -- retention ----------------------------------------------------------------------------
    async def trim(
        self,
        *,
        max_age: Duration | None = None,
        max_length: int | None = None,
        min_id: str | None = None,
    ) -> TrimResult:
        """Delete publications outside the retention policy that no subscription still needs.

        Give at least one limit: ``max_age`` (older than this on the server clock),
        ``max_length`` (beyond the newest N) or ``min_id`` (ids below it). A publication outside
        *any* given limit is out of policy. The cut is then lowered to every subscription's
        lowest pending publication and first undelivered one, so leased, NACKed, waiting and
        not yet delivered publications all survive; it all runs as one atomic script (the
        conservative MINID procedure), and the protected entries are verified afterwards.

        Raises :class:`ValidationError` before sending anything for bad limits,
        :class:`~respire_actors.errors.ScriptError` (``RESPIRE_TRIM_VERIFY``) if verification
        failed. If cancelled, the trim may have run; running it again is safe.
        """
        if max_age is None and max_length is None and min_id is None:
            raise ValidationError("trim needs max_age, max_length or min_id")
        age_ms = "" if max_age is None else str(_trim_age_ms(max_age))
        if max_length is not None:
            validate_max_length(max_length)
        if min_id is not None and not (
            isinstance(min_id, str) and "-" in min_id and is_entry_id(min_id)
        ):
            raise ValidationError(
                f"min_id must be a stream id like '1700000000000-0' (two 64-bit unsigned "
                f"integers), got {min_id!r}"
            )
        reply = await load("topic_trim")(
            self._client,
            [self._keys.stream],
            [age_ms, "" if max_length is None else str(max_length), min_id or ""],
        )
        cutoff = _text(reply[1]) or None
        policy = _text(reply[2]) or None
        return TrimResult(
            removed=int(reply[0]),
            cutoff=cutoff,
            policy_cutoff=policy,
            held_by=tuple(_text(n) for n in reply[3:]),
        )

    def __repr__(self) -> str:
        return f"ReliableTopic({self._name!r}, codec={self._codec!r})"


def _trim_age_ms(value: object) -> int:
    """``max_age`` of a topic trim in whole milliseconds: zero (everything is out of policy) or
    a retention age of up to ten years, as for a job queue's retention."""
    if isinstance(value, int | float) and not isinstance(value, bool) and value == 0:
        return 0
    if isinstance(value, timedelta) and not value:
        return 0
    return retention_age_ms(value, what="max_age")
