"""Added after a mutation review: SKIP coalesces missed cron ticks into "the latest occurrence at or
before the pass's clock reading" (MissedTickPolicy), also when the clock reads exactly an
occurrence."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from respire_actors.jobs import JobQueue
from respire_actors.jobs.queue import _pairs
from respire_actors.redis.client import RedisClient
from respire_actors.testing import FakeClock

pytestmark = pytest.mark.anyio


def ms(when: datetime) -> int:
    return (when - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(milliseconds=1)


def text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


async def ticks(client: RedisClient, queue: JobQueue[Any]) -> list[int]:
    rows = await client.execute("XRANGE", queue.keys.ready, "-", "+")
    jobs = [{text(k): text(v) for k, v in _pairs(fields)} for _, fields in rows or []]
    return [int(j["_respire.job.tick"]) for j in jobs if "_respire.job.tick" in j]


async def test_skip_takes_the_occurrence_the_clock_reads_exactly(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    clock = FakeClock(datetime(2030, 1, 4, 9, 0, tzinfo=UTC))  # Friday 09:00
    scheduler = queue.scheduler(clock=clock)
    await scheduler.upsert("weekday", "x", cron="0 9 * * MON-FRI")
    wednesday = datetime(2030, 1, 9, 9, 0, tzinfo=UTC)
    clock.set(wednesday)  # Mon, Tue passed; Wednesday's occurrence is now, to the millisecond
    assert await scheduler.run_due() == 1
    assert await scheduler.run_due() == 0  # nothing more is due
    assert await ticks(client, queue) == [ms(wednesday)]
    stored = await scheduler.get("weekday")
    assert stored is not None and stored.next_due == datetime(2030, 1, 10, 9, tzinfo=UTC)
