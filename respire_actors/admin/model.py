"""What the operator API returns: plain frozen records, one page at a time."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

from ..jobs.model import JobEvent
from ..jobs.options import RateLimit


@dataclass(frozen=True, slots=True)
class QueueSummary:
    """One job queue at a glance (:meth:`QueueAdmin.summary`).

    ``ready`` is the length of the ready stream (acknowledged entries it still retains
    included); ``pending`` the deliveries not yet acknowledged; ``oldest_pending_age_ms`` the
    age of the oldest pending entry by its id's time on the server clock (None when nothing is
    pending); ``lag`` the entries not yet delivered to the consumer group as Redis reports it
    (None when Redis cannot tell, or before the group exists); ``scheduled`` the staged jobs
    (delayed, durable retries and grouped); ``consumers`` the group's consumers.
    """

    name: str
    ready: int
    pending: int
    oldest_pending_age_ms: int | None
    lag: int | None
    scheduled: int
    dead_letters: int
    paused: bool
    rate_limit: RateLimit | None
    rate_limit_hits: int
    consumers: int
    groups_in_use: bool
    metrics_enabled: bool


@dataclass(frozen=True, slots=True)
class PendingRow:
    """One delivery that is not acknowledged yet (XPENDING). ``job_id`` is '' when the entry's
    body is gone."""

    entry_id: str
    job_id: str
    consumer: str
    idle_ms: int
    deliveries: int


@dataclass(frozen=True, slots=True)
class PendingPage:
    rows: list[PendingRow]
    next_start: str | None
    """Pass as ``start`` for the next page; None when this was the last page."""


@dataclass(frozen=True, slots=True)
class ScheduledRow:
    """One staged job of the due index (delayed jobs and durable retries). ``attempts`` counts
    the attempts before this staging (0 for a delayed job)."""

    entry_id: str
    job_id: str
    due_at: datetime
    attempts: int


@dataclass(frozen=True, slots=True)
class ScheduledPage:
    rows: list[ScheduledRow]
    next_cursor: str | None
    """Pass as ``cursor`` for the next page; None when this was the last page."""


@dataclass(frozen=True, slots=True)
class DeadLetterRow:
    """One dead letter. ``payload`` is the raw encoded payload (decode it with the queue's
    codec); ``at`` the time it was dead-lettered (its id's time); ``source_id`` the ready entry
    it came from."""

    dead_id: str
    job_id: str
    reason: str
    attempt: int
    detail: str
    source_id: str
    consumer: str
    at: datetime
    payload: bytes


@dataclass(frozen=True, slots=True)
class DeadLetterPage:
    rows: list[DeadLetterRow]
    next_before: str | None
    """Pass as ``before`` for the next (older) page; None when this was the last page."""


@dataclass(frozen=True, slots=True)
class EventPage:
    rows: list[JobEvent]
    next_before: str | None
    """Pass as ``before`` for the next (older) page; None when this was the last page."""


@dataclass(frozen=True, slots=True)
class JobDetail:
    """One ready-stream entry: its envelope fields (payload apart), delivery state, trace id,
    recent events of its job id and its log lines."""

    entry_id: str
    job_id: str
    fields: Mapping[str, str]
    payload: bytes
    pending: PendingRow | None
    trace_id: str | None
    events: list[JobEvent] = field(default_factory=list)
    logs: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class RetryProgress:
    """Running totals of :meth:`QueueAdmin.retry_all`: dead letters looked at, re-enqueued,
    and skipped (another reason, or gone or malformed)."""

    scanned: int
    retried: int
    skipped: int


__all__ = [
    "DeadLetterPage",
    "DeadLetterRow",
    "EventPage",
    "JobDetail",
    "PendingPage",
    "PendingRow",
    "QueueSummary",
    "RetryProgress",
    "ScheduledPage",
    "ScheduledRow",
]
