"""State shared by the actors of one worker registration, and the Job handed to handlers."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Generic, TypeVar

import anyio

from supervisors import Mailbox

from ..actors.admission import Admission
from ..actors.source import Source
from ..codecs import Codec
from ..errors import ValidationError
from ..keys import JobQueueKeys
from ..redis.client import RedisClient
from ..redis.scripts import load
from .model import Delivery, Outcome, RetryAfter
from .options import CONSUMER_GROUP, QueueOptions, WorkerOptions, duration_ms

T = TypeVar("T")

log = logging.getLogger("respire_actors.worker")

_PROGRESS = load("job_progress")
_LOG = load("job_log")

Handler = Callable[["Job[Any]"], Awaitable[Outcome | None]]


@dataclass(slots=True)
class WorkerStatistics:
    """Counters of one worker registration (this process only)."""

    admitted: int = 0
    recovered: int = 0
    replayed: int = 0
    started: int = 0
    acked: int = 0
    dead_lettered: int = 0
    nacked: int = 0
    failed: int = 0
    decode_failures: int = 0
    stale_completions: int = 0
    leases_lost: int = 0
    cleared_deleted_refs: int = 0
    dead_lettered_by_recovery: int = 0
    completion_batches: int = 0
    read_calls: int = 0
    paused_reads: int = 0
    rate_limited_reads: int = 0
    denied_claims: int = 0
    expired: int = 0
    retried: int = 0
    promoted: int = 0
    promotion_passes: int = 0
    expired_staged: int = 0
    missing_staged: int = 0


@dataclass(frozen=True, slots=True)
class Completion:
    """An outcome on its way to the completer."""

    delivery: Delivery
    kind: str  # 'ack' | 'dead' | 'expired' | 'retry'
    reason: str = ""
    delay_ms: int = 0  # 'retry': stage the new entry due this long after the transition


@dataclass(slots=True)
class QueueRuntime:
    """Everything the actors of one registration share."""

    client: RedisClient
    keys: JobQueueKeys | None
    codec: Codec[Any]
    handler: Handler
    options: WorkerOptions
    consumer: str
    admission: Admission
    deliveries: Mailbox[Delivery]
    completions: Mailbox[Completion]
    source: Source
    group: str = CONSUMER_GROUP
    # Builds the handler argument of one delivery; None means a Job with the decoded payload
    # (respire_actors.actors.runner.bind_job). Stream workers hand over the raw entry.
    bind: Callable[[QueueRuntime, Delivery], Any] | None = None
    stats: WorkerStatistics = field(default_factory=WorkerStatistics)
    # Scheduling, TTL checks and durable retries; None keeps immediate-only processing.
    queue_options: QueueOptions | None = None
    stopping: anyio.Event = field(default_factory=anyio.Event)
    # Set once the sweeper's startup replay is over (or skipped); the reader admits nothing
    # before, so replay can never re-claim an entry the reader has just delivered.
    replay_done: anyio.Event = field(default_factory=anyio.Event)

    @property
    def job_keys(self) -> JobQueueKeys:
        """The job queue's keys (job workers only)."""
        if self.keys is None:
            raise RuntimeError("this runtime does not belong to a job queue")
        return self.keys

    @property
    def visibility_ms(self) -> int:
        return duration_ms(self.options.visibility_timeout, what="visibility_timeout")

    @property
    def delivery_limit(self) -> int:
        return self.options.delivery_limit or 0

    @property
    def name(self) -> str:
        """The queue (or stream) name, for logs."""
        return self.source.name

    async def ensure_group(self) -> None:
        """Create the consumer group if missing (BUSYGROUP is success)."""
        await self.source.ensure_group()


