"""State shared by the actors of one consumer registration (job or stream worker)."""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio

from supervisors import Mailbox

from ..codecs import Codec
from ..errors import ValidationError
from ..keys import JobQueueKeys
from ..redis.client import RedisClient
from ..tracing import ConsumerTelemetry
from .admission import Admission
from .messages import Completion, Delivery
from .options import CONSUMER_GROUP, QueueOptions, WorkerOptions, duration_ms
from .source import Source

log = logging.getLogger("respire_actors.worker")

Handler = Callable[[Any], Awaitable[Any]]
"""A handler: an async function of the bound delivery (a ``Job``, a ``StreamEntry``...)."""


def check_handler(handler: object, *, what: str = "handler") -> None:
    """Raise :class:`ValidationError` unless ``handler`` is an ``async def`` function (or a
    ``functools.partial`` of one, or an object whose ``__call__`` is ``async def``)."""
    if isinstance(handler, type) or not callable(handler):
        raise ValidationError(f"{what} must be an async function, got {type(handler).__name__}")
    name = getattr(handler, "__name__", handler)
    call = getattr(handler, "__call__", None)  # noqa: B004 - the bound method is what is awaited
    if inspect.iscoroutinefunction(handler) or (
        call is not None and inspect.iscoroutinefunction(call)
    ):
        try:
            signature = inspect.signature(handler)
        except (TypeError, ValueError):  # cannot tell: it is called with one argument anyway
            return
        try:
            signature.bind(None)
        except TypeError as exc:
            raise ValidationError(
                f"{what} {name!r} must take exactly one positional argument (the job or entry) "
                f"and nothing else required: {signature} ({exc})"
            ) from exc
        return
    if inspect.isasyncgenfunction(handler) or (
        call is not None and inspect.isasyncgenfunction(call)
    ):
        raise ValidationError(
            f"{what} {name!r} is an async generator function (it yields): a handler returns "
            "its outcome, so write it as async def with return"
        )
    raise ValidationError(
        f"{what} {name!r} must be an async function "
        "(async def); a plain function would be called and its return value awaited"
    )


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
    # grouped deliveries that failed and were left pending: their group lease was released
    group_releases: int = 0
    promoted: int = 0
    promotion_passes: int = 0
    expired_staged: int = 0
    missing_staged: int = 0
    consumers_removed: int = 0
    # handler returns that were outcomes built around their checks (treated as failures)
    invalid_outcomes: int = 0
    # completions the server (or the completer's own check) refused; their entries stay pending
    rejected_completions: int = 0
    # successes whose return value was too large or unencodable to keep (keep_results)
    results_not_kept: int = 0
    # handlers cancelled by their execution budget (WorkerOptions.timeout); they take the
    # nack path
    timed_out: int = 0
    # suspect deliveries (redelivered without an outcome) whose handlers ran alone
    isolated: int = 0
    # batch members acknowledged as cancelled without running (their batch was cancelled)
    cancelled: int = 0
    # lease renewal (WorkerOptions.renew_leases): passes run, script calls made, leases
    # renewed, calls that failed or timed out, and leases given up because no renewal could be
    # confirmed for a whole visibility timeout (also counted in leases_lost)
    renewal_passes: int = 0
    renewal_calls: int = 0
    leases_renewed: int = 0
    renewal_failures: int = 0
    leases_expired: int = 0
    # times this registration's actors gave up on a transient error (the server or its slot
    # unreachable or loading) and were started again after a backoff (actors/restarts.py)
    outages: int = 0
    # committed dead letters by fixed reason (see actors/metrics.note_dead_letter)
    dead_letter_reasons: dict[str, int] = field(default_factory=dict)


@dataclass(slots=True, eq=False)
class Lease:
    """A running delivery as the lease renewer sees it (registered by the runner while its
    handler runs). ``confirmed_at`` is the local monotonic time from which the lease is known
    to hold: the claiming read's return, then the moment each successful renewal was sent."""

    delivery: Delivery
    arg: Any  # the handler argument (``cancel_scope`` and ``lease_lost`` attributes)
    scope: anyio.CancelScope
    confirmed_at: float
    lost: bool = False
    # A grouped job also holds its group's concurrency lease, which may be shorter than the
    # visibility timeout: ``grouped`` says so, ``term`` is that lease's duration in seconds once
    # known (learned from renewals, per group), None before.
    grouped: bool = False
    term: float | None = None
    # The handler ended and its outcome went to the completer with this lease: it is renewed
    # until the completer has committed it, which then discards it.
    handed: bool = False
    # The handler returned (its outcome is decided, maybe still on its way to the completer):
    # a loss found from here on is the commit's to report (as stale), not a lost lease.
    returned: bool = False


