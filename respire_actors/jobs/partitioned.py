"""A partitioned job queue: one queue name over a fixed number of ordinary job queues.

Partition ``i`` of queue ``orders`` is the plain job queue ``orders:p<i>``, with its own hash
tag, so the partitions spread over Redis Cluster slots and nodes instead of sharing one. A job
goes to the partition of its ordering key (default: its job id; see
:mod:`respire_actors.jobs.partitioning`), so deduplication, status and results are found in
that partition. Workers read every partition of the queue (``Worker.register(...,
partitions=N)``). See docs/partitions.md.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import UTC, timedelta
from functools import partial
from typing import Any, Generic, TypeVar

import anyio

from .. import tracing
from ..actors.options import RateLimit, iterate
from ..codecs import Codec, check_codec
from ..errors import RespireError, ValidationError
from ..keys import partition_name, validate_name
from ..redis.client import Pending, RedisClient, Transaction
from . import backpressure as _backpressure
from .backpressure import Backlog
from .groups import DEFAULT_LEASE, GroupInfo
from .metrics import MinuteMetrics
from .model import EnqueueResult, JobStatus, QueueState
from .options import JobEnqueueOptions, validate_group, validate_job_id
from .partitioning import (
    _probe_partitions,
    partition_of,
    run_all,
    validate_partitions,
    verify_partition_count,
)
from .queue import (
    _ENQUEUE,
    _SPAN,
    JobQueue,
    _Prepared,
    _to_result,
    fail_unaccepted,
    run_enqueues,
)

T = TypeVar("T")


def _item(item: object, index: int) -> tuple[str, Any, str | None]:
    """``(job_id, payload)`` or ``(job_id, payload, ordering_key)`` of ``enqueue_many``."""
    if isinstance(item, tuple) and len(item) in (2, 3):
        key = item[2] if len(item) == 3 else None
        return item[0], item[1], key
    raise ValidationError(
        f"job {index} must be a (job_id, payload) or (job_id, payload, ordering_key) tuple"
    )


@dataclass(frozen=True, slots=True)
class PartitionedBacklog:
    """:meth:`PartitionedJobQueue.backlog`: each partition's :class:`Backlog` in partition
    order; ``backlog`` is the total, ``limit`` the per-partition bound they all share (None
    when some partition is unbounded or the bounds differ)."""

    partitions: Sequence[Backlog]

    @property
    def backlog(self) -> int:
        return sum(p.backlog for p in self.partitions)

    @property
    def limit(self) -> int | None:
        limits = {p.limit for p in self.partitions}
        return limits.pop() if len(limits) == 1 else None


@dataclass(frozen=True, slots=True)
class PartitionedQueueState:
    """:meth:`PartitionedJobQueue.get_state`: ``partitions`` holds each partition's state in
    partition order; ``paused`` is True when every partition is paused, ``paused_partitions``
    counts the paused ones, ``rate_limit_hits`` sums the partitions'."""

    partitions: Sequence[QueueState]
    paused: bool
    paused_partitions: int
    rate_limit_hits: int


