"""The typed job queue: the producer and observer side. Needs no worker."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from contextlib import ExitStack, asynccontextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Generic, TypeVar

import anyio
from opentelemetry.trace import Span

from .. import tracing
from ..actors.options import is_entry_id, iterate
from ..clock import Clock
from ..codecs import Codec, JsonValueCodec, check_codec, decode_with, encode_with
from ..errors import (
    JobDeadLettered,
    JobResultTimeout,
    JobResultUnavailable,
    RedisUnavailable,
    RespireError,
    ValidationError,
)
from ..keys import JobQueueKeys, validate_name
from ..redis.client import BlockingConnection, Pending, RedisClient, Transaction
from ..redis.scripts import Script, load, run_many
from . import backpressure as _backpressure
from . import batches as _batches
from . import flows as _flows
from . import groups as _groups
from .backpressure import Backlog
from .batches import BatchStatus, Callback
from .flows import FAIL_PARENT, FlowFailurePolicy, FlowNode, FlowNodeResult
from .groups import GroupInfo, GroupOptions, GroupPage
from .metrics import MinuteMetrics, read_metrics
from .model import EnqueueResult, JobEvent, JobStatus, QueueState
from .options import (
    DEFAULT_DEDUP_WINDOW,
    JobEnqueueOptions,
    RateLimit,
    duration_ms,
    validate_job_id,
)
from .recurring import RecurringScheduler

T = TypeVar("T")

_ENQUEUE = load("job_enqueue")
_SCHEDULE = load("job_schedule")
_SCHEDULE_GROUP = load("job_schedule_group")
_PAUSE = load("job_pause")
_RATE_POLICY = load("job_rate_policy")
_SPAN = "job enqueue"
_tlog = logging.getLogger("respire_actors.telemetry")


def _pair(item: object, index: int) -> tuple[str, Any]:
    """One ``(job_id, payload)`` item of a many-call, checked before anything is sent."""
    if not isinstance(item, tuple | list) or len(item) != 2:
        raise ValidationError(
            f"item {index} must be a (job_id, payload) pair, got {type(item).__name__}"
        )
    return item[0], item[1]


async def run_enqueues(
    client: RedisClient,
    calls: Sequence[tuple[Script, Sequence[str], Sequence[bytes | str | int]]],
    accept: Callable[[int, Any], EnqueueResult],
) -> list[EnqueueResult]:
    """Run enqueue script calls 1000 per pipelined round trip; ``accept(i, reply)`` turns call
    ``i``'s reply into its result. Every round trip is sent even after a job was refused (the
    others may fit or be deduplicated repeats); a round trip that fails as a whole (the
    connection was lost) stops the call, its jobs' outcome unknown. On a cluster each node's
    part of a round trip stands alone: jobs on an unreachable node get its error, the rest
    their results. Then the first error is
    raised with :attr:`~respire_actors.errors.RespireError.partial_results`: each job's result,
    error, or None when it was never sent."""
    outcomes: list[EnqueueResult | BaseException | None] = [None] * len(calls)
    first: BaseException | None = None
    for start in range(0, len(calls), 1000):
        chunk = calls[start : start + 1000]
        try:
            # on a cluster, a node that cannot be reached fails only its own jobs: the others'
            # results are known and reported as such
            replies = await run_many(client, chunk, per_node_errors=True)
        except RespireError as exc:
            outcomes[start : start + len(chunk)] = [exc] * len(chunk)
            first = first or exc
            break
        for offset, reply in enumerate(replies):
            if isinstance(reply, BaseException):
                outcomes[start + offset] = reply
                first = first or reply
            else:
                outcomes[start + offset] = accept(start + offset, reply)
    if first is not None:
        if isinstance(first, RespireError):
            first.partial_results = list(outcomes)
        raise first
    return [o for o in outcomes if isinstance(o, EnqueueResult)]


def fail_unaccepted(spans: Sequence[Span | None], error: RespireError) -> None:
    """Mark failed the producer spans of a many-call's jobs that were not accepted (an error,
    or never sent), per ``error.partial_results``; the accepted ones keep their success."""
    outcomes = error.partial_results
    for i, span in enumerate(spans):
        outcome = outcomes[i] if outcomes is not None and i < len(outcomes) else None
        if not isinstance(outcome, EnqueueResult):
            tracing.fail(span, outcome if isinstance(outcome, BaseException) else error)


def _to_result(reply: Any) -> EnqueueResult:
    entry, new = reply
    return EnqueueResult(_s(entry), bool(int(new)))


def _s(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


@dataclass(frozen=True, slots=True)
class _Prepared:
    keys: tuple[str, ...]
    args: tuple[bytes | str | int, ...]
    script: Script | None = None
    job_id: str = ""
    span: Span | None = None


class JobQueue(Generic[T]):
    """A typed job queue bound to a client, a queue name and a codec.

    ``JobQueue(client, "email", JsonCodec(EmailJob))``. The queue does not own the client. A
    worker for the same queue name and key prefix processes what this queue enqueues.
    Raises :class:`ValidationError` for a client that is not a :class:`RedisClient`, a bad
    name, or a codec that is not a codec instance (``JsonCodec(EmailJob)``, not the class).
    """

    def __init__(self, client: RedisClient, name: str, codec: Codec[T]) -> None:
        if not isinstance(client, RedisClient):
            raise ValidationError(f"client must be a RedisClient, got {type(client).__name__}")
        validate_name(name)
        check_codec(codec)
        self.client = client
        self.name = name
        self.codec = codec
        self.keys = JobQueueKeys(name, client.key_prefix)
        # how spans and logs name the destination: the queue, or for a partition of a
        # partitioned queue that queue's name and the partition (set by PartitionedJobQueue)
        self._destination = name
        self._span_attrs: dict[str, Any] = {}

    # -- enqueue ----------------------------------------------------------------------------
    def _prepare(
        self,
        job_id: str,
        payload: T,
        dedup_window: timedelta | float | None,
        span: Span | None = None,
    ) -> _Prepared:
        validate_job_id(job_id)
        tracing.set_attributes(span, {"respire.job.id": job_id})
        window = duration_ms(
            DEFAULT_DEDUP_WINDOW if dedup_window is None else dedup_window,
            what="deduplication window",
        )
        body = encode_with(self.codec, payload, limit=self.client.settings.max_payload_bytes)
        fields: list[bytes | str | int] = [
            "_respire.job.id",
            job_id,
            "_respire.job.payload",
            body,
        ]
        fields += tracing.context_fields(span)
        return _Prepared(
            (self.keys.ready, self.keys.dedup(job_id), self.keys.control, self.keys.scheduled),
            (window, *fields),
            job_id=job_id,
            span=span,
        )

    async def enqueue(
        self,
        job_id: str,
        payload: T,
        *,
        dedup_window: timedelta | float | None = None,
        wait: timedelta | float | None = None,
    ) -> EnqueueResult:
        """Append a job unless ``job_id`` was enqueued within the deduplication window.

        Concurrent duplicates all get the original entry id; exactly one reports
        ``enqueued=True``; the first payload wins. The window (default one day; positive, at
        most 2**31-1 ms, fractions rounded up) starts at the successful enqueue and duplicates
        do not extend it. Raises :class:`ValidationError` before sending anything for a bad id,
        window or payload. If cancelled or the reply is lost, the job may or may not be queued:
        retry with the same id inside the window.

        When the queue has a backlog bound (:meth:`set_max_backlog`) that is reached, raises
        :class:`~respire_actors.errors.QueueFull` and enqueues nothing (a duplicate of an
        accepted id still succeeds). ``wait`` (a timedelta or seconds) retries a refused
        enqueue with backoff (10 ms doubling to 500 ms) until the backlog drains or ``wait``
        has passed, then raises the last QueueFull; None (default) tries once.
        """
        return await self._enqueue(job_id, payload, dedup_window, wait, None)

    async def _enqueue(
        self,
        job_id: str,
        payload: T,
        dedup_window: timedelta | float | None,
        wait: timedelta | float | None,
        before_send: Callable[[], Awaitable[None]] | None,
    ) -> EnqueueResult:
        """:meth:`enqueue`; ``before_send`` runs after every check, before the first command
        (a partitioned queue records its partition count there)."""
        wait_s = _backpressure.wait_seconds(wait)
        with tracing.producer_span(_SPAN, self._destination, self._span_attrs) as span:
            prepared = self._prepare(job_id, payload, dedup_window, span)
            if before_send is not None:
                await before_send()
            reply = await _backpressure.retry_while_full(
                lambda: _ENQUEUE(self.client, prepared.keys, prepared.args), wait_s
            )
            return self._accepted(span, prepared, _to_result(reply))

    async def enqueue_many(
        self,
        jobs: Iterable[tuple[str, T]],
        *,
        dedup_window: timedelta | float | None = None,
    ) -> list[EnqueueResult]:
        """Enqueue many jobs in pipelined round trips, each with :meth:`enqueue`'s semantics.

        Every job is validated before anything is sent: each item must be a ``(job_id,
        payload)`` pair (else :class:`ValidationError`), and a payload the codec cannot encode
        raises :class:`~respire_actors.codecs.EncodeError`. Not atomic as a whole: if a command
        fails, the exception is raised after the others ran; retrying the whole call is safe
        (deduplication returns the existing entries). Under a backlog bound each job is
        checked on its own: the jobs that fit are enqueued and the first
        :class:`~respire_actors.errors.QueueFull` is raised after the rest ran (repeat the call
        once the backlog drains: the accepted ones deduplicate). The raised error's
        ``partial_results`` lists each job's outcome in input order: its
        :class:`EnqueueResult`, the error it got, or None if it was never sent (a connection
        lost on an earlier round trip of 1000 jobs stops the call).
        """
        return await self._many(
            jobs, lambda item, i, span: self._prepare(*_pair(item, i), dedup_window, span), _ENQUEUE
        )

    async def _many(
        self,
        jobs: Iterable[Any],
        prepare: Callable[[Any, int, Span | None], _Prepared],
        script: Script,
    ) -> list[EnqueueResult]:
        """Prepare every job (each with its producer span), then run them pipelined. A job
        refused by Redis fails its own span only, never its accepted neighbours'."""
        error: RespireError | None = None
        with ExitStack() as stack:
            prepared = []
            for i, item in enumerate(iterate(jobs, what="jobs")):
                span = stack.enter_context(
                    tracing.producer_span(_SPAN, self._destination, self._span_attrs)
                )
                prepared.append(prepare(item, i, span))
            try:
                return await self._pipelined(script, prepared)
            except RespireError as exc:
                fail_unaccepted([p.span for p in prepared], exc)
                error = exc
        raise error

    async def _pipelined(
        self, script: Script, prepared: Sequence[_Prepared]
    ) -> list[EnqueueResult]:
        """Run prepared enqueues 1000 per round trip (see :func:`run_enqueues`)."""
        return await run_enqueues(
            self.client,
            [(p.script or script, p.keys, p.args) for p in prepared],
            lambda i, reply: self._accepted(prepared[i].span, prepared[i], _to_result(reply)),
        )

    def _accepted(
        self, span: Span | None, prepared: _Prepared, result: EnqueueResult
    ) -> EnqueueResult:
        """Record an enqueue's reply on its producer span and in the DEBUG log."""
        tracing.set_attributes(
            span,
            {
                "messaging.message.id": result.entry_id,
                "respire.job.deduplicated": not result.enqueued,
            },
        )
        if _tlog.isEnabledFor(logging.DEBUG):
            trace = tracing.enqueue_trace_id(prepared.args)
            _tlog.debug(
                "%s: %r %s as %s",
                self.name,
                prepared.job_id,
                "accepted" if result.enqueued else "deduplicated",
                result.entry_id,
                extra={
                    "event": "accepted",
                    "queue": self._destination,
                    "job_id": prepared.job_id,
                    "entry_id": result.entry_id,
                    "attempt": 0,
                    "trace_id": trace,
                    "deduplicated": not result.enqueued,
                },
            )
        return result

    def enqueue_in(
        self,
        tx: Transaction,
        job_id: str,
        payload: T,
        *,
        dedup_window: timedelta | float | None = None,
    ) -> Pending[EnqueueResult]:
        """Queue the enqueue inside a caller's transaction; read the result after commit.

        Nothing is written before EXEC; a discarded or WATCH-aborted transaction aborts the
        pending result. The transaction must come from the same client (same key prefix), and
        every key in it must hash to this queue's slot in a cluster.

        Under a reached backlog bound the enqueue writes nothing and the pending result raises
        :class:`~respire_actors.errors.QueueFull` after commit; Redis does not roll back the
        transaction's other commands, so check :meth:`backlog` first (or leave transactional
        producers unbounded) when they must not commit without the job.
        """
        if tx.client is not self.client:
            raise ValidationError("the transaction must be created from the queue's own client")
        return self._queue_in_tx(
            tx, lambda span: self._prepare(job_id, payload, dedup_window, span), _ENQUEUE
        )

    def _queue_in_tx(
        self, tx: Transaction, prepare: Callable[[Span | None], _Prepared], script: Script
    ) -> Pending[EnqueueResult]:
        """Queue a prepared enqueue in ``tx``. Its producer span stays open until the
        transaction ends, to carry the reply (entry id, deduplicated) or its error."""
        scope = tracing.producer_span(_SPAN, self._destination, self._span_attrs)
        span = scope.__enter__()

        def done(pending: Pending[EnqueueResult]) -> None:
            try:
                if pending.error is None:
                    self._accepted(span, prepared, pending.result())
                else:
                    tracing.fail(span, pending.error)
            finally:
                scope.__exit__(None, None, None)

        try:
            prepared = prepare(span)
            return (prepared.script or script).queue_in(
                tx, prepared.keys, prepared.args, convert=_to_result, on_done=done
            )
        except BaseException as exc:  # refused before it was queued: the span ends now
            scope.__exit__(type(exc), exc, exc.__traceback__)
            raise

    # -- scheduled enqueue ------------------------------------------------------------------
    def _prepare_scheduled(
        self, job_id: str, payload: T, options: JobEnqueueOptions | None, span: Span | None = None
    ) -> _Prepared:
        validate_job_id(job_id)
        tracing.set_attributes(span, {"respire.job.id": job_id})
        options = JobEnqueueOptions() if options is None else options
        if not isinstance(options, JobEnqueueOptions):
            raise ValidationError("options must be a JobEnqueueOptions")
        body = encode_with(self.codec, payload, limit=self.client.settings.max_payload_bytes)
        fields: list[bytes | str | int] = ["_respire.job.id", job_id, "_respire.job.payload", body]
        fields += tracing.context_fields(span)
        timing = (options.dedup_window_ms, options.delay_ms, options.priority, options.ttl_ms)
        if options.group is not None:
            k = self.keys
            return _Prepared(
                (
                    k.scheduled,
                    k.dedup(job_id),
                    k.group_jobs,
                    k.group_order,
                    k.group_parked,
                    k.group_policy,
                    k.control,
                    k.ready,
                ),
                (*timing, options.group, *fields),
                _SCHEDULE_GROUP,
                job_id,
                span,
            )
        return _Prepared(
            (
                self.keys.scheduled,
                self.keys.due,
                self.keys.dedup(job_id),
                self.keys.control,
                self.keys.ready,
            ),
            (*timing, *fields),
            _SCHEDULE,
            job_id,
            span,
        )

    async def enqueue_scheduled(
        self,
        job_id: str,
        payload: T,
        options: JobEnqueueOptions | None = None,
        *,
        wait: timedelta | float | None = None,
    ) -> EnqueueResult:
        """Stage a job with a delay, a priority and/or a time to live.

        The job waits in the staging stream until it is due (Redis server time + delay), then a
        scheduling-enabled worker (registered with :class:`QueueOptions`) promotes it to the
        ready stream under a new entry id. ``entry_id`` of the result is the staging id.
        Deduplication is shared with :meth:`enqueue`: a duplicate within the window returns the
        original (staged or ready) id with ``enqueued=False`` and changes nothing. Raises
        :class:`ValidationError` before sending anything. If cancelled or the reply is lost,
        the job may or may not be staged: retry with the same id inside the window.

        With ``options.group`` the job belongs to that application group: it stays staged until
        a reader selects it in its group's turn (fair rotation, group limits; see
        docs/groups.md) and ``job.group`` gives the group to the handler.

        Staged jobs count in the backlog: a reached bound raises
        :class:`~respire_actors.errors.QueueFull` (``wait`` as in :meth:`enqueue`).
        """
        return await self._enqueue_scheduled(job_id, payload, options, wait, None)

    async def _enqueue_scheduled(
        self,
        job_id: str,
        payload: T,
        options: JobEnqueueOptions | None,
        wait: timedelta | float | None,
        before_send: Callable[[], Awaitable[None]] | None,
    ) -> EnqueueResult:
        """:meth:`enqueue_scheduled`; ``before_send`` as in :meth:`_enqueue`."""
        wait_s = _backpressure.wait_seconds(wait)
        with tracing.producer_span(_SPAN, self._destination, self._span_attrs) as span:
            prepared = self._prepare_scheduled(job_id, payload, options, span)
            if before_send is not None:
                await before_send()
            script = prepared.script
            assert script is not None
            reply = await _backpressure.retry_while_full(
                lambda: script(self.client, prepared.keys, prepared.args), wait_s
            )
            return self._accepted(span, prepared, _to_result(reply))

    async def enqueue_scheduled_many(
        self,
        jobs: Iterable[tuple[str, T]],
        options: JobEnqueueOptions | None = None,
    ) -> list[EnqueueResult]:
        """:meth:`enqueue_scheduled` for many jobs with the same options, pipelined; validated
        up front, not atomic as a whole, safe to retry (deduplication). A refused job does not
        stop the others; the first error is raised after them, with every job's outcome in its
        ``partial_results`` (as :meth:`enqueue_many`)."""
        return await self._many(
            jobs, lambda item, i, span: self._prepare_scheduled(*_pair(item, i), options, span),
            _SCHEDULE,
        )  # fmt: skip

    def enqueue_scheduled_in(
        self,
        tx: Transaction,
        job_id: str,
        payload: T,
        options: JobEnqueueOptions | None = None,
    ) -> Pending[EnqueueResult]:
        """Queue :meth:`enqueue_scheduled` inside a caller's transaction (see
        :meth:`enqueue_in`); the delay and TTL clocks start when EXEC runs it."""
        if tx.client is not self.client:
            raise ValidationError("the transaction must be created from the queue's own client")
        return self._queue_in_tx(
            tx, lambda span: self._prepare_scheduled(job_id, payload, options, span), _SCHEDULE
        )

    # -- recurring schedules (jobs/recurring.py) --------------------------------------------
    def scheduler(self, clock: Clock | None = None) -> RecurringScheduler[T]:
        """The recurring scheduler of this queue (see docs/recurring.md); ``clock`` is the UTC
        clock deciding what is due (default the system clock)."""
        return RecurringScheduler(self.client, self.name, self.codec, clock=clock)

    # -- queue controls ---------------------------------------------------------------------
    async def pause(self) -> bool:
        """Pause the queue for every worker: new reads, startup replay and recovery admit
        nothing until :meth:`resume`. Running handlers are not interrupted; enqueue and
        promotion of scheduled jobs continue. Persistent in the control hash.

        Returns True when this call changed the state, atomically appending a ``paused``
        event; False (and no event) when it was already paused. Safe to retry after a lost
        reply (the retry returns False).
        """
        reply = await _PAUSE(self.client, (self.keys.control, self.keys.events), ("pause",))
        return bool(int(reply))

    async def resume(self) -> bool:
        """Undo :meth:`pause`. Returns True (with a ``resumed`` event) when the state changed."""
        reply = await _PAUSE(self.client, (self.keys.control, self.keys.events), ("resume",))
        return bool(int(reply))

    async def set_rate_limit(self, policy: RateLimit | None) -> bool:
        """Set (or with None remove) the queue-wide rate limit that every worker enforces at
        once. Admissions already counted in the current window are kept (also when the window
        length changes). Returns True when the stored policy changed.
        """
        if policy is None:
            reply = await _RATE_POLICY(self.client, (self.keys.control,), ("clear",))
        else:
            if not isinstance(policy, RateLimit):
                raise ValidationError("policy must be a RateLimit or None")
            reply = await _RATE_POLICY(
                self.client,
                (self.keys.control,),
                ("set", policy.permit_limit, policy.window_ms),
            )
        return bool(int(reply))

    async def set_max_backlog(self, limit: int | None) -> bool:
        """Bound the queue's backlog for every producer at once (None removes the bound).

        The backlog is every job accepted and not finished: ready entries not yet delivered,
        delivered ones not yet acknowledged (running, or awaiting recovery after a crash) and
        staged ones (delayed, durable retries, grouped). Each enqueue checks it atomically
        before writing and raises :class:`~respire_actors.errors.QueueFull` instead of going
        over ``limit`` (1 to 2**31-1); workers' own transitions (retries, promotion, flow
        parents, batch callbacks) are never refused. Stored in the control hash; returns True
        when the stored bound changed. Raises :class:`ValidationError` before sending.
        """
        return await _backpressure.set_max_backlog(self.client, self.keys, limit)

    async def backlog(self) -> Backlog:
        """The queue's backlog (as :meth:`set_max_backlog` counts it) and bound, read in one
        atomic step. O(1) except when the server cannot tell the consumer group's lag (after
        an XDEL at its last delivered entry): then the undelivered entries are counted."""
        return await _backpressure.read_backlog(self.client, self.keys)

    # -- parent/child flows (docs/flows.md) -------------------------------------------------
    async def enqueue_flow(
        self,
        flow_id: str,
        tree: FlowNode[T],
        failure_policy: FlowFailurePolicy = FAIL_PARENT,
    ) -> bool:
        """Enqueue a tree of up to 256 jobs: leaves at once, each parent once every direct
        child is terminal (completed or failed); ``failure_policy`` decides what a parent with
        a failed child does (see :class:`FlowFailurePolicy`). Nodes run with this queue's
        handler; a parent reads its children with :meth:`Job.child_results`.

        Returns True when the flow was created, False when ``flow_id`` already exists (flow ids
        deduplicate permanently, until :meth:`remove_flow`; the first tree wins). Raises an
        :class:`~respire_actors.errors.InvalidFlow` subclass (a cycle, a shared node, a
        duplicate job id, more than 256 nodes, ids and payloads over 256 KiB, a node of
        another queue, a bad policy) or :class:`~respire_actors.codecs.EncodeError` before
        anything is sent; :class:`~respire_actors.errors.UnsupportedSchema` when the stored
        flow has an unknown schema version (nothing changes). If cancelled or the reply is
        lost, the flow may or may not exist: call again with the same id (False then means it
        was created). Under a backlog bound (:meth:`set_max_backlog`) the whole tree is checked
        at once: every node counts, and a tree that does not fit raises
        :class:`~respire_actors.errors.QueueFull` with nothing written (parents activated
        later are not checked again).
        """
        return await _flows.enqueue_flow(
            self.client, self.keys, self.codec, flow_id, tree, failure_policy
        )

    async def flow_results(self, flow_id: str) -> list[FlowNodeResult]:
        """Every node of a flow in breadth-first order (the root first) with its status and
        retained result; an empty list for an unknown or removed flow. Read only."""
        return await _flows.flow_results(self.client, self.keys, flow_id)

    async def remove_flow(self, flow_id: str) -> bool:
        """Delete a finished flow's state and release its id. Returns False when there is no
        such flow; raises :class:`~respire_actors.errors.FlowActive` (deleting nothing) while a
        node is still waiting or ready. Flow state never expires on its own. Safe to repeat."""
        return await _flows.remove_flow(self.client, self.keys, flow_id)

    # -- application groups (docs/groups.md) -------------------------------------------------
    async def set_group_options(
        self,
        group: str,
        *,
        max_concurrency: int | None = None,
        rate_limit: RateLimit | None = None,
        lease_duration: timedelta | float = _groups.DEFAULT_LEASE,
    ) -> bool:
        """Store the limits of an application group, shared by every worker at once.

        ``max_concurrency`` bounds the group's simultaneous deliveries across all workers,
        ``rate_limit`` its admitted delivery attempts (GCRA: a burst of ``permit_limit``,
        then one permit every ``window / permit_limit``), ``lease_duration`` (100 ms to
        2**31-1 ms) how long a delivery's concurrency permit lives without renewal. None means
        unlimited; calling with no limits removes them. The pause state is kept. A group
        parked by a limit is woken. Returns True when the stored policy changed. Raises
        :class:`ValidationError` before anything is sent. Safe to repeat.
        """
        options = GroupOptions(max_concurrency, rate_limit, lease_duration)
        return await _groups.set_group_options(self.client, self.keys, group, options)

    async def pause_group(self, group: str) -> bool:
        """Stop new deliveries and recovery admissions of one application group (handlers
        already running finish; other groups and the queue are not affected). Returns True
        when this call changed the state. Safe to repeat (a repeat returns False)."""
        return await _groups.set_group_paused(self.client, self.keys, group, True)

    async def resume_group(self, group: str) -> bool:
        """Undo :meth:`pause_group` (it does not resume a paused queue). Returns True when
        this call changed the state."""
        return await _groups.set_group_paused(self.client, self.keys, group, False)

    async def get_group(self, group: str) -> GroupInfo:
        """Counts, policy, pause and parking of one group, also for an idle group that only
        has a policy (``known`` is False when Redis holds nothing about it)."""
        return await _groups.get_group(self.client, self.keys, group)

    async def list_groups(self, cursor: str | None = None, count: int = 100) -> GroupPage:
        """One page (``count`` 1-1000) of the groups with staged work or parked, in byte order
        of their names after ``cursor``. Groups that only have a policy are not listed; use
        :meth:`get_group`."""
        return await _groups.list_groups(self.client, self.keys, cursor, count)

    # -- batches (jobs/batches.py, docs/batches.md) ------------------------------------------
    async def create_batch(
        self,
        *,
        on_success: Callback[T] | None = None,
        on_failure: Callback[T] | None = None,
        on_complete: Callback[T] | None = None,
        batch_id: str | None = None,
    ) -> str:
        """Create an open batch with its completion callbacks; returns its id.

        ``batch_id`` is the id to use (a nonblank str of at most 1024 UTF-8 bytes), or None for
        a generated one. Reusing an existing id changes nothing and returns it: the first
        callbacks are kept, so an ambiguous call can be retried with the same id. Each callback
        is a :class:`Callback` (job id and payload on this queue, encoded with its codec) or
        None. Once the batch is sealed and no member is pending, ``on_success`` (every member
        succeeded and cancellation was not requested) or ``on_failure`` is enqueued, then
        ``on_complete``, each exactly once. Raises :class:`ValidationError` for a bad id or
        callback and :class:`~respire_actors.errors.BatchLimitExceeded` when the callbacks'
        ids and payloads exceed 256 KiB, before anything is sent. If cancelled or the reply is
        lost, the batch may or may not exist: retry with the same id.
        """
        return await _batches.create_batch(
            self.client, self.keys, self.codec, on_success, on_failure, on_complete, batch_id
        )

    async def add_to_batch(self, batch_id: str, job_id: str, payload: T) -> bool:
        """Add a member and enqueue it at once, atomically. Returns False (and keeps the first
        payload) when ``job_id`` is already a member, also after sealing.

        Member ids are unique within a batch, independently of :meth:`enqueue`'s deduplication.
        Members carry no delay, priority, TTL or group; the worker's retry policy applies.
        Raises :class:`~respire_actors.errors.UnknownBatch`,
        :class:`~respire_actors.errors.BatchSealed` (a new id for a sealed or cancelled batch)
        or :class:`~respire_actors.errors.BatchLimitExceeded` (256 members, 256 KiB of ids and
        payloads) without writing anything; :class:`ValidationError` for bad arguments before
        anything is sent. If cancelled or the reply is lost, retry: a repeat returns False.
        Each new member counts in the backlog: a reached bound (:meth:`set_max_backlog`)
        raises :class:`~respire_actors.errors.QueueFull` with nothing written (an existing
        member still returns False).
        """
        attributes = {**self._span_attrs, "respire.batch.id": batch_id, "respire.job.id": job_id}
        with tracing.producer_span(_SPAN, self._destination, attributes) as span:
            context = tracing.context_fields(span)
            added = await _batches.add_to_batch(
                self.client, self.keys, self.codec, batch_id, job_id, payload, context
            )
            tracing.set_attributes(span, {"respire.job.deduplicated": not added})
        if _tlog.isEnabledFor(logging.DEBUG):
            _tlog.debug(
                "%s: %r %s to batch %r",
                self._destination,
                job_id,
                "added" if added else "already a member",
                batch_id,
                extra={
                    "event": "accepted",
                    "queue": self._destination,
                    "job_id": job_id,
                    "entry_id": "",
                    "attempt": 0,
                    "trace_id": tracing.enqueue_trace_id(context),
                    "deduplicated": not added,
                    "batch_id": batch_id,
                },
            )
        return added

    async def add_many_to_batch(self, batch_id: str, jobs: Iterable[tuple[str, T]]) -> list[bool]:
        """:meth:`add_to_batch` for many ``(job_id, payload)`` pairs, pipelined. Every item is
        validated, and the call's own members checked against the limits, before anything is
        sent. Not atomic as a whole: when some adds fail, the first error is raised after the
        others ran; repeating the call is safe (existing members return False)."""
        # one producer span for the call: its members share one envelope context
        with tracing.producer_span(
            _SPAN, self._destination, {**self._span_attrs, "respire.batch.id": batch_id}
        ) as span:
            return await _batches.add_many_to_batch(
                self.client, self.keys, self.codec, batch_id, jobs, tracing.context_fields(span)
            )

    async def seal_batch(self, batch_id: str) -> bool:
        """Close the batch to new members. Returns True when this call sealed it, False when it
        already was sealed (idempotent). A sealed batch with nothing pending completes here:
        its callbacks are published in the same atomic step (an empty batch succeeds). Raises
        :class:`~respire_actors.errors.UnknownBatch`. Safe to retry after a lost reply."""
        return await _batches.seal_batch(self.client, self.keys, batch_id, cancel=False)

    async def cancel_batch(self, batch_id: str) -> bool:
        """Seal the batch and request cancellation. Workers acknowledge members they have not
        started as cancelled; running handlers are not interrupted, and every member completing
        after the request counts as cancelled. The batch then completes with ``on_failure`` and
        ``on_complete``. Returns True when this call requested it; False when it was already
        requested or the batch has completed (a completed batch is left unchanged). Raises
        :class:`~respire_actors.errors.UnknownBatch`. Safe to retry."""
        return await _batches.seal_batch(self.client, self.keys, batch_id, cancel=True)

    async def batch_status(self, batch_id: str) -> BatchStatus | None:
        """A snapshot of the batch's counts and flags, or None for an unknown (or removed) id."""
        return await _batches.batch_status(self.client, self.keys, batch_id)

    async def remove_batch(self, batch_id: str) -> bool:
        """Delete a completed batch's state, freeing its id. Returns False when there is no
        such batch. Raises :class:`~respire_actors.errors.BatchActive` (nothing deleted) while
        it is unsealed or has pending members. Entries, callbacks and events are kept."""
        return await _batches.remove_batch(self.client, self.keys, batch_id)

    async def get_state(self) -> QueueState:
        """The queue's persistent controls: paused, cumulative rate-limit denials, policy."""
        paused, hits, limit, window, bound = await self.client.execute(
            "HMGET",
            self.keys.control,
            "paused",
            "rate_limit_hits",
            "rate.limit",
            "rate.window",
            "max_backlog",
        )
        policy = None
        if limit is not None and window is not None:
            policy = RateLimit(int(limit), timedelta(milliseconds=int(window)))
        return QueueState(
            paused=_s(paused) == "1" if paused is not None else False,
            rate_limit_hits=int(hits) if hits is not None else 0,
            rate_limit=policy,
            max_backlog=int(bound) if bound is not None else None,
        )

    # -- observation ------------------------------------------------------------------------
    @asynccontextmanager
    async def read_events(
        self,
        cursor: str = "0-0",
        *,
        block: timedelta = timedelta(seconds=5),
        batch: int = 100,
    ) -> AsyncIterator[EventReader]:
        """Open a reader of every event after ``cursor`` (progress, completed, dead-letter,
        paused, resumed)::

            async with queue.read_events(saved_cursor) as events:
                async for event in events:
                    handle(event)
                    save(event.id)          # checkpoint after your side effects

        Observers do not compete: each reader sees all events. Transient disconnects are
        retried with backoff (capped at 3.2 s), resuming after the last yielded event. Cancel
        to stop; permanent errors (wrong key type, ACL) are raised. The reader holds its own
        connection (a blocking XREAD), opened here and closed on exit.

        ``cursor`` is an event id, ``"0-0"`` (everything retained, the default) or ``"$"``
        (only events appended after the reader opens: the newest id is looked up once, so a
        reconnect before the first event misses nothing).
        """
        block_ms = duration_ms(block, what="block")
        if isinstance(batch, bool) or not isinstance(batch, int) or not 1 <= batch <= 10_000:
            raise ValidationError("batch must be an integer from 1 to 10000")
        if not isinstance(cursor, str) or not (cursor == "$" or is_entry_id(cursor)):
            raise ValidationError(f"cursor must be '0-0', '$' or an event id, got {cursor!r}")
        if cursor == "$":
            newest = await self.client.execute("XREVRANGE", self.keys.events, "+", "-", "COUNT", 1)
            cursor = _s(newest[0][0]) if newest else "0-0"
        async with self.client.open_blocking() as conn:
            yield EventReader(conn, self.keys.events, cursor, block_ms, batch)

    async def read_metrics(self, minutes: int = 60) -> list[MinuteMetrics]:
        """Per-minute completed/failed counts of this queue, oldest first (see
        :func:`respire_actors.jobs.metrics.read_metrics`); needs workers that record them
        (``QueueOptions.metrics_retention_minutes``)."""
        return await read_metrics(self.client, self.keys, minutes)

    async def get_logs(self, job_id: str, count: int = 100) -> list[str]:
        """The newest ``count`` (1-1000) retained log lines of a job, oldest first."""
        validate_job_id(job_id)
        if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= 1000:
            raise ValidationError("count must be an integer from 1 to 1000")
        lines = await self.client.execute("LRANGE", self.keys.logs(job_id), -count, -1)
        return [_s(line) for line in lines or []]

    async def read_dead_letters(
        self, count: int = 100, *, stream: str | None = None
    ) -> list[tuple[str, dict[str, bytes]]]:
        """The oldest ``count`` (1-10000) dead letters as (entry id, fields). Reading does not
        requeue them. ``stream`` is a dead-letter suffix override, as in WorkerOptions."""
        if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= 10_000:
            raise ValidationError("count must be an integer from 1 to 10000")
        if stream is not None:
            validate_name(stream, what="dead-letter stream suffix")
        key = self.keys.custom(stream) if stream else self.keys.dead
        rows = await self.client.execute("XRANGE", key, "-", "+", "COUNT", count)
        return [(_s(i), {_s(k): v for k, v in _pairs(f)}) for i, f in rows or []]

    # -- retained outcomes (beyond the seed; see docs/results.md) ----------------------------
    async def status(self, job_id: str) -> JobStatus:
        """What is known about ``job_id`` from its retained record: ``completed`` or
        ``dead-lettered`` while a worker with ``WorkerOptions(keep_results=...)`` keeps it,
        else ``unknown`` (see :class:`JobStatus`). One read; changes nothing."""
        validate_job_id(job_id)
        record = await self._record(job_id)
        return _status(job_id, record)

    async def result(
        self,
        job_id: str,
        *,
        timeout: timedelta | float | None,
        codec: Codec[Any] | None = None,
    ) -> Any:
        """Wait for ``job_id`` to finish and return the value its handler returned.

        Needs a worker registered with ``WorkerOptions(keep_results=...)``: the value is the
        handler's return value encoded with the registration's result codec, decoded here
        with ``codec`` (default :class:`~respire_actors.codecs.JsonValueCodec`, giving plain
        JSON values; pass e.g. ``JsonCodec(Receipt)`` to structure them). A handler that
        returned ``None`` or ``ACK`` yields ``None``.

        The retained record is read first; if there is none, the call waits on the queue's
        event stream (a blocking XREAD on its own connection, from the newest event at the
        time of the call, so an outcome committed in between is found by the record check)
        for this job's completed or dead-letter event, then reads the record. It never polls.
        ``timeout`` (a timedelta or seconds, or None to wait indefinitely) bounds the wait.

        Raises :class:`~respire_actors.errors.JobResultTimeout` (a ``TimeoutError``) when no
        outcome arrived in time, :class:`~respire_actors.errors.JobDeadLettered` when the job
        was dead-lettered, :class:`~respire_actors.errors.JobResultUnavailable` when it
        completed without a kept value (no retention, record expired, value too large or
        unencodable), :class:`~respire_actors.codecs.DecodeError` when ``codec`` cannot read
        the value, and :class:`ValidationError` for bad arguments (before anything is sent).
        Transient disconnects while waiting are retried. Cancelling leaves nothing behind.
        """
        validate_job_id(job_id)
        limit = None if timeout is None else duration_ms(timeout, what="timeout") / 1000
        codec = JsonValueCodec() if codec is None else codec
        check_codec(codec)
        outcome: dict[str, bytes] | None = None
        with anyio.move_on_after(limit if limit is not None else float("inf")):
            outcome = await self._wait_for_record(job_id)
        if outcome is None:
            raise JobResultTimeout(
                f"job {job_id!r} of queue {self.name!r} had no outcome within {timeout}", job_id
            )
        return _value(job_id, outcome, codec)

    async def _record(self, job_id: str) -> dict[str, bytes]:
        reply = await self.client.execute("HGETALL", self.keys.result(job_id))
        return {_s(k): bytes(v) for k, v in _pairs(reply or [])}

    async def _wait_for_record(self, job_id: str) -> dict[str, bytes]:
        """The job's record, or a synthetic one from its terminal event when no record is
        kept. Waits on the event stream; retries transient disconnects."""
        newest = await self.client.execute("XREVRANGE", self.keys.events, "+", "-", "COUNT", 1)
        cursor = _s(newest[0][0]) if newest else "0-0"
        record = await self._record(job_id)
        if record:
            return record
        backoff = 0.1
        async with self.client.open_blocking() as conn:
            while True:
                try:
                    reply = await conn.execute(
                        "XREAD", "COUNT", 100, "BLOCK", 5000, "STREAMS", self.keys.events, cursor
                    )
                    backoff = 0.1
                except RedisUnavailable:
                    await anyio.sleep(backoff)
                    backoff = min(backoff * 2, 3.2)
                    continue
                for entry_id, flat in _stream_entries(reply) if reply else []:
                    cursor = entry_id
                    event = _to_event(entry_id, flat)
                    if event.job_id != job_id or event.kind not in _TERMINAL:
                        continue
                    # the record and the event are written by one script: read it now
                    record = await self._record(job_id)
                    if record:
                        return record
                    return {
                        "state": _TERMINAL[event.kind],
                        "reason": (event.reason or "").encode(),
                        "result_state": b"not-retained",
                    }


