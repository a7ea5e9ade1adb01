"""Validated settings of job enqueue; the worker-side settings live in
:mod:`respire_actors.actors.options` and are re-exported here. Every check runs before Redis is
contacted."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from ..actors.options import (
    CONSUMER_GROUP,
    MAX_MS,
    MAX_SCHEDULING_BATCH,
    LogPolicy,
    QueueOptions,
    RateLimit,
    Retention,
    WorkerOptions,
    default_consumer_name,
    duration_ms,
)
from ..errors import ValidationError

DEFAULT_DEDUP_WINDOW = timedelta(days=1)

MAX_PRIORITY = 2**31 - 1
MAX_GROUP_BYTES = 1024
"""Longest application group name, in UTF-8 bytes."""
MIN_PRIORITY = -(2**31)


MAX_JOB_ID_BYTES = 1024
"""Longest job id (and flow id), in UTF-8 bytes."""


def validate_text(value: object, *, what: str, max_bytes: int) -> str:
    """Check an application identifier (job, flow, group, schedule id): a nonblank,
    valid-Unicode ``str`` of at most ``max_bytes`` UTF-8 bytes, never truncated. Raises
    :class:`ValidationError` naming ``what`` (before anything is sent to Redis)."""
    if not isinstance(value, str):
        raise ValidationError(f"{what} must be a str, got {type(value).__name__}")
    if not value.strip():
        raise ValidationError(f"{what} must not be blank")
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        raise ValidationError(f"{what} {value!r} is not valid Unicode") from None
    if size > max_bytes:
        raise ValidationError(f"{what} is {size} bytes; the limit is {max_bytes}")
    return value


def validate_job_id(job_id: object, *, what: str = "job id") -> str:
    """Check a job id (or, with ``what``, a flow id): a nonblank, valid-Unicode ``str`` of at
    most :data:`MAX_JOB_ID_BYTES` UTF-8 bytes. Raises :class:`ValidationError`."""
    return validate_text(job_id, what=what, max_bytes=MAX_JOB_ID_BYTES)


def validate_group(group: object) -> str:
    """Check an application group name: a nonblank, valid-Unicode ``str`` of at most
    :data:`MAX_GROUP_BYTES` UTF-8 bytes. The text is kept exactly (no trimming or case
    folding); braces, separators and NUL characters are fine, since a group never becomes part
    of a Redis key. Raises :class:`ValidationError` (before anything is sent to Redis)."""
    return validate_text(group, what="group", max_bytes=MAX_GROUP_BYTES)


@dataclass(frozen=True, slots=True)
class JobEnqueueOptions:
    """How :meth:`JobQueue.enqueue_scheduled` stages one job.

    delay:         minimum time from enqueue (server clock) until the job may be promoted to the
                   ready stream; zero means the next scheduling pass (default)
    priority:      integer from -2**31 to 2**31-1 (default 0); within one promotion batch higher
                   priorities go to the ready stream first
    ttl:           time to live from enqueue, including delay, backlog and retries (None = none);
                   an expired job is dropped without running its handler; must be longer
                   than ``delay``
    dedup_window:  deduplication window (default one day), shared with plain enqueue
    group:         application group (a tenant id, say) for fair scheduling and group controls;
                   None (default) is ungrouped. See docs/groups.md.

    Durations are timedeltas or seconds, rounded up to whole milliseconds, at most 2**31-1 ms;
    the TTL and window must be positive. Invalid values raise :class:`ValidationError` here.
    """

    delay: timedelta | float = timedelta(0)
    priority: int = 0
    ttl: timedelta | float | None = None
    dedup_window: timedelta | float | None = None
    group: str | None = None

    def __post_init__(self) -> None:
        duration_ms(self.delay, what="delay", allow_zero=True)
        if self.group is not None:
            validate_group(self.group)
        if (
            isinstance(self.priority, bool)
            or not isinstance(self.priority, int)
            or not MIN_PRIORITY <= self.priority <= MAX_PRIORITY
        ):
            raise ValidationError("priority must be an integer from -2**31 to 2**31-1")
        if self.ttl is not None:
            ttl_ms = duration_ms(self.ttl, what="ttl")
            delay_ms = duration_ms(self.delay, what="delay", allow_zero=True)
            if ttl_ms <= delay_ms:
                # the job would expire before it could be promoted: dropped unseen, its id
                # kept by deduplication for the whole window
                raise ValidationError(
                    f"ttl ({ttl_ms} ms) must be longer than delay ({delay_ms} ms): the TTL "
                    "counts from enqueue, so this job would expire before it could run"
                )
        if self.dedup_window is not None:
            duration_ms(self.dedup_window, what="deduplication window")

    @property
    def delay_ms(self) -> int:
        return duration_ms(self.delay, what="delay", allow_zero=True)

    @property
    def ttl_ms(self) -> int:
        """The TTL in ms, 0 for none."""
        return 0 if self.ttl is None else duration_ms(self.ttl, what="ttl")

    @property
    def dedup_window_ms(self) -> int:
        window = DEFAULT_DEDUP_WINDOW if self.dedup_window is None else self.dedup_window
        return duration_ms(window, what="deduplication window")


__all__ = [
    "CONSUMER_GROUP",
    "DEFAULT_DEDUP_WINDOW",
    "MAX_GROUP_BYTES",
    "MAX_MS",
    "MAX_PRIORITY",
    "MAX_SCHEDULING_BATCH",
    "MIN_PRIORITY",
    "JobEnqueueOptions",
    "LogPolicy",
    "QueueOptions",
    "RateLimit",
    "Retention",
    "WorkerOptions",
    "default_consumer_name",
    "duration_ms",
    "validate_group",
]
