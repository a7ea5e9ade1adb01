"""The operator API of one job queue: paged reads of its state, dead-letter retry and removal,
and safe retention. The CLI and the dashboard read Redis only through this and
:class:`~respire_actors.jobs.JobQueue`.

Every read is bounded (a page of at most 1000 rows, never KEYS or an unbounded XRANGE) and
every mutation is logged on the ``respire_actors.admin`` logger.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from ..actors.messages import DeadLetterReason
from ..actors.options import CONSUMER_GROUP, is_entry_id
from ..codecs import StrCodec
from ..errors import RespireError, ServerError, ValidationError
from ..jobs.options import RateLimit, validate_job_id
from ..jobs.queue import JobQueue, _pairs, _to_event
from ..keys import JobQueueKeys, validate_job_key_suffix, validate_name
from ..redis.client import RedisClient
from ..redis.scripts import load, run_many
from ..retention import (
    DEFAULT_TRIM_LIMIT,
    TrimPlan,
    TrimResult,
    TrimStream,
    plan_trim,
    stream_key,
    trim_planned,
)
from .model import (
    DeadLetterPage,
    DeadLetterRow,
    EventPage,
    JobDetail,
    PendingPage,
    PendingRow,
    QueueSummary,
    RetryProgress,
    ScheduledPage,
    ScheduledRow,
)

log = logging.getLogger("respire_actors.admin")

_RETRY = load("job_dead_retry")
MAX_PAGE = 1000
MAX_RETRY_CHUNK = 500
JOB_EVENT_SCAN = 1000
"""How many of the newest events :meth:`QueueAdmin.job` looks through for the job's events."""


