"""Recurring and cron jobs: durable schedules whose ticks become ordinary immediate jobs.

::

    scheduler = queue.scheduler()                    # or RecurringScheduler(client, name, codec)
    await scheduler.upsert("hourly", payload, interval=timedelta(hours=1), missed=CATCH_UP)
    await scheduler.upsert("weekdays", payload, cron="0 9 * * MON-FRI")
    enqueued = await scheduler.run_due(max_ticks=64)  # or a worker with RecurringOptions

State lives in four keys of the queue's slot (see :class:`~respire_actors.keys.JobQueueKeys`):
the definition hash (schedule id -> one header line and the encoded payload), the due index
(next due unix ms), the visiting order (every id at score 0) and the shared cursor (the last
visited id). A pass takes its candidates and advances the cursor in one script
(``recurring_scan``), computes each due candidate's tick from the scheduler's clock, then
commits every tick with ``recurring_tick``, pipelined: each commit is a compare-and-set on the
revision and due time the scan saw, so a (revision, tick) is committed at most once whatever
the number of schedulers, lost replies, restarts or clock jumps.

Definition header (ASCII, space separated, the cron expression last because it has spaces)::

    1 <revision> <last tick ms or -> <skip|catch-up> <created ms> i <interval ms>
    1 <revision> <last tick ms or -> <skip|catch-up> <created ms> c <cron expression>
"""

from __future__ import annotations

import enum
import logging
import math
import uuid
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Generic, TypeVar

from cronsim import CronSim, CronSimError
from opentelemetry.trace import Span

from .. import tracing
from ..actors.ticker import DEFAULT_MAX_TICKS, MAX_TICKS_PER_PASS, TickPass
from ..clock import (
    MAX_UNIX_MS,
    Clock,
    SystemClock,
    check_clock,
    from_unix_ms,
    to_unix_ms,
    utc_now_ms,
)
from ..codecs import Codec, check_codec, decode_with, encode_with
from ..errors import InvalidSchedule, ValidationError
from ..keys import JobQueueKeys, validate_name
from ..redis.client import RedisClient
from ..redis.scripts import load, run_many
from .options import duration_ms, validate_text

T = TypeVar("T")

MAX_SCHEDULE_ID_BYTES = 1024
JOB_ID_PREFIX = "recurring:"
"""Job ids ``recurring:<revision>:<unix-ms>`` are reserved for the scheduler's ticks."""

_UPSERT = load("recurring_upsert")
_REMOVE = load("recurring_remove")
_SCAN = load("recurring_scan")
_TICK = load("recurring_tick")
_LIST = load("recurring_list")
_FORMAT = "1"
log = logging.getLogger("respire_actors.recurring")
_tlog = logging.getLogger("respire_actors.telemetry")


class MissedTickPolicy(enum.Enum):
    """What a pass does with occurrences that passed while no scheduler ran.

    ``SKIP`` (default): coalesce them into one tick, the latest occurrence at or before the
    pass's clock reading. ``CATCH_UP``: enqueue every overdue occurrence in order, one per
    schedule visit, so the backlog drains over later bounded passes.
    """

    SKIP = "skip"
    CATCH_UP = "catch-up"


SKIP = MissedTickPolicy.SKIP
CATCH_UP = MissedTickPolicy.CATCH_UP


@dataclass(frozen=True, slots=True)
class RecurringOptions:
    """Enable the hosted recurring ticker for one worker registration.

    poll_interval:      longest pause between passes (default 1 s); the ticker wakes earlier
                        when a schedule it visited falls due sooner
    max_ticks_per_pass: schedules one pass visits, due or not (1-256, default 64)
    clock:              the UTC clock deciding what is due and timing the passes (default the
                        system clock; :class:`respire_actors.testing.FakeClock` in tests)
    """

    poll_interval: timedelta | float = timedelta(seconds=1)
    max_ticks_per_pass: int = DEFAULT_MAX_TICKS
    clock: Clock | None = None

    def __post_init__(self) -> None:
        duration_ms(self.poll_interval, what="poll_interval")
        _check_budget(self.max_ticks_per_pass, "max_ticks_per_pass")
        if self.clock is not None:
            check_clock(self.clock)

    @property
    def poll_ms(self) -> int:
        return duration_ms(self.poll_interval, what="poll_interval")


