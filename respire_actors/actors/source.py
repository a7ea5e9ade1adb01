"""Where the reader, sweeper and completer get and settle work: a pluggable source.

The actors are the same for every kind of consumer; what differs is the atomic step each one
runs. :class:`JobSource` runs the job-queue scripts (queue checks inside the claim, events and
dead letters on completion); :class:`respire_actors.streams.StreamSource` runs the generic
stream-worker scripts over an application-owned stream. Every step is one script call.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

from ..errors import ServerError
from ..jobs.model import Delivery
from ..redis.client import Arg, RedisClient
from ..redis.scripts import load
from ._util import field_map, text

if TYPE_CHECKING:
    from ..jobs.runtime import Completion

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


@dataclass(frozen=True, slots=True)
class ClaimResult:
    """One recovery or replay page. ``next_cursor`` 0-0 ends the pass; ``denied`` means the
    queue refused admission (paused or rate limited) and the pass should stop."""

    denied: bool
    next_cursor: str = "0-0"
    deliveries: Sequence[Delivery] = field(default=())
    cleared_deleted: int = 0
    dead_lettered: int = 0


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
        return ClaimResult(denied=True)
    claimed = reply[2]
    return ClaimResult(
        denied=False,
        next_cursor=text(reply[1]),
        deliveries=[Delivery(text(i), field_map(f), int(d)) for i, f, d in claimed],
        cleared_deleted=int(reply[3]),
        dead_lettered=int(reply[4]),
    )


_JOB_READ = load("job_read")
_JOB_CLAIM = load("job_claim_pending")
_JOB_COMPLETE = load("job_complete")


class JobSource:
    """The job queue's steps: ``job_read``, ``job_claim_pending`` and ``job_complete``."""

    def __init__(
        self, client: RedisClient, keys: object, dead_key: str, group: str
    ) -> None:
        from ..keys import JobQueueKeys

        assert isinstance(keys, JobQueueKeys)
        self.client = client
        self.keys = keys
        self.dead_key = dead_key
        self.group = group
        self.name = keys.name
        self.stream_key = keys.ready

    async def ensure_group(self) -> None:
        await create_group(self.client, self.keys.ready, self.group, "0")

    async def read(self, consumer: str, count: int) -> ReadResult:
        reply = await _JOB_READ(
            self.client, (self.keys.ready, self.keys.control), (self.group, consumer, count)
        )
        status = text(reply[0])
        if status == "ok":
            return ReadResult("ok", deliveries_from_read(reply[1]))
        if status == "empty":
            return ReadResult("empty", last_id=text(reply[1]))
        if status == "limited":
            return ReadResult("limited", retry_after_ms=int(reply[1]))
        return ReadResult("paused")

    async def claim(
        self, consumer: str, mode: str, cursor: str, count: int, min_idle_ms: int, limit: int
    ) -> ClaimResult:
        reply = await _JOB_CLAIM(
            self.client,
            (self.keys.ready, self.keys.control, self.keys.events, self.dead_key),
            (self.group, consumer, mode, min_idle_ms, cursor, count, limit),
        )
        return claim_result(reply)

    async def complete(self, consumer: str, batch: Sequence[Completion]) -> list[int]:
        args: list[Arg] = [self.group, consumer, len(batch)]
        for c in batch:
            args += [c.delivery.entry_id, c.delivery.attempt, c.kind, c.reason, c.delivery.job_id]
        reply = await _JOB_COMPLETE(
            self.client, (self.keys.ready, self.keys.events, self.dead_key), args
        )
        return [int(s) for s in reply]