def lose_lease(rt: QueueRuntime, lease: Lease) -> None:
    """Mark ``lease`` lost and cancel its handler's scope (it produces no outcome). A lease
    whose handler already returned (its outcome decided, on its way to the completer or
    handed to it) is only no longer renewed: the commit finds the outcome stale and counts it
    there (counted once, not also as a lost lease)."""
    lease.lost = True
    if lease.handed or lease.returned:
        return
    if not lease.arg.lease_lost:
        lease.arg.lease_lost = True
        rt.stats.leases_lost += 1
    lease.scope.cancel()


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
    # Builds the handler argument of one delivery (a Job with the decoded payload for job
    # workers, the raw entry for stream workers). It must have ``cancel_scope`` and
    # ``lease_lost`` attributes; raising DecodeError takes the nack path (or dead-letters the
    # delivery at once with WorkerOptions.dead_letter_undecodable).
    bind: Callable[[QueueRuntime, Delivery], Any]
    group: str = CONSUMER_GROUP
    stats: WorkerStatistics = field(default_factory=WorkerStatistics)
    # Scheduling, TTL checks and durable retries; None keeps immediate-only processing.
    queue_options: QueueOptions | None = None
    stopping: anyio.Event = field(default_factory=anyio.Event)
    # Set once the sweeper's startup replay is over (or skipped); the reader admits nothing
    # before, so replay can never re-claim an entry the reader has just delivered.
    replay_done: anyio.Event = field(default_factory=anyio.Event)
    # Called with an error that must stop the whole worker (a vanished consumer group).
    on_fatal: Callable[[BaseException], None] | None = None
    # Encodes handler return values kept with WorkerOptions.keep_results (job workers).
    result_codec: Codec[Any] | None = None
    # The deliveries whose handlers are running now (with renew_leases): the runner adds and
    # removes them, the lease renewer renews them and cancels the ones it finds lost.
    leases: set[Lease] = field(default_factory=set)
    # Set by a runner that adds a grouped job's lease: its group lease may need a renewal
    # sooner than the renewer planned (the renewer replaces the event each time it plans).
    lease_added: anyio.Event = field(default_factory=anyio.Event)
    # Group lease durations (seconds) learned from renewals, by (Delivery.origin, job group).
    group_terms: dict[tuple[int, str], float] = field(default_factory=dict)
    # How the registration names itself to tracing, metrics and logs (None: from the options).
    telemetry: ConsumerTelemetry | None = None
    # Runs before a delivery's handler (job workers: a batch member's cancellation check). A
    # Completion it returns is committed instead of running the handler; None runs it.
    gate: Callable[[QueueRuntime, Delivery], Awaitable[Completion | None]] | None = None
    # A partitioned job queue's partitions' keys, indexed by ``Delivery.origin`` (keys_for).
    partition_keys: Sequence[JobQueueKeys] = ()
    # Mistakes of the registration's handlers already warned about (each once per run).
    warned: set[str] = field(default_factory=set)
    # The earliest due time (anyio clock) of a job this registration staged since the promoter
    # last looked (its durable retries), and the event that wakes the promoter for it: without
    # it a retry_after(0) waited out the promoter's sleep, up to a whole poll interval.
    staged_due: float | None = None
    staged: anyio.Event = field(default_factory=anyio.Event)

    def note_staged(self, delay_ms: int) -> None:
        """A job this registration staged is due in ``delay_ms``: wake the promoter for it."""
        due = anyio.current_time() + max(0, delay_ms) / 1000
        if self.staged_due is None or due < self.staged_due:
            self.staged_due = due
        self.staged.set()

    def keys_for(self, delivery: Delivery) -> JobQueueKeys:
        """The job queue keys of ``delivery``: its partition's for a partitioned queue."""
        if self.partition_keys:
            return self.partition_keys[delivery.origin]
        return self.job_keys

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
        """Start-up: create the consumer group of a new stream (see ``Source.ensure_group``)."""
        await self.source.ensure_group(self.options.recreate_missing_group)

    async def restore_group(self) -> None:
        """After NOGROUP: raise :class:`ConsumerGroupMissing` or recreate the group as the
        options say; never at ``0``."""
        await self.source.restore_group(self.options.recreate_missing_group)

    def fail(self, exc: BaseException) -> None:
        """Stop this registration's intake for good and report ``exc`` to the host (which
        stops the worker and raises it from ``run``)."""
        log.error("%s: %s", self.name, exc)
        self.stopping.set()
        if self.on_fatal is not None:
            self.on_fatal(exc)


__all__ = [
    "Completion",
    "Handler",
    "Lease",
    "QueueRuntime",
    "WorkerStatistics",
    "check_handler",
    "log",
    "lose_lease",
]
