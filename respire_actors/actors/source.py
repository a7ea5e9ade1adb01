"""Where the reader, sweeper and completer get and settle work: a pluggable source.

The actors are the same for every kind of consumer; what differs is the atomic step each one
runs. ``respire_actors.jobs.source.JobSource`` runs the job-queue scripts (queue checks inside
the claim, events and dead letters on completion); ``respire_actors.streams.StreamSource`` runs
the generic stream-worker scripts over an application-owned stream. Every step is one script
call. Nothing here imports jobs/ or streams/: they depend on the actors, never the reverse.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

import anyio

from ..errors import ConsumerGroupMissing, RedisUnavailable, ServerError
from ..redis.client import Arg, BlockingConnection, RedisClient
from ..redis.scripts import load
from ._util import field_map, text
from .messages import Completion, Delivery

ReadStatus = Literal["ok", "empty", "paused", "limited", "recover"]

RENEWED = 1
"""Renewal status: the lease is renewed (the entry's idle time was reset for this consumer)."""
LOST = 0
"""Renewal status: the lease is lost (the entry is not pending for this delivery any more)."""
GONE = 2
"""Renewal status: still pending for this delivery, but the entry's body was deleted, so it
cannot be renewed (the lease is treated as lost)."""
UNCONFIRMED = -1
"""Renewal status: the renewal could not be made (its partition's node is unreachable while
the others answered): neither renewed nor lost; the lease expires as for a failed call."""
GROUP_RENEWED_MIN = 100
"""Renewal statuses from this value up also mean renewed: the delivery is a grouped job and
its group's concurrency lease (renewed too) lasts that many milliseconds (100 ms is the
shortest lease a group may have). The renewer paces itself by it."""
MAX_RENEW_BATCH = 500
"""Most deliveries one renewal call carries (the renewer splits a larger pass)."""

RenewItem = tuple[str, int, str]
"""One running delivery to renew: entry id, attempt (delivery count), job group ('' when none)."""


@dataclass(frozen=True, slots=True)
class ReadResult:
    """What one admission read returned.

    ``ok``: ``deliveries`` were claimed for this consumer. ``empty``: nothing unread; wait for an
    entry newer than ``last_id``. ``paused`` / ``limited``: admission was denied; try again after
    ``retry_after_ms`` (or the poll interval when 0)."""

    status: ReadStatus
    deliveries: Sequence[Delivery] = ()
    last_id: str = "0-0"
    retry_after_ms: int = 0
    expired: int = 0  # entries past their TTL, acknowledged by the read instead of delivered
    pace_ms: int = 0
    # 'empty' of a grouped read: the newest staging-stream entry (a new staged job wakes the
    # reader) and how long until a delayed or parked group may have work (-1: unknown)
    staged_last_id: str | None = None
    wake_ms: int = -1
    # 'ok' that reached the end of the stream (fewer entries than asked for): the newest entry
    # id then, so the reader can wait for a newer one instead of reading an empty stream
    drained_id: str | None = None


@dataclass(frozen=True, slots=True)
class ClaimResult:
    """One recovery or replay page. ``next_cursor`` 0-0 ends the pass; ``denied`` means the
    queue refused admission (paused or rate limited) and the pass should stop."""

    denied: bool
    next_cursor: str = "0-0"
    deliveries: Sequence[Delivery] = field(default=())
    cleared_deleted: int = 0
    dead_lettered: int = 0
    expired: int = 0
    retry_after_ms: int = 0  # denied by the rate limit: the rest of the window
    # entries left unclaimed because their flow or batch state could not be updated: (id, error)
    refused: Sequence[tuple[str, str]] = field(default=())


class Source(Protocol):
    """The atomic steps the shared actors run against Redis."""

    name: str
    stream_key: str

    async def ensure_group(self, on_missing: str) -> None:
        """At start: create the group of a new stream; for a group that existed and vanished,
        raise :class:`ConsumerGroupMissing` (``on_missing == "fail"``) or recreate it at
        ``on_missing`` (``"$"`` or an entry id)."""
        ...

    async def restore_group(self, on_missing: str) -> None:
        """A running consumer was told NOGROUP: raise :class:`ConsumerGroupMissing` or recreate
        the group at ``on_missing``; never at ``0``."""
        ...

    async def read(self, consumer: str, count: int, min_idle_ms: int) -> ReadResult:
        """Admit up to ``count`` new entries. ``min_idle_ms`` is the visibility timeout: a
        source with a rate policy answers ``recover`` while an entry is idle that long."""
        ...

    async def claim(
        self, consumer: str, mode: str, cursor: str, count: int, min_idle_ms: int, limit: int
    ) -> ClaimResult: ...

    async def complete(self, consumer: str, batch: Sequence[Completion]) -> list[int]: ...

    async def renew(self, consumer: str, items: Sequence[RenewItem]) -> list[int]:
        """Renew the leases of running deliveries (at most :data:`MAX_RENEW_BATCH`), one
        atomic script call: returns :data:`RENEWED` (or, for a grouped job, its group lease's
        duration in ms, at least :data:`GROUP_RENEWED_MIN`), :data:`LOST` or :data:`GONE` per
        item, in order. Safe to repeat; if cancelled, some or all leases may have been
        renewed."""
        ...


_LEASE_RENEW = load("lease_renew")


async def renew_leases(
    client: RedisClient, stream: str, group: str, consumer: str, items: Sequence[RenewItem]
) -> list[int]:
    """``lease_renew`` over a plain stream: fence each delivery, then XCLAIM ... JUSTID."""
    if not items:
        return []
    if len(items) > MAX_RENEW_BATCH:
        raise ValueError(f"at most {MAX_RENEW_BATCH} leases per renewal call, got {len(items)}")
    args: list[Arg] = [group, consumer, len(items)]
    for entry_id, attempt, _group in items:
        args += [entry_id, attempt]
    reply = await _LEASE_RENEW(client, (stream,), args)
    return [int(s) for s in reply]


def renew_item(delivery: Delivery) -> RenewItem:
    """What the renewer passes to ``Source.renew`` for one running delivery."""
    group = delivery.fields.get(b"_respire.job.group", b"")
    return (delivery.entry_id, delivery.attempt, group.decode("utf-8", "replace"))


async def create_group(client: RedisClient, stream: str, group: str, start: str) -> None:
    """XGROUP CREATE ... MKSTREAM; an existing group (BUSYGROUP) counts as success."""
    try:
        await client.execute("XGROUP", "CREATE", stream, group, start, "MKSTREAM")
    except ServerError as exc:
        if exc.code != "BUSYGROUP":
            raise


def group_missing(stream: str, group: str) -> ConsumerGroupMissing:
    """The error a consumer stops with when its group vanished."""
    return ConsumerGroupMissing(
        f"the consumer group {group!r} of {stream!r} is gone (deleted by XGROUP DESTROY or a "
        "key rewrite, or the server restarted without its data or from an older snapshot); "
        "it is not recreated at '0' because that would run every retained, already "
        "acknowledged entry again. Recreate it yourself at the right id (XGROUP CREATE), or "
        "start the worker with recreate_missing_group set to an entry id (everything after "
        "it runs) or '$' (only entries added from then on: anything written meanwhile is "
        "skipped)",
        stream=stream,
        group=group,
    )


async def recreate_group(client: RedisClient, stream: str, group: str, on_missing: str) -> None:
    """``restore_group`` for a plain stream: raise, or recreate at ``on_missing``."""
    if on_missing == "fail":
        raise group_missing(stream, group)
    await create_group(client, stream, group, on_missing)


_CONSUMER_CLEANUP = load("consumer_cleanup")


async def remove_consumer(client: RedisClient, stream: str, group: str, consumer: str) -> bool:
    """Remove ``consumer`` from the group if it has nothing pending (one script: a delivery
    cannot slip in between the check and XGROUP DELCONSUMER, which would drop it)."""
    reply = await _CONSUMER_CLEANUP(client, (stream,), (group, "self", consumer))
    return int(reply) == 1


async def remove_idle_consumers(
    client: RedisClient, stream: str, group: str, consumer: str, idle_ms: int
) -> int:
    """Remove the group's other consumers idle at least ``idle_ms`` with nothing pending;
    returns how many were removed."""
    reply = await _CONSUMER_CLEANUP(client, (stream,), (group, "idle", consumer, idle_ms))
    return int(reply)


def deliveries_from_read(entries: Sequence[Any]) -> list[Delivery]:
    return [Delivery(text(i), field_map(f), 1) for i, f in entries]


def claim_result(reply: Sequence[Any]) -> ClaimResult:
    status = text(reply[0])
    if status != "ok":
        retry = int(reply[1]) if status == "limited" and len(reply) > 1 else 0
        return ClaimResult(denied=True, retry_after_ms=retry)
    claimed = reply[2]
    return ClaimResult(
        denied=False,
        next_cursor=text(reply[1]),
        deliveries=[Delivery(text(i), field_map(f), int(d)) for i, f, d in claimed],
        cleared_deleted=int(reply[3]),
        dead_lettered=int(reply[4]),
        expired=int(reply[5]) if len(reply) > 5 else 0,
        refused=[(text(i), text(e)) for i, e in reply[6]] if len(reply) > 6 else (),
    )


@dataclass(frozen=True, slots=True)
class PromotionResult:
    """One promotion pass: jobs moved to the ready stream, expired and missing staged entries
    removed, and how long until the next staged job is due (0 now, -1 nothing staged)."""

    promoted: int
    expired: int
    missing: int
    next_due_ms: int


@runtime_checkable
class ManySources(Protocol):
    """A source over several streams (the partitions of a partitioned job queue). Each
    delivery carries the index of its stream in ``Delivery.origin``, and the source routes its
    completion and renewal there. ``stream_keys`` lists the streams in index order (consumer
    cleanup visits each). When a read found nothing, the reader calls :meth:`wait` instead of
    blocking on ``stream_key`` alone."""

    stream_keys: Sequence[str]

    async def wait(self, blocking: BlockingConnection, wait_ms: int) -> None:
        """Wait up to ``wait_ms`` for a new entry in any stream, claiming nothing (safe to
        cancel)."""
        ...

    async def renew_deliveries(
        self, consumer: str, deliveries: Sequence[Delivery], within: float
    ) -> list[int]:
        """``Source.renew`` for running deliveries of any of the streams (statuses in order);
        a stream whose call has not answered within ``within`` seconds reports
        :data:`UNCONFIRMED` for its deliveries, the others their own statuses."""
        ...


class PartlyUnavailable(RedisUnavailable):
    """A call spread over several nodes (a partitioned queue's) reached some and not others:
    ``statuses`` has the reached ones' statuses and None for the others (not committed: to
    retry). Raised only when at least one was reached."""

    def __init__(self, message: str, statuses: list[int | None]) -> None:
        super().__init__(message)
        self.statuses = statuses


def stream_keys(source: Source) -> Sequence[str]:
    """Every stream ``source`` reads: its ``stream_keys`` when it reads several."""
    if isinstance(source, ManySources):
        return source.stream_keys
    return (source.stream_key,)


async def renew_deliveries(
    source: Source, consumer: str, deliveries: Sequence[Delivery], within: float
) -> list[int] | None:
    """Renew running deliveries through ``source`` (routed per stream for a
    :class:`ManySources`); statuses in order, or None when no answer came within ``within``
    seconds (a many-stream source answers per stream: :data:`UNCONFIRMED` for the late)."""
    if isinstance(source, ManySources):
        return await source.renew_deliveries(consumer, deliveries, within)
    with anyio.move_on_after(within):
        return await source.renew(consumer, [renew_item(d) for d in deliveries])
    return None


@runtime_checkable
class PreparingSource(Protocol):
    """A source with start-up checks (a stored policy to compare, ...). The consumer tree's
    first child runs them on every start, so a tree composed into another supervisor cannot
    skip them. Must be safe to repeat; raises :class:`ConfigurationError` to refuse the start."""

    async def prepare(self) -> None: ...


@runtime_checkable
class PromotingSource(Protocol):
    """A source with staged (scheduled) entries that the promoter moves to the ready stream."""

    async def promote(self, batch_size: int) -> PromotionResult: ...
