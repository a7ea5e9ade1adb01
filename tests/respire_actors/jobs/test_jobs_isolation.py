"""Crash-loop isolation in one process (docs/job-queue.md, "Poison jobs"): suspects run alone
and one at a time, also when the reader's recover claims and the sweeper's claims each bring
one at once, and a suspect still waiting for its turn when the worker stops is not started."""

from __future__ import annotations

from datetime import timedelta

import anyio
import pytest
from jobs_helpers import create_group, deliver, fast_options, pending_count, wait_until

from respire_actors.actors.isolation import suspect_from
from respire_actors.codecs import StrCodec
from respire_actors.jobs import ACK, Job, JobQueue, Outcome, QueueOptions, RateLimit, Worker
from respire_actors.jobs.options import CONSUMER_GROUP
from respire_actors.redis.client import RedisClient

pytestmark = pytest.mark.anyio


async def make_suspects(client: RedisClient, queue: JobQueue[str], ids: list[str]) -> None:
    """Jobs delivered twice to a consumer that died: their next delivery makes them suspects."""
    await queue.enqueue_many([(job_id, "x") for job_id in ids])
    await create_group(client, queue.keys)
    for entry in await deliver(client, queue.keys, "dead", len(ids)):
        await client.execute("XCLAIM", queue.keys.ready, CONSUMER_GROUP, "dead", 0, entry.entry_id)


async def test_suspects_claimed_by_the_reader_and_the_sweeper_run_one_at_a_time(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    """Found by review: under a rate limit the reader claims recover pages too; it and the
    sweeper each dispatched a suspect, each waited for the other's permit, and nothing ran
    again until the stop."""
    ids = [f"s{i}" for i in range(6)]
    await make_suspects(client, queue, ids)
    await anyio.sleep(0.6)  # idle past the visibility timeout
    running: list[str] = []
    overlaps: list[list[str]] = []
    done: list[str] = []

    async def handler(job: Job[str]) -> Outcome:
        if running:
            overlaps.append([*running, job.id])
        running.append(job.id)
        await anyio.sleep(0.05)
        running.remove(job.id)
        done.append(job.id)
        return ACK

    worker = Worker()
    worker.register(
        queue.name,
        handler,
        StrCodec(),
        fast_options(
            consumer_count=2,
            read_batch=1,
            recovery_page_size=1,
            delivery_limit=10,
            visibility_timeout=timedelta(milliseconds=500),
            recovery_interval=timedelta(milliseconds=1),
            poll_interval=timedelta(milliseconds=50),
        ),
        queue_options=QueueOptions(rate_limit=RateLimit(1000, timedelta(seconds=1))),
    )
    async with anyio.create_task_group() as tg:
        await tg.start(worker.run, client)
        await wait_until(lambda: len(done) == len(ids), timeout=30)
        stats = worker.statistics(queue.name)
        await worker.stop()
    assert sorted(done) == ids and overlaps == []
    assert stats.isolated == len(ids)


async def test_a_suspect_waiting_for_its_turn_is_not_started_by_a_stopping_worker(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    """Found by review: a suspect waiting for the handler beside it started once that one
    finished, well after the stop request, though shutdown starts nothing new."""
    await make_suspects(client, queue, ["suspect"])
    await queue.enqueue("long", "x")
    started: list[str] = []
    long_started = anyio.Event()

    async def handler(job: Job[str]) -> Outcome:
        started.append(job.id)
        if job.id == "long":
            long_started.set()
            await anyio.sleep(1.0)
        return ACK

    worker = Worker()
    worker.register(
        queue.name,
        handler,
        StrCodec(),
        fast_options(
            consumer_count=2,
            visibility_timeout=timedelta(milliseconds=300),
            recovery_interval=timedelta(milliseconds=20),
            poll_interval=timedelta(milliseconds=50),
        ),
    )
    async with anyio.create_task_group() as tg:
        await tg.start(worker.run, client)
        with anyio.fail_after(10):
            await long_started.wait()
        stats = worker.statistics(queue.name)
        await wait_until(lambda: stats.recovered >= 1, timeout=10)  # claimed, waiting
        await worker.stop()
    assert started == ["long"]
    assert stats.isolated == 0
    assert await pending_count(client, queue.keys) == 1  # left for recovery


def test_a_limit_of_three_isolates_before_the_last_attempt() -> None:
    """With a delivery limit of 3 or less a delivery is a suspect from its second delivery
    (found untested by a mutation review)."""
    assert [suspect_from(n) for n in (2, 3, 4, 10, 0)] == [2, 2, 3, 3, 3]


async def test_a_suspects_budget_starts_after_its_wait_to_run_alone(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    """actors/isolation.py: the wait to run alone happens under the delivery's lease and
    before its execution budget starts (found untested by a mutation review)."""
    await make_suspects(client, queue, ["suspect"])
    await queue.enqueue("long", "x")  # read at once by the worker; the suspect waits for it
    done: list[str] = []
    long_started = anyio.Event()

    async def handler(job: Job[str]) -> Outcome:
        if job.id == "long":
            long_started.set()
            await anyio.sleep(1.5)  # the suspect waits for it to end
        else:
            await anyio.sleep(1.0)  # well within its 2 s budget, counted from its start
        done.append(job.id)
        return ACK

    worker = Worker()
    worker.register(
        queue.name,
        handler,
        StrCodec(),
        fast_options(
            consumer_count=2,
            timeout=timedelta(seconds=2),
            visibility_timeout=timedelta(milliseconds=300),
            recovery_interval=timedelta(milliseconds=20),
            poll_interval=timedelta(milliseconds=50),
        ),
    )
    async with anyio.create_task_group() as tg:
        await tg.start(worker.run, client)
        stats = worker.statistics(queue.name)
        await wait_until(lambda: len(done) == 2 or stats.timed_out > 0, timeout=20)
        await worker.stop()
    assert long_started.is_set()
    assert stats.isolated == 1
    assert stats.timed_out == 0 and sorted(done) == ["long", "suspect"], (stats.timed_out, done)
