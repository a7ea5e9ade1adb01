"""Validated settings of the consumer runtime (job and stream workers), durable retries and
scheduling. Every check runs before Redis is contacted."""

from __future__ import annotations

import math
import os
import random
import re
import socket
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from ..errors import ValidationError
from ..keys import validate_job_key_suffix, validate_name

MAX_MS = 2**31 - 1
CONSUMER_GROUP = "respire"
MIN_VISIBILITY_MS = 10
"""The shortest visibility timeout (a handler's lease) job workers, stream workers and the
reliable queue accept: a lease shorter than a few round trips cannot be honoured."""
DEFAULT_MAX_RESULT_BYTES = 512 * 1024
MAX_RESULT_BYTES = 64 * 1024 * 1024


def duration_ms(value: timedelta | float | int, *, what: str, allow_zero: bool = False) -> int:
    """Convert a ``timedelta`` (or seconds) to whole milliseconds, rounding fractions up.

    Raises :class:`ValidationError` unless the result is positive (or zero when allowed) and at
    most 2**31-1 ms.
    """
    if isinstance(value, bool) or not isinstance(value, timedelta | int | float):
        raise ValidationError(f"{what} must be a timedelta or a number of seconds")
    if isinstance(value, int) and not -MAX_MS <= value <= MAX_MS:
        # float(10**400) would raise OverflowError; such a value is out of range anyway
        raise ValidationError(f"{what} must be at most {MAX_MS} ms (about 24.8 days)")
    seconds = value.total_seconds() if isinstance(value, timedelta) else float(value)
    if math.isnan(seconds) or math.isinf(seconds):
        raise ValidationError(f"{what} must be finite")
    if seconds < 0:
        raise ValidationError(f"{what} must be {'zero or ' if allow_zero else ''}positive")
    # rounded to a nanosecond first, so 0.001 s (1.0000000000000002 ms in binary) is 1 ms; any
    # positive value is at least 1 ms
    ms = math.ceil(round(seconds * 1000, 6))
    if seconds > 0:
        ms = max(ms, 1)
    if ms == 0 and not allow_zero:
        raise ValidationError(f"{what} must be {'zero or ' if allow_zero else ''}positive")
    if ms > MAX_MS:
        raise ValidationError(f"{what} must be at most {MAX_MS} ms (about 24.8 days)")
    return ms


def iterate(values: object, *, what: str) -> Iterator[Any]:
    """An iterator over a ``*_many`` call's items, or :class:`ValidationError` for a value that
    is not an iterable of them: a number, or one ``str``/``bytes`` (its characters would be
    taken for items)."""
    if isinstance(values, str | bytes | bytearray | memoryview):
        raise ValidationError(
            f"{what} must be an iterable of items (a list), not one {type(values).__name__}"
        )
    try:
        return iter(values)  # type: ignore[call-overload, no-any-return]
    except TypeError:
        raise ValidationError(
            f"{what} must be an iterable of items (a list), got {type(values).__name__}"
        ) from None


# ASCII digits only, matched in full: ``\d`` would admit other scripts' digits and ``$``
# a trailing newline, both of which the server rejects.
_ID = re.compile(r"([0-9]+)(?:-([0-9]+))?")
_U64 = 2**64 - 1


def is_entry_id(value: str) -> bool:
    """True for a stream entry id (``ms`` or ``ms-seq``, each part a 64-bit unsigned integer)."""
    match = _ID.fullmatch(value)
    return match is not None and all(int(p) <= _U64 for p in match.groups() if p is not None)


def validate_recreate_missing_group(value: object) -> str:
    """``"fail"`` (default), ``"$"`` or an entry id such as ``"1700000000000-0"``."""
    if not isinstance(value, str) or not (value in ("fail", "$") or is_entry_id(value)):
        raise ValidationError(
            "recreate_missing_group must be 'fail', '$' or a stream entry id like "
            f"'1700000000000-0', got {value!r}"
        )
    return value


def visibility_ms(value: timedelta | float | int, *, what: str = "visibility_timeout") -> int:
    """:func:`duration_ms` for a visibility timeout: at least :data:`MIN_VISIBILITY_MS`."""
    ms = duration_ms(value, what=what)
    if ms < MIN_VISIBILITY_MS:
        raise ValidationError(f"{what} must be at least {MIN_VISIBILITY_MS} ms, got {value!r}")
    return ms


