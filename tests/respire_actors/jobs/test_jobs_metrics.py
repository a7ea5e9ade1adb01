"""Per-minute completion metrics through a running worker (issue 13): the counters match a
known mix of outcomes, every worker must agree on the retention, and a worker without the
option records nothing."""

from __future__ import annotations

from typing import Any

import pytest
from jobs_helpers import fast_options, wait_until
from sched_helpers import sched_options, scheduling_worker

from respire_actors.codecs import StrCodec
from respire_actors.errors import ConfigurationError, ValidationError
from respire_actors.jobs import ACK, DeadLetter, Job, JobQueue, QueueOptions, Worker
from respire_actors.redis.client import RedisClient

pytestmark = pytest.mark.anyio


async def test_a_known_mix_of_outcomes_is_counted(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    for i in range(7):
        await queue.enqueue(f"ok-{i}", "ok")
    for i in range(3):
        await queue.enqueue(f"bad-{i}", "bad")
    await queue.enqueue("flaky", "flaky")
    seen: dict[str, int] = {}

    async def handler(job: Job[str]) -> Any:
        seen[job.id] = seen.get(job.id, 0) + 1
        if job.payload == "bad":
            return DeadLetter()
        if job.payload == "flaky" and seen[job.id] == 1:
            raise RuntimeError("first attempt fails, the durable retry succeeds")
        return ACK

    qo = sched_options(metrics_retention_minutes=10, retry_backoff=0.01)
    async with scheduling_worker(
        client, queue.name, handler, queue_options=qo, options=fast_options(delivery_limit=3)
    ) as worker:
        stats = worker.statistics(queue.name)
        await wait_until(lambda: stats.acked == 8 and stats.dead_lettered == 3)
    history = await queue.read_metrics(10)
    assert 1 <= len(history) <= 10
    assert sum(h.completed for h in history) == 8  # the retried job counts once
    assert sum(h.failed for h in history) == 3


async def test_workers_must_agree_on_the_retention(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    await client.execute("HSET", queue.keys.metrics, "retention", "60")

    async def handler(job: Job[str]) -> Any:
        return None

    worker = Worker()
    worker.register(
        queue.name, handler, StrCodec(), queue_options=sched_options(metrics_retention_minutes=30)
    )
    with pytest.raises(ConfigurationError, match="metrics_retention_minutes"):
        await worker.run(client)


async def test_workers_started_together_with_different_retentions_count_every_job(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    """On a fresh queue the start-up check finds no counters to compare with, so both start;
    each used to write its own slot layout into the one hash and overwrite the other's
    retention, losing counts. Recording now keeps the stored layout."""
    done: list[str] = []

    async def handler(job: Job[str]) -> Any:
        done.append(job.id)
        return ACK

    seven = sched_options(metrics_retention_minutes=7)
    eleven = sched_options(metrics_retention_minutes=11)
    async with (
        scheduling_worker(client, queue.name, handler, queue_options=seven),
        scheduling_worker(client, queue.name, handler, queue_options=eleven),
    ):
        await queue.enqueue_many([(f"j{i}", "x") for i in range(40)])
        await wait_until(lambda: len(done) == 40)
    stored = int(await client.execute("HGET", queue.keys.metrics, "retention"))
    history = await queue.read_metrics(stored)
    assert sum(h.completed for h in history) == 40


async def test_a_worker_without_metrics_beside_recording_ones_warns(
    client: RedisClient, queue: JobQueue[str], caplog: pytest.LogCaptureFixture
) -> None:
    await client.execute("HSET", queue.keys.metrics, "retention", "60")

    async def handler(job: Job[str]) -> Any:
        return None

    async with scheduling_worker(client, queue.name, handler):
        pass
    assert any("its completions are not counted" in r.getMessage() for r in caplog.records), (
        caplog.text
    )


async def test_without_the_option_nothing_is_recorded(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    await queue.enqueue("a", "x")

    async def handler(job: Job[str]) -> Any:
        return None

    async with scheduling_worker(client, queue.name, handler) as worker:
        stats = worker.statistics(queue.name)
        await wait_until(lambda: stats.acked == 1)
    assert await client.execute("EXISTS", queue.keys.metrics) == 0
    assert await queue.read_metrics() == []


@pytest.mark.parametrize("value", [-1, 1441, True, 1.0, "60"])
def test_the_retention_option_is_validated(value: Any) -> None:
    with pytest.raises(ValidationError, match="metrics_retention_minutes"):
        QueueOptions(metrics_retention_minutes=value)
