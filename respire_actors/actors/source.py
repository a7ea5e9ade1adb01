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

from ..errors import ServerError
from ..redis.client import RedisClient
from ._util import field_map, text
from .messages import Completion, Delivery

ReadStatus = Literal["ok", "empty", "paused", "limited"]


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


class Source(Protocol):
    """The atomic steps the shared actors run against Redis."""

    name: str
    stream_key: str

    async def ensure_group(self) -> None: ...

    async def read(self, consumer: str, count: int) -> ReadResult: ...

    async def claim(
        self, consumer: str, mode: str, cursor: str, count: int, min_idle_ms: int, limit: int
    ) -> ClaimResult: ...

    async def complete(self, consumer: str, batch: Sequence[Completion]) -> list[int]: ...


async def create_group(client: RedisClient, stream: str, group: str, start: str) -> None:
    """XGROUP CREATE ... MKSTREAM; an existing group (BUSYGROUP) counts as success."""
    try:
        await client.execute("XGROUP", "CREATE", stream, group, start, "MKSTREAM")
    except ServerError as exc:
        if exc.code != "BUSYGROUP":
            raise


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
class PromotingSource(Protocol):
    """A source with staged (scheduled) entries that the promoter moves to the ready stream."""

    async def promote(self, batch_size: int) -> PromotionResult: ...