def default_consumer_name() -> str:
    """Unique per process: host, pid and a random suffix."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


@dataclass(frozen=True, slots=True)
class LogPolicy:
    """Per-job log limits: lines kept (1-1000), bytes per line (1-16384), retention."""

    max_lines: int = 100
    max_line_bytes: int = 4096
    retention: timedelta = timedelta(days=1)

    def __post_init__(self) -> None:
        if (
            isinstance(self.max_lines, bool)
            or not isinstance(self.max_lines, int)
            or not 1 <= self.max_lines <= 1000
        ):
            raise ValidationError("max_lines must be an integer from 1 to 1000")
        if (
            isinstance(self.max_line_bytes, bool)
            or not isinstance(self.max_line_bytes, int)
            or not 1 <= self.max_line_bytes <= 16384
        ):
            raise ValidationError("max_line_bytes must be an integer from 1 to 16384")
        duration_ms(self.retention, what="log retention")

    @property
    def retention_ms(self) -> int:
        return duration_ms(self.retention, what="log retention")


RETENTION_STREAMS = ("ready", "events", "dead")
MAX_RETENTION_AGE = timedelta(days=3650)
MAX_TRIM_BATCH = 100_000


def retention_age_ms(value: object, *, what: str = "max_age") -> int:
    """A retention age in whole milliseconds (fractions rounded up): a positive timedelta or
    number of seconds of at most :data:`MAX_RETENTION_AGE` (retention ages may exceed the
    2**31-1 ms that :func:`duration_ms` allows). Raises :class:`ValidationError`."""
    if isinstance(value, bool) or not isinstance(value, timedelta | int | float):
        raise ValidationError(f"{what} must be a timedelta or a number of seconds")
    seconds = value.total_seconds() if isinstance(value, timedelta) else float(value)
    if math.isnan(seconds) or math.isinf(seconds) or seconds <= 0:
        raise ValidationError(f"{what} must be positive and finite")
    if seconds > MAX_RETENTION_AGE.total_seconds():
        raise ValidationError(f"{what} must be at most {MAX_RETENTION_AGE.days} days")
    return math.ceil(round(seconds * 1000, 6))


def validate_max_length(value: object, *, what: str = "max_length") -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**53:
        raise ValidationError(f"{what} must be an integer from 0 to 2**53-1")
    return value


@dataclass(frozen=True, slots=True)
class Retention:
    """How long a job queue keeps acknowledged ready entries, events and dead letters.

    max_age:     entries older than this go (a timedelta or seconds, at most 10 years); None
                 for no age limit
    max_length:  only the newest this many entries of each stream stay; None for no limit
    streams:     which of the queue's streams the policy applies to: any of "ready" (its
                 acknowledged, delivered entries), "events" and "dead" (dead letters)
    interval:    pause between the keeper's passes
    batch:       most entries one trim call removes (1-100000); a pass repeats calls until
                 nothing more is out of policy

    At least one of ``max_age`` and ``max_length`` is required. A pending entry, an entry not
    yet delivered to every consumer group, and staged (scheduled) jobs are never removed: see
    docs/retention.md. ``WorkerOptions(retention=None)`` turns retention off.
    """

    max_age: timedelta | float | None = timedelta(days=7)
    max_length: int | None = None
    streams: tuple[str, ...] = RETENTION_STREAMS
    interval: timedelta = timedelta(minutes=1)
    batch: int = 10_000

    def __post_init__(self) -> None:
        if self.max_age is None and self.max_length is None:
            raise ValidationError("Retention needs a max_age, a max_length or both")
        if self.max_age is not None:
            retention_age_ms(self.max_age)
        if self.max_length is not None:
            validate_max_length(self.max_length)
        if (
            not isinstance(self.streams, tuple)
            or not self.streams
            or any(s not in RETENTION_STREAMS for s in self.streams)
            or len(set(self.streams)) != len(self.streams)
        ):
            raise ValidationError(
                f"streams must be a non-empty tuple of distinct names from {RETENTION_STREAMS}"
            )
        duration_ms(self.interval, what="retention interval")
        if (
            isinstance(self.batch, bool)
            or not isinstance(self.batch, int)
            or not 1 <= self.batch <= MAX_TRIM_BATCH
        ):
            raise ValidationError(f"batch must be an integer from 1 to {MAX_TRIM_BATCH}")

    @property
    def max_age_ms(self) -> int | None:
        return None if self.max_age is None else retention_age_ms(self.max_age)


DEFAULT_RETENTION = Retention()
"""Seven days for acknowledged ready entries, events and dead letters."""


@dataclass(frozen=True, slots=True)
class WorkerOptions:
    """How one worker registration consumes a queue.

    consumer_count:      handlers running at once for this registration (admission permits)
    visibility_timeout:  a delivery idle this long may be recovered by another consumer (the
                         lease renewer keeps running deliveries from going idle)
    recovery_interval:   pause between recovery passes
    recovery_page_size:  most entries one recovery page asks for (fewer when fewer admission
                         permits are free; each page re-checks admission)
    delivery_limit:      attempts before dead-lettering (None = unlimited)
    dead_letter_stream:  suffix of a dead-letter stream inside the queue's slot (default "dead")
    telemetry_name:      bounded name for metrics and logs, unique per worker
    consumer_name:       Redis consumer name; default unique per process
    read_batch:          most entries admitted by one read (bounded by free permits)
    poll_interval:       longest blocking wait; paused readers re-check this often
    shutdown_grace:      how long running handlers may finish at shutdown before cancellation
    logs:                per-job log limits
    recreate_missing_group: what to do when the consumer group of a queue that had one is gone:
                         ``"fail"`` (default: stop with :class:`ConsumerGroupMissing`, never
                         replay acknowledged history), ``"$"`` (recreate it for new entries
                         only) or an entry id to recreate it at
    recovery_max_pages:  a recovery pass asks for at most recovery_max_pages *
                         recovery_page_size entries (1-1000 pages' worth); the pass then yields
                         to the reader and the next pass, one recovery_interval later, continues
                         from where this one stopped
    consumer_idle_timeout: the sweeper removes other consumers of the group that have been idle
                         this long and have nothing pending (None: never)
    keep_results:        job workers only: keep each job's outcome (and the handler's encoded
                         return value) this long for ``JobQueue.result`` / ``status``; None
                         (default) keeps nothing. Beyond the seed, see docs/results.md
    max_result_bytes:    largest encoded return value kept (default 512 KiB, at most 64 MiB);
                         a larger one is recorded as ``result-too-large``, the job still completes
    dead_letter_undecodable: dead-letter a payload the codec cannot decode at once; by default
                         (False) it follows the nack policy like a failed handler
    renew_leases:        (default True) a lease renewer keeps the visibility of every running
                         delivery fresh, so a handler may run longer than the visibility timeout
                         and is cancelled only when its lease is really lost; False restores the
                         fixed lease (the handler is cancelled when the visibility timeout runs
                         out)
    timeout:             the execution budget of one handler call (None, the default: no budget).
                         When it runs out the handler is cancelled and the nack path applies
                         (reason ``processing-failed``). With ``renew_leases=False`` it may not
                         exceed the visibility timeout (the lease would end first)
    isolate_suspects:    (default True) a delivery redelivered twice without an outcome (once
                         with a delivery limit of 3 or less) runs alone in its registration, so
                         a job that crashes its process does not drag the jobs beside it to
                         their delivery limit (docs/job-queue.md, "Poison jobs")
    retention:           job workers only: the retention keeper's policy for the queue's
                         acknowledged ready entries, events and dead letters (default
                         :data:`DEFAULT_RETENTION`, seven days). None turns it off, and then
                         Redis memory grows with every processed job. See docs/retention.md

    The visibility timeout must be at least 10 ms (:data:`MIN_VISIBILITY_MS`).
    """

    consumer_count: int = 16
    visibility_timeout: timedelta = timedelta(minutes=2)
    recovery_interval: timedelta = timedelta(seconds=5)
    recovery_page_size: int = 64
    delivery_limit: int | None = 5
    dead_letter_stream: str | None = None
    telemetry_name: str | None = None
    consumer_name: str | None = None
    read_batch: int = 64
    poll_interval: timedelta = timedelta(seconds=1)
    shutdown_grace: timedelta = timedelta(seconds=10)
    logs: LogPolicy = field(default_factory=LogPolicy)
    recreate_missing_group: str = "fail"
    recovery_max_pages: int = 4
    consumer_idle_timeout: timedelta | None = timedelta(days=1)
    keep_results: timedelta | float | None = None
    max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES
    dead_letter_undecodable: bool = False
    renew_leases: bool = True
    timeout: timedelta | float | None = None
    isolate_suspects: bool = True
    retention: Retention | None = DEFAULT_RETENTION

    def __post_init__(self) -> None:
        validate_recreate_missing_group(self.recreate_missing_group)
        if self.retention is not None and not isinstance(self.retention, Retention):
            raise ValidationError(
                f"retention must be a Retention or None, got {type(self.retention).__name__}"
            )
        if (
            isinstance(self.recovery_max_pages, bool)
            or not isinstance(self.recovery_max_pages, int)
            or not 1 <= self.recovery_max_pages <= 1000
        ):
            raise ValidationError("recovery_max_pages must be from 1 to 1000")
        if self.consumer_idle_timeout is not None:
            duration_ms(self.consumer_idle_timeout, what="consumer_idle_timeout")
        if (
            isinstance(self.consumer_count, bool)
            or not isinstance(self.consumer_count, int)
            or not 1 <= self.consumer_count <= 10_000
        ):
            raise ValidationError("consumer_count must be an integer from 1 to 10000")
        visibility_ms(self.visibility_timeout)
        duration_ms(self.recovery_interval, what="recovery_interval")
        duration_ms(self.poll_interval, what="poll_interval")
        duration_ms(self.shutdown_grace, what="shutdown_grace", allow_zero=True)
        if (
            isinstance(self.recovery_page_size, bool)
            or not isinstance(self.recovery_page_size, int)
            or not 1 <= self.recovery_page_size <= 1000
        ):
            raise ValidationError("recovery_page_size must be from 1 to 1000")
        if (
            isinstance(self.read_batch, bool)
            or not isinstance(self.read_batch, int)
            or not 1 <= self.read_batch <= 1000
        ):
            raise ValidationError("read_batch must be from 1 to 1000")
        if self.delivery_limit is not None and (
            isinstance(self.delivery_limit, bool)
            or not isinstance(self.delivery_limit, int)
            or self.delivery_limit < 1
        ):
            raise ValidationError("delivery_limit must be a positive integer or None (unlimited)")
        if self.dead_letter_stream is not None:
            validate_job_key_suffix(self.dead_letter_stream, what="dead_letter_stream suffix")
        if self.consumer_name is not None:
            validate_name(self.consumer_name, what="consumer_name")
        if self.telemetry_name is not None:
            validate_name(self.telemetry_name, what="telemetry_name")
        if not isinstance(self.logs, LogPolicy):
            raise ValidationError(f"logs must be a LogPolicy, got {type(self.logs).__name__}")
        if self.keep_results is not None:
            duration_ms(self.keep_results, what="keep_results")
        if (
            isinstance(self.max_result_bytes, bool)
            or not isinstance(self.max_result_bytes, int)
            or not 1 <= self.max_result_bytes <= MAX_RESULT_BYTES
        ):
            raise ValidationError(
                f"max_result_bytes must be an integer from 1 to {MAX_RESULT_BYTES}"
            )
        if not isinstance(self.dead_letter_undecodable, bool):
            raise ValidationError("dead_letter_undecodable must be a bool")
        if not isinstance(self.renew_leases, bool):
            raise ValidationError("renew_leases must be a bool")
        if not isinstance(self.isolate_suspects, bool):
            raise ValidationError("isolate_suspects must be a bool")
        if self.timeout is not None:
            budget = duration_ms(self.timeout, what="timeout")
            if not self.renew_leases and budget > visibility_ms(self.visibility_timeout):
                raise ValidationError(
                    f"timeout ({budget} ms) exceeds the visibility timeout "
                    f"({visibility_ms(self.visibility_timeout)} ms): without lease renewal the "
                    "lease ends first, so the budget could never be reached; raise "
                    "visibility_timeout or keep renew_leases=True"
                )

    @property
    def timeout_ms(self) -> int:
        """The execution budget in ms, 0 for none."""
        if self.timeout is None:
            return 0
        return duration_ms(self.timeout, what="timeout")

    @property
    def keep_results_ms(self) -> int:
        """Result retention in ms, 0 for none."""
        if self.keep_results is None:
            return 0
        return duration_ms(self.keep_results, what="keep_results")


MAX_SCHEDULING_BATCH = 256

MAX_METRICS_MINUTES = 1440
"""Longest per-minute completion history (one day)."""


@dataclass(frozen=True, slots=True)
class RateLimit:
    """A queue-wide fixed-window rate limit: at most ``permit_limit`` deliveries per ``window``,
    shared by every worker (windows are aligned to the server clock)."""

    permit_limit: int
    window: timedelta | float

    def __post_init__(self) -> None:
        if (
            isinstance(self.permit_limit, bool)
            or not isinstance(self.permit_limit, int)
            or not 1 <= self.permit_limit <= MAX_MS
        ):
            raise ValidationError("permit_limit must be an integer from 1 to 2**31-1")
        duration_ms(self.window, what="rate-limit window")

    @property
    def window_ms(self) -> int:
        return duration_ms(self.window, what="rate-limit window")


@dataclass(frozen=True, slots=True)
class QueueOptions:
    """Scheduling, TTL checks and durable retries for one worker registration.

    Passing ``QueueOptions`` (even all defaults) enables them; ``None`` keeps immediate-only
    processing, which needs no access to the scheduling keys.

    scheduling_poll_interval:    longest pause between promotion passes; blocked readers also
                                 wake at least this often (default 1 s)
    scheduling_batch_size:       most due jobs one promotion pass moves (1-256, default 64)
    retry_backoff:               base of the exponential retry backoff; None (default) keeps
                                 visibility-timeout recovery for nacks without ``retry_after``
    max_retry_backoff:           cap of the backoff (default: uncapped up to 2**31-1 ms)
    retry_jitter:                fraction (0-1, default 0.2) by which each backoff is shortened
                                 at random: the delay is drawn from [(1 - j) * d, d], so jobs
                                 that failed together (an outage) do not retry in lock step;
                                 0 keeps the exact exponential schedule
    rate_limit:                  queue-wide policy to enforce; stored when Redis has none, and
                                 the worker refuses to start if Redis holds a different one
    delete_acknowledged_entries: delete ready entries once acknowledged (XACKDEL ACKED on Redis
                                 8.2+, XACK then XDEL elsewhere)
    metrics_retention_minutes:   keep per-minute completed/failed counters in Redis for this many
                                 minutes (1-1440; 0, the default, records nothing); every worker
                                 of the queue must use the same value (see docs/observability.md)
    """

    scheduling_poll_interval: timedelta | float = timedelta(seconds=1)
    scheduling_batch_size: int = 64
    retry_backoff: timedelta | float | None = None
    max_retry_backoff: timedelta | float | None = None
    retry_jitter: float = 0.2
    rate_limit: RateLimit | None = None
    delete_acknowledged_entries: bool = False
    metrics_retention_minutes: int = 0

    def __post_init__(self) -> None:
        duration_ms(self.scheduling_poll_interval, what="scheduling_poll_interval")
        if (
            isinstance(self.scheduling_batch_size, bool)
            or not isinstance(self.scheduling_batch_size, int)
            or not 1 <= self.scheduling_batch_size <= MAX_SCHEDULING_BATCH
        ):
            raise ValidationError(
                f"scheduling_batch_size must be an integer from 1 to {MAX_SCHEDULING_BATCH}"
            )
        if self.retry_backoff is not None:
            duration_ms(self.retry_backoff, what="retry_backoff")
        if self.max_retry_backoff is not None:
            if self.retry_backoff is None:
                raise ValidationError("max_retry_backoff needs retry_backoff")
            cap = duration_ms(self.max_retry_backoff, what="max_retry_backoff")
            if cap < duration_ms(self.retry_backoff, what="retry_backoff"):
                raise ValidationError("max_retry_backoff must be at least retry_backoff")
        j = self.retry_jitter
        if isinstance(j, bool) or not isinstance(j, int | float) or not 0 <= j <= 1:
            raise ValidationError(f"retry_jitter must be a number from 0 to 1, got {j!r}")
        if self.rate_limit is not None and not isinstance(self.rate_limit, RateLimit):
            raise ValidationError("rate_limit must be a RateLimit or None")
        if not isinstance(self.delete_acknowledged_entries, bool):
            raise ValidationError("delete_acknowledged_entries must be a bool")
        m = self.metrics_retention_minutes
        if isinstance(m, bool) or not isinstance(m, int) or not 0 <= m <= MAX_METRICS_MINUTES:
            raise ValidationError(
                f"metrics_retention_minutes must be an integer from 0 to {MAX_METRICS_MINUTES}, "
                f"got {m!r}"
            )

    @property
    def poll_ms(self) -> int:
        return duration_ms(self.scheduling_poll_interval, what="scheduling_poll_interval")

    def retry_delay_ms(
        self, total_attempt: int, draw: Callable[[], float] = random.random
    ) -> int | None:
        """The backoff after total attempt ``total_attempt`` (from 1): ``d = min(max, base *
        2**(n-1))`` shortened by the jitter, ``d - floor(d * retry_jitter * draw())`` (``draw``
        in [0, 1): at least ``(1 - retry_jitter) * d``, at most ``d``); None when no backoff
        is configured."""
        delay = self._backoff_ms(total_attempt)
        if delay is None or not self.retry_jitter:
            return delay
        return delay - math.floor(delay * self.retry_jitter * draw())

    def _backoff_ms(self, total_attempt: int) -> int | None:
        if self.retry_backoff is None:
            return None
        base = duration_ms(self.retry_backoff, what="retry_backoff")
        cap = (
            MAX_MS
            if self.max_retry_backoff is None
            else duration_ms(self.max_retry_backoff, what="max_retry_backoff")
        )
        exponent = max(0, total_attempt - 1)
        if exponent >= 62:
            return cap
        delay: int = base * 2**exponent
        return min(cap, delay)