_TERMINAL = {"completed": b"completed", "dead-letter": b"dead-lettered", "cancelled": b"cancelled"}
"""A job's terminal events, and the state of the record they stand for."""


def _status(job_id: str, record: dict[str, bytes]) -> JobStatus:
    state = record.get("state", b"").decode("utf-8", "replace")
    if state not in ("completed", "dead-lettered"):
        return JobStatus(job_id, "unknown")

    def opt(name: str) -> str | None:
        raw = record.get(name)
        return raw.decode("utf-8", "replace") if raw is not None else None

    attempt = opt("attempt")
    finished = opt("finished_at")
    return JobStatus(
        job_id,
        "completed" if state == "completed" else "dead-lettered",
        entry_id=opt("entry_id"),
        attempt=int(attempt) if attempt else None,
        reason=opt("reason") or None,
        detail=opt("detail") or None,
        result_state=opt("result_state") or "",
        finished_at=int(finished) if finished else None,
    )


def _value(job_id: str, record: dict[str, bytes], codec: Codec[Any]) -> Any:
    status = _status(job_id, record)
    if record.get("state") == b"dead-lettered":
        reason = record.get("reason", b"").decode("utf-8", "replace")
        detail = record.get("detail", b"").decode("utf-8", "replace")
        raise JobDeadLettered(
            f"job {job_id!r} was dead-lettered ({reason}{': ' + detail if detail else ''})",
            job_id,
            reason,
            detail,
        )
    if record.get("state") == b"cancelled":
        raise JobResultUnavailable(
            f"job {job_id!r} was cancelled with its batch: it has no result", job_id, "cancelled"
        )
    if status.result_state != "value" or "result" not in record:
        problem = status.result_state or "not-retained"
        raise JobResultUnavailable(
            f"job {job_id!r} completed but its value is not available ({problem})",
            job_id,
            problem,
        )
    return decode_with(codec, record["result"])


