"""The job queue's source: the atomic steps the shared actors run for a job worker."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from ..actors._util import text
from ..actors.messages import Completion
from ..actors.options import RateLimit
from ..actors.source import (
    MAX_RENEW_BATCH,
    ClaimResult,
    PromotionResult,
    ReadResult,
    RenewItem,
    claim_result,
    deliveries_from_read,
    group_missing,
)
from ..errors import ConfigurationError, PermissionDenied, ServerError, ServerLoading
from ..keys import JobQueueKeys
from ..redis.client import Arg, RedisClient
from ..redis.scripts import load, run_many

log = logging.getLogger("respire_actors.worker")

_JOB_READ = load("job_read")
_JOB_CLAIM = load("job_claim_pending")
_JOB_COMPLETE = load("job_complete")
_JOB_RETRY = load("job_retry")
_JOB_PROMOTE = load("job_promote")
_JOB_GROUP = load("job_group")
_RATE_POLICY = load("job_rate_policy")
_JOB_FINISH = load("job_finish")
_JOB_SELECT = load("job_select")
_GROUP_RELEASE = load("job_group_release")
_LEASE_RENEW = load("job_lease_renew")
MAX_GROUP_VISITS = 64
"""Most group visits one read makes (each visit is one rotation turn)."""
REFUSED = -1
"""Status of a completion the server refused on its own (its entry stays pending)."""


class JobSource:
    """The job queue's steps: ``job_read``, ``job_claim_pending``, ``job_complete`` (with
    ``job_retry`` for durable retries) and ``job_promote``.

    ``delete_acknowledged`` deletes ready entries once acknowledged. Only that wish is passed
    to the scripts (``"delete"`` or ``"ack"``): each script decides per call whether the server
    it runs on has XACKDEL (else XACK + XDEL), so nothing cached at start-up can go stale after
    a failover to a different server version.
    """

    def __init__(
        self,
        client: RedisClient,
        keys: JobQueueKeys,
        dead_key: str,
        group: str,
        *,
        delete_acknowledged: bool = False,
        rate_limit: RateLimit | None = None,
        selection_batch: int | None = None,
        metrics_retention: int = 0,
    ) -> None:
        self.client = client
        self.keys = keys
        self.dead_key = dead_key
        self.group = group
        self.name = keys.name
        self.stream_key = keys.ready
        self.settle = "delete" if delete_acknowledged else "ack"
        self.rate_limit = rate_limit
        # With scheduling enabled (QueueOptions), reads also select grouped jobs (job_select),
        # taking at most `selection_batch` candidates per group visit.
        self.selection_batch = selection_batch
        # Per-minute completion counters (0: off), committed by the completion scripts.
        self.metrics_retention = metrics_retention
        # Crash-loop isolation (actors/isolation.py): the delivery count from which a claimed
        # entry comes alone in its recovery page (0: off); set by the worker registration.
        self.alone_from = 0
        # the worker's visibility timeout, recorded with each renewal (0: not recorded)
        self.visibility_ms = 0

    async def _group(self, context: str, on_missing: str) -> None:
        reply = await _JOB_GROUP(
            self.client, (self.keys.ready, self.keys.control), (self.group, context, on_missing)
        )
        if text(reply[0]) == "missing":
            raise group_missing(self.keys.ready, self.group)

    async def ensure_group(self, on_missing: str) -> None:
        """``job_group``: a new queue gets its group at ``0`` (jobs enqueued before the first
        worker run); a queue whose group vanished raises or is recreated at ``on_missing``."""
        await self._group("start", on_missing)

    async def restore_group(self, on_missing: str) -> None:
        await self._group("lost", on_missing)

    async def prepare(self) -> None:
        """Start-up checks: the metrics retention must match the stored counters'; store the
        configured rate limit when Redis holds none, or compare it with the stored one.
        :class:`ConfigurationError` on a mismatch. Safe to repeat."""
        await self._check_metrics_retention()
        policy = self.rate_limit
        if policy is None:
            return
        reply = await _RATE_POLICY(
            self.client, (self.keys.control,), ("init", policy.permit_limit, policy.window_ms)
        )
        if text(reply[0]) == "mismatch":
            raise ConfigurationError(
                f"queue {self.name!r}: the worker's rate limit ({policy.permit_limit} per "
                f"{policy.window_ms} ms) differs from the one stored in Redis "
                f"({text(reply[1])} per {text(reply[2])} ms); change it with "
                "JobQueue.set_rate_limit or configure the stored policy"
            )

    async def _check_metrics_retention(self) -> None:
        """Every worker recording metrics must use the retention the stored counters have."""
        stored = await self.client.execute("HGET", self.keys.metrics, "retention")
        if not self.metrics_retention:
            if stored is not None:
                log.warning(
                    "queue %r: other workers record completion metrics (%d minutes kept) but "
                    "this one has metrics_retention_minutes=0: its completions are not counted; "
                    "use the same metrics_retention_minutes on every worker",
                    self.name,
                    int(stored),
                )
            return
        if stored is not None and int(stored) != self.metrics_retention:
            raise ConfigurationError(
                f"queue {self.name!r}: this worker keeps {self.metrics_retention} minutes of "
                f"completion metrics but Redis holds counters kept for {int(stored)} minutes; "
                "use the same metrics_retention_minutes on every worker, or stop the workers, "
                f"delete {self.keys.metrics} and restart with the new retention"
            )

    async def read(self, consumer: str, count: int, min_idle_ms: int = 0) -> ReadResult:
        k = self.keys
        if self.selection_batch is None:
            reply = await _JOB_READ(
                self.client,
                (k.ready, k.control),
                (self.group, consumer, count, self.settle, min_idle_ms),
            )
        else:
            reply = await _JOB_SELECT(
                self.client,
                (
                    k.ready,
                    k.control,
                    k.scheduled,
                    k.group_order,
                    k.group_jobs,
                    k.group_cursor,
                    k.group_policy,
                    k.group_owners,
                    k.group_leases,
                    k.group_parked,
                ),
                (
                    self.group,
                    consumer,
                    count,
                    self.settle,
                    min_idle_ms,
                    self.selection_batch,
                    MAX_GROUP_VISITS,
                ),
            )
        status = text(reply[0])
        if status == "ok":
            expired = int(reply[2]) if len(reply) > 2 else 0
            pace = int(reply[3]) if len(reply) > 3 else 0
            drained = text(reply[4]) if len(reply) > 4 else ""
            return ReadResult(
                "ok",
                deliveries_from_read(reply[1]),
                expired=expired,
                pace_ms=pace,
                drained_id=drained or None,
            )
        if status == "empty":
            if len(reply) > 3:
                return ReadResult(
                    "empty",
                    last_id=text(reply[1]),
                    staged_last_id=text(reply[2]),
                    wake_ms=int(reply[3]),
                )
            return ReadResult("empty", last_id=text(reply[1]))
        if status == "limited":
            return ReadResult("limited", retry_after_ms=int(reply[1]))
        if status == "recover":
            return ReadResult("recover", last_id=text(reply[1]), pace_ms=int(reply[2]))
        return ReadResult("paused")

    async def claim(
        self, consumer: str, mode: str, cursor: str, count: int, min_idle_ms: int, limit: int
    ) -> ClaimResult:
        reply = await _JOB_CLAIM(
            self.client,
            (
                self.keys.ready,
                self.keys.control,
                self.keys.events,
                self.dead_key,
                self.keys.group_policy,
                self.keys.group_owners,
                self.keys.group_leases,
                self.keys.group_parked,
            ),
            (
                self.group,
                consumer,
                mode,
                min_idle_ms,
                cursor,
                count,
                limit,
                self.settle,
                self.metrics_retention,
                self.alone_from,
            ),
        )
        return claim_result(reply)

    async def complete(self, consumer: str, batch: Sequence[Completion]) -> list[int]:
        """Commit a batch; returns 1 (committed) or 0 (stale) per completion, in order. Flow
        nodes and batch members are coordinated by the same scripts (lib/coordination.lua). Durable
        retries go through ``job_retry`` (a second call only when the batch holds any); a
        retry acknowledged as expired instead of staged reports 2. Outcomes with a retained
        record or a dead-letter detail go through ``job_finish``, one pipelined call each; one
        the server refuses reports ``REFUSED`` (-1) and leaves its entry pending."""
        retries = [i for i, c in enumerate(batch) if c.kind == "retry"]
        releases = [i for i, c in enumerate(batch) if c.kind == "release"]
        # outcomes with a retained record or a dead-letter detail: job_finish, one per call
        finish = [
            i
            for i, c in enumerate(batch)
            if (c.kind in ("ack", "dead") and (c.keep_ms or c.detail or c.flow_result is not None))
            or (c.kind == "cancelled" and c.keep_ms)
        ]
        others = [
            i for i, c in enumerate(batch) if c.kind not in ("retry", "release") and i not in finish
        ]
        statuses = [0] * len(batch)
        if finish:
            refused: dict[int, ServerError] = {}
            await self._finish(consumer, batch, finish, statuses, refused)
            for i, exc in refused.items():
                log.error(
                    "completing %r of %s was refused: %s", batch[i].delivery.job_id, self.name, exc
                )
        if others:
            args: list[Arg] = [self.group, consumer, len(others)]
            for i in others:
                c = batch[i]
                d = c.delivery
                args += [d.entry_id, d.attempt, c.kind, c.reason, d.job_id]
            if self.settle != "ack" or self.metrics_retention:
                args.append(self.settle)
            if self.metrics_retention:
                args.append(self.metrics_retention)
            reply = await _JOB_COMPLETE(
                self.client,
                (self.keys.ready, self.keys.events, self.dead_key, *self.keys.lease_keys),
                args,
            )
            for i, status in zip(others, reply, strict=True):
                statuses[i] = int(status)
        if retries:
            rargs: list[Arg] = [self.group, consumer, self.settle, len(retries)]
            for i in retries:
                c = batch[i]
                rargs += [c.delivery.entry_id, c.delivery.attempt, c.delay_ms, c.reason]
            k = self.keys
            reply = await _JOB_RETRY(
                self.client,
                (
                    k.ready,
                    k.scheduled,
                    k.due,
                    k.group_jobs,
                    k.group_order,
                    k.group_leases,
                    k.group_owners,
                    k.group_parked,
                    k.group_policy,
                ),
                rargs,
            )
            for i, status in zip(retries, reply, strict=True):
                statuses[i] = int(status)
        if releases:
            largs: list[Arg] = [consumer]
            for i in releases:
                d = batch[i].delivery
                largs += [d.entry_id, d.attempt, d.fields.get(b"_respire.job.group", b"")]
            reply = await _GROUP_RELEASE(self.client, self.keys.lease_keys, largs)
            for i, status in zip(releases, reply, strict=True):
                statuses[i] = int(status)
        return statuses

    async def _finish(
        self,
        consumer: str,
        batch: Sequence[Completion],
        indices: list[int],
        statuses: list[int],
        refused: dict[int, ServerError],
    ) -> None:
        """Commit outcomes with their records (``job_finish``) in one pipelined round trip.
        Each call is atomic and safe to repeat; a call the server refuses reports
        :data:`REFUSED` (its error in ``refused``) without failing the others."""
        calls = []
        for i in indices:
            c = batch[i]
            d = c.delivery
            calls.append(
                (
                    _JOB_FINISH,
                    (
                        self.keys.ready,
                        self.keys.events,
                        self.dead_key,
                        self.keys.result(d.job_id),
                        *self.keys.lease_keys,
                    ),
                    (
                        self.group,
                        consumer,
                        d.entry_id,
                        d.attempt,
                        c.kind,
                        c.reason,
                        d.job_id,
                        c.detail,
                        c.keep_ms,
                        c.result_state,
                        c.result,
                        self.settle,
                        "0" if c.flow_result is None else "1",
                        c.flow_result or b"",
                        self.metrics_retention,
                    ),
                )
            )
        replies = await run_many(self.client, calls)
        for i, reply in zip(indices, replies, strict=True):
            if isinstance(reply, PermissionDenied | ServerLoading):
                raise reply  # would refuse every call, or nothing ran: the caller retries
            if isinstance(reply, ServerError):
                # this job's call alone was refused (a key of its own holding the wrong type,
                # say): report it, so the others' outcomes stand (see the completer)
                statuses[i] = REFUSED
                refused[i] = reply
            elif isinstance(reply, BaseException):
                raise reply
            else:
                statuses[i] = int(reply)

    async def renew(self, consumer: str, items: Sequence[RenewItem]) -> list[int]:
        """Renew running deliveries in one call (``job_lease_renew``): for each, the fence,
        then the group concurrency lease of a grouped job, then its visibility (XCLAIM ...
        JUSTID). 1 renewed (a grouped job: its group lease's duration in ms, >= 100), 0 lost
        (fence or group lease), 2 body deleted, per item."""
        if not items:
            return []
        if len(items) > MAX_RENEW_BATCH:
            raise ValueError(f"at most {MAX_RENEW_BATCH} leases per renewal call, got {len(items)}")
        args: list[Arg] = [self.group, consumer, len(items)]
        for entry_id, attempt, group in items:
            args += [entry_id, attempt, group]
        if self.visibility_ms:
            args.append(self.visibility_ms)  # recorded: see job_lease_renew's ARGV
        reply = await _LEASE_RENEW(self.client, self._renew_keys(), args)
        return [int(x) for x in reply]

    async def mark_leases(self, consumer: str, origins: Sequence[int] = ()) -> None:
        """Mark this worker's visibility timeout as in use (``job_lease_renew`` with no
        deliveries): while it holds running deliveries, workers with a shorter timeout wait
        for this one before recovering anything (lib/fence.lua). ``origins`` is for a
        partitioned source; one queue has one."""
        if not self.visibility_ms:
            return
        await _LEASE_RENEW(
            self.client, self._renew_keys(), (self.group, consumer, 0, self.visibility_ms)
        )

    def _renew_keys(self) -> tuple[str, ...]:
        """``job_lease_renew``'s keys (renewals and marks alike)."""
        k = self.keys
        return (k.ready, k.group_leases, k.group_owners, k.group_policy, k.control)

    async def promote(self, batch_size: int) -> PromotionResult:
        """One promotion pass (``job_promote``): at most ``batch_size`` due jobs become ready.
        Atomic: if cancelled or the reply is lost, each job is either still staged or ready."""
        reply = await _JOB_PROMOTE(
            self.client, (self.keys.scheduled, self.keys.due, self.keys.ready), (batch_size,)
        )
        return PromotionResult(*(int(x) for x in reply))


__all__ = ["JobSource"]
