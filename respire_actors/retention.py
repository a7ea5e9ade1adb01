"""Safe retention of a job queue's streams: the conservative MINID procedure in one script.

``plan_trim`` inventories every consumer group of a stream (lowest pending id, first undelivered
entry), combines that with the policy (max age and/or max length) and reports what would go;
``trim_planned`` removes exactly that, after re-checking atomically that the groups and their
positions still allow it; ``apply_trim`` plans and trims in one call (the retention keeper).
A pending entry, an entry some group has not been delivered yet, and staged (scheduled) jobs
are never removed. See docs/retention.md.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Literal

from .actors.options import MAX_TRIM_BATCH, retention_age_ms, validate_max_length
from .errors import ValidationError
from .keys import JobQueueKeys
from .redis.client import RedisClient
from .redis.scripts import load

log = logging.getLogger("respire_actors.admin")

_TRIM = load("job_trim")

TrimStream = Literal["ready", "events", "dead"]
TRIM_STREAMS: tuple[TrimStream, ...] = ("ready", "events", "dead")
DEFAULT_TRIM_LIMIT = 10_000


def entry_id_key(entry_id: str) -> tuple[int, int]:
    """A stream id ``ms-seq`` (or ``ms``) as a sortable pair."""
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


@dataclass(frozen=True, slots=True)
class TrimGroup:
    """A consumer group's boundaries at planning time: a trim keeps everything from the lowest
    of ``lowest_pending`` and ``first_undelivered`` on."""

    name: str
    last_delivered_id: str
    pending: int
    lowest_pending: str | None
    first_undelivered: str | None


@dataclass(frozen=True, slots=True)
class TrimPlan:
    """What a trim of one stream would remove (:func:`plan_trim`, `QueueAdmin.trim_plan`).

    Entries with ids below ``cutoff`` go (``count`` of them; None when nothing goes).
    ``age_cutoff`` is the policy's age boundary, ``boundary`` the earliest group boundary (the
    reason a trim stops before the policy would), ``limited`` True when the per-call limit
    stopped the plan (run again for the rest).
    """

    queue: str
    stream: TrimStream
    key: str
    length: int
    cutoff: str | None
    count: int
    limited: bool
    age_cutoff: str | None
    boundary: str | None
    groups: tuple[TrimGroup, ...]
    max_age_ms: int | None
    max_length: int | None
    limit: int

    @property
    def safe(self) -> bool:
        """True when the cutoff is at or before every group boundary (the script guarantees
        it; :meth:`QueueAdmin.trim` checks again atomically before removing anything)."""
        if self.cutoff is None or self.boundary is None:
            return True
        return entry_id_key(self.cutoff) <= entry_id_key(self.boundary)


@dataclass(frozen=True, slots=True)
class TrimResult:
    """``removed`` entries went; ``aborted`` says why nothing was removed (the groups or their
    positions changed since the plan: plan again), else None."""

    removed: int
    cutoff: str | None
    aborted: str | None = None


def stream_key(keys: JobQueueKeys, stream: object, dead_stream: str | None = None) -> str:
    """The key of one of a queue's trimmable streams (``dead_stream``: a dead-letter suffix
    override, as in ``WorkerOptions.dead_letter_stream``). The staging stream of scheduled jobs
    is not trimmable."""
    if stream == "ready":
        return keys.ready
    if stream == "events":
        return keys.events
    if stream == "dead":
        return keys.custom(dead_stream) if dead_stream else keys.dead
    raise ValidationError(f"stream must be one of {', '.join(TRIM_STREAMS)}, got {stream!r}")


def _policy_args(max_age: object, max_length: object, limit: object) -> tuple[str, str, int]:
    if max_age is None and max_length is None:
        raise ValidationError("a trim needs a max age, a max length or both")
    age = "" if max_age is None else str(retention_age_ms(max_age, what="max_age"))
    length = "" if max_length is None else str(validate_max_length(max_length))
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_TRIM_BATCH:
        raise ValidationError(f"limit must be an integer from 1 to {MAX_TRIM_BATCH}")
    return age, length, limit


def _s(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


async def plan_trim(
    client: RedisClient,
    queue: str,
    stream: TrimStream,
    key: str,
    *,
    max_age: object = None,
    max_length: object = None,
    limit: int = DEFAULT_TRIM_LIMIT,
) -> TrimPlan:
    """What a trim of ``key`` (the queue's ``stream``) would remove now; changes nothing.

    ``max_age`` (timedelta or seconds) and/or ``max_length``: entries older than the age or
    beyond the newest ``max_length`` are out of policy. ``limit`` (1-100000) caps the entries
    one plan covers. Raises :class:`ValidationError` before anything is sent."""
    age, length, limit = _policy_args(max_age, max_length, limit)
    reply = await _TRIM(client, (key,), ("plan", age, length, limit))
    total, cutoff, count, limited, age_cut, boundary, n = reply[:7]
    flat = reply[7:]
    groups = tuple(
        TrimGroup(
            name=_s(flat[i]),
            last_delivered_id=_s(flat[i + 1]),
            pending=int(flat[i + 2]),
            lowest_pending=_s(flat[i + 3]) or None,
            first_undelivered=_s(flat[i + 4]) or None,
        )
        for i in range(0, int(n) * 5, 5)
    )
    return TrimPlan(
        queue=queue,
        stream=stream,
        key=key,
        length=int(total),
        cutoff=_s(cutoff) or None,
        count=int(count),
        limited=bool(int(limited)),
        age_cutoff=_s(age_cut) or None,
        boundary=_s(boundary) or None,
        groups=groups,
        max_age_ms=int(age) if age else None,
        max_length=int(length) if length else None,
        limit=limit,
    )


async def trim_planned(client: RedisClient, plan: TrimPlan) -> TrimResult:
    """Remove exactly the entries ``plan`` listed (ids below its cutoff), in one script that
    first recomputes the plan and aborts, removing nothing, when the consumer groups or their
    positions changed so that the plan's cutoff is no longer safe (``aborted`` says why: plan
    again). If cancelled or the reply is lost the trim may or may not have run; repeating it is
    harmless."""
    if not isinstance(plan, TrimPlan):
        raise ValidationError(f"plan must be a TrimPlan, got {type(plan).__name__}")
    if plan.cutoff is None:
        return TrimResult(0, None)
    names = [g.name for g in plan.groups]
    args = (
        "trim",
        "" if plan.max_age_ms is None else plan.max_age_ms,
        "" if plan.max_length is None else plan.max_length,
        plan.limit,
        plan.cutoff,
        len(names),
        *names,
    )
    reply = await _TRIM(client, (plan.key,), args)
    result = _result(reply)
    if result.aborted:
        log.warning("trim of %s (%s) aborted: %s", plan.queue, plan.stream, result.aborted)
    else:
        log.info(
            "trimmed %d entries of %s (%s) below %s",
            result.removed,
            plan.queue,
            plan.stream,
            plan.cutoff,
        )
    return result


async def apply_trim(
    client: RedisClient,
    key: str,
    *,
    max_age: object = None,
    max_length: object = None,
    limit: int = DEFAULT_TRIM_LIMIT,
) -> TrimResult:
    """Plan and trim in one script call (what the retention keeper runs): removes at most
    ``limit`` entries that are out of policy, never one at or after a group boundary."""
    age, length, limit = _policy_args(max_age, max_length, limit)
    return _result(await _TRIM(client, (key,), ("apply", age, length, limit)))


def _result(reply: Any) -> TrimResult:
    if _s(reply[0]) == "changed":
        return TrimResult(0, None, _s(reply[1]))
    return TrimResult(int(reply[1]), _s(reply[2]) or None)


__all__ = [
    "DEFAULT_TRIM_LIMIT",
    "TRIM_STREAMS",
    "TrimGroup",
    "TrimPlan",
    "TrimResult",
    "TrimStream",
    "apply_trim",
    "plan_trim",
    "stream_key",
    "trim_planned",
]