@dataclass(frozen=True, slots=True)
class ScheduleInfo(Generic[T]):
    """One stored schedule, as :meth:`RecurringScheduler.get` and ``list`` return it.

    ``next_due`` is None once the schedule has no representable next occurrence (it stays
    until removed); ``last_tick`` is None until a tick of this revision committed.
    """

    schedule_id: str
    revision: str
    payload: T
    interval: timedelta | None
    cron: str | None
    missed: MissedTickPolicy
    created_at: datetime
    next_due: datetime | None
    last_tick: datetime | None


@dataclass(frozen=True, slots=True)
class SchedulePage(Generic[T]):
    """A page of schedules in id order; pass ``next_after`` to ``list`` for the next page
    (None: this was the last page)."""

    schedules: list[ScheduleInfo[T]]
    next_after: str | None


# -- validation (pure; runs before anything is sent) ----------------------------------------


def _check_budget(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValidationError(f"{what} must be an integer from 1 to {MAX_TICKS_PER_PASS}")
    if not 1 <= value <= MAX_TICKS_PER_PASS:
        raise ValidationError(f"{what} must be an integer from 1 to {MAX_TICKS_PER_PASS}")
    return value


def validate_schedule_id(schedule_id: object) -> str:
    return validate_text(schedule_id, what="schedule id", max_bytes=MAX_SCHEDULE_ID_BYTES)


def interval_ms(value: object) -> int:
    """A positive whole number of milliseconds from a timedelta or seconds; fractions of a
    millisecond are refused, not rounded."""
    if isinstance(value, bool) or not isinstance(value, timedelta | int | float):
        raise InvalidSchedule("interval must be a timedelta or a number of seconds")
    if isinstance(value, timedelta):
        if value.microseconds % 1000:
            raise InvalidSchedule(f"interval must be whole milliseconds, got {value!r}")
        ms = value // timedelta(milliseconds=1)
    else:
        try:
            seconds = float(value)
        except OverflowError:
            raise InvalidSchedule(f"interval {value} s is out of range") from None
        if math.isnan(seconds) or math.isinf(seconds):
            raise InvalidSchedule("interval must be finite")
        exact = round(seconds * 1000, 6)
        if not math.isfinite(exact):
            raise InvalidSchedule(f"interval {value} s is out of range")
        if exact != math.floor(exact):
            raise InvalidSchedule(f"interval must be whole milliseconds, got {value!r} s")
        ms = int(exact)
    if ms <= 0:
        raise InvalidSchedule("interval must be positive")
    return ms


def validate_cron(expression: object) -> str:
    """Five space-separated fields (minute hour day-of-month month day-of-week), evaluated in
    UTC. Six-field (seconds) expressions, macros (``@hourly``) and time-zone prefixes
    (``CRON_TZ=``, ``TZ=``) are refused. Returns the expression with single spaces."""
    if not isinstance(expression, str):
        raise InvalidSchedule(f"cron must be a str, got {type(expression).__name__}")
    if not expression.isascii():
        raise InvalidSchedule(f"cron expression {expression!r} must be ASCII")
    fields = expression.split()
    if any("=" in f for f in fields):
        raise InvalidSchedule(
            f"cron expression {expression!r}: time zones are not accepted; expressions are UTC"
        )
    if len(fields) != 5:
        raise InvalidSchedule(
            f"cron expression {expression!r} must have five fields (minute hour day-of-month "
            f"month day-of-week), got {len(fields)}"
        )
    normal = " ".join(fields)
    try:
        CronSim(normal, datetime(2000, 1, 1, tzinfo=UTC))
    except CronSimError as exc:
        raise InvalidSchedule(f"cron expression {expression!r}: {exc}") from None
    return normal


def cron_after(expression: str, after_ms: int) -> int | None:
    """The first occurrence strictly after ``after_ms`` (unix ms), or None when there is none
    within cronsim's search horizon (50 years) or before the end of year 9999."""
    start = from_unix_ms(after_ms)
    try:
        occurrence = next(CronSim(expression, start))
    except (StopIteration, OverflowError, ValueError):
        return None
    ms = to_unix_ms(occurrence)
    return ms if after_ms < ms <= MAX_UNIX_MS else None


def cron_at_or_before(expression: str, at_ms: int) -> int | None:
    """The latest occurrence at or before ``at_ms`` (unix ms), None if there is none."""
    # cronsim's reverse iteration excludes its start unless it has microseconds
    start = from_unix_ms(at_ms) + timedelta(microseconds=1)
    try:
        occurrence = next(CronSim(expression, start, reverse=True))
    except (StopIteration, OverflowError, ValueError):
        return None
    return to_unix_ms(occurrence)


@dataclass(frozen=True, slots=True)
class _Definition:
    revision: str
    last_tick: int | None
    missed: MissedTickPolicy
    created: int
    interval: int | None
    cron: str | None
    payload: bytes

    def header(self) -> bytes:
        last = "-" if self.last_tick is None else str(self.last_tick)
        spec = f"i {self.interval}" if self.interval is not None else f"c {self.cron}"
        line = f"{_FORMAT} {self.revision} {last} {self.missed.value} {self.created} {spec}\n"
        return line.encode("ascii")

    def encode(self) -> bytes:
        return self.header() + self.payload

    def first_due(self) -> int | None:
        return self.following(self.created)

    def following(self, tick: int) -> int | None:
        """The occurrence after ``tick``, None past the representable range."""
        if self.interval is not None:
            after = tick + self.interval
            return after if after <= MAX_UNIX_MS else None
        assert self.cron is not None
        return cron_after(self.cron, tick)

    def tick_for(self, due: int, now: int) -> int:
        """The tick a pass at ``now`` commits for a schedule due at ``due`` (``due <= now``)."""
        if self.missed is CATCH_UP:
            return due
        if self.interval is not None:
            return due + (now - due) // self.interval * self.interval
        assert self.cron is not None
        latest = cron_at_or_before(self.cron, now)
        return due if latest is None or latest < due else latest


def _parse(blob: bytes) -> _Definition:
    head, sep, payload = blob.partition(b"\n")
    parts = head.decode("ascii").split(" ", 6)
    if not sep or len(parts) != 7 or parts[0] != _FORMAT or parts[5] not in ("i", "c"):
        raise ValueError("malformed recurring definition")
    _, revision, last, missed, created, kind, spec = parts
    return _Definition(
        revision=revision,
        last_tick=None if last == "-" else int(last),
        missed=MissedTickPolicy(missed),
        created=int(created),
        interval=int(spec) if kind == "i" else None,
        cron=spec if kind == "c" else None,
        payload=payload,
    )


def _b(value: Any) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode("utf-8")


def _s(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _score(value: Any) -> int | None:
    return None if value is None or value is False else int(float(_s(value)))


def _rows(reply: Any) -> list[tuple[str, bytes | None, int | None]]:
    rows: list[tuple[str, bytes | None, int | None]] = []
    for row in reply or []:
        sid, blob, due = row[0], row[1], row[2]
        rows.append((_s(sid), None if blob is None or blob is False else _b(blob), _score(due)))
    return rows


def recurring_job_id(revision: str, tick_ms: int) -> str:
    return f"{JOB_ID_PREFIX}{revision}:{tick_ms}"


class RecurringScheduler(Generic[T]):
    """Durable recurring schedules of one job queue (create it with ``queue.scheduler()``).

    ``clock`` is the UTC clock that decides what is due (default :class:`SystemClock`; a
    :class:`respire_actors.testing.FakeClock` in tests). Redis server time is not used for
    recurring schedules, but still governs delays, TTLs and rate limits of the jobs.
    """

    def __init__(
        self, client: RedisClient, queue: str, codec: Codec[T], *, clock: Clock | None = None
    ) -> None:
        if not isinstance(client, RedisClient):
            raise ValidationError(f"client must be a RedisClient, got {type(client).__name__}")
        validate_name(queue)
        check_codec(codec)
        self.client = client
        self.queue = queue
        self.codec = codec
        self.keys = JobQueueKeys(queue, client.key_prefix)
        self._clock: Clock = SystemClock() if clock is None else check_clock(clock)

    @property
    def clock(self) -> Clock:
        return self._clock

    # -- control plane ----------------------------------------------------------------------
    async def upsert(
        self,
        schedule_id: str,
        payload: T,
        *,
        interval: timedelta | float | None = None,
        cron: str | None = None,
        missed: MissedTickPolicy = SKIP,
    ) -> ScheduleInfo[T]:
        """Create or replace a schedule; every call creates a new revision.

        Exactly one of ``interval`` (a positive whole number of milliseconds, as a timedelta or
        seconds; occurrences at upsert time + k * interval) or ``cron`` (five UTC fields; the
        first occurrence strictly after upsert time). Replacing a schedule resets its next
        occurrence and stops any tick computed from the old revision from committing; jobs
        already enqueued stay. Raises :class:`InvalidSchedule` (a :class:`ValidationError`) or
        :class:`~respire_actors.codecs.EncodeError` before anything is sent, including for a
        schedule with no future occurrence. If cancelled or the reply is lost, the upsert may
        or may not have happened: repeat it (that creates yet another revision).
        """
        validate_schedule_id(schedule_id)
        if (interval is None) == (cron is None):
            raise InvalidSchedule("give exactly one of interval and cron")
        if not isinstance(missed, MissedTickPolicy):
            raise InvalidSchedule(f"missed must be SKIP or CATCH_UP, got {missed!r}")
        every = interval_ms(interval) if interval is not None else None
        expression = validate_cron(cron) if cron is not None else None
        body = encode_with(self.codec, payload, limit=self.client.settings.max_payload_bytes)
        now = utc_now_ms(self._clock)
        definition = _Definition(uuid.uuid4().hex, None, missed, now, every, expression, body)
        first = definition.first_due()
        if first is None:
            raise InvalidSchedule(f"schedule {schedule_id!r} has no future occurrence")
        await _UPSERT(
            self.client,
            (self.keys.recurring, self.keys.recurring_due, self.keys.recurring_order),
            (schedule_id, definition.encode(), first),
        )
        return self._info(schedule_id, definition, first)

    async def remove(self, schedule_id: str) -> bool:
        """Delete a schedule; True when a definition existed. No tick of it commits after
        this returns; jobs already enqueued are not retracted. Safe to repeat."""
        validate_schedule_id(schedule_id)
        reply = await _REMOVE(
            self.client,
            (self.keys.recurring, self.keys.recurring_due, self.keys.recurring_order),
            (schedule_id,),
        )
        return bool(int(reply))

    async def get(self, schedule_id: str) -> ScheduleInfo[T] | None:
        """The stored schedule, or None. Raises :class:`DecodeError` if its payload does not
        decode with this scheduler's codec."""
        validate_schedule_id(schedule_id)
        rows = _rows(await _LIST(self.client, self._list_keys(), ("get", schedule_id, 1)))
        for sid, blob, due in rows:
            if blob is not None:
                return self._info(sid, _parse(blob), due)
        return None

    async def list(self, *, after: str | None = None, count: int = 100) -> SchedulePage[T]:
        """A page of up to ``count`` (1-1000) schedules in id order, starting after ``after``."""
        if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= 1000:
            raise ValidationError("count must be an integer from 1 to 1000")
        if after is not None:
            validate_schedule_id(after)
        reply = await _LIST(self.client, self._list_keys(), ("page", after or "", count))
        rows = _rows(reply)
        infos = [self._info(sid, _parse(blob), due) for sid, blob, due in rows if blob]
        return SchedulePage(infos, rows[-1][0] if len(rows) == count else None)

    # -- scheduling passes ------------------------------------------------------------------
    async def run_due(self, max_ticks: int = DEFAULT_MAX_TICKS) -> int:
        """Run one bounded scheduling pass; returns how many ticks it enqueued.

        Visits up to ``max_ticks`` (1-256) schedules round-robin from the shared cursor, due
        or not, and commits at most one tick per visited schedule. Safe to run from any number
        of processes at once: each (revision, tick) is enqueued once. If cancelled or a reply
        is lost, every tick is either committed or still due for a later pass; never twice.
        """
        return (await self.run_pass(max_ticks)).enqueued

    async def run_pass(self, max_ticks: int = DEFAULT_MAX_TICKS) -> TickPass:
        """:meth:`run_due` with the details (visited, stale, backlog, next due) of the pass."""
        _check_budget(max_ticks, "max_ticks")
        now = utc_now_ms(self._clock)
        keys = self.keys
        rows = _rows(
            await _SCAN(
                self.client,
                (keys.recurring_order, keys.recurring_cursor, keys.recurring, keys.recurring_due),
                (max_ticks,),
            )
        )
        calls: list[Any] = []
        planned: list[tuple[_Definition, int | None, tuple[bytes | str | int, ...]]] = []
        tick_spans: list[Span | None] = []
        next_due: int | None = None
        problems: list[str] = []
        with ExitStack() as spans:
            for sid, blob, due in rows:
                if blob is None or due is None:
                    continue  # removed in between, or no further occurrence
                try:
                    definition = _parse(blob)
                except (ValueError, UnicodeDecodeError):
                    problems.append(sid)
                    continue
                if due > now:
                    next_due = due if next_due is None else min(next_due, due)
                    continue
                tick = definition.tick_for(due, now)
                following = definition.following(tick)
                envelope: tuple[bytes | str | int, ...] = (
                    "_respire.job.id",
                    recurring_job_id(definition.revision, tick),
                    "_respire.job.payload",
                    definition.payload,
                    "_respire.job.schedule",
                    sid,
                    "_respire.job.tick",
                    tick,
                )
                args = (
                    sid,
                    definition.revision,
                    due,
                    tick,
                    "-" if following is None else following,
                )
                # each tick is an enqueue: the same producer span and persisted context
                span = spans.enter_context(
                    tracing.producer_span(
                        "job enqueue",
                        self.queue,
                        {
                            "respire.job.id": recurring_job_id(definition.revision, tick),
                            "respire.recurring.schedule": sid,
                        },
                    )
                )
                envelope += tuple(tracing.context_fields(span))
                calls.append(
                    (_TICK, (keys.ready, keys.recurring, keys.recurring_due), args + envelope)
                )
                planned.append((definition, following, envelope))
                tick_spans.append(span)
            replies = await run_many(self.client, calls) if calls else []
            for span, reply in zip(tick_spans, replies, strict=True):
                if isinstance(reply, BaseException):
                    tracing.fail(span, reply)
                elif _s(reply[0]) == "committed":
                    tracing.set_attributes(span, {"messaging.message.id": _s(reply[1])})
                else:
                    tracing.set_attributes(span, {"respire.recurring.stale": True})
        enqueued = stale = backlog = 0
        failure: BaseException | None = None
        for reply, (_, following, envelope) in zip(replies, planned, strict=True):
            if isinstance(reply, BaseException):
                failure = failure or reply
                continue
            if _s(reply[0]) == "committed":
                enqueued += 1
                self._log_accepted(envelope, _s(reply[1]))
                if following is not None:
                    if following <= now:
                        backlog += 1
                    else:
                        next_due = following if next_due is None else min(next_due, following)
            else:
                stale += 1
        if failure is not None:
            raise failure
        if problems:
            log.warning(
                "recurring definitions %r of queue %r are malformed (written by something "
                "else?) and were skipped; remove and upsert them again",
                problems[:5],
                self.queue,
            )
        return TickPass(
            visited=len(rows),
            enqueued=enqueued,
            stale=stale,
            backlog=backlog,
            next_due=None if next_due is None else from_unix_ms(next_due),
        )

    # -- helpers ----------------------------------------------------------------------------

    def _log_accepted(self, envelope: Sequence[bytes | str | int], entry_id: str) -> None:
        """The ``accepted`` record of a committed tick (a tick is an enqueue)."""
        if not _tlog.isEnabledFor(logging.DEBUG):
            return
        job_id = str(envelope[1])
        _tlog.debug(
            "%s: %r accepted as %s",
            self.queue,
            job_id,
            entry_id,
            extra={
                "event": "accepted",
                "queue": self.queue,
                "job_id": job_id,
                "entry_id": entry_id,
                "attempt": 0,
                "trace_id": tracing.enqueue_trace_id(envelope),
                "deduplicated": False,
            },
        )

    def _list_keys(self) -> Sequence[str]:
        return (self.keys.recurring_order, self.keys.recurring, self.keys.recurring_due)

    def _info(self, sid: str, d: _Definition, due: int | None) -> ScheduleInfo[T]:
        return ScheduleInfo(
            schedule_id=sid,
            revision=d.revision,
            payload=decode_with(self.codec, d.payload),
            interval=None if d.interval is None else timedelta(milliseconds=d.interval),
            cron=d.cron,
            missed=d.missed,
            created_at=from_unix_ms(d.created),
            next_due=None if due is None else from_unix_ms(due),
            last_tick=None if d.last_tick is None else from_unix_ms(d.last_tick),
        )
