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


_JOB_READ = load("job_read")
_JOB_CLAIM = load("job_claim_pending")
_JOB_COMPLETE = load("job_complete")
_JOB_RETRY = load("job_retry")
_JOB_PROMOTE = load("job_promote")


class JobSource:
    """The job queue's steps: ``job_read``, ``job_claim_pending``, ``job_complete`` (with
    ``job_retry`` for durable retries) and ``job_promote``.

    ``ack_mode`` is how acknowledged entries are settled: ``"ack"`` (kept for trimming),
    ``"xdel"`` (XACK + XDEL) or ``"ackdel"`` (XACKDEL ACKED, Redis 8.2+); the worker decides it
    per server at start-up.
    """

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
        self.ack_mode = "ack"

    async def ensure_group(self) -> None:
        await create_group(self.client, self.keys.ready, self.group, "0")

    async def read(self, consumer: str, count: int) -> ReadResult:
        reply = await _JOB_READ(
            self.client,
            (self.keys.ready, self.keys.control),
            (self.group, consumer, count, self.ack_mode),
        )
        status = text(reply[0])
        if status == "ok":
            expired = int(reply[2]) if len(reply) > 2 else 0
            return ReadResult("ok", deliveries_from_read(reply[1]), expired=expired)
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
            (self.group, consumer, mode, min_idle_ms, cursor, count, limit, self.ack_mode),
        )
        return claim_result(reply)

    async def complete(self, consumer: str, batch: Sequence[Completion]) -> list[int]:
        """Commit a batch; returns 1 (committed) or 0 (stale) per completion, in order. Durable
        retries go through ``job_retry`` (a second call only when the batch holds any); a
        retry acknowledged as expired instead of staged reports 2."""
        retries = [i for i, c in enumerate(batch) if c.kind == "retry"]
        others = [i for i, c in enumerate(batch) if c.kind != "retry"]
        statuses = [0] * len(batch)
        if others:
            args: list[Arg] = [self.group, consumer, len(others)]
            for i in others:
                c = batch[i]
                d = c.delivery
                args += [d.entry_id, d.attempt, c.kind, c.reason, d.job_id]
            if self.ack_mode != "ack":
                args.append(self.ack_mode)
            reply = await _JOB_COMPLETE(
                self.client, (self.keys.ready, self.keys.events, self.dead_key), args
            )
            for i, status in zip(others, reply, strict=True):
                statuses[i] = int(status)
        if retries:
            rargs: list[Arg] = [self.group, consumer, self.ack_mode, len(retries)]
            for i in retries:
                c = batch[i]
                rargs += [c.delivery.entry_id, c.delivery.attempt, c.delay_ms]
            reply = await _JOB_RETRY(
                self.client, (self.keys.ready, self.keys.scheduled, self.keys.due), rargs
            )
            for i, status in zip(retries, reply, strict=True):
                statuses[i] = int(status)
        return statuses

    async def promote(self, batch_size: int) -> PromotionResult:
        """One promotion pass (``job_promote``): at most ``batch_size`` due jobs become ready.
        Atomic: if cancelled or the reply is lost, each job is either still staged or ready."""
        reply = await _JOB_PROMOTE(
            self.client, (self.keys.scheduled, self.keys.due, self.keys.ready), (batch_size,)
        )
        return PromotionResult(*(int(x) for x in reply))
