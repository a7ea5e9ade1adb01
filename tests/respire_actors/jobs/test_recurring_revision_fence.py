"""Recurring ticks: the revision fence and the pass's backlog count.

docs/recurring.md / recurring_tick-3.lua: a tick commits only for the definition revision the
pass read ("a stale snapshot cannot commit"); an upsert replaces the revision. The existing test
re-upserts at a later clock reading, so the due score moves too and the score check alone
refuses the stale tick: the revision comparison itself is unprotected. Here the replacement
lands on the same due time (two upserts at one clock reading), so only the revision differs.

TickPass.backlog counts committed schedules whose next occurrence is already due (due means
"at or before the pass's clock reading", the rule run_pass applies to candidates).

Added after a mutation review: no test failed with this guarantee broken.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from jobs_helpers import text

from respire_actors.jobs import CATCH_UP, JobQueue
from respire_actors.jobs.queue import _pairs
from respire_actors.jobs.recurring import _TICK, recurring_job_id
from respire_actors.redis.client import RedisClient
from respire_actors.testing import FakeClock

pytestmark = pytest.mark.anyio

HOUR = timedelta(hours=1)
T0 = datetime(2030, 1, 1, 0, 0, 0, 250_000, tzinfo=UTC)


def ms(when: datetime) -> int:
    return (when - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(milliseconds=1)


async def ready_jobs(client: RedisClient, queue: JobQueue[Any]) -> list[dict[str, str]]:
    rows = await client.execute("XRANGE", queue.keys.ready, "-", "+")
    return [{text(k): text(v) for k, v in _pairs(fields)} for _, fields in rows or []]


async def test_a_replaced_revision_with_the_same_due_time_cannot_commit(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    clock = FakeClock(T0)
    scheduler = queue.scheduler(clock=clock)
    first = await scheduler.upsert("r", "old", interval=HOUR)
    second = await scheduler.upsert("r", "new", interval=HOUR)  # same clock reading
    assert second.revision != first.revision
    assert first.next_due == second.next_due == T0 + HOUR  # only the revision differs
    due = ms(T0 + HOUR)
    keys = queue.keys
    stale_args = (
        "r", first.revision, due, due, due + 3_600_000,
        "_respire.job.id", recurring_job_id(first.revision, due), "_respire.job.payload", "old",
    )  # fmt: skip
    reply = await _TICK(client, (keys.ready, keys.recurring, keys.recurring_due), stale_args)
    assert [text(v) for v in reply] == ["stale"]
    assert await ready_jobs(client, queue) == []
    # the current revision still ticks once, with its own payload
    clock.advance(HOUR)
    assert await scheduler.run_due() == 1
    jobs = await ready_jobs(client, queue)
    assert [j["_respire.job.id"] for j in jobs] == [recurring_job_id(second.revision, due)]


async def test_a_next_occurrence_due_exactly_now_counts_as_backlog(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    clock = FakeClock(T0)
    scheduler = queue.scheduler(clock=clock)
    await scheduler.upsert("c", "x", interval=HOUR, missed=CATCH_UP)
    clock.set(T0 + 2 * HOUR)  # two occurrences due; the second exactly at the clock reading
    first = await scheduler.run_pass()
    assert (first.enqueued, first.backlog) == (1, 1)
    second = await scheduler.run_pass()  # same reading: the backlog was real
    assert (second.enqueued, second.backlog) == (1, 0)
