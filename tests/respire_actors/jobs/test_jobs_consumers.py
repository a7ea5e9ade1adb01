"""Consumers do not accumulate (issue 8, item 13): a clean shutdown removes this process's
consumer when nothing is pending for it, and the sweeper removes other consumers idle past
``consumer_idle_timeout`` with nothing pending. Removal is atomic with the pending check."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import anyio
import pytest
from jobs_helpers import create_group, deliver, fast_options, running_worker, text, wait_until

from respire_actors.actors.source import remove_consumer, remove_idle_consumers
from respire_actors.errors import ValidationError
from respire_actors.jobs import Job, JobQueue, WorkerOptions
from respire_actors.jobs.options import CONSUMER_GROUP
from respire_actors.redis.client import RedisClient

pytestmark = pytest.mark.anyio


async def consumers(client: RedisClient, stream: str) -> dict[str, int]:
    """consumer name -> pending count."""
    rows = await client.execute("XINFO", "CONSUMERS", stream, CONSUMER_GROUP)
    out: dict[str, int] = {}
    for row in rows:
        info = dict(zip(row[0::2], row[1::2], strict=True)) if isinstance(row, list) else row
        info = {text(k): v for k, v in info.items()}
        out[text(info["name"])] = int(info["pending"])
    return out


def test_consumer_idle_timeout_is_validated() -> None:
    with pytest.raises(ValidationError, match="consumer_idle_timeout"):
        WorkerOptions(consumer_idle_timeout=timedelta(0))
    assert WorkerOptions(consumer_idle_timeout=None).consumer_idle_timeout is None
    assert WorkerOptions().consumer_idle_timeout == timedelta(days=1)


async def test_a_clean_shutdown_removes_its_own_consumer(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    async def handler(job: Job[str]) -> Any:
        return None

    await queue.enqueue("a", "x")
    async with running_worker(client, queue.name, handler) as worker:
        await wait_until(lambda: worker.statistics(queue.name).acked == 1)
        me = worker.consumer_name(queue.name)
        assert me in await consumers(client, queue.keys.ready)
    assert me not in await consumers(client, queue.keys.ready)  # used to stay forever
    assert worker.statistics(queue.name).consumers_removed == 1


async def test_a_shutdown_leaving_deliveries_pending_keeps_its_consumer(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    started = anyio.Event()

    async def handler(job: Job[str]) -> Any:
        started.set()
        await anyio.sleep_forever()  # cancelled at the end of the shutdown grace

    await queue.enqueue("a", "x")
    options = fast_options(shutdown_grace=timedelta(milliseconds=100))
    async with running_worker(client, queue.name, handler, options=options) as worker:
        with anyio.fail_after(10):
            await started.wait()
        me = worker.consumer_name(queue.name)
    # its delivery stays pending for recovery, so the consumer (its owner) must stay too
    assert (await consumers(client, queue.keys.ready)).get(me) == 1


async def test_the_sweeper_removes_idle_consumers_with_nothing_pending(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    await queue.enqueue("held", "x")
    await create_group(client, queue.keys)
    await deliver(client, queue.keys, "ghost-holding")  # idle, but owns a pending entry
    for name in ("ghost-a", "ghost-b"):
        await client.execute("XGROUP", "CREATECONSUMER", queue.keys.ready, CONSUMER_GROUP, name)
    await anyio.sleep(0.4)  # every ghost is now idle longer than the timeout below
    await queue.enqueue("own", "x")  # so that our consumer exists in the group

    async def handler(job: Job[str]) -> Any:
        return None

    options = fast_options(consumer_idle_timeout=timedelta(milliseconds=300))
    async with running_worker(client, queue.name, handler, options=options) as worker:
        stats = worker.statistics(queue.name)
        await wait_until(lambda: stats.consumers_removed == 2 and stats.acked == 1)
        left = await consumers(client, queue.keys.ready)
        assert "ghost-a" not in left and "ghost-b" not in left
        assert left["ghost-holding"] == 1  # pending entries are never dropped
        await anyio.sleep(0.5)  # our own consumer, idle or not, is never removed by the sweep
        assert worker.consumer_name(queue.name) in await consumers(client, queue.keys.ready)


async def test_removal_checks_pending_atomically(client: RedisClient, queue: JobQueue[str]) -> None:
    await queue.enqueue("a", "x")
    await create_group(client, queue.keys)
    await deliver(client, queue.keys, "busy")
    await client.execute("XGROUP", "CREATECONSUMER", queue.keys.ready, CONSUMER_GROUP, "free")
    ready = queue.keys.ready
    assert await remove_consumer(client, ready, CONSUMER_GROUP, "busy") is False
    assert await remove_consumer(client, ready, CONSUMER_GROUP, "free") is True
    assert await remove_consumer(client, ready, CONSUMER_GROUP, "absent") is False
    assert await consumers(client, ready) == {"busy": 1}
    # idle mode spares the caller and anyone with pending entries
    assert await remove_idle_consumers(client, ready, CONSUMER_GROUP, "busy", 1) == 0
    # a missing group or stream removes nothing and raises nothing
    assert await remove_consumer(client, f"{ready}-none", CONSUMER_GROUP, "busy") is False
