"""Recurring and cron jobs (issue 12): schedules, missed-tick policies, exactly-once ticks,
round-robin passes, cron edge cases and bad schedules, driven by a fake clock on real servers
and both anyio backends."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import pytest
from jobs_helpers import text

from respire_actors.codecs import JsonCodec, StrCodec
from respire_actors.errors import InvalidSchedule, ValidationError, WrongKeyType
from respire_actors.jobs import CATCH_UP, SKIP, JobQueue, RecurringScheduler
from respire_actors.jobs.queue import _pairs
from respire_actors.jobs.recurring import _SCAN, _TICK, recurring_job_id
from respire_actors.redis.client import RedisClient
from respire_actors.testing import FakeClock

pytestmark = pytest.mark.anyio

HOUR = timedelta(hours=1)
T0 = datetime(2030, 1, 1, 0, 0, 0, 250_000, tzinfo=UTC)  # a Tuesday


def ms(when: datetime) -> int:
    return (when - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(milliseconds=1)


async def ready_jobs(client: RedisClient, queue: JobQueue[Any]) -> list[dict[str, str]]:
    """Every job in the ready stream, oldest first, as text fields."""
    rows = await client.execute("XRANGE", queue.keys.ready, "-", "+")
    return [{text(k): text(v) for k, v in _pairs(fields)} for _, fields in rows or []]


async def ticks_of(client: RedisClient, queue: JobQueue[Any], schedule: str) -> list[int]:
    return [
        int(j["_respire.job.tick"])
        for j in await ready_jobs(client, queue)
        if j.get("_respire.job.schedule") == schedule
    ]


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(T0)


@pytest.fixture
def scheduler(queue: JobQueue[str], clock: FakeClock) -> RecurringScheduler[str]:
    return queue.scheduler(clock=clock)


# -- intervals and missed-tick policies -----------------------------------------------------


async def test_an_interval_tick_is_an_ordinary_ready_job_with_schedule_fields(
    client: RedisClient, queue: JobQueue[str], scheduler: RecurringScheduler[str], clock: FakeClock
) -> None:
    info = await scheduler.upsert("hourly", "ping", interval=HOUR)
    assert info.next_due == T0 + HOUR and info.last_tick is None and info.missed is SKIP
    assert await scheduler.run_due() == 0  # not due yet
    clock.advance(HOUR)
    assert await scheduler.run_due() == 1
    [job] = await ready_jobs(client, queue)
    # with an OpenTelemetry SDK installed, the tick also carries its trace context
    # (_respire.trace.*, see test_jobs_tracing); the job's own fields are these
    job = {k: v for k, v in job.items() if not k.startswith("_respire.trace.")}
    tick = ms(T0 + HOUR)
    assert job == {
        "_respire.job.id": f"recurring:{info.revision}:{tick}",
        "_respire.job.payload": "ping",
        "_respire.job.schedule": "hourly",
        "_respire.job.tick": str(tick),
    }
    stored = await scheduler.get("hourly")
    assert stored is not None
    assert stored.last_tick == T0 + HOUR and stored.next_due == T0 + 2 * HOUR
    assert stored.revision == info.revision and stored.payload == "ping"


async def test_skip_coalesces_an_outage_into_the_latest_tick_without_shifting_cadence(
    client: RedisClient, queue: JobQueue[str], scheduler: RecurringScheduler[str], clock: FakeClock
) -> None:
    await scheduler.upsert("s", "x", interval=HOUR)  # SKIP is the default
    clock.advance(5 * HOUR + timedelta(minutes=40))  # an outage: five occurrences passed
    assert await scheduler.run_due() == 1
    assert await ticks_of(client, queue, "s") == [ms(T0 + 5 * HOUR)]
    info = await scheduler.get("s")
    assert info is not None and info.next_due == T0 + 6 * HOUR  # cadence kept
    assert await scheduler.run_due() == 0


async def test_catch_up_enqueues_every_overdue_tick_in_order_over_later_passes(
    client: RedisClient, queue: JobQueue[str], scheduler: RecurringScheduler[str], clock: FakeClock
) -> None:
    await scheduler.upsert("c", "x", interval=HOUR, missed=CATCH_UP)
    clock.advance(5 * HOUR + timedelta(minutes=40))
    passes = []
    for _ in range(7):
        result = await scheduler.run_pass(max_ticks=64)
        passes.append((result.enqueued, result.backlog))
    assert passes == [(1, 1), (1, 1), (1, 1), (1, 1), (1, 0), (0, 0), (0, 0)]
    assert await ticks_of(client, queue, "c") == [ms(T0 + k * HOUR) for k in range(1, 6)]
    info = await scheduler.get("c")
    assert info is not None and info.next_due == T0 + 6 * HOUR


async def test_a_backward_clock_jump_never_repeats_a_tick_and_a_forward_jump_applies_policy(
    client: RedisClient, queue: JobQueue[str], scheduler: RecurringScheduler[str], clock: FakeClock
) -> None:
    await scheduler.upsert("j", "x", interval=HOUR)
    clock.advance(HOUR)
    assert await scheduler.run_due() == 1
    clock.set(T0 - timedelta(days=1))  # back a day
    for _ in range(3):
        assert await scheduler.run_due() == 0
    clock.set(T0 + 10 * HOUR + timedelta(seconds=1))  # forward: SKIP coalesces
    assert await scheduler.run_due() == 1
    assert await ticks_of(client, queue, "j") == [ms(T0 + HOUR), ms(T0 + 10 * HOUR)]


async def test_upsert_replaces_the_revision_and_a_stale_snapshot_cannot_commit(
    client: RedisClient, queue: JobQueue[str], scheduler: RecurringScheduler[str], clock: FakeClock
) -> None:
    first = await scheduler.upsert("r", "old", interval=HOUR)
    due = ms(T0 + HOUR)
    keys = queue.keys
    tick_keys = (keys.ready, keys.recurring, keys.recurring_due)

    def tick_args(revision: str) -> tuple[Any, ...]:
        envelope = ("_respire.job.id", recurring_job_id(revision, due), "_respire.job.payload", "p")
        return ("r", revision, due, due, due + 3_600_000, *envelope)

    clock.advance(HOUR)
    second = await scheduler.upsert("r", "new", interval=HOUR)  # anchored at the new time
    assert second.revision != first.revision and second.next_due == T0 + 2 * HOUR
    # a pass that read the first revision before the upsert: refused
    assert [text(v) for v in await _TICK(client, tick_keys, tick_args(first.revision))] == ["stale"]
    # and after a removal, even with the current revision
    assert await scheduler.remove("r") is True
    assert await scheduler.remove("r") is False
    assert [text(v) for v in await _TICK(client, tick_keys, tick_args(second.revision))] == [
        "stale"
    ]
    assert await ready_jobs(client, queue) == []
    assert await scheduler.get("r") is None


async def test_a_repeated_tick_after_a_lost_reply_commits_nothing(
    client: RedisClient, queue: JobQueue[str], scheduler: RecurringScheduler[str], clock: FakeClock
) -> None:
    info = await scheduler.upsert("once", "x", interval=HOUR)
    due = ms(T0 + HOUR)
    keys = queue.keys
    args = (
        "once",
        info.revision,
        due,
        due,
        due + 3_600_000,
        "_respire.job.id",
        recurring_job_id(info.revision, due),
    )
    tick_keys = (keys.ready, keys.recurring, keys.recurring_due)
    committed = await _TICK(client, tick_keys, args)
    assert text(committed[0]) == "committed"
    for _ in range(3):  # the caller never saw the reply and retries
        assert [text(v) for v in await _TICK(client, tick_keys, args)] == ["stale"]
    clock.advance(HOUR)
    assert await scheduler.run_due() == 0  # the due time already moved on
    assert len(await ready_jobs(client, queue)) == 1


async def test_concurrent_schedulers_commit_each_catch_up_tick_once(
    client: RedisClient, queue: JobQueue[str], clock: FakeClock
) -> None:
    await queue.scheduler(clock=clock).upsert("race", "x", interval=HOUR, missed=CATCH_UP)
    clock.advance(40 * HOUR)
    schedulers = [queue.scheduler(clock=clock) for _ in range(3)]
    totals = [0, 0, 0]

    async def drive(i: int) -> None:
        # racing passes often find their tick taken (stale): keep going until drained
        for _ in range(300):
            if sum(totals) >= 40:
                return
            totals[i] += await schedulers[i].run_due(max_ticks=4)

    async with anyio.create_task_group() as tg:
        for i in range(3):
            tg.start_soon(drive, i)
    ticks = await ticks_of(client, queue, "race")
    assert ticks == [ms(T0 + k * HOUR) for k in range(1, 41)]
    assert sum(totals) == 40
    assert await schedulers[0].run_due() == 0


# -- round robin ---------------------------------------------------------------------------


async def test_one_candidate_passes_visit_schedules_round_robin_despite_a_backlog(
    client: RedisClient, queue: JobQueue[str], scheduler: RecurringScheduler[str], clock: FakeClock
) -> None:
    await scheduler.upsert("a-backlog", "x", interval=timedelta(minutes=1), missed=CATCH_UP)
    await scheduler.upsert("b", "x", interval=HOUR)
    await scheduler.upsert("c", "x", interval=HOUR)
    clock.advance(HOUR)  # a-backlog: 60 overdue ticks; b and c: one each
    for _ in range(3):
        assert await scheduler.run_due(max_ticks=1) == 1
    jobs = await ready_jobs(client, queue)
    assert [j["_respire.job.schedule"] for j in jobs] == ["a-backlog", "b", "c"]
    # the cursor lives in Redis: a new scheduler (a restart) continues after "c"
    restarted = queue.scheduler(clock=clock)
    assert await restarted.run_due(max_ticks=1) == 1
    assert (await ready_jobs(client, queue))[-1]["_respire.job.schedule"] == "a-backlog"
    # removing the cursor's own schedule does not lose the place
    assert text(await client.execute("GET", queue.keys.recurring_cursor)) == "a-backlog"
    await scheduler.remove("a-backlog")
    await scheduler.upsert("d", "x", interval=HOUR)
    clock.advance(HOUR)
    visited = [(await restarted.run_pass(max_ticks=1)) for _ in range(3)]
    assert [v.visited for v in visited] == [1, 1, 1]
    assert [j["_respire.job.schedule"] for j in (await ready_jobs(client, queue))[-3:]] == [
        "b",
        "c",
        "d",
    ]


async def test_the_candidate_budget_counts_schedules_that_are_not_due(
    client: RedisClient, queue: JobQueue[str], scheduler: RecurringScheduler[str], clock: FakeClock
) -> None:
    for i in range(10):
        await scheduler.upsert(f"s{i}", "x", interval=HOUR * (i + 1))
    clock.advance(HOUR)  # only s0 is due
    results = [await scheduler.run_pass(max_ticks=4) for _ in range(3)]
    assert [r.visited for r in results] == [4, 4, 4]
    assert sum(r.enqueued for r in results) == 1
    assert results[0].next_due == T0 + 2 * HOUR  # s0's next tick (s1 is due then too)


# -- cron --------------------------------------------------------------------------------


async def test_weekday_cron_ticks_strictly_after_upsert_in_utc(
    client: RedisClient, queue: JobQueue[str], scheduler: RecurringScheduler[str], clock: FakeClock
) -> None:
    clock.set(datetime(2030, 1, 4, 9, 0, tzinfo=UTC))  # Friday 09:00 exactly
    info = await scheduler.upsert("weekday", "x", cron="0 9 * * MON-FRI")
    assert info.next_due == datetime(2030, 1, 7, 9, 0, tzinfo=UTC)  # strictly after: Monday
    clock.set(datetime(2030, 1, 9, 12, 0, tzinfo=UTC))  # Wednesday noon: Mon, Tue, Wed passed
    assert await scheduler.run_due() == 1  # SKIP: the latest one
    assert await ticks_of(client, queue, "weekday") == [ms(datetime(2030, 1, 9, 9, tzinfo=UTC))]
    stored = await scheduler.get("weekday")
    assert stored is not None and stored.next_due == datetime(2030, 1, 10, 9, tzinfo=UTC)


async def test_cron_catch_up_enqueues_each_missed_occurrence(
    client: RedisClient, queue: JobQueue[str], scheduler: RecurringScheduler[str], clock: FakeClock
) -> None:
    clock.set(datetime(2030, 1, 4, 10, 0, tzinfo=UTC))  # Friday
    await scheduler.upsert("weekday", "x", cron="0 9 * * MON-FRI", missed=CATCH_UP)
    clock.set(datetime(2030, 1, 9, 12, 0, tzinfo=UTC))
    for _ in range(5):
        await scheduler.run_due()
    assert await ticks_of(client, queue, "weekday") == [
        ms(datetime(2030, 1, d, 9, tzinfo=UTC)) for d in (7, 8, 9)
    ]


@pytest.mark.parametrize(
    ("expression", "start", "expected"),
    [
        # Feb 29 only exists in leap years: from 2029 the next one is 2032
        ("0 0 29 2 *", datetime(2029, 3, 1, tzinfo=UTC), [(2032, 2, 29), (2036, 2, 29)]),
        # the 31st skips 30-day months and February
        ("30 12 31 * *", datetime(2030, 1, 31, 13, tzinfo=UTC), [(2030, 3, 31), (2030, 5, 31)]),
        # the last day of each month
        ("0 0 L * *", datetime(2030, 1, 31, 1, tzinfo=UTC), [(2030, 2, 28), (2030, 3, 31)]),
    ],
)
async def test_cron_calendar_edges(
    client: RedisClient,
    queue: JobQueue[str],
    scheduler: RecurringScheduler[str],
    clock: FakeClock,
    expression: str,
    start: datetime,
    expected: list[tuple[int, int, int]],
) -> None:
    clock.set(start)
    info = await scheduler.upsert("edge", "x", cron=expression, missed=CATCH_UP)
    days = [datetime(*d, tzinfo=UTC) for d in expected]
    assert info.next_due is not None and info.next_due.date() == days[0].date()
    clock.set(days[1] + timedelta(days=1))
    assert await scheduler.run_due() == 1
    assert await scheduler.run_due() == 1
    ticks = await ticks_of(client, queue, "edge")
    assert [datetime.fromtimestamp(t / 1000, UTC).date() for t in ticks] == [d.date() for d in days]


async def test_a_schedule_past_its_last_representable_occurrence_stays_removable(
    client: RedisClient, queue: JobQueue[str], scheduler: RecurringScheduler[str], clock: FakeClock
) -> None:
    clock.set(datetime(9999, 12, 30, tzinfo=UTC))
    await scheduler.upsert("last-cron", "x", cron="0 0 31 12 *")
    await scheduler.upsert("last-interval", "x", interval=timedelta(days=1))
    clock.set(datetime(9999, 12, 31, 12, tzinfo=UTC))
    assert await scheduler.run_due() == 2
    for sid in ("last-cron", "last-interval"):
        info = await scheduler.get(sid)
        assert info is not None and info.next_due is None and info.last_tick is not None
    clock.set(datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC))
    assert await scheduler.run_due() == 0
    assert len(await ready_jobs(client, queue)) == 2
    assert await scheduler.remove("last-cron") is True
    # no future occurrence at all: refused at upsert
    with pytest.raises(InvalidSchedule, match="no future occurrence"):
        await scheduler.upsert("too-late", "x", interval=timedelta(days=2))


# -- listing -------------------------------------------------------------------------------


async def test_list_pages_through_schedules_in_id_order(
    client: RedisClient, queue: JobQueue[str], scheduler: RecurringScheduler[str]
) -> None:
    for i in range(5):
        await scheduler.upsert(f"id-{i}", f"p{i}", cron="*/5 * * * *")
    first = await scheduler.list(count=3)
    assert [s.schedule_id for s in first.schedules] == ["id-0", "id-1", "id-2"]
    assert first.next_after == "id-2"
    second = await scheduler.list(after=first.next_after, count=3)
    assert [s.schedule_id for s in second.schedules] == ["id-3", "id-4"]
    assert second.next_after is None
    assert second.schedules[0].cron == "*/5 * * * *" and second.schedules[0].payload == "p3"


# -- bad schedules -------------------------------------------------------------------------


@contextmanager
def nothing_sent(client: RedisClient) -> Iterator[None]:
    async def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"a command was sent: {args[:1]!r}")

    before = client.round_trips
    client.execute = refuse  # type: ignore[method-assign]
    client.pipeline = refuse  # type: ignore[method-assign]
    try:
        yield
    finally:
        del client.execute, client.pipeline
    assert client.round_trips == before


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({}, "exactly one"),
        ({"interval": HOUR, "cron": "* * * * *"}, "exactly one"),
        ({"interval": timedelta(0)}, "positive"),
        ({"interval": timedelta(milliseconds=-5)}, "positive"),
        ({"interval": timedelta(microseconds=1500)}, "whole milliseconds"),
        ({"interval": 0.0015}, "whole milliseconds"),
        ({"interval": float("nan")}, "finite"),
        ({"interval": 10**400}, "out of range"),
        ({"interval": 1e306}, "out of range"),
        ({"interval": "1h"}, "timedelta"),
        ({"interval": True}, "timedelta"),
        ({"cron": "0 0 * * * *"}, "five fields"),
        ({"cron": "0 * * *"}, "five fields"),
        ({"cron": "@hourly"}, "five fields"),
        ({"cron": "CRON_TZ=Europe/Paris 0 9 * * *"}, "time zones"),
        ({"cron": "TZ=UTC 0 9 * * *"}, "time zones"),
        ({"cron": "0 0 30 2 *"}, "day-of-month"),
        ({"cron": "0 0 15W * *"}, "day-of-month"),  # cronsim has LW only (docs/recurring.md)
        ({"cron": "0 0 L-3 * *"}, "day-of-month"),
        ({"cron": "61 * * * *"}, "minute"),
        ({"cron": "0 9 * * MÖN"}, "ASCII"),
        ({"cron": 5}, "str"),
        ({"interval": HOUR, "missed": "skip"}, "SKIP or CATCH_UP"),
    ],
)
async def test_bad_schedules_are_refused_with_nothing_sent(
    client: RedisClient, queue: JobQueue[str], kwargs: dict[str, Any], match: str
) -> None:
    scheduler = queue.scheduler(clock=FakeClock(T0))
    with nothing_sent(client), pytest.raises(InvalidSchedule, match=match):
        await scheduler.upsert("bad", "x", **kwargs)


async def test_bad_arguments_are_refused_with_nothing_sent(
    client: RedisClient, unique_name: str
) -> None:
    queue = JobQueue(client, unique_name, JsonCodec(int))
    scheduler = queue.scheduler(clock=FakeClock(T0))
    with nothing_sent(client):
        for bad_id in ("", "   ", 7, "x" * 1025):
            with pytest.raises(ValidationError):
                await scheduler.upsert(bad_id, 1, interval=HOUR)  # type: ignore[arg-type]
            with pytest.raises(ValidationError):
                await scheduler.remove(bad_id)  # type: ignore[arg-type]
        with pytest.raises(ValidationError):  # not JSON-encodable as int payload
            await scheduler.upsert("x", object(), interval=HOUR)  # type: ignore[arg-type]
        for budget in (0, 257, True, 1.5):
            with pytest.raises(ValidationError):
                await scheduler.run_due(max_ticks=budget)  # type: ignore[arg-type]
        with pytest.raises(ValidationError):
            await scheduler.list(count=0)
    with pytest.raises(ValidationError):
        queue.scheduler(clock=object())  # type: ignore[arg-type]

    class Naive(FakeClock):
        def now(self) -> datetime:
            return datetime(2030, 1, 1)

    with nothing_sent(client), pytest.raises(ValidationError, match="aware"):
        await queue.scheduler(clock=Naive()).upsert("n", 1, interval=HOUR)


async def test_scripts_refuse_wrong_key_types_before_writing(
    client: RedisClient, queue: JobQueue[str], scheduler: RecurringScheduler[str], clock: FakeClock
) -> None:
    await scheduler.upsert("k", "x", interval=HOUR)
    await client.execute("SET", queue.keys.recurring_cursor, "k")
    await client.execute("DEL", queue.keys.recurring_cursor)
    await client.execute("RPUSH", queue.keys.recurring_cursor, "oops")
    clock.advance(HOUR)
    with pytest.raises(WrongKeyType):
        await scheduler.run_due()
    assert await client.execute("ZSCORE", queue.keys.recurring_due, "k") is not None
    await client.execute("DEL", queue.keys.recurring_cursor)
    await client.execute("SET", queue.keys.ready, "not a stream")
    with pytest.raises(WrongKeyType):
        await scheduler.run_due()
    # nothing advanced: once the key is fixed the tick commits
    await client.execute("DEL", queue.keys.ready)
    assert await scheduler.run_due() == 1
    raw = await _SCAN(
        client,
        (
            queue.keys.recurring_order,
            queue.keys.recurring_cursor,
            queue.keys.recurring,
            queue.keys.recurring_due,
        ),
        (1,),
    )
    assert text(raw[0][0]) == "k"


async def test_a_scheduler_is_bound_to_the_queue_codec_and_prefix(
    server_url: str, unique_name: str
) -> None:
    from respire_actors.redis.client import connect

    async with connect(server_url, key_prefix=f"{unique_name}:") as prefixed:
        try:
            queue = JobQueue(prefixed, "q", StrCodec())
            clock = FakeClock(T0)
            await queue.scheduler(clock=clock).upsert("p", "x", interval=HOUR)
            assert queue.keys.recurring.startswith(f"{unique_name}:{{respire-job:q}}")
            clock.advance(HOUR)
            assert await queue.scheduler(clock=clock).run_due() == 1
            assert len(await ready_jobs(prefixed, queue)) == 1
        finally:
            from helpers.keyspace import release_keys

            await release_keys(prefixed, f"*{unique_name}*")


async def test_recurring_scripts_run_in_one_slot_on_a_cluster(
    cluster_client: RedisClient, unique_name: str
) -> None:
    queue = JobQueue(cluster_client, unique_name, StrCodec())
    clock = FakeClock(T0)
    scheduler = queue.scheduler(clock=clock)
    for i in range(5):
        await scheduler.upsert(f"c{i}", "x", interval=HOUR, missed=CATCH_UP)
    clock.advance(2 * HOUR)
    total = 0
    for _ in range(4):
        total += await scheduler.run_due(max_ticks=3)
    assert total == 10
    assert len(await ready_jobs(cluster_client, queue)) == 10
    assert len((await scheduler.list()).schedules) == 5
    assert await scheduler.remove("c0") is True


async def test_cron_is_utc_so_daylight_saving_changes_nothing(
    client: RedisClient, queue: JobQueue[str], scheduler: RecurringScheduler[str], clock: FakeClock
) -> None:
    # 02:30 falls in the skipped hour of Europe's spring change (2030-03-31) and the repeated
    # hour of its autumn change (2030-10-27) in local time; in UTC each day has exactly one
    clock.set(datetime(2030, 3, 30, 3, tzinfo=UTC))
    await scheduler.upsert("spring", "x", cron="30 2 * * *", missed=CATCH_UP)
    clock.set(datetime(2030, 4, 2, 3, tzinfo=UTC))
    for _ in range(4):
        await scheduler.run_due()
    assert await ticks_of(client, queue, "spring") == [
        ms(datetime(2030, 3, d, 2, 30, tzinfo=UTC)) for d in (31,)
    ] + [ms(datetime(2030, 4, d, 2, 30, tzinfo=UTC)) for d in (1, 2)]
    clock.set(datetime(2030, 10, 26, 3, tzinfo=UTC))
    await scheduler.upsert("autumn", "x", cron="30 2 * * *", missed=CATCH_UP)
    clock.set(datetime(2030, 10, 28, 3, tzinfo=UTC))
    for _ in range(4):
        await scheduler.run_due()
    assert await ticks_of(client, queue, "autumn") == [
        ms(datetime(2030, 10, d, 2, 30, tzinfo=UTC)) for d in (27, 28)
    ]


async def test_a_tick_is_retried_and_dead_lettered_like_any_job(
    client: RedisClient, queue: JobQueue[str], scheduler: RecurringScheduler[str], clock: FakeClock
) -> None:
    from jobs_helpers import fast_options, running_worker, wait_until

    from respire_actors.jobs import NACK, Job

    attempts: list[int] = []

    async def failing(job: Job[str]) -> Any:
        attempts.append(job.attempt)
        return NACK

    await scheduler.upsert("flaky", "x", interval=HOUR)
    clock.advance(HOUR)
    assert await scheduler.run_due() == 1
    options = fast_options(delivery_limit=2, visibility_timeout=timedelta(milliseconds=200))
    async with running_worker(client, queue.name, failing, options=options):
        await wait_until(lambda: len(attempts) >= 2, timeout=20)

        async def dead() -> bool:
            return len(await queue.read_dead_letters()) == 1

        from jobs_helpers import wait_until_async

        await wait_until_async(dead, timeout=20)
    [(_, fields)] = await queue.read_dead_letters()
    assert text(fields["_respire.job.schedule"]) == "flaky"