class Job(Generic[T]):
    """One delivery of a job, as its handler sees it.

    ``id`` is the application job id, ``payload`` the decoded payload, ``entry_id`` the ready
    stream entry, ``attempt`` this entry's delivery count (from 1) and ``total_attempts`` the
    attempts across durable retries. The handler runs inside :attr:`cancel_scope`, which is
    cancelled when the delivery's lease (the visibility timeout) runs out or a fenced call finds
    that another delivery owns the job.
    """

    __slots__ = ("_rt", "cancel_scope", "delivery", "lease_lost", "payload")

    def __init__(self, rt: QueueRuntime, delivery: Delivery, payload: T) -> None:
        self._rt = rt
        self.delivery = delivery
        self.payload = payload
        self.cancel_scope: anyio.CancelScope | None = None
        self.lease_lost = False

    @property
    def id(self) -> str:
        return self.delivery.job_id

    @property
    def entry_id(self) -> str:
        return self.delivery.entry_id

    @property
    def attempt(self) -> int:
        return self.delivery.attempt

    @property
    def total_attempts(self) -> int:
        return self.delivery.prior_attempts + self.delivery.attempt

    @property
    def queue(self) -> str:
        return self._rt.name

    def _lose_lease(self) -> None:
        if not self.lease_lost:
            self.lease_lost = True
            self._rt.stats.leases_lost += 1
            if self.cancel_scope is not None:
                self.cancel_scope.cancel()

    async def report_progress(self, percent: int) -> bool:
        """Append a progress event (integer 0-100). Returns False when this delivery is no
        longer current (acknowledged, recovered by another attempt, body deleted); the handler's
        scope is then cancelled at its next checkpoint. If cancelled, the event may or may not
        have been appended.
        """
        if isinstance(percent, bool) or not isinstance(percent, int) or not 0 <= percent <= 100:
            raise ValidationError("percent must be an integer from 0 to 100")
        rt = self._rt
        ok = await _PROGRESS(
            rt.client,
            (rt.job_keys.ready, rt.job_keys.events),
            (rt.group, rt.consumer, self.entry_id, self.attempt, self.id, percent),
        )
        if not ok:
            self._lose_lease()
        return bool(ok)

    async def log(self, line: str) -> bool:
        """Append a line to this job's log (fenced like progress). Returns False when the
        delivery is no longer current. Raises :class:`ValidationError` for a line that is not
        valid Unicode or longer than the policy's byte limit (never truncated).
        """
        if not isinstance(line, str):
            raise ValidationError(f"log line must be a str, got {type(line).__name__}")
        try:
            data = line.encode("utf-8")
        except UnicodeEncodeError:
            raise ValidationError("log line is not valid Unicode") from None
        policy = self._rt.options.logs
        if len(data) > policy.max_line_bytes:
            raise ValidationError(
                f"log line is {len(data)} bytes; the limit is {policy.max_line_bytes}"
            )
        rt = self._rt
        ok = await _LOG(
            rt.client,
            (rt.job_keys.ready, rt.job_keys.logs(self.id)),
            (
                rt.group,
                rt.consumer,
                self.entry_id,
                self.attempt,
                data,
                policy.max_lines,
                policy.retention_ms,
                self.delivery.expires_at or 0,
            ),
        )
        if not ok:
            self._lose_lease()
        return bool(ok)

    @property
    def priority(self) -> int:
        """The job's scheduling priority (0 for immediate jobs)."""
        return self.delivery.priority

    @property
    def expires_at(self) -> int | None:
        """The job's absolute expiry in unix ms of the server clock, or None."""
        return self.delivery.expires_at

    def retry_after(self, delay: timedelta | float) -> RetryAfter:
        """An outcome to return: retry durably after ``delay`` (rounded up to whole ms, at most
        2**31-1 ms; zero means at once), overriding the queue's backoff and its cap for this
        attempt. The delivery limit and the job's TTL still apply: at the limit the job is
        dead-lettered instead. Raises :class:`ValidationError` for a bad delay. Needs
        :class:`QueueOptions` on the registration, else it behaves as ``NACK``.
        """
        return RetryAfter(duration_ms(delay, what="retry delay", allow_zero=True))

    def __repr__(self) -> str:
        return f"Job(id={self.id!r}, entry_id={self.entry_id!r}, attempt={self.attempt})"
