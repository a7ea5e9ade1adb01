"""Producer backpressure: a job queue's optional backlog bound (docs/job-queue.md#backpressure).

The bound is stored in the queue's control hash, so every producer sees the same one; each
enqueue script checks it atomically before its first write (``lib/backlog.lua``) and refuses
with :class:`~respire_actors.errors.QueueFull`. This module holds the Python side: storing and
reading the bound, and the opt-in wait that retries a refused enqueue with backoff.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import TypeVar

import anyio

from ..errors import QueueFull, ValidationError
from ..keys import JobQueueKeys
from ..redis.client import RedisClient
from ..redis.scripts import load
from .options import duration_ms

R = TypeVar("R")

_BACKLOG = load("job_backlog")
MAX_BACKLOG = 2**31 - 1
"""The largest bound :meth:`JobQueue.set_max_backlog` accepts."""
FIRST_BACKOFF = 0.01
MAX_BACKOFF = 0.5
"""A waiting enqueue retries after 10 ms, doubling up to 500 ms, until its deadline."""


@dataclass(frozen=True, slots=True)
class Backlog:
    """A queue's backlog (accepted, not finished: waiting, running or awaiting recovery, and
    staged) and its bound (None when unbounded); see :meth:`JobQueue.backlog`."""

    backlog: int
    limit: int | None


def check_limit(limit: object) -> int | None:
    if limit is None:
        return None
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_BACKLOG:
        raise ValidationError(f"max backlog must be None or an integer from 1 to {MAX_BACKLOG}")
    return limit


async def set_max_backlog(client: RedisClient, keys: JobQueueKeys, limit: int | None) -> bool:
    """Store (or with None remove) the bound; True when the stored value changed."""
    checked = check_limit(limit)
    script_keys = (keys.control, keys.ready, keys.scheduled)
    if checked is None:
        return bool(int(await _BACKLOG(client, script_keys, ("clear",))))
    return bool(int(await _BACKLOG(client, script_keys, ("set", checked))))


async def read_backlog(client: RedisClient, keys: JobQueueKeys) -> Backlog:
    """The exact backlog and the stored bound, read atomically."""
    backlog, limit = await _BACKLOG(client, (keys.control, keys.ready, keys.scheduled), ("read",))
    return Backlog(int(backlog), None if int(limit) < 0 else int(limit))


def wait_seconds(wait: timedelta | float | None) -> float | None:
    """A ``wait=`` argument in seconds (validated before anything is sent), or None."""
    if wait is None:
        return None
    return duration_ms(wait, what="wait", allow_zero=True) / 1000


async def retry_while_full(attempt: Callable[[], Awaitable[R]], wait: float | None) -> R:
    """Run ``attempt``; while it raises :class:`QueueFull` and ``wait`` seconds have not passed
    since the first try, sleep with backoff and try again. The last QueueFull is raised at the
    deadline; any other error at once. ``wait=None`` tries once."""
    if wait is None:
        return await attempt()
    deadline = anyio.current_time() + wait
    backoff = FIRST_BACKOFF
    while True:
        try:
            return await attempt()
        except QueueFull:
            remaining = deadline - anyio.current_time()
            if remaining <= 0:
                raise
            await anyio.sleep(min(backoff, remaining))
            backoff = min(backoff * 2, MAX_BACKOFF)
