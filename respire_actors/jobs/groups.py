"""Application job groups: group controls (concurrency, GCRA rate limit, lease, pause) and
inspection. :class:`~respire_actors.jobs.JobQueue` exposes these as methods; see
docs/groups.md for the scheduling rules.

Group policy lives in Redis (``:group-policy``) and is shared by every process; workers never
write it at registration. Every argument is validated before anything is sent to Redis.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal

from ..errors import ValidationError
from ..keys import JobQueueKeys
from ..redis.client import RedisClient
from ..redis.scripts import load
from .options import MAX_MS, RateLimit, duration_ms, validate_group

_ADMIN = load("job_group_admin")

DEFAULT_LEASE = timedelta(seconds=60)
MIN_LEASE_MS = 100

ParkedReason = Literal["paused", "concurrency", "rate", "delayed"]


@dataclass(frozen=True, slots=True)
class GroupOptions:
    """The limits of one application group.

    max_concurrency:  most deliveries of the group running at once, across all workers (None:
                      unlimited); each admitted delivery holds a lease until it completes,
                      is retried, dead-lettered or fails, or until the lease expires
    rate_limit:       GCRA limit of admitted delivery attempts (recovery included): a burst of
                      ``permit_limit``, then one permit per ``window / permit_limit`` (rounded
                      up to whole ms); None: unlimited
    lease_duration:   how long a delivery's concurrency lease lasts without renewal (100 ms to
                      2**31-1 ms, default 60 s)
    """

    max_concurrency: int | None = None
    rate_limit: RateLimit | None = None
    lease_duration: timedelta | float = DEFAULT_LEASE

    def __post_init__(self) -> None:
        if self.max_concurrency is not None and (
            isinstance(self.max_concurrency, bool)
            or not isinstance(self.max_concurrency, int)
            or not 1 <= self.max_concurrency <= MAX_MS
        ):
            raise ValidationError("max_concurrency must be None or an integer from 1 to 2**31-1")
        if self.rate_limit is not None and not isinstance(self.rate_limit, RateLimit):
            raise ValidationError("rate_limit must be None or a RateLimit")
        if self.lease_ms < MIN_LEASE_MS:
            raise ValidationError(f"lease_duration must be at least {MIN_LEASE_MS} ms")

    @property
    def lease_ms(self) -> int:
        return duration_ms(self.lease_duration, what="lease_duration")


@dataclass(frozen=True, slots=True)
class GroupInfo:
    """What Redis holds about one application group.

    ``staged``: jobs waiting in the group's staged index (``due``: of those, due now);
    ``running``: live concurrency leases; ``parked``: why the group is outside the rotation
    (None when it is not parked; ``delayed`` when none of its jobs was due at its last visit)
    and ``wake_at_ms`` the deadline (server unix ms) at which a group parked for any reason but
    a pause becomes eligible again; ``known`` is False when Redis
    holds nothing about the group at all.
    """

    name: str
    options: GroupOptions
    paused: bool
    staged: int
    due: int
    running: int
    parked: ParkedReason | None
    wake_at_ms: int | None
    known: bool


@dataclass(frozen=True, slots=True)
class GroupPage:
    """One page of :meth:`JobQueue.list_groups`; pass ``next_cursor`` for the next page (None:
    this was the last)."""

    groups: Sequence[GroupInfo]
    next_cursor: str | None


_REASONS = ("paused", "concurrency", "rate", "delayed")


def _s(value: Any) -> str:
    return value.decode("utf-8", "surrogateescape") if isinstance(value, bytes) else str(value)


def _options(raw: str) -> GroupOptions:
    if not raw:
        return GroupOptions()
    parts = [*raw.split("|"), "", "", "", "", ""][:5]
    rate = None
    if parts[1] and parts[2]:
        rate = RateLimit(int(parts[1]), timedelta(milliseconds=int(parts[2])))
    lease = timedelta(milliseconds=int(parts[3])) if parts[3] else DEFAULT_LEASE
    return GroupOptions(int(parts[0]) if parts[0] else None, rate, lease)


def _info(name: str, reply: Sequence[Any]) -> GroupInfo:
    raw, paused, staged, due, running, reason, deadline, known = reply
    why = _s(reason)
    wake = int(deadline)
    return GroupInfo(
        name=name,
        options=_options(_s(raw)),
        paused=int(paused) == 1,
        staged=int(staged),
        due=int(due),
        running=int(running),
        parked=why if why in _REASONS else None,  # type: ignore[arg-type]
        wake_at_ms=wake if wake >= 0 and why in _REASONS and why != "paused" else None,
        known=int(known) == 1,
    )


def _keys(keys: JobQueueKeys) -> tuple[str, ...]:
    return (
        keys.group_policy,
        keys.group_order,
        keys.group_jobs,
        keys.group_parked,
        keys.group_leases,
        keys.group_owners,
    )


async def set_group_options(
    client: RedisClient, keys: JobQueueKeys, group: str, options: GroupOptions
) -> bool:
    validate_group(group)
    if not isinstance(options, GroupOptions):
        raise ValidationError("options must be a GroupOptions")
    rate = options.rate_limit
    reply = await _ADMIN(
        client,
        _keys(keys),
        (
            "set",
            group,
            "" if options.max_concurrency is None else options.max_concurrency,
            "" if rate is None else rate.permit_limit,
            "" if rate is None else rate.window_ms,
            options.lease_ms,
        ),
    )
    return bool(int(reply))


async def set_group_paused(
    client: RedisClient, keys: JobQueueKeys, group: str, paused: bool
) -> bool:
    validate_group(group)
    reply = await _ADMIN(client, _keys(keys), ("pause" if paused else "resume", group))
    return bool(int(reply))


async def get_group(client: RedisClient, keys: JobQueueKeys, group: str) -> GroupInfo:
    validate_group(group)
    reply = await _ADMIN(client, _keys(keys), ("get", group))
    return _info(group, reply)


async def list_groups(
    client: RedisClient, keys: JobQueueKeys, cursor: str | None, count: int
) -> GroupPage:
    if cursor is not None:
        validate_group(cursor)
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= 1000:
        raise ValidationError("count must be an integer from 1 to 1000")
    reply = await _ADMIN(client, _keys(keys), ("list", cursor or "", count))
    nxt = _s(reply[0])
    groups = [_info(_s(name), info) for name, info in reply[1]]
    return GroupPage(groups, nxt or None)


__all__ = ["GroupInfo", "GroupOptions", "GroupPage", "ParkedReason"]
