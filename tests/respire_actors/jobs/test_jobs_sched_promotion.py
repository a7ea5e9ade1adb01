"""Scheduled enqueue, promotion and TTL (spec: "Delay, priority and expiry")."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import anyio
import pytest
from jobs_helpers import all_events, pending_count, text, wait_until, wait_until_async
from sched_helpers import id_ms, ready_job_ids, sched_options, scheduling_worker, staged, xlen

from respire_actors.actors.promoter import next_wait_ms
from respire_actors.errors import ValidationError, WrongKeyType
from respire_actors.jobs import ACK, Job, JobEnqueueOptions, JobQueue
from respire_actors.jobs.options import CONSUMER_GROUP
from respire_actors.jobs.source import JobSource
from respire_actors.redis.client import RedisClient

pytestmark = pytest.mark.anyio


def source_of(queue: JobQueue[str]) -> JobSource:
    return JobSource(queue.client, queue.keys, queue.keys.dead, CONSUMER_GROUP)


# -- options (no Redis) ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "complaint"),
    [
        ({"delay": -1}, "delay"),
        ({"delay": 2**31}, "delay"),
        ({"priority": 2**31}, "priority"),
        ({"priority": True}, "priority"),
        ({"priority": 1.5}, "priority"),
        ({"ttl": 0}, "ttl"),
        ({"ttl": timedelta(days=30)}, "ttl"),
        ({"dedup_window": 0}, "deduplication"),
        # the TTL counts from enqueue: one no longer than the delay expires before promotion
        ({"delay": 0.5, "ttl": 0.5}, r"ttl \(500 ms\) must be longer than delay \(500 ms\)"),
        ({"delay": 60, "ttl": 30}, "would expire before it could run"),
    ],
)
def test_enqueue_options_are_validated(changes: dict[str, Any], complaint: str) -> None:
    with pytest.raises(ValidationError, match=complaint):
        JobEnqueueOptions(**changes)


def test_enqueue_options_round_up_to_milliseconds() -> None:
    o = JobEnqueueOptions(delay=0.0001, ttl=timedelta(microseconds=1500), priority=-(2**31))
    assert (o.delay_ms, o.ttl_ms, o.priority) == (1, 2, -(2**31))
    assert JobEnqueueOptions().delay_ms == 0 and JobEnqueueOptions().ttl_ms == 0


def test_promoter_waits_for_the_next_due_job_but_at_most_a_poll() -> None:
    # a full batch, or more due now: wait a whole poll (at most one batch per poll interval;
    # this used to be 0, re-running at once and flooding the ready stream with the backlog)
    assert next_wait_ms(64, 64, 5000, 1000) == 1000
    assert next_wait_ms(64, 64, 0, 1000) == 1000
    assert next_wait_ms(3, 64, 0, 1000) == 1000
    assert next_wait_ms(3, 64, 250, 1000) == 250
    assert next_wait_ms(0, 64, 5000, 1000) == 1000
    assert next_wait_ms(0, 64, -1, 1000) == 1000


async def test_a_due_backlog_is_promoted_one_batch_per_poll_interval(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    for i in range(6):
        await queue.enqueue_scheduled(f"j{i}", "x")
    poll = timedelta(seconds=1.5)
    qo = sched_options(scheduling_batch_size=2, scheduling_poll_interval=poll)

    async def handler(job: Job[str]) -> Any:
        return ACK

    async with scheduling_worker(client, queue.name, handler, queue_options=qo) as worker:
        stats = worker.statistics(queue.name)
        await wait_until(lambda: stats.promoted >= 2)
        started = anyio.current_time()
        await anyio.sleep(0.5)
        if anyio.current_time() - started < 1.4:  # still inside the first poll interval
            assert await xlen(client, queue.keys.ready) == 2
            assert stats.promotion_passes == 1
        await wait_until(lambda: stats.promoted == 6, timeout=15)
        assert stats.promotion_passes >= 3


# -- scheduled enqueue -----------------------------------------------------------------------


async def test_scheduled_enqueue_stages_with_server_time_due_and_expiry(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    options = JobEnqueueOptions(delay=timedelta(seconds=30), priority=-4, ttl=60)
    result = await queue.enqueue_scheduled("a", "payload", options)
    assert result.enqueued
    ((member, due),) = await staged(client, queue.keys)
    assert member == result.entry_id
    # the staging id's time part and the due score come from the same server clock reading
    assert abs(due - id_ms(result.entry_id) - 30_000) <= 1
    (row,) = await client.execute("XRANGE", queue.keys.scheduled, "-", "+")
    items = (
        row[1].items() if isinstance(row[1], dict) else zip(row[1][0::2], row[1][1::2], strict=True)
    )
    fields = {text(k): text(v) for k, v in items}
    assert fields["_respire.job.id"] == "a" and fields["_respire.job.payload"] == "payload"
    assert fields["_respire.job.priority"] == "-4"
    assert abs(int(fields["_respire.job.expires_at"]) - id_ms(result.entry_id) - 60_000) <= 1
    assert await xlen(client, queue.keys.ready) == 0


async def test_deduplication_is_shared_with_plain_enqueue(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    first = await queue.enqueue_scheduled("a", "x", JobEnqueueOptions(delay=60))
    again = await queue.enqueue_scheduled("a", "other", JobEnqueueOptions(priority=9))
    plain = await queue.enqueue("a", "plain")
    assert not again.enqueued and again.entry_id == first.entry_id
    assert not plain.enqueued and plain.entry_id == first.entry_id
    ready = await queue.enqueue("b", "x")
    dup = await queue.enqueue_scheduled("b", "y")
    assert not dup.enqueued and dup.entry_id == ready.entry_id
    assert await xlen(client, queue.keys.scheduled) == 1


async def test_scheduled_enqueue_in_a_transaction(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    async with client.transaction() as tx:
        pending = queue.enqueue_scheduled_in(tx, "t", "x", JobEnqueueOptions(delay=5))
        tx.queue("SET", queue.keys.custom("business"), "1")
        assert await tx.commit()
    assert pending.result().enqueued
    assert [m for m, _ in await staged(client, queue.keys)] == [pending.result().entry_id]


async def test_scheduled_enqueue_many_and_wrong_key_types(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    results = await queue.enqueue_scheduled_many([("a", "1"), ("b", "2")])
    assert [r.enqueued for r in results] == [True, True]
    await client.execute("SET", queue.keys.due, "x")
    await client.execute("UNLINK", queue.keys.dedup("c"))
    with pytest.raises(WrongKeyType):
        await queue.enqueue_scheduled("c", "3")
    assert await xlen(client, queue.keys.scheduled) == 2


# -- promotion -------------------------------------------------------------------------------


async def test_promotion_orders_a_batch_by_priority_keeping_due_order_for_ties(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    for job_id, priority in [("a", 0), ("b", 5), ("c", -1), ("d", 5), ("e", 0)]:
        await queue.enqueue_scheduled(job_id, "x", JobEnqueueOptions(priority=priority))
    result = await source_of(queue).promote(64)
    assert (result.promoted, result.expired, result.missing, result.next_due_ms) == (5, 0, 0, -1)
    assert await ready_job_ids(client, queue.keys) == ["b", "d", "a", "e", "c"]
    assert await staged(client, queue.keys) == []
    assert await xlen(client, queue.keys.scheduled) == 0


async def test_promotion_takes_the_oldest_due_first_then_priority_within_the_batch(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    for job_id, priority in [("old", -5), ("p1", 1), ("p9", 9), ("p7", 7)]:
        await queue.enqueue_scheduled(job_id, "x", JobEnqueueOptions(priority=priority))
    await queue.enqueue_scheduled("later", "x", JobEnqueueOptions(delay=3600, priority=100))
    source = source_of(queue)
    first = await source.promote(2)
    assert first.promoted == 2 and first.next_due_ms == 0
    assert await ready_job_ids(client, queue.keys) == ["p1", "old"]
    second = await source.promote(2)
    assert second.promoted == 2 and 3_500_000 < second.next_due_ms <= 3_600_000
    assert await ready_job_ids(client, queue.keys) == ["p1", "old", "p9", "p7"]
    assert (await source.promote(2)).promoted == 0  # "later" is not due


async def test_promotion_skips_index_entries_without_a_body(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    gone = await queue.enqueue_scheduled("gone", "x")
    await queue.enqueue_scheduled("kept", "x")
    await client.execute("XDEL", queue.keys.scheduled, gone.entry_id)
    result = await source_of(queue).promote(64)
    assert (result.promoted, result.missing) == (1, 1)
    assert await ready_job_ids(client, queue.keys) == ["kept"]
    assert await staged(client, queue.keys) == []


async def test_expired_staged_jobs_are_dropped_not_promoted(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    doomed = await queue.enqueue_scheduled("doomed", "x", JobEnqueueOptions(ttl=0.001))
    await queue.enqueue_scheduled("fine", "x", JobEnqueueOptions(ttl=3600))
    await wait_until_async(lambda: _server_time_past(client, id_ms(doomed.entry_id) + 1))
    result = await source_of(queue).promote(64)
    assert (result.promoted, result.expired) == (1, 1)
    assert await ready_job_ids(client, queue.keys) == ["fine"]
    assert await xlen(client, queue.keys.scheduled) == 0
    # expiry does not remove the deduplication record
    assert not (await queue.enqueue("doomed", "again")).enqueued


async def _server_time_past(client: RedisClient, ms: int) -> bool:
    return await client.time_ms() > ms


async def test_promotion_refuses_a_bad_batch_and_wrong_types(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    from respire_actors.errors import ScriptError

    source = source_of(queue)
    with pytest.raises(ScriptError):
        await source.promote(257)
    await client.execute("SET", queue.keys.scheduled, "x")
    with pytest.raises(WrongKeyType):
        await source.promote(1)


# -- with a worker ---------------------------------------------------------------------------


async def test_delayed_job_runs_after_its_server_time_due(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    ran_at: list[int] = []

    async def handler(job: Job[str]) -> Any:
        ran_at.append(await client.time_ms())
        assert job.priority == 2 and job.expires_at is None
        return ACK

    async with scheduling_worker(client, queue.name, handler):
        result = await queue.enqueue_scheduled("d", "x", JobEnqueueOptions(delay=0.3, priority=2))
        await wait_until(lambda: len(ran_at) == 1)
    assert ran_at[0] >= id_ms(result.entry_id) + 300
    (event,) = [e for e in await all_events(client, queue.keys) if e.kind == "completed"]
    assert event.job_id == "d" and event.entry_id != result.entry_id  # a new ready id


async def test_high_priority_arrivals_cannot_starve_an_older_due_job(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    order: list[str] = []

    async def handler(job: Job[str]) -> Any:
        order.append(job.id)
        return ACK

    await queue.enqueue_scheduled("old", "x", JobEnqueueOptions(priority=-100))
    for i in range(20):
        await queue.enqueue_scheduled(f"hot{i}", "x", JobEnqueueOptions(priority=100))
    stop = anyio.Event()

    async def arrivals() -> None:
        i = 0
        while not stop.is_set():
            await queue.enqueue_scheduled(f"new{i}", "x", JobEnqueueOptions(priority=1000))
            i += 1
            await anyio.sleep(0.001)

    qo = sched_options(scheduling_batch_size=4)
    async with anyio.create_task_group() as tg:
        tg.start_soon(arrivals)
        async with scheduling_worker(client, queue.name, handler, queue_options=qo):
            await wait_until(lambda: "old" in order)
        stop.set()
    # the first pass selected the four oldest due jobs, including "old"
    assert order.index("old") < 4


async def test_expired_ready_delivery_is_acknowledged_without_the_handler(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    async def handler(job: Job[str]) -> Any:
        raise AssertionError("an expired job must not reach its handler")

    result = await queue.enqueue_scheduled("e", "x", JobEnqueueOptions(ttl=0.2))
    assert (await source_of(queue).promote(64)).promoted == 1
    await wait_until_async(lambda: _server_time_past(client, id_ms(result.entry_id) + 200))
    async with scheduling_worker(client, queue.name, handler) as worker:
        await wait_until(lambda: worker.statistics(queue.name).expired == 1)
        assert worker.statistics(queue.name).started == 0
    assert await pending_count(client, queue.keys) == 0
    assert await xlen(client, queue.keys.dead) == 0
    assert await all_events(client, queue.keys) == []
    assert not (await queue.enqueue("e", "again")).enqueued
