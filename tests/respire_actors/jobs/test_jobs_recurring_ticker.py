"""The hosted recurring ticker (issue 12): a supervised actor in the worker tree that reacts to
a fake clock without real sleeping, survives failed passes, and stops with the worker."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import pytest
from jobs_helpers import fast_options, wait_until

from respire_actors.clock import SystemClock
from respire_actors.codecs import StrCodec
from respire_actors.errors import ValidationError
from respire_actors.jobs import CATCH_UP, Job, JobQueue, RecurringOptions, Worker
from respire_actors.redis.client import RedisClient
from respire_actors.testing import FakeClock, LoopClock

pytestmark = pytest.mark.anyio

HOUR = timedelta(hours=1)
T0 = datetime(2030, 1, 1, tzinfo=UTC)


@asynccontextmanager
async def hosted(
    client: RedisClient, queue: str, recurring: RecurringOptions, seen: list[Job[str]]
) -> AsyncIterator[Worker]:
    async def handler(job: Job[str]) -> None:
        seen.append(job)

    worker = Worker()
    worker.register(queue, handler, StrCodec(), fast_options(), recurring=recurring)
    async with anyio.create_task_group() as tg:
        await tg.start(worker.run, client)
        try:
            yield worker
        finally:
            with anyio.fail_after(15, shield=True):
                await worker.stop()


async def test_the_hosted_ticker_reacts_to_a_fake_clock_without_real_sleeping(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    clock = FakeClock(T0)
    # a poll interval of a day: only the fake clock can wake the ticker in time
    options = RecurringOptions(poll_interval=timedelta(days=1), clock=clock)
    seen: list[Job[str]] = []
    info = await queue.scheduler(clock=clock).upsert("hourly", "tick", interval=HOUR)
    async with hosted(client, queue.name, options, seen) as worker:
        with anyio.fail_after(10):
            await clock.wait_for_sleepers(1)  # first pass done, nothing due
            assert worker.ticker_statistics(queue.name).passes == 1
            clock.advance(HOUR)  # the ticker sleeps until the schedule's due time
            await wait_until(lambda: len(seen) == 1)
        job = seen[0]
        assert job.id == f"recurring:{info.revision}:{(T0 + HOUR).timestamp() * 1000:.0f}"
        assert job.schedule_id == "hourly" and job.tick == T0 + HOUR and job.payload == "tick"
        with anyio.fail_after(10):
            clock.advance(2 * HOUR)  # skipped one: SKIP coalesces
            await wait_until(lambda: len(seen) == 2)
        assert seen[1].tick == T0 + 3 * HOUR
        stats = worker.ticker_statistics(queue.name)
        assert stats.enqueued == 2 and stats.failed_passes == 0


async def test_a_catch_up_backlog_drains_one_bounded_pass_per_poll(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    clock = FakeClock(T0)
    options = RecurringOptions(
        poll_interval=timedelta(minutes=1), max_ticks_per_pass=1, clock=clock
    )
    await queue.scheduler(clock=clock).upsert("c", "x", interval=HOUR, missed=CATCH_UP)
    seen: list[Job[str]] = []
    clock.advance(3 * HOUR)
    async with hosted(client, queue.name, options, seen):
        with anyio.fail_after(10):
            await wait_until(lambda: len(seen) == 1)
            await clock.wait_for_sleepers(1)
            assert len(seen) == 1  # the backlog waits for the next poll
            for expected in (2, 3):
                clock.advance(timedelta(minutes=1))
                await wait_until(lambda n=expected: len(seen) == n)  # type: ignore[misc]
    assert sorted(j.tick for j in seen if j.tick) == [T0 + k * HOUR for k in (1, 2, 3)]


async def test_a_catch_up_backlog_of_one_schedule_drains_within_the_pass_budget(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    """Each pass visits a schedule once and commits one of its ticks; a schedule behind by
    several ticks used to get one per poll interval, so one whose interval was at most the
    poll interval never caught up. Passes now follow each other until the interval's budget
    (max_ticks_per_pass) is spent."""
    clock = FakeClock(T0)
    options = RecurringOptions(
        poll_interval=timedelta(minutes=1), max_ticks_per_pass=3, clock=clock
    )
    await queue.scheduler(clock=clock).upsert("c", "x", interval=HOUR, missed=CATCH_UP)
    seen: list[Job[str]] = []
    clock.advance(5 * HOUR)
    async with hosted(client, queue.name, options, seen) as worker:
        with anyio.fail_after(10):
            await wait_until(lambda: len(seen) == 3)  # the budget of this poll interval
            await clock.wait_for_sleepers(1)
            await anyio.sleep(0.3)
            assert len(seen) == 3  # the rest waits for the next interval
            clock.advance(timedelta(minutes=1))
            await wait_until(lambda: len(seen) == 5)
        assert worker.ticker_statistics(queue.name).enqueued == 5
    assert sorted(j.tick for j in seen if j.tick) == [T0 + k * HOUR for k in range(1, 6)]


async def test_follow_up_passes_never_exceed_the_interval_budget(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    """Each follow-up pass asked for the whole budget again: with three schedules behind and
    a budget of 4, an interval committed 6 ticks."""
    clock = FakeClock(T0)
    options = RecurringOptions(
        poll_interval=timedelta(minutes=1), max_ticks_per_pass=4, clock=clock
    )
    scheduler = queue.scheduler(clock=clock)
    for sid in ("a", "b", "c"):
        await scheduler.upsert(sid, "x", interval=HOUR, missed=CATCH_UP)
    seen: list[Job[str]] = []
    clock.advance(10 * HOUR)
    async with hosted(client, queue.name, options, seen):
        with anyio.fail_after(10):
            await wait_until(lambda: len(seen) == 4)
            await clock.wait_for_sleepers(1)
            await anyio.sleep(0.3)
            assert len(seen) == 4  # the interval's budget, then the next interval
            clock.advance(timedelta(minutes=1))
            await wait_until(lambda: len(seen) == 8)
            await clock.wait_for_sleepers(1)
            await anyio.sleep(0.3)
            assert len(seen) == 8


async def test_a_failed_pass_is_logged_and_retried_without_crashing_the_tree(
    client: RedisClient, queue: JobQueue[str], caplog: pytest.LogCaptureFixture
) -> None:
    clock = FakeClock(T0)
    options = RecurringOptions(poll_interval=timedelta(seconds=30), clock=clock)
    await queue.scheduler(clock=clock).upsert("f", "x", interval=HOUR)
    await client.execute("DEL", queue.keys.recurring_cursor)
    await client.execute("RPUSH", queue.keys.recurring_cursor, "wrong type")
    seen: list[Job[str]] = []
    clock.advance(HOUR)
    async with hosted(client, queue.name, options, seen) as worker:
        stats = worker.ticker_statistics(queue.name)
        with anyio.fail_after(10):
            await clock.wait_for_sleepers(1)
            assert stats.failed_passes == 1 and stats.passes == 0
            await client.execute("DEL", queue.keys.recurring_cursor)
            clock.advance(timedelta(seconds=30))  # retried after the poll interval
            await wait_until(lambda: len(seen) == 1)
        assert stats.passes >= 1 and stats.enqueued == 1
    assert any("recurring pass" in r.getMessage() for r in caplog.records)


async def test_the_ticker_stops_promptly_while_sleeping_on_a_long_poll(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    options = RecurringOptions(poll_interval=timedelta(days=1))  # the system clock
    seen: list[Job[str]] = []
    with anyio.fail_after(15):
        async with hosted(client, queue.name, options, seen) as worker:
            await wait_until(lambda: worker.ticker_statistics(queue.name).passes == 1)


async def test_recurring_options_are_validated() -> None:
    for bad in (
        {"max_ticks_per_pass": 0},
        {"max_ticks_per_pass": 257},
        {"max_ticks_per_pass": True},
        {"poll_interval": timedelta(0)},
        {"poll_interval": -1},
        {"clock": object()},
    ):
        with pytest.raises(ValidationError):
            RecurringOptions(**bad)
    assert RecurringOptions().max_ticks_per_pass == 64
    assert RecurringOptions(max_ticks_per_pass=256, clock=SystemClock()).poll_ms == 1000
    with pytest.raises(ValidationError, match="RecurringOptions"):
        Worker().register("q", _handler, StrCodec(), recurring={"poll_interval": 1})  # type: ignore[arg-type]


async def _handler(job: Any) -> None:
    return None


async def test_a_loop_clock_ticks_at_real_speed_with_an_exact_cadence(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    clock = LoopClock(T0)
    assert abs((clock.now() - T0).total_seconds()) < 1
    seen: list[Job[str]] = []
    await queue.scheduler(clock=clock).upsert("loop", "x", interval=timedelta(milliseconds=200))
    options = RecurringOptions(poll_interval=timedelta(milliseconds=50), clock=clock)
    async with hosted(client, queue.name, options, seen):
        with anyio.fail_after(10):
            await wait_until(lambda: len(seen) >= 2)
    ticks = sorted(j.tick for j in seen if j.tick)
    assert (ticks[1] - ticks[0]) % timedelta(milliseconds=200) == timedelta(0)


async def test_stepping_a_fake_clock_with_wait_for_sleepers_runs_one_pass_per_step(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    """The documented way to step the hosted ticker: after ``advance``, ``wait_for_sleepers``
    returns once the ticker ran the pass the advance made due and sleeps again (it used to
    return at once, counting the woken ticker as still asleep)."""
    clock = FakeClock(T0)
    options = RecurringOptions(poll_interval=timedelta(days=1), clock=clock)
    await queue.scheduler(clock=clock).upsert("hourly", "tick", interval=HOUR)
    seen: list[Job[str]] = []
    async with hosted(client, queue.name, options, seen) as worker:
        with anyio.fail_after(10):
            await clock.wait_for_sleepers(1)
            steps = []
            for _ in range(5):
                clock.advance(HOUR)
                await clock.wait_for_sleepers(1)
                stats = worker.ticker_statistics(queue.name)
                steps.append((stats.passes, stats.enqueued))
    assert steps == [(2, 1), (3, 2), (4, 3), (5, 4), (6, 5)]


class _BerlinClock:
    """A FakeClock seen through Europe/Berlin: ``now()`` is aware but not UTC."""

    def __init__(self, inner: FakeClock) -> None:
        self.inner = inner

    def now(self) -> datetime:
        from zoneinfo import ZoneInfo

        return self.inner.now().astimezone(ZoneInfo("Europe/Berlin"))

    async def sleep_until(self, when: datetime) -> None:
        await self.inner.sleep_until(when)


async def test_a_clock_in_a_zone_with_dst_polls_evenly_across_the_fall_back(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    """Any aware clock is allowed: the ticker's arithmetic runs in UTC, so across the night
    the clocks go back it neither sleeps an hour nor polls back to back."""
    inner = FakeClock(datetime(2030, 10, 27, 0, 59, 55, tzinfo=UTC))  # 02:59:55 CEST
    options = RecurringOptions(poll_interval=timedelta(seconds=1), clock=_BerlinClock(inner))
    seen: list[Job[str]] = []
    async with hosted(client, queue.name, options, seen) as worker:
        with anyio.fail_after(20):
            await inner.wait_for_sleepers(1)
            passes = []
            for _ in range(12):
                before = worker.ticker_statistics(queue.name).passes
                inner.advance(timedelta(seconds=1))
                await inner.wait_for_sleepers(1)
                passes.append(worker.ticker_statistics(queue.name).passes - before)
    assert passes == [1] * 12
