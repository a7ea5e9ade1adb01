"""The job queue's source: the atomic steps the shared actors run for a job worker."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from ..actors._util import text
from ..actors.messages import Completion
from ..actors.source import (
    ClaimResult,
    PromotionResult,
    ReadResult,
    claim_result,
    create_group,
    deliveries_from_read,
)
from ..errors import PermissionDenied, ServerError, ServerLoading
from ..keys import JobQueueKeys
from ..redis.client import Arg, RedisClient
from ..redis.scripts import load, run_many

log = logging.getLogger("respire_actors.worker")

_JOB_READ = load("job_read")
_JOB_CLAIM = load("job_claim_pending")
_JOB_COMPLETE = load("job_complete")
_JOB_RETRY = load("job_retry")
_JOB_PROMOTE = load("job_promote")
_JOB_FINISH = load("job_finish")
REFUSED = -1
"""Status of a completion the server refused on its own (its entry stays pending)."""


class JobSource:
    """The job queue's steps: ``job_read``, ``job_claim_pending``, ``job_complete`` (with
    ``job_retry`` for durable retries) and ``job_promote``.

    ``ack_mode`` is how acknowledged entries are settled: ``"ack"`` (kept for trimming),
    ``"xdel"`` (XACK + XDEL) or ``"ackdel"`` (XACKDEL ACKED, Redis 8.2+); the worker decides it
    per server at start-up.
    """

    def __init__(self, client: RedisClient, keys: JobQueueKeys, dead_key: str, group: str) -> None:
        self.client = client
        self.keys = keys
        self.dead_key = dead_key
        self.group = group
        self.name = keys.name
        self.stream_key = keys.ready
        self.ack_mode = "ack"

    async def ensure_group(self) -> None:
        await create_group(self.client, self.keys.ready, self.group, "0")

    async def read(self, consumer: str, count: int) -> ReadResult:
        reply = await _JOB_READ(
            self.client,
            (self.keys.ready, self.keys.control),
            (self.group, consumer, count, self.ack_mode),
        )
        status = text(reply[0])
        if status == "ok":
            expired = int(reply[2]) if len(reply) > 2 else 0
            return ReadResult("ok", deliveries_from_read(reply[1]), expired=expired)
        if status == "empty":
            return ReadResult("empty", last_id=text(reply[1]))
        if status == "limited":
            return ReadResult("limited", retry_after_ms=int(reply[1]))
        return ReadResult("paused")

    async def claim(
        self, consumer: str, mode: str, cursor: str, count: int, min_idle_ms: int, limit: int
    ) -> ClaimResult:
        reply = await _JOB_CLAIM(
            self.client,
            (self.keys.ready, self.keys.control, self.keys.events, self.dead_key),
            (self.group, consumer, mode, min_idle_ms, cursor, count, limit, self.ack_mode),
        )
        return claim_result(reply)

    async def complete(self, consumer: str, batch: Sequence[Completion]) -> list[int]:
        """Commit a batch; returns 1 (committed) or 0 (stale) per completion, in order. Durable
        retries go through ``job_retry`` (a second call only when the batch holds any); a
        retry acknowledged as expired instead of staged reports 2. Outcomes with a retained
        record or a dead-letter detail go through ``job_finish``, one pipelined call each; one
        the server refuses reports ``REFUSED`` (-1) and leaves its entry pending."""
        retries = [i for i, c in enumerate(batch) if c.kind == "retry"]
        # outcomes with a retained record or a dead-letter detail: job_finish, one per call
        finish = [
            i for i, c in enumerate(batch) if c.kind in ("ack", "dead") and (c.keep_ms or c.detail)
        ]
        others = [i for i, c in enumerate(batch) if c.kind != "retry" and i not in finish]
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
            if self.ack_mode != "ack":
                args.append(self.ack_mode)
            reply = await _JOB_COMPLETE(
                self.client, (self.keys.ready, self.keys.events, self.dead_key), args
            )
            for i, status in zip(others, reply, strict=True):
                statuses[i] = int(status)
        if retries:
            rargs: list[Arg] = [self.group, consumer, self.ack_mode, len(retries)]
            for i in retries:
                c = batch[i]
                rargs += [c.delivery.entry_id, c.delivery.attempt, c.delay_ms]
            reply = await _JOB_RETRY(
                self.client, (self.keys.ready, self.keys.scheduled, self.keys.due), rargs
            )
            for i, status in zip(retries, reply, strict=True):
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
                    (self.keys.ready, self.keys.events, self.dead_key, self.keys.result(d.job_id)),
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
                        self.ack_mode,
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

    async def promote(self, batch_size: int) -> PromotionResult:
        """One promotion pass (``job_promote``): at most ``batch_size`` due jobs become ready.
        Atomic: if cancelled or the reply is lost, each job is either still staged or ready."""
        reply = await _JOB_PROMOTE(
            self.client, (self.keys.scheduled, self.keys.due, self.keys.ready), (batch_size,)
        )
        return PromotionResult(*(int(x) for x in reply))


__all__ = ["JobSource"]
