"""The job worker: handler registrations run as a supervision tree of actors.

::

    worker                               (root supervisor, one_for_one)
    └── queue:email                      (one supervisor per registration, one_for_one)
        ├── membership                   start-up checks; removes an idle consumer at stop
        ├── sampler                      Redis-side metric gauges, read when a collection asks
        ├── completer                    commits outcomes in batches (stopped last, drains)
        ├── renewer                      renews running deliveries' leases (renew_leases)
        ├── runners                      consumer_count handler runners
        ├── sweeper                      startup replay, then recovery passes
        ├── promoter                     due scheduled jobs -> ready (with QueueOptions only)
        ├── ticker                       recurring schedules -> ready (with RecurringOptions only)
        ├── keeper                       registers the queue; applies WorkerOptions.retention
        └── reader                       admits new jobs (stopped first)

Children start in that order and stop in reverse: intake stops first, running handlers get
``shutdown_grace`` to finish, and the completer commits what finished before it exits.
Unfinished work is left pending in Redis for recovery; nothing is acknowledged to make shutdown
fast.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import anyio
import anyio.abc

from supervisors import ChildSpec, Mailbox, Supervisor

from ..actors.admission import Admission
from ..actors.isolation import suspect_from
from ..actors.messages import Completion, Delivery
from ..actors.options import (
    CONSUMER_GROUP,
    QueueOptions,
    WorkerOptions,
    default_consumer_name,
    duration_ms,
)
from ..actors.promoter import run_promoter
from ..actors.restarts import RestartLimits
from ..actors.retention_keeper import KeeperStatistics, run_retention_keeper
from ..actors.runtime import Handler, QueueRuntime, check_handler
from ..actors.ticker import TickerStatistics, run_ticker
from ..actors.tree import ConsumerHost, consumer_supervisor
from ..codecs import Codec, JsonValueCodec, check_codec
from ..errors import ValidationError
from ..keys import JobQueueKeys, partition_name, validate_name
from ..redis.client import RedisClient
from ..retention import stream_key
from ..tracing import ConsumerTelemetry
from .job import batch_gate, bind_job
from .partitioned_source import PartitionedSource
from .partitioning import validate_partitions
from .recurring import RecurringOptions, RecurringScheduler
from .source import JobSource

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Registration:
    """One handler registered for one queue."""

    queue: str
    handler: Handler
    codec: Codec[Any]
    options: WorkerOptions
    queue_options: QueueOptions | None = None
    result_codec: Codec[Any] | None = None
    recurring: RecurringOptions | None = None
    partitions: int | None = None


class Worker(ConsumerHost):
    """Registers handlers and runs them as supervised actors.

    ::

        worker = Worker()

        @worker.job("email", JsonCodec(EmailJob), WorkerOptions(consumer_count=8))
        async def send_email(job: Job[EmailJob]) -> Outcome:
            ...
            return ACK

        async with connect(url) as client:
            await worker.run(client)       # or: python -m respire_actors serve app:worker
    """

    def __init__(
        self, name: str = "worker", *, restart_limits: RestartLimits | None = None
    ) -> None:
        validate_name(name, what="worker name")
        super().__init__(name, restart_limits)
        self._registrations: dict[str, Registration] = {}
        self._ticker_stats: dict[str, TickerStatistics] = {}
        self._keeper_stats: dict[str, KeeperStatistics] = {}

    def register(
        self,
        queue: str,
        handler: Handler,
        codec: Codec[Any],
        options: WorkerOptions | None = None,
        *,
        queue_options: QueueOptions | None = None,
        result_codec: Codec[Any] | None = None,
        recurring: RecurringOptions | None = None,
        partitions: int | None = None,
    ) -> Registration:
        """Register ``handler`` for ``queue``. Each queue once per worker; telemetry names
        must be unique. ``queue_options`` enables scheduling (a promoter actor), TTL checks and
        durable retries; None keeps immediate-only processing. ``result_codec`` encodes the
        handler's return values kept with ``WorkerOptions(keep_results=...)`` (default
        :class:`~respire_actors.codecs.JsonValueCodec`). ``recurring`` runs a recurring ticker
        actor for the queue's schedules (see docs/recurring.md); None runs none.
        ``partitions`` makes ``queue`` a partitioned job queue of that many partitions (1 to
        1024, the count its producers use; see docs/partitions.md): one registration reads
        every partition.

        Raises :class:`ValidationError` at once for what could never run: a handler that is
        not an ``async def`` function, a codec that is not a codec instance (pass
        ``JsonCodec(Email)``, not the class), options of the wrong type.
        """
        validate_name(queue)
        check_handler(handler)
        check_codec(codec)
        if result_codec is not None:
            check_codec(result_codec, what="result_codec")
        if options is None:
            options = WorkerOptions()
        elif not isinstance(options, WorkerOptions):
            raise ValidationError(
                f"options must be a WorkerOptions or None, got {type(options).__name__}"
            )
        if queue_options is not None and not isinstance(queue_options, QueueOptions):
            raise ValidationError(
                f"queue_options must be a QueueOptions or None, got {type(queue_options).__name__}"
            )
        if recurring is not None and not isinstance(recurring, RecurringOptions):
            raise ValidationError(
                f"recurring must be a RecurringOptions or None, got {type(recurring).__name__}"
            )
        if partitions is not None:
            validate_partitions(partitions)
            if recurring is not None:
                raise ValidationError(
                    "recurring schedules are not supported on a partitioned queue; register "
                    "them on an ordinary queue (docs/partitions.md)"
                )
            if queue_options is not None and queue_options.rate_limit is not None:
                raise ValidationError(
                    "a queue-wide rate limit is not supported on a partitioned queue (each "
                    "partition would enforce it on its own); see docs/partitions.md"
                )
        if queue in self._registrations:
            raise ValidationError(f"queue {queue!r} is already registered on this worker")
        names = {r.options.telemetry_name or r.queue for r in self._registrations.values()}
        if (options.telemetry_name or queue) in names:
            raise ValidationError(f"telemetry name {options.telemetry_name or queue!r} is taken")
        if self._supervisor is not None:
            raise RuntimeError("register handlers before the worker runs")
        if result_codec is None and options.keep_results is not None:
            result_codec = JsonValueCodec()
        reg = Registration(
            queue, handler, codec, options, queue_options, result_codec, recurring, partitions
        )
        self._registrations[queue] = reg
        return reg

    def job(
        self,
        queue: str,
        codec: Codec[Any],
        options: WorkerOptions | None = None,
        *,
        queue_options: QueueOptions | None = None,
        result_codec: Codec[Any] | None = None,
        recurring: RecurringOptions | None = None,
        partitions: int | None = None,
    ) -> Callable[[Handler], Handler]:
        """Decorator form of :meth:`register` (the codec and options are checked here, before
        the function is seen)."""
        check_codec(codec)
        if options is not None and not isinstance(options, WorkerOptions):
            raise ValidationError(
                f"options must be a WorkerOptions or None, got {type(options).__name__}"
            )

        def decorate(fn: Handler) -> Handler:
            self.register(
                queue,
                fn,
                codec,
                options,
                queue_options=queue_options,
                result_codec=result_codec,
                recurring=recurring,
                partitions=partitions,
            )
            return fn

        return decorate

    @property
    def registrations(self) -> list[Registration]:
        return list(self._registrations.values())

    def _job_source(self, client: RedisClient, reg: Registration, queue: str) -> JobSource:
        o, qo = reg.options, reg.queue_options
        keys = JobQueueKeys(queue, client.key_prefix)
        dead = keys.custom(o.dead_letter_stream) if o.dead_letter_stream else keys.dead
        source = JobSource(
            client,
            keys,
            dead,
            CONSUMER_GROUP,
            delete_acknowledged=bool(qo and qo.delete_acknowledged_entries),
            rate_limit=qo.rate_limit if qo else None,
            selection_batch=qo.scheduling_batch_size if qo else None,
            metrics_retention=qo.metrics_retention_minutes if qo else 0,
        )
        if o.isolate_suspects:
            source.alone_from = suspect_from(o.delivery_limit or 0)
        source.visibility_ms = duration_ms(o.visibility_timeout, what="visibility_timeout")
        return source

    def _runtime(self, client: RedisClient, reg: Registration) -> QueueRuntime:
        o = reg.options
        keys: JobQueueKeys | None
        partition_keys: tuple[JobQueueKeys, ...]
        source: JobSource | PartitionedSource
        if reg.partitions is None:
            source = self._job_source(client, reg, reg.queue)
            keys, partition_keys = source.keys, ()
        else:
            parts = [self._job_source(client, reg, q) for q in _partition_names(reg)]
            source = PartitionedSource(client, reg.queue, parts, CONSUMER_GROUP)
            keys, partition_keys = None, tuple(p.keys for p in parts)
        return QueueRuntime(
            client=client,
            keys=keys,
            partition_keys=partition_keys,
            source=source,
            bind=bind_job,
            codec=reg.codec,
            handler=reg.handler,
            options=o,
            consumer=o.consumer_name or default_consumer_name(),
            admission=Admission(o.consumer_count),
            deliveries=Mailbox[Delivery](
                max(o.consumer_count, o.read_batch, o.recovery_page_size) + o.consumer_count,
                name=f"{reg.queue}:deliveries",
            ),
            completions=Mailbox[Completion](
                max(64, o.consumer_count * 2), name=f"{reg.queue}:completions"
            ),
            queue_options=reg.queue_options,
            result_codec=reg.result_codec,
            telemetry=ConsumerTelemetry(o.telemetry_name or reg.queue, reg.queue),
            gate=batch_gate,
        )

    def build(self, client: RedisClient) -> Supervisor:
        """Build the supervision tree for ``client`` (to compose into your own supervisor).

        The tree runs its own start-up checks: each registration's first child creates the
        consumer group of a new queue (a vanished group raises :class:`ConsumerGroupMissing`
        unless ``recreate_missing_group`` says otherwise) and, with :class:`QueueOptions`,
        stores or compares the rate policy (:class:`ConfigurationError` on a mismatch). A
        failed check fails the tree's start (``supervisors.StartError`` with the error as its
        cause); :meth:`run` raises the error itself. Raises :class:`RuntimeError` while this
        worker is running (one Worker runs once at a time). A tree composed into your own
        supervisor belongs to this Worker until it has stopped: do not also ``run`` it, or
        ``build`` it again, meanwhile (the worker cannot tell when your supervisor ends it);
        use one Worker per tree."""
        self._refuse_if_running()
        if not self._registrations:
            raise ValidationError("the worker has no registered handlers")
        queue_sups = []
        for reg in self._registrations.values():
            rt = self._runtime(client, reg)
            rt.on_fatal = self._on_fatal
            self._runtimes[reg.queue] = rt
            extra = []
            if reg.queue_options is not None:
                io = client.settings.command_timeout + 1
                extra.append(ChildSpec("promoter", run_promoter, rt, shutdown=io))
            if reg.recurring is not None:
                extra.append(self._ticker(client, reg))
            extra.append(self._keeper(client, reg))
            queue_sups.append(
                consumer_supervisor(
                    f"queue:{reg.queue}", rt, before_reader=extra, limits=self.restart_limits
                )
            )
        return self._root(queue_sups)

    async def run(
        self,
        client: RedisClient,
        *,
        task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Run until cancelled or :meth:`request_stop`; reports ready once every actor has
        started. The client must be entered and stay open while the worker runs.

        Raises the start-up checks' errors (see :meth:`build`) before any job is read, and
        :class:`ConsumerGroupMissing` if a queue's group vanishes while running (the worker
        stops instead of replaying acknowledged jobs).
        """
        await self._run_tree(self.build(client), task_status)

    def _ticker(self, client: RedisClient, reg: Registration) -> ChildSpec:
        assert reg.recurring is not None
        scheduler = RecurringScheduler(client, reg.queue, reg.codec, clock=reg.recurring.clock)
        stats = self._ticker_stats[reg.queue] = TickerStatistics()
        return ChildSpec(
            "ticker",
            run_ticker,
            reg.queue,
            scheduler,
            reg.recurring.poll_ms,
            reg.recurring.max_ticks_per_pass,
            stats,
            shutdown=client.settings.command_timeout + 1,
        )

    def _keeper(self, client: RedisClient, reg: Registration) -> ChildSpec:
        retention = reg.options.retention
        dead = reg.options.dead_letter_stream
        names = _partition_names(reg)
        streams = []
        for name in names:
            keys = JobQueueKeys(name, client.key_prefix)
            label = "" if reg.partitions is None else f"{name}:"
            if retention:
                streams += [(label + s, stream_key(keys, s, dead)) for s in retention.streams]
        stats = self._keeper_stats[reg.queue] = KeeperStatistics()
        return ChildSpec(
            "keeper",
            run_retention_keeper,
            client,
            names,
            streams,
            retention,
            stats,
            shutdown=client.settings.command_timeout + 1,
        )

    def keeper_statistics(self, queue: str) -> KeeperStatistics:
        """Counters of ``queue``'s retention keeper (passes, trim calls, entries removed per
        stream); after :meth:`build`."""
        return self._keeper_stats[queue]

    def ticker_statistics(self, queue: str) -> TickerStatistics:
        """Counters of ``queue``'s recurring ticker (passes, failed passes, enqueued ticks,
        stale ticks); only for a registration with ``recurring=``, after :meth:`build`."""
        return self._ticker_stats[queue]

    def in_flight(self, queue: str) -> int:
        """How many of ``queue``'s deliveries this process holds now: admitted and not yet
        handed to the completer (read-only; ``serve`` reports it in its throughput line)."""
        return self._runtimes[queue].admission.statistics().in_use


def _partition_names(reg: Registration) -> list[str]:
    """The job queues a registration reads: its queue, or each partition of it."""
    if reg.partitions is None:
        return [reg.queue]
    return [partition_name(reg.queue, i) for i in range(reg.partitions)]