class EventReader:
    """Async iterator over a queue's events; see :meth:`JobQueue.read_events`."""

    def __init__(
        self, conn: BlockingConnection, key: str, cursor: str, block_ms: int, batch: int
    ) -> None:
        self._conn = conn
        self._key = key
        self.cursor = cursor
        self._block_ms = block_ms
        self._batch = batch
        self._buffer: list[JobEvent] = []

    def __aiter__(self) -> EventReader:
        return self

    async def __anext__(self) -> JobEvent:
        backoff = 0.1
        while not self._buffer:
            try:
                reply = await self._conn.execute(
                    "XREAD",
                    "COUNT",
                    self._batch,
                    "BLOCK",
                    self._block_ms,
                    "STREAMS",
                    self._key,
                    self.cursor,
                )
                backoff = 0.1
            except RedisUnavailable:
                await anyio.sleep(backoff)
                backoff = min(backoff * 2, 3.2)
                continue
            if reply:
                self._buffer = [_to_event(i, f) for i, f in _stream_entries(reply)]
        event = self._buffer.pop(0)
        self.cursor = event.id
        return event


def _pairs(flat: Sequence[Any]) -> Iterable[tuple[Any, Any]]:
    if isinstance(flat, dict):
        return flat.items()
    return zip(flat[0::2], flat[1::2], strict=True)


def _stream_entries(reply: Any) -> list[tuple[str, Sequence[Any]]]:
    """Entries of a single-stream XREAD reply (RESP2 list or RESP3 map)."""
    streams = list(reply.values()) if isinstance(reply, dict) else [item[1] for item in reply]
    out: list[tuple[str, Sequence[Any]]] = []
    for entries in streams:
        for entry_id, flat in entries:
            out.append((_s(entry_id), flat))
    return out


def _to_event(entry_id: str, flat: Sequence[Any]) -> JobEvent:
    fields = {_s(k): _s(v) for k, v in _pairs(flat)}
    percent = fields.pop("percent", None)
    reason = fields.pop("reason", None)
    return JobEvent(
        id=entry_id,
        kind=fields.pop("kind", ""),
        job_id=fields.pop("job_id", ""),
        entry_id=fields.pop("entry_id", "0-0"),
        attempt=int(fields.pop("attempt", "0") or 0),
        percent=int(percent) if percent is not None else None,
        reason=reason,
        flow_id=fields.pop("flow", None),
        batch_id=fields.pop("batch", None),
        extra=fields,
    )