class PartitionedJobQueue(Generic[T]):
    """A typed job queue split over ``partitions`` ordinary job queues (1 to 1024).

    ``PartitionedJobQueue(client, "orders", JsonCodec(Order), partitions=16)``. The count is
    fixed for the queue's life: the first producer or worker records it in Redis and every
    later one compares (:class:`~respire_actors.errors.PartitionCountMismatch`); this producer
    checks once, before its first enqueue. Raises :class:`ValidationError` for a bad client,
    name, codec or count.
    """

    def __init__(self, client: RedisClient, name: str, codec: Codec[T], *, partitions: int) -> None:
        validate_name(name)
        check_codec(codec)
        self.partitions = validate_partitions(partitions)
        self.client = client
        self.name = name
        self.codec = codec
        self.queues: tuple[JobQueue[T], ...] = tuple(
            JobQueue(client, partition_name(name, i), codec) for i in range(partitions)
        )
        for i, queue in enumerate(self.queues):
            # spans and logs name this queue (as the workers' do), with the partition apart
            queue._destination = name
            queue._span_attrs = {"respire.partition": i}
        self._checked = False  # the count was recorded or found equal
        self._lock = anyio.Lock()

    # -- routing ----------------------------------------------------------------------------
    def partition_of(self, ordering_key: str) -> int:
        """The partition (0-based) that ``ordering_key`` (a job id by default) routes to."""
        return partition_of(ordering_key, self.partitions)

    def partition(self, index: int) -> JobQueue[T]:
        """Partition ``index`` as an ordinary :class:`JobQueue` (events, dead letters, logs,
        pause, metrics of that partition)."""
        if isinstance(index, bool) or not isinstance(index, int):
            raise ValidationError(f"partition must be an int, got {type(index).__name__}")
        if not 0 <= index < self.partitions:
            raise ValidationError(f"partition must be from 0 to {self.partitions - 1}")
        return self.queues[index]

    def queue_for(self, job_id: str, ordering_key: str | None = None) -> JobQueue[T]:
        """The partition holding ``job_id`` (enqueued with ``ordering_key``, if one was given)."""
        validate_job_id(job_id)
        return self.queues[self.partition_of(job_id if ordering_key is None else ordering_key)]

    async def check(self, first: str = "enqueue") -> None:
        """Record the partition count in Redis, or compare it with the recorded one (done once
        before the first enqueue; call it to fail early). Before recording it, checks that
        this client may do ``first`` (``"enqueue"`` or ``"schedule"``, a scheduled enqueue) on
        every partition, so a refused producer records nothing. Raises
        :class:`~respire_actors.errors.PartitionCountMismatch` or
        :class:`~respire_actors.errors.PermissionDenied`."""
        if self._checked:
            return
        async with self._lock:
            if not self._checked:
                await verify_partition_count(self.client, self.name, self.partitions, first=first)
                self._checked = True

    async def _verify(self) -> None:
        """Before a control or an inspection: compare the partition count with the recorded
        one without recording it (an observer may not write). A mismatch would pause, inspect
        or route to partitions the producers and workers do not use."""
        if self._checked:
            return
        async with self._lock:
            if not self._checked:
                self._checked = await verify_partition_count(
                    self.client, self.name, self.partitions, record=False
                )

    # -- enqueue ----------------------------------------------------------------------------
    async def enqueue(
        self,
        job_id: str,
        payload: T,
        *,
        ordering_key: str | None = None,
        dedup_window: timedelta | float | None = None,
        wait: timedelta | float | None = None,
    ) -> EnqueueResult:
        """:meth:`JobQueue.enqueue` into the partition of ``ordering_key`` (default the job
        id). Deduplication is per partition: repeat a job id with the same ordering key (or
        none) and it is found. Under a backlog bound (:meth:`set_max_backlog`) a full
        partition raises :class:`~respire_actors.errors.QueueFull`; ``wait`` retries it with
        backoff as :meth:`JobQueue.enqueue` does. Raises :class:`ValidationError` before
        sending anything."""
        queue = self.queue_for(job_id, ordering_key)
        return await queue._enqueue(job_id, payload, dedup_window, wait, self.check)

    def enqueue_in(
        self,
        tx: Transaction,
        job_id: str,
        payload: T,
        *,
        ordering_key: str | None = None,
        dedup_window: timedelta | float | None = None,
    ) -> Pending[EnqueueResult]:
        """:meth:`JobQueue.enqueue_in` into the partition of ``ordering_key`` (default the job
        id): queued in the caller's transaction, read after commit. In a cluster every other
        key of the transaction must hash to that partition's slot: give it the hash tag
        ``{respire-job:<partition>}``, the partition being
        ``queue.queue_for(job_id, ordering_key).name`` (``<name>:p<i>``).

        The partition count must have been checked first (``await queue.check()``, or any
        enqueue through this object): a transaction cannot wait for it, and a producer with
        the wrong count would route jobs to partitions the workers do not read. Raises
        :class:`ValidationError` (nothing queued) otherwise, or for bad arguments."""
        if tx.client is not self.client:
            raise ValidationError("the transaction must be created from the queue's own client")
        queue = self.queue_for(job_id, ordering_key)
        if not self._checked:
            raise ValidationError(
                f"the partition count of {self.name!r} is not checked yet: call "
                "'await queue.check()' once before a transactional enqueue"
            )
        return queue.enqueue_in(tx, job_id, payload, dedup_window=dedup_window)

    async def enqueue_many(
        self,
        jobs: Iterable[tuple[str, T] | tuple[str, T, str]],
        *,
        dedup_window: timedelta | float | None = None,
    ) -> list[EnqueueResult]:
        """Enqueue many ``(job_id, payload)`` or ``(job_id, payload, ordering_key)`` jobs, each
        routed to its partition, 1000 per pipelined round trip whatever partitions they go to
        (on a cluster the client splits each pipeline per node and writes the parts
        concurrently); results in input order. Everything is validated first; not atomic as a
        whole, safe to retry (deduplication); the first error is raised after the rest ran,
        with each job's outcome in its ``partial_results`` (see ``JobQueue.enqueue_many``)."""
        routed: list[tuple[JobQueue[T], _Prepared]] = []
        error: RespireError | None = None
        with ExitStack() as stack:
            # validate and encode everything before anything is sent
            for i, item in enumerate(iterate(jobs, what="jobs")):
                job_id, payload, key = _item(item, i)
                queue = self.queues[self.partition_of(job_id if key is None else key)]
                span = stack.enter_context(
                    tracing.producer_span(_SPAN, queue._destination, queue._span_attrs)
                )
                routed.append((queue, queue._prepare(job_id, payload, dedup_window, span)))
            await self.check()

            def accept(i: int, reply: Any) -> EnqueueResult:
                queue, m = routed[i]
                return queue._accepted(m.span, m, _to_result(reply))

            try:
                return await run_enqueues(
                    self.client,
                    [(m.script or _ENQUEUE, m.keys, m.args) for _, m in routed],
                    accept,
                )
            except RespireError as exc:  # a refused job fails its own span, not its neighbours'
                fail_unaccepted([m.span for _, m in routed], exc)
                error = exc
        raise error

    async def enqueue_scheduled(
        self,
        job_id: str,
        payload: T,
        options: JobEnqueueOptions | None = None,
        *,
        ordering_key: str | None = None,
        wait: timedelta | float | None = None,
    ) -> EnqueueResult:
        """:meth:`JobQueue.enqueue_scheduled` into the partition of ``ordering_key``. Its
        default is the job's application group (``options.group``), so each group lives in one
        partition and its limits hold, else the job id. Workers need :class:`QueueOptions` to
        promote staged jobs. ``wait`` as in :meth:`enqueue`."""
        if ordering_key is None and isinstance(options, JobEnqueueOptions):
            ordering_key = options.group
        queue = self.queue_for(job_id, ordering_key)
        return await queue._enqueue_scheduled(
            job_id, payload, options, wait, partial(self.check, "schedule")
        )

    # -- application groups (docs/groups.md), each in the partition of its name -------------
    def group_queue(self, group: str) -> JobQueue[T]:
        """The partition application group ``group`` lives in (its name is its ordering key)."""
        validate_group(group)
        return self.queues[self.partition_of(group)]

    async def set_group_options(
        self,
        group: str,
        *,
        max_concurrency: int | None = None,
        rate_limit: RateLimit | None = None,
        lease_duration: timedelta | float = DEFAULT_LEASE,
    ) -> bool:
        """:meth:`JobQueue.set_group_options` in the group's partition."""
        queue = self.group_queue(group)
        await self._verify()
        return await queue.set_group_options(
            group,
            max_concurrency=max_concurrency,
            rate_limit=rate_limit,
            lease_duration=lease_duration,
        )

    async def pause_group(self, group: str) -> bool:
        """:meth:`JobQueue.pause_group` in the group's partition."""
        queue = self.group_queue(group)
        await self._verify()
        return await queue.pause_group(group)

    async def resume_group(self, group: str) -> bool:
        """:meth:`JobQueue.resume_group` in the group's partition."""
        queue = self.group_queue(group)
        await self._verify()
        return await queue.resume_group(group)

    async def get_group(self, group: str) -> GroupInfo:
        """:meth:`JobQueue.get_group` in the group's partition."""
        queue = self.group_queue(group)
        await self._verify()
        return await queue.get_group(group)

    # -- controls and inspection ------------------------------------------------------------
    async def _each(self, method: str, *args: Any) -> list[Any]:
        """Call ``method`` on every partition concurrently, each to its end. When some fail
        (a node that cannot be reached), the first failure in partition order is raised with
        every partition's outcome, its result or its error, in ``partial_results``."""
        await self._verify()
        out, failures = await run_all([partial(getattr(q, method), *args) for q in self.queues])
        if failures:
            first = failures[min(failures)]
            if isinstance(first, RespireError):
                first.partial_results = [failures.get(i, r) for i, r in enumerate(out)]
            raise first
        return out

    async def _check_writes(self, probe: str) -> None:
        """Before a control that writes every partition: may this client write each one (and
        do its keys hold the right types)? Refused on one, it writes none (PermissionDenied or
        WrongKeyType naming what is missing; one pipelined round trip)."""
        await self._verify()
        await _probe_partitions(self.client, self.name, self.partitions, probe)

    async def pause(self) -> int:
        """Pause every partition (each with its own paused event); returns how many changed.
        A client refused a partition's keys or commands pauses none."""
        await self._check_writes("pause")
        return sum(await self._each("pause"))

    async def resume(self) -> int:
        """Resume every partition; returns how many changed (refused on one: resumes none)."""
        await self._check_writes("pause")
        return sum(await self._each("resume"))

    async def get_state(self) -> PartitionedQueueState:
        """Every partition's controls, and the aggregate."""
        states: list[QueueState] = await self._each("get_state")
        paused = sum(1 for s in states if s.paused)
        return PartitionedQueueState(
            partitions=tuple(states),
            paused=paused == self.partitions,
            paused_partitions=paused,
            rate_limit_hits=sum(s.rate_limit_hits for s in states),
        )

    async def status(self, job_id: str, *, ordering_key: str | None = None) -> JobStatus:
        """:meth:`JobQueue.status` in the job's partition: pass the ``ordering_key`` the job
        was enqueued with, if any (without it the job id is routed, as at enqueue)."""
        queue = self.queue_for(job_id, ordering_key)
        await self._verify()
        return await queue.status(job_id)

    async def result(
        self,
        job_id: str,
        *,
        timeout: timedelta | float | None,
        ordering_key: str | None = None,
        codec: Codec[Any] | None = None,
    ) -> Any:
        """:meth:`JobQueue.result` in the job's partition (``ordering_key`` as in
        :meth:`status`)."""
        queue = self.queue_for(job_id, ordering_key)
        await self._verify()
        return await queue.result(job_id, timeout=timeout, codec=codec)

    async def get_logs(
        self, job_id: str, count: int = 100, *, ordering_key: str | None = None
    ) -> list[str]:
        """:meth:`JobQueue.get_logs` in the job's partition."""
        queue = self.queue_for(job_id, ordering_key)
        await self._verify()
        return await queue.get_logs(job_id, count)

    async def read_metrics(self, minutes: int = 60) -> list[MinuteMetrics]:
        """Per-minute completed / failed counts summed over the partitions (each partition's
        own counts: ``partition(i).read_metrics()``)."""
        per: list[list[MinuteMetrics]] = await self._each("read_metrics", minutes)
        total: dict[Any, list[int]] = {}
        for rows in per:
            for m in rows:
                slot = total.setdefault(m.minute.astimezone(UTC), [0, 0])
                slot[0] += m.completed
                slot[1] += m.failed
        return [MinuteMetrics(minute, c, f) for minute, (c, f) in sorted(total.items())]

    async def set_max_backlog(self, per_partition: int | None) -> int:
        """Bound every partition's backlog at ``per_partition`` jobs (None removes the bounds):
        :meth:`JobQueue.set_max_backlog` on each partition, so a producer whose job routes to
        a full partition gets :class:`~respire_actors.errors.QueueFull` while the others still
        accept (the queue holds at most ``partitions * per_partition``). Returns how many
        partitions' bounds changed. Raises :class:`ValidationError` before sending."""
        _backpressure.check_limit(per_partition)
        await self._check_writes("backlog")
        return sum(await self._each("set_max_backlog", per_partition))

    async def backlog(self) -> PartitionedBacklog:
        """Each partition's backlog and bound (:meth:`JobQueue.backlog`: jobs accepted and not
        finished, not the stream length), read concurrently; ``.backlog`` is their sum."""
        return PartitionedBacklog(tuple(await self._each("backlog")))

    async def stream_lengths(self) -> list[int]:
        """Each partition's ready stream length (XLEN: entries retained, acknowledged or not),
        in partition order; one pipelined call per server."""
        await self._verify()
        replies = await self.client.pipeline([("XLEN", q.keys.ready) for q in self.queues])
        out = []
        for reply in replies:
            if isinstance(reply, BaseException):
                raise reply
            out.append(int(reply))
        return out


__all__ = ["PartitionedBacklog", "PartitionedJobQueue", "PartitionedQueueState"]
