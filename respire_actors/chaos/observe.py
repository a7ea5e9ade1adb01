"""Read what a job queue settled (events, dead letters) and wait for it, for scenarios."""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

import anyio

from ..jobs.model import JobEvent
from ..jobs.queue import JobQueue, _pairs, _s, _to_event


@dataclass(frozen=True)
class DeadLetterEntry:
    """One entry of a queue's dead-letter stream, with the fields scenarios check."""

    job_id: str
    reason: str
    attempt: int  # this ready entry's delivery count
    total_attempts: int  # across durable retries (= attempt for a job never retried)
    detail: str


async def read_events(queue: JobQueue[Any]) -> list[JobEvent]:
    """Every retained event of ``queue`` (paged XRANGE), oldest first."""
    events: list[JobEvent] = []
    start = "-"
    while True:
        rows = await queue.client.execute("XRANGE", queue.keys.events, start, "+", "COUNT", 1000)
        events += [_to_event(_s(entry_id), flat) for entry_id, flat in rows or ()]
        if not rows or len(rows) < 1000:
            return events
        start = "(" + _s(rows[-1][0])


async def read_dead_letters(queue: JobQueue[Any]) -> list[DeadLetterEntry]:
    """Every entry of ``queue``'s default dead-letter stream, oldest first."""
    out: list[DeadLetterEntry] = []
    rows = await queue.client.execute("XRANGE", queue.keys.dead, "-", "+")
    for _entry_id, flat in rows or ():
        fields = {_s(k): _s(v) for k, v in _pairs(flat)}
        attempt = int(fields.get("_respire.attempt") or 0)
        out.append(
            DeadLetterEntry(
                job_id=fields.get("_respire.job.id", ""),
                reason=fields.get("_respire.reason", ""),
                attempt=attempt,
                total_attempts=int(fields.get("_respire.total_attempts") or attempt),
                detail=fields.get("_respire.detail", ""),
            )
        )
    return out


async def wait_until_settled(
    queue: JobQueue[Any],
    jobs: Collection[str],
    timeout: float,
    *,
    also: Callable[[], bool] = lambda: True,
) -> float:
    """Wait until every job of ``jobs`` has a completed or dead-letter event (and ``also()``
    holds), or ``timeout`` seconds pass; returns the seconds waited. The caller reconciles
    what it finds either way (a job still unsettled counts as lost)."""
    started = time.monotonic()
    wanted = set(jobs)
    while time.monotonic() - started < timeout:
        settled = {e.job_id for e in await read_events(queue) if e.kind in _SETTLED}
        if wanted <= settled and also():
            break
        await anyio.sleep(0.1)
    return time.monotonic() - started


_SETTLED = frozenset({"completed", "dead-letter"})
