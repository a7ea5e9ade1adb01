"""The retention keeper actor: it registers its queue, trims acknowledged ready entries, events
and dead letters by the queue's Retention policy, and never removes a pending, undelivered or
staged entry; retention=None trims nothing. Plus the Retention option's validation."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import anyio
import pytest
from jobs_helpers import fast_options, running_worker, wait_until_async

from respire_actors.actors.options import DEFAULT_RETENTION
from respire_actors.admin import list_queues
from respire_actors.codecs import StrCodec
from respire_actors.errors import ValidationError
from respire_actors.jobs import (
    DeadLetter,
    Job,
    JobEnqueueOptions,
    JobQueue,
    QueueOptions,
    Retention,
    Worker,
    WorkerOptions,
)
from respire_actors.redis.client import RedisClient

pytestmark = pytest.mark.anyio

SHORT = Retention(max_age=timedelta(milliseconds=300), interval=timedelta(milliseconds=50))


async def xlen(client: RedisClient, key: str) -> int:
    return int(await client.execute("XLEN", key))


async def test_default_policy_is_seven_days() -> None:
    assert WorkerOptions().retention == DEFAULT_RETENTION
    assert DEFAULT_RETENTION.max_age == timedelta(days=7)
    assert DEFAULT_RETENTION.max_length is None
    assert DEFAULT_RETENTION.streams == ("ready", "events", "dead")


async def test_keeper_trims_processed_jobs_events_and_dead_letters(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    async def handler(job: Job[str]) -> Any:
        return DeadLetter() if job.payload == "die" else None

    options = fast_options(retention=SHORT)
    await queue.enqueue_many([(f"j{i}", "die" if i % 10 == 0 else "ok") for i in range(100)])
    async with running_worker(client, queue.name, handler, options=options) as worker:
        assert queue.name in await list_queues(client)

        async def trimmed() -> bool:
            lengths = [await xlen(client, k) for k in (queue.keys.ready, queue.keys.events)]
            return lengths == [0, 0] and await xlen(client, queue.keys.dead) == 0

        await wait_until_async(trimmed, timeout=15)
        stats = worker.keeper_statistics(queue.name)
    assert stats.passes >= 1 and stats.failed_passes == 0
    assert stats.removed["ready"] == 100
    assert stats.removed["dead"] == 10
    assert stats.removed["events"] >= 100


async def test_keeper_keeps_pending_undelivered_and_staged(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    release = anyio.Event()
    started: list[str] = []

    async def handler(job: Job[str]) -> None:
        started.append(job.id)
        if job.id == "slow":
            await release.wait()

    options = fast_options(retention=SHORT, consumer_count=1)
    await queue.enqueue("slow", "x")
    await queue.enqueue("waiting", "x")  # undelivered while the only runner is busy
    await queue.enqueue_scheduled("later", "x", JobEnqueueOptions(delay=timedelta(hours=1)))
    worker = Worker()
    worker.register(queue.name, handler, StrCodec(), options, queue_options=QueueOptions())
    async with anyio.create_task_group() as tg:
        await tg.start(worker.run, client)
        await wait_until_async(lambda: _true(started))
        await anyio.sleep(0.1)  # the entries are old enough now; let several passes run
        await wait_until_async(lambda: _passes(worker, queue.name, 5))
        assert await xlen(client, queue.keys.ready) == 2  # pending + undelivered both stay
        assert await xlen(client, queue.keys.scheduled) == 1  # staged: never trimmed
        release.set()
        await wait_until_async(lambda: _ready_empty(client, queue))
        await worker.stop()
    assert started == ["slow", "waiting"]


async def _true(items: list[str]) -> bool:
    return bool(items)


async def _passes(worker: Worker, queue: str, n: int) -> bool:
    return worker.keeper_statistics(queue).passes >= n


async def _ready_empty(client: RedisClient, queue: JobQueue[str]) -> bool:
    return await xlen(client, queue.keys.ready) == 0


async def test_retention_none_trims_nothing(client: RedisClient, queue: JobQueue[str]) -> None:
    done: list[str] = []

    async def handler(job: Job[str]) -> None:
        done.append(job.id)

    await queue.enqueue_many([(f"j{i}", "x") for i in range(5)])
    async with running_worker(
        client, queue.name, handler, options=fast_options(retention=None)
    ) as worker:
        await wait_until_async(lambda: _count(done, 5))
        await anyio.sleep(0.5)
        assert queue.name in await list_queues(client)
        assert worker.keeper_statistics(queue.name).passes == 0
    assert await xlen(client, queue.keys.ready) == 5


async def _count(items: list[str], n: int) -> bool:
    return len(items) >= n


async def test_max_length_keeps_the_newest(client: RedisClient, queue: JobQueue[str]) -> None:
    async def handler(job: Job[str]) -> None:
        return None

    policy = Retention(max_age=None, max_length=3, interval=timedelta(milliseconds=50))
    await queue.enqueue_many([(f"j{i}", "x") for i in range(20)])
    async with running_worker(client, queue.name, handler, options=fast_options(retention=policy)):

        async def three() -> bool:
            return await xlen(client, queue.keys.ready) == 3

        await wait_until_async(three)
    rows = await client.execute("XRANGE", queue.keys.ready, "-", "+")
    assert [dict(zip(r[1][0::2], r[1][1::2], strict=True))[b"_respire.job.id"] for r in rows] == [
        b"j17",
        b"j18",
        b"j19",
    ]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_age": None}, "max_age, a max_length"),
        ({"max_age": -1}, "positive"),
        ({"max_age": timedelta(days=4000)}, "at most"),
        ({"max_length": -1}, "max_length"),
        ({"max_length": True}, "max_length"),
        ({"streams": ("ready", "scheduled")}, "streams"),
        ({"streams": ()}, "streams"),
        ({"batch": 0}, "batch"),
        ({"interval": 0}, "interval"),
    ],
)
def test_retention_validation(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        Retention(**kwargs)


def test_worker_options_rejects_a_non_retention() -> None:
    with pytest.raises(ValidationError, match="retention must be a Retention"):
        WorkerOptions(retention=timedelta(days=1))  # type: ignore[arg-type]
