"""The attempt a dead letter records is the number of deliveries the handler got, on every path
(issue 8, item 12; spec: "Processing, retry and dead letters"). Recovery past the limit used to
record one more (the claim that found the limit counted as a delivery)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import anyio
import pytest
from jobs_helpers import events_of_kind, fast_options, pending_count, running_worker, wait_until
from sched_helpers import sched_options, scheduling_worker

from respire_actors.jobs import DeadLetter, Job, JobQueue
from respire_actors.redis.client import RedisClient

pytestmark = pytest.mark.anyio

LEASE = timedelta(milliseconds=300)


async def only_letter(queue: JobQueue[str]) -> dict[str, bytes]:
    (letter,) = await queue.read_dead_letters()
    return letter[1]


async def hang(job: Job[str]) -> Any:
    await anyio.sleep_forever()  # cancelled when the lease runs out: no outcome


def hanging_options(**changes: Any) -> Any:
    """A fixed lease (no renewal): a hung handler is cancelled when the visibility timeout runs
    out, and recovery delivers its job again."""
    return fast_options(renew_leases=False, **changes)


async def test_explicit_dead_letter_records_the_deliveries_handled(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    calls: list[int] = []

    async def handler(job: Job[str]) -> Any:
        calls.append(job.attempt)
        if job.attempt == 1:
            await anyio.sleep_forever()
        return DeadLetter(detail="gave-up")

    await queue.enqueue("a", "x")
    options = hanging_options(delivery_limit=3, visibility_timeout=LEASE)
    async with running_worker(client, queue.name, handler, options=options) as worker:
        await wait_until(lambda: worker.statistics(queue.name).dead_lettered == 1)
    assert calls == [1, 2]
    letter = await only_letter(queue)
    assert letter["_respire.attempt"] == b"2" and letter["_respire.reason"] == b"explicit"
    assert letter["_respire.detail"] == b"gave-up"


async def test_raising_at_the_limit_records_the_limit(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    calls: list[int] = []

    async def handler(job: Job[str]) -> Any:
        calls.append(job.attempt)
        raise RuntimeError("always")

    await queue.enqueue("a", "x")
    options = fast_options(delivery_limit=3, visibility_timeout=LEASE)
    async with running_worker(client, queue.name, handler, options=options) as worker:
        await wait_until(lambda: worker.statistics(queue.name).dead_lettered == 1, timeout=20)
    assert calls == [1, 2, 3]
    assert (await only_letter(queue))["_respire.attempt"] == b"3"


async def test_hanging_until_the_limit_records_the_limit_not_one_more(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    calls: list[int] = []

    async def handler(job: Job[str]) -> Any:
        calls.append(job.attempt)
        await anyio.sleep_forever()

    await queue.enqueue("a", "x")
    options = hanging_options(delivery_limit=3, visibility_timeout=LEASE)
    async with running_worker(client, queue.name, handler, options=options) as worker:
        stats = worker.statistics(queue.name)
        await wait_until(lambda: stats.dead_lettered_by_recovery == 1, timeout=20)
    assert calls == [1, 2, 3]  # the handler got three deliveries ...
    letter = await only_letter(queue)
    assert letter["_respire.attempt"] == b"3"  # ... and the dead letter says so (was 4)
    assert letter["_respire.reason"] == b"delivery-limit"
    (event,) = await events_of_kind(client, queue.keys, "dead-letter")
    assert event.attempt == 3
    assert await pending_count(client, queue.keys) == 0


async def test_durable_retries_then_hangs_count_every_handled_delivery(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    calls: list[tuple[int, int]] = []

    async def handler(job: Job[str]) -> Any:
        calls.append((job.attempt, job.total_attempts))
        if job.total_attempts == 1:
            raise RuntimeError("first attempt fails: a durable retry")
        await anyio.sleep_forever()

    await queue.enqueue("a", "x")
    qo = sched_options(retry_backoff=timedelta(milliseconds=1))
    options = hanging_options(delivery_limit=3, visibility_timeout=LEASE)
    async with scheduling_worker(
        client, queue.name, handler, queue_options=qo, options=options
    ) as worker:
        stats = worker.statistics(queue.name)
        await wait_until(lambda: stats.dead_lettered_by_recovery == 1, timeout=20)
    assert calls == [(1, 1), (1, 2), (2, 3)]
    letter = await only_letter(queue)
    assert letter["_respire.attempt"] == b"2"  # deliveries of the current entry
    assert letter["_respire.job.attempts"] == b"1"
    assert letter["_respire.total_attempts"] == b"3"  # equals the handler calls