def _s(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _count(value: object, *, what: str = "count", high: int = MAX_PAGE) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= high:
        raise ValidationError(f"{what} must be an integer from 1 to {high}")
    return value


def _entry_id(value: object, *, what: str = "entry id") -> str:
    if not isinstance(value, str) or not is_entry_id(value):
        raise ValidationError(f"{what} must be a stream entry id like '1700000000000-0'")
    return value


def _bound(value: object, *, what: str, open_end: str) -> str:
    """A range bound: ``open_end`` ('-' or '+'), an id, or '(' + id (exclusive)."""
    if value == open_end:
        return open_end
    if isinstance(value, str) and value.startswith("("):
        return "(" + _entry_id(value[1:], what=what)
    return _entry_id(value, what=what)


_REASONS = tuple(r.value for r in DeadLetterReason)


def _check_reason(reason: object) -> None:
    """A dead-letter reason filter: None or one of the reasons letters carry (a misspelt one
    would match nothing, silently)."""
    if reason is not None and reason not in _REASONS:
        raise ValidationError(
            f"unknown dead-letter reason {reason!r}: use one of {', '.join(_REASONS)}"
        )


def _id_time(entry_id: str) -> datetime:
    return datetime.fromtimestamp(int(entry_id.partition("-")[0]) / 1000, UTC)


def _fields(flat: Any) -> dict[str, bytes]:
    return {_s(k): bytes(v) if isinstance(v, bytes) else _s(v).encode() for k, v in _pairs(flat)}


def _text(fields: dict[str, bytes], name: str) -> str:
    raw = fields.get(name)
    return raw.decode("utf-8", "replace") if raw is not None else ""


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        return 0


def _map(item: Any) -> dict[str, Any]:
    """One XINFO row (a RESP3 map, or a flat RESP2 list) with str keys."""
    return {_s(k): v for k, v in _pairs(item)}


def trace_id_of(fields: dict[str, bytes]) -> str | None:
    """The producer's trace id from a W3C ``traceparent`` in ``_respire.trace.parent``."""
    parent = _text(fields, "_respire.trace.parent").split("-")
    if len(parent) == 4 and len(parent[1]) == 32:
        return parent[1]
    return None


def _dead_row(dead_id: str, fields: dict[str, bytes]) -> DeadLetterRow:
    return DeadLetterRow(
        dead_id=dead_id,
        job_id=_text(fields, "_respire.job.id"),
        reason=_text(fields, "_respire.reason"),
        attempt=_int(_text(fields, "_respire.attempt")),
        detail=_text(fields, "_respire.detail"),
        source_id=_text(fields, "_respire.source_id"),
        consumer=_text(fields, "_respire.consumer"),
        at=_id_time(dead_id),
        payload=fields.get("_respire.job.payload", b""),
    )


class QueueAdmin:
    """Operator access to one job queue (no codec needed: payloads are returned raw).

    ``QueueAdmin(client, "email")``; ``dead_stream`` is a dead-letter suffix override, as in
    ``WorkerOptions(dead_letter_stream=...)``. Raises :class:`ValidationError` for a bad client
    or name. The admin does not own the client.
    """

    def __init__(self, client: RedisClient, name: str, *, dead_stream: str | None = None) -> None:
        if not isinstance(client, RedisClient):
            raise ValidationError(f"client must be a RedisClient, got {type(client).__name__}")
        validate_name(name)
        if dead_stream is not None:
            validate_job_key_suffix(dead_stream, what="dead-letter stream suffix")
        self.client = client
        self.name = name
        self.keys = JobQueueKeys(name, client.key_prefix)
        self.dead_stream = dead_stream
        self.dead_key = stream_key(self.keys, "dead", dead_stream)
        self._queue: JobQueue[str] = JobQueue(client, name, StrCodec())

    @property
    def queue(self) -> JobQueue[str]:
        """A :class:`JobQueue` view of the same queue (payloads as text) for the reads the
        admin does not repeat: events, logs, metrics, groups, pause and rate limits."""
        return self._queue

    # -- reads ----------------------------------------------------------------------------
    async def summary(self) -> QueueSummary:
        """Counts and controls of the queue (a pipeline of counts, :meth:`JobQueue.get_state`
        and, when something is pending, the server's clock)."""
        k = self.keys
        replies = await self.client.pipeline(
            [
                ("XLEN", k.ready),
                ("XINFO", "GROUPS", k.ready),
                ("XPENDING", k.ready, CONSUMER_GROUP, "-", "+", 1),
                ("ZCARD", k.due),
                ("ZCARD", k.group_jobs),
                ("XLEN", self.dead_key),
                ("EXISTS", k.metrics),
                ("EXISTS", k.group_policy, k.group_order, k.group_jobs, k.group_owners),
            ]
        )
        for reply in replies:
            if isinstance(reply, RespireError) and not (
                isinstance(reply, ServerError) and reply.code in ("ERR", "NOGROUP")
            ):
                raise reply  # XINFO on a missing stream says ERR, XPENDING without group NOGROUP
        length, groups, oldest, due, grouped, dead, metrics, in_use = replies
        pending = consumers = 0
        lag: int | None = None
        if not isinstance(groups, RespireError):
            for group in groups:
                row = _map(group)
                if _s(row.get("name")) == CONSUMER_GROUP:
                    pending = int(row.get("pending") or 0)
                    consumers = int(row.get("consumers") or 0)
                    lag = int(row["lag"]) if row.get("lag") is not None else None
        age: int | None = None
        if pending and not isinstance(oldest, RespireError) and oldest:
            now_ms = await self.client.time_ms()  # TIME has no key: not in a cluster pipeline
            age = max(0, now_ms - int(_s(oldest[0][0]).partition("-")[0]))
        state = await self._queue.get_state()
        return QueueSummary(
            name=self.name,
            ready=int(length),
            pending=pending,
            oldest_pending_age_ms=age,
            lag=lag,
            scheduled=int(due) + int(grouped),
            dead_letters=int(dead),
            paused=state.paused,
            rate_limit=state.rate_limit,
            rate_limit_hits=state.rate_limit_hits,
            consumers=consumers,
            groups_in_use=int(in_use) > 0,
            metrics_enabled=int(metrics) > 0,
        )

    async def pending(
        self, start: str = "-", count: int = 50, *, consumer: str | None = None
    ) -> PendingPage:
        """One page of unacknowledged deliveries in entry id order (extended XPENDING), with
        each entry's job id. ``start`` is ``"-"``, an id, or a page's ``next_start``;
        ``count`` 1-1000; ``consumer`` limits the page to one consumer."""
        start = _bound(start, what="start", open_end="-")
        count = _count(count)
        args: list[str | int] = ["XPENDING", self.keys.ready, CONSUMER_GROUP, start, "+", count]
        if consumer is not None:
            validate_name(consumer, what="consumer")
            args.append(consumer)
        try:
            rows = await self.client.execute(*args)
        except ServerError as exc:
            if exc.code == "NOGROUP":
                return PendingPage([], None)
            raise
        ids = [_s(r[0]) for r in rows]
        bodies = await self._bodies(self.keys.ready, ids)
        page = [
            PendingRow(
                entry_id=i,
                job_id=_text(bodies.get(i, {}), "_respire.job.id"),
                consumer=_s(r[1]),
                idle_ms=int(r[2]),
                deliveries=int(r[3]),
            )
            for i, r in zip(ids, rows, strict=True)
        ]
        return PendingPage(page, "(" + ids[-1] if len(ids) == count else None)

    async def scheduled(self, cursor: str | None = None, count: int = 50) -> ScheduledPage:
        """One page of staged jobs of the due index (delayed jobs and durable retries), earliest
        due first. ``cursor`` is None or a page's ``next_cursor``; ``count`` 1-1000. Grouped
        staged jobs are counted in :meth:`summary` but not listed here (see
        :meth:`JobQueue.list_groups`). Jobs promoted between pages may shift the next page by
        a few rows (a row may show twice, none is skipped)."""
        count = _count(count)
        start = 0
        if cursor is not None:
            score, sep, member = cursor.partition(":") if isinstance(cursor, str) else ("", "", "")
            if not sep or not score.isdigit() or not is_entry_id(member):
                raise ValidationError("cursor must be a ScheduledPage.next_cursor value")
            rank, below = await self.client.pipeline(
                [("ZRANK", self.keys.due, member), ("ZCOUNT", self.keys.due, "-inf", f"({score}")]
            )
            start = int(rank) + 1 if isinstance(rank, int) else int(below)
        flat = await self.client.execute(
            "ZRANGE", self.keys.due, start, start + count - 1, "WITHSCORES"
        )
        pairs = [(_s(m), int(float(_s(sc)))) for m, sc in _score_pairs(flat)]
        bodies = await self._bodies(self.keys.scheduled, [m for m, _ in pairs])
        rows = [
            ScheduledRow(
                entry_id=m,
                job_id=_text(bodies.get(m, {}), "_respire.job.id"),
                due_at=datetime.fromtimestamp(due / 1000, UTC),
                attempts=_int(_text(bodies.get(m, {}), "_respire.job.attempts")),
            )
            for m, due in pairs
        ]
        next_cursor = f"{pairs[-1][1]}:{pairs[-1][0]}" if len(pairs) == count else None
        return ScheduledPage(rows, next_cursor)

    async def dead_letters(
        self, before: str | None = None, count: int = 50, *, reason: str | None = None
    ) -> DeadLetterPage:
        """One page of dead letters, newest first: ``count`` (1-1000) entries older than
        ``before`` (None: from the newest; else a page's ``next_before``). With ``reason``
        only that reason's letters are returned, so a page may hold fewer rows than it
        scanned; follow ``next_before`` until it is None."""
        count = _count(count)
        end = "+" if before is None else _bound(before, what="before", open_end="+")
        _check_reason(reason)
        rows = await self.client.execute("XREVRANGE", self.dead_key, end, "-", "COUNT", count)
        page = []
        for dead_id, flat in rows or []:
            row = _dead_row(_s(dead_id), _fields(flat))
            if reason is None or row.reason == reason:
                page.append(row)
        last = _s(rows[-1][0]) if rows else None
        return DeadLetterPage(page, "(" + last if last and len(rows) == count else None)

    async def dead_letter_reasons(self, scan: int = 10_000) -> dict[str, int]:
        """Dead letters per reason among the newest ``scan`` (1-100000) letters, read in pages
        of 1000."""
        scan = _count(scan, what="scan", high=100_000)
        counts: dict[str, int] = {}
        before: str | None = None
        seen = 0
        while seen < scan:
            page = await self.dead_letters(before, min(MAX_PAGE, scan - seen))
            seen += len(page.rows)
            for row in page.rows:
                counts[row.reason] = counts.get(row.reason, 0) + 1
            if page.next_before is None:
                break
            before = page.next_before
        return counts

    async def events(self, before: str | None = None, count: int = 50) -> EventPage:
        """One page of the queue's events, newest first: ``count`` (1-1000) events older than
        ``before`` (None: from the newest; else a page's ``next_before``). To follow new
        events as they come, use ``admin.queue.read_events("$")``."""
        count = _count(count)
        end = "+" if before is None else _bound(before, what="before", open_end="+")
        rows = await self.client.execute("XREVRANGE", self.keys.events, end, "-", "COUNT", count)
        events = [_to_event(_s(i), f) for i, f in rows or []]
        return EventPage(events, "(" + events[-1].id if len(events) == count else None)

    async def job(self, entry_id: str) -> JobDetail | None:
        """One entry of the ready stream with its delivery state, the events of its job id
        among the newest 1000 events, its trace id and its log lines; None when the entry is
        not in the ready stream (never enqueued there, trimmed or deleted)."""
        entry_id = _entry_id(entry_id)
        body, pend = await self.client.pipeline(
            [
                ("XRANGE", self.keys.ready, entry_id, entry_id),
                ("XPENDING", self.keys.ready, CONSUMER_GROUP, entry_id, entry_id, 1),
            ]
        )
        if isinstance(body, RespireError):
            raise body
        if not body:
            return None
        fields = _fields(body[0][1])
        job_id = _text(fields, "_respire.job.id")
        pending = None
        if not isinstance(pend, RespireError) and pend:
            r = pend[0]
            pending = PendingRow(entry_id, job_id, _s(r[1]), int(r[2]), int(r[3]))
        events = []
        logs: list[str] = []
        if job_id:
            recent = await self.client.execute(
                "XREVRANGE", self.keys.events, "+", "-", "COUNT", JOB_EVENT_SCAN
            )
            events = [
                e
                for e in (_to_event(_s(i), f) for i, f in reversed(recent or []))
                if e.job_id == job_id
            ]
            logs = await self._queue.get_logs(validate_job_id(job_id), 100)
        payload = fields.pop("_respire.job.payload", b"")
        return JobDetail(
            entry_id=entry_id,
            job_id=job_id,
            fields={k: v.decode("utf-8", "replace") for k, v in fields.items()},
            payload=payload,
            pending=pending,
            trace_id=trace_id_of(fields),
            events=events,
            logs=logs,
        )

    async def _bodies(self, key: str, ids: Sequence[str]) -> dict[str, dict[str, bytes]]:
        """The fields of each existing entry of ``ids`` (one pipelined XRANGE per id)."""
        if not ids:
            return {}
        replies = await self.client.pipeline([("XRANGE", key, i, i) for i in ids])
        out: dict[str, dict[str, bytes]] = {}
        for i, reply in zip(ids, replies, strict=True):
            if isinstance(reply, RespireError):
                raise reply
            if reply:
                out[i] = _fields(reply[0][1])
        return out

    # -- controls (JobQueue's, logged) -------------------------------------------------------
    async def pause(self) -> bool:
        """:meth:`JobQueue.pause`, logged. Returns True when this call paused the queue."""
        changed = await self._queue.pause()
        log.info("%s: paused%s", self.name, "" if changed else " (it already was)")
        return changed

    async def resume(self) -> bool:
        """:meth:`JobQueue.resume`, logged. Returns True when this call resumed the queue."""
        changed = await self._queue.resume()
        log.info("%s: resumed%s", self.name, "" if changed else " (it was not paused)")
        return changed

    async def set_rate_limit(self, policy: RateLimit | None) -> bool:
        """:meth:`JobQueue.set_rate_limit`, logged (None removes the limit)."""
        changed = await self._queue.set_rate_limit(policy)
        log.info("%s: rate limit set to %s", self.name, policy)
        return changed

    # -- dead letters ---------------------------------------------------------------------
    async def retry_dead_letters(self, dead_ids: Sequence[str]) -> int:
        """Re-enqueue each dead letter as a new delivery of its original job (same job id and
        payload, trace context kept; no batch or flow membership, group, priority, expiry or
        attempt count) and delete the dead letter, atomically per letter. Returns how many
        were retried; ids that are gone (or letters without a job id or payload) are skipped.
        Raises :class:`ValidationError` for a malformed id before anything is sent. If
        cancelled, the letters handled so far stay retried; repeating the call is harmless
        (a retried letter is gone)."""
        ids = self._dead_ids(dead_ids)
        retried = 0
        for i in range(0, len(ids), MAX_RETRY_CHUNK):
            retried += await self._retry_chunk(ids[i : i + MAX_RETRY_CHUNK])
        log.info("%s: retried %d of %d dead letters", self.name, retried, len(ids))
        return retried

    async def _retry_chunk(self, ids: Sequence[str]) -> int:
        """Retry up to 500 letters: one pipelined read of the letters (their job ids name the
        result records each retry deletes), then one pipelined script call per letter."""
        bodies = await self._bodies(self.dead_key, ids)
        calls = []
        statuses: dict[str, str] = {}
        for dead_id in ids:
            fields = bodies.get(dead_id)
            job_id = _text(fields, "_respire.job.id") if fields is not None else ""
            if fields is None:
                statuses[dead_id] = "missing"
            elif not job_id or "_respire.job.payload" not in fields:
                statuses[dead_id] = "malformed"
            else:
                keys = (self.dead_key, self.keys.ready, self.keys.result(job_id))
                calls.append((_RETRY, keys, (dead_id, job_id)))
        sent = [dead_id for dead_id in ids if dead_id not in statuses]
        for dead_id, reply in zip(sent, await run_many(self.client, calls), strict=True):
            if isinstance(reply, BaseException):
                raise reply
            statuses[dead_id] = _s(reply)
        done = 0
        for dead_id in ids:
            status = statuses[dead_id]
            if status in ("missing", "malformed", "changed"):
                log.warning("%s: dead letter %s not retried (%s)", self.name, dead_id, status)
            else:
                done += 1
                log.debug("%s: retried dead letter %s as entry %s", self.name, dead_id, status)
        # one INFO line per call of retry_dead_letters / retry_all, not per page
        log.debug("%s: retried %d of %d dead letters of a page", self.name, done, len(ids))
        return done

    async def retry_all(
        self, *, reason: str | None = None, batch: int = 500
    ) -> AsyncIterator[RetryProgress]:
        """Retry every dead letter that exists now (of ``reason``, if given), oldest first, a
        page of ``batch`` (1-500) at a time; yields the running totals after each page. Memory
        stays bounded by one page. Letters dead-lettered after the call started (a retried job
        failing again, say) are not retried by it. Stopping the iteration stops the retries;
        pages already handled stay retried."""
        batch = _count(batch, what="batch", high=MAX_RETRY_CHUNK)
        _check_reason(reason)
        newest = await self.client.execute("XREVRANGE", self.dead_key, "+", "-", "COUNT", 1)
        if not newest:
            return
        end = _s(newest[0][0])
        cursor = "-"
        scanned = retried = skipped = 0
        while True:
            rows = await self.client.execute("XRANGE", self.dead_key, cursor, end, "COUNT", batch)
            if not rows:
                log.info(
                    "%s: retried %d of %d dead letters scanned (%d skipped)",
                    self.name,
                    retried,
                    scanned,
                    skipped,
                )
                return
            ids = []
            for dead_id, flat in rows:
                scanned += 1
                if reason is None or _text(_fields(flat), "_respire.reason") == reason:
                    ids.append(_s(dead_id))
                else:
                    skipped += 1
            if ids:
                done = await self._retry_chunk(ids)
                retried += done
                skipped += len(ids) - done
            yield RetryProgress(scanned, retried, skipped)
            cursor = "(" + _s(rows[-1][0])

    async def delete_dead_letters(self, dead_ids: Sequence[str]) -> int:
        """Delete dead letters (XDEL); returns how many existed. Raises
        :class:`ValidationError` for a malformed id before anything is sent."""
        ids = self._dead_ids(dead_ids)
        deleted = 0
        for i in range(0, len(ids), MAX_RETRY_CHUNK):
            deleted += int(
                await self.client.execute("XDEL", self.dead_key, *ids[i : i + MAX_RETRY_CHUNK])
            )
        log.info("%s: deleted %d of %d dead letters", self.name, deleted, len(ids))
        return deleted

    @staticmethod
    def _dead_ids(dead_ids: object) -> list[str]:
        if isinstance(dead_ids, str) or not isinstance(dead_ids, Sequence):
            raise ValidationError("dead_ids must be a list of dead-letter ids")
        # an id given twice is one letter: handled (and counted) once
        return list(dict.fromkeys(_entry_id(i, what="dead-letter id") for i in dead_ids))

    # -- retention ------------------------------------------------------------------------
    async def trim_plan(
        self,
        stream: TrimStream,
        *,
        max_age: timedelta | float | None = None,
        max_length: int | None = None,
        limit: int = DEFAULT_TRIM_LIMIT,
    ) -> TrimPlan:
        """What :meth:`trim` would remove from ``stream`` (``"ready"``, ``"events"`` or
        ``"dead"``) under the policy (``max_age`` and/or ``max_length``), at most ``limit``
        (1-100000) entries; changes nothing. The plan names every consumer group's lowest
        pending id and first undelivered entry: nothing from the earliest of them on goes."""
        key = stream_key(self.keys, stream, self.dead_stream)
        return await plan_trim(
            self.client,
            self.name,
            stream,
            key,
            max_age=max_age,
            max_length=max_length,
            limit=limit,
        )

    async def trim(self, plan: TrimPlan) -> TrimResult:
        """Remove exactly what ``plan`` listed, after re-checking atomically that the groups
        and their positions still allow it (else nothing is removed and ``aborted`` says
        why). See :func:`respire_actors.retention.trim_planned`."""
        if not isinstance(plan, TrimPlan):
            raise ValidationError(f"plan must be a TrimPlan, got {type(plan).__name__}")
        if plan.key != stream_key(self.keys, plan.stream, self.dead_stream):
            raise ValidationError(f"the plan is for {plan.key!r}, not a stream of this queue")
        return await trim_planned(self.client, plan)


def _score_pairs(flat: Any) -> list[tuple[Any, Any]]:
    """(member, score) pairs of a ZRANGE WITHSCORES reply (RESP3 pairs or a flat list)."""
    if flat and isinstance(flat[0], list | tuple):
        return [(m, sc) for m, sc in flat]
    return list(zip(flat[0::2], flat[1::2], strict=True))
