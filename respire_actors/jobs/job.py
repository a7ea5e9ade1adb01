"""The :class:`Job` a job handler receives, and how a delivery becomes one."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Generic, TypeVar

import anyio
import anyio.lowlevel

from ..actors.messages import Complete, Completion, Delivery, RetryAfter
from ..actors.options import duration_ms
from ..actors.runtime import QueueRuntime
from ..codecs import decode_with
from ..errors import ValidationError
from ..redis.scripts import load
from . import flows as _flows
from .flows import FlowNodeResult

T = TypeVar("T")

_PROGRESS = load("job_progress")
_LOG = load("job_log")


async def batch_gate(rt: QueueRuntime, delivery: Delivery) -> Completion | None:
    """The job worker's pre-start check: a batch member whose batch's cancellation was
    requested is acknowledged as cancelled instead of running its handler."""
    raw = delivery.fields.get(b"_respire.batch")
    if raw is None:
        return None
    from .batches import cancellation_requested

    batch_id = raw.decode("utf-8", "surrogateescape")
    # with the job id: a dead-letter replay of a finished member runs as an independent job
    if await cancellation_requested(rt.client, rt.keys_for(delivery), batch_id, delivery.job_id):
        # with result retention its record says cancelled, so result() and status() know
        return Completion(delivery, "cancelled", keep_ms=rt.options.keep_results_ms)
    return None


def bind_job(rt: QueueRuntime, delivery: Delivery) -> Job[object]:
    """The job worker's handler argument: the decoded payload wrapped in a :class:`Job`.
    Raises :class:`~respire_actors.codecs.DecodeError` for a payload the codec cannot read."""
    return Job(rt, delivery, decode_with(rt.codec, delivery.payload))


class Job(Generic[T]):
    """One delivery of a job, as its handler sees it.

    ``id`` is the application job id, ``payload`` the decoded payload, ``entry_id`` the ready
    stream entry, ``attempt`` this entry's delivery count (from 1) and ``total_attempts`` the
    attempts across durable retries. The handler runs inside :attr:`cancel_scope`, which is
    cancelled when the delivery's lease is lost (the lease renewer or a fenced call finds that
    another delivery owns the job, or no renewal could be confirmed for a visibility timeout;
    without renewal, when the visibility timeout runs out) or its execution budget ends.
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
    def group(self) -> str | None:
        """The application group the job was enqueued with, None when ungrouped."""
        return self.delivery.group

    @property
    def attempt(self) -> int:
        return self.delivery.attempt

    @property
    def total_attempts(self) -> int:
        return self.delivery.prior_attempts + self.delivery.attempt

    @property
    def queue(self) -> str:
        return self._rt.name

    @property
    def partition(self) -> int:
        """The partition this job came from, for a partitioned queue (docs/partitions.md);
        0 for an ordinary queue."""
        return self.delivery.origin

    def _lose_lease(self) -> None:
        if not self.lease_lost:
            self.lease_lost = True
            self._rt.stats.leases_lost += 1
            if self.cancel_scope is not None:
                self.cancel_scope.cancel()

    async def _raise_if_past_deadline(self) -> None:
        """A fenced call made after this delivery's deadline (its fixed lease without renewal,
        or its execution budget) raises the cancellation here, whatever order the event loop
        runs the deadline's timer and the call's reply in."""
        scope = self.cancel_scope
        if scope is not None and anyio.current_time() >= scope.deadline:
            scope.cancel()
            await anyio.lowlevel.checkpoint()

    async def report_progress(self, percent: int) -> bool:
        """Append a progress event (integer 0-100). Returns False when this delivery is no
        longer current (acknowledged, recovered by another attempt, body deleted); the handler's
        scope is then cancelled at its next checkpoint. If cancelled, the event may or may not
        have been appended.
        """
        if isinstance(percent, bool) or not isinstance(percent, int) or not 0 <= percent <= 100:
            raise ValidationError("percent must be an integer from 0 to 100")
        await self._raise_if_past_deadline()
        rt = self._rt
        keys = rt.keys_for(self.delivery)
        ok = await _PROGRESS(
            rt.client,
            (keys.ready, keys.events),
            (rt.group, rt.consumer, self.entry_id, self.attempt, self.id, percent),
        )
        if not ok:
            self._lose_lease()
        return bool(ok)

    async def log(self, line: str) -> bool:
        """Append a line to this job's log (fenced like progress).

        Returns True when appended. Returns False when the delivery is no longer current (the
        lease is lost: the handler's scope is then cancelled at its next checkpoint) or when the
        job's TTL has passed. A TTL-refused line is only that: the TTL is an admission check,
        not a cancellation deadline, so the handler keeps running and its outcome still
        commits. Raises :class:`ValidationError` for a line that is not valid Unicode or longer
        than the policy's byte limit (never truncated). If cancelled, the line may or may not
        have been appended.
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
        await self._raise_if_past_deadline()
        rt = self._rt
        keys = rt.keys_for(self.delivery)
        ok = await _LOG(
            rt.client,
            (keys.ready, keys.logs(self.id)),
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
        status = int(ok)
        if status == 0:  # the fence failed; 2 (TTL passed) leaves the lease alone
            self._lose_lease()
        return status == 1

    @property
    def priority(self) -> int:
        """The job's scheduling priority (0 for immediate jobs)."""
        return self.delivery.priority

    @property
    def expires_at(self) -> int | None:
        """The job's absolute expiry in unix ms of the server clock, or None."""
        return self.delivery.expires_at

    @property
    def schedule_id(self) -> str | None:
        """The recurring schedule that enqueued this job (see docs/recurring.md), else None."""
        raw = self.delivery.fields.get(b"_respire.job.schedule")
        return None if raw is None else raw.decode("utf-8", "replace")

    @property
    def tick(self) -> datetime | None:
        """The occurrence (UTC) a recurring schedule enqueued this job for, else None."""
        raw = self.delivery.fields.get(b"_respire.job.tick")
        if raw is None:
            return None
        return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=int(raw))

    @property
    def previous_entry_id(self) -> str | None:
        """The stream entry id of the attempt this durable retry replaced (the prior stream id;
        the last retry's when there were several), else None."""
        raw = self.delivery.fields.get(b"_respire.retry.previous_id")
        return None if raw is None else raw.decode("ascii", "replace")

    @property
    def retry_reason(self) -> str | None:
        """Why the attempt :attr:`previous_entry_id` names failed: a compact reason code
        (``processing-failed`` for an exception, ``nack`` for a returned NACK or retry), else
        None."""
        raw = self.delivery.fields.get(b"_respire.retry.reason")
        return None if raw is None else raw.decode("utf-8", "replace")

    @property
    def replayed_from(self) -> str | None:
        """The dead-letter id this job was re-enqueued from by a dead-letter retry
        (:meth:`QueueAdmin.retry_dead_letters`), else None."""
        raw = self.delivery.fields.get(b"_respire.replayed_from")
        return None if raw is None else raw.decode("ascii", "replace")

    @property
    def flow_id(self) -> str | None:
        """The flow this job is a node of (see docs/flows.md), else None."""
        raw = self.delivery.fields.get(b"_respire.flow")
        return None if raw is None else raw.decode("utf-8", "surrogateescape")

    @property
    def flow_node(self) -> int | None:
        """This node's 1-based breadth-first index in its flow's tree, else None."""
        raw = self.delivery.fields.get(b"_respire.flow.node")
        return None if raw is None else int(raw)

    @property
    def batch_id(self) -> str | None:
        """The batch this job is a member of (see docs/batches.md), else None."""
        raw = self.delivery.fields.get(b"_respire.batch")
        return None if raw is None else raw.decode("utf-8", "surrogateescape")

    def complete(self, result: bytes) -> Complete:
        """An outcome to return: success that keeps ``result`` (at most 4096 bytes) as this flow
        node's result, for its parent's :meth:`child_results` and ``flow_results``. ``b""`` is a
        result; returning ``None`` or ``ACK`` completes with none. Raises
        :class:`~respire_actors.errors.ResultTooLarge` (over the limit, nothing kept) or
        :class:`ValidationError` (not bytes) here, in the handler. Outside a flow it is an
        ordinary success."""
        return Complete(result)

    async def child_results(self) -> list[FlowNodeResult]:
        """The direct children of this flow node, in breadth-first order: job id, status and
        retained result (None without one). Under ``IGNORE`` failed children are left out; under
        ``CONTINUE`` they are included with status ``"failed"``; a leaf, or a job that is not a
        flow node, gets an empty list (without asking Redis). Read only; safe to cancel.
        Raises :class:`~respire_actors.errors.FlowNotFound` when the flow's record is gone
        (deleted by hand); a dead letter replayed with ``retry`` is no longer a flow node.
        """
        flow_id, node = self.flow_id, self.flow_node
        if flow_id is None or node is None:
            return []
        return await _flows.child_results(
            self._rt.client, self._rt.keys_for(self.delivery), flow_id, node, self.id
        )

    def retry_after(self, delay: timedelta | float) -> RetryAfter:
        """An outcome to return: retry durably after ``delay`` (rounded up to whole ms, at most
        2**31-1 ms; zero means at once), overriding the queue's backoff and its cap for this
        attempt. The delivery limit and the job's TTL still apply: at the limit the job is
        dead-lettered instead. Raises :class:`ValidationError` for a bad delay. Needs
        :class:`QueueOptions` on the registration, else it behaves as ``NACK`` (the job
        comes back after the visibility timeout; the worker logs a warning once).
        """
        return RetryAfter(duration_ms(delay, what="retry delay", allow_zero=True))

    def __repr__(self) -> str:
        return f"Job(id={self.id!r}, entry_id={self.entry_id!r}, attempt={self.attempt})"


__all__ = ["Job", "bind_job"]
