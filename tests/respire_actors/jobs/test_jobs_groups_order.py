"""The order in which a group's staged jobs are handed out: due time, then staging id compared
as a stream id (not as text), also for members written by earlier versions."""

from __future__ import annotations

import re
from collections import Counter
from datetime import timedelta
from typing import Any

import anyio
import pytest
from jobs_helpers import fast_options, wait_until_async

from respire_actors.codecs import StrCodec
from respire_actors.jobs import JobEnqueueOptions, JobQueue, QueueOptions, Worker
from respire_actors.redis.client import RedisClient

pytestmark = pytest.mark.anyio

QO = QueueOptions(scheduling_poll_interval=timedelta(milliseconds=100))


def genc(group: str) -> str:
    """The group's encoding inside members (lib/group_lease.lua)."""
    return f"{len(group.encode()):08x}{group}"


def text(reply: Any) -> str:
    return reply.decode() if isinstance(reply, bytes) else str(reply)


async def serve(
    client: RedisClient, queue: JobQueue[str], expected: int
) -> dict[str | None, list[str]]:
    """Runs a worker until `expected` jobs ran; returns the job ids in start order per group."""
    started: dict[str | None, list[str]] = {}

    async def handler(job: Any) -> None:
        started.setdefault(job.group, []).append(job.id)

    worker = Worker()
    worker.register(queue.name, handler, StrCodec(), fast_options(), queue_options=QO)
    async with anyio.create_task_group() as tg:
        await tg.start(worker.run, client)

        async def all_ran() -> bool:
            return sum(len(ids) for ids in started.values()) >= expected

        await wait_until_async(all_ran, timeout=30)
        await worker.stop()
    return started


async def test_jobs_staged_in_one_millisecond_run_in_enqueue_order(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    """Within one millisecond the staging ids are ms-0, ms-1, ..., ms-10: as text ms-10 sorts
    before ms-2, as stream ids it comes after ms-9. A max_concurrency=1 group must hand its jobs
    out in enqueue order."""
    batch = 100  # 40 pipelined enqueues sometimes spread over ten milliseconds on a loaded machine
    groups: list[str] = []
    for attempt in range(10):  # pipelined enqueues; retried on a machine too slow for 11 per ms
        g = f"g{attempt}"
        await queue.set_group_options(g, max_concurrency=1)
        results = await queue.enqueue_scheduled_many(
            [(f"{g}-{i:02d}", "x") for i in range(batch)], JobEnqueueOptions(group=g)
        )
        groups.append(g)
        per_ms = Counter(r.entry_id.split("-")[0] for r in results)
        if max(per_ms.values()) >= 11:
            break
    else:
        pytest.fail("no 11 staging ids shared a millisecond: the case was not exercised")
    started = await serve(client, queue, batch * len(groups))
    for g in groups:
        assert started[g] == [f"{g}-{i:02d}" for i in range(batch)]
    assert await client.execute("ZCARD", queue.keys.group_jobs) == 0


async def test_members_of_the_previous_format_are_still_served(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    """A member written by an earlier version (staging id unpadded) still parses after an
    upgrade: its job is delivered and the member removed, next to new-format members."""
    g = "upgraded"
    jobs = queue.keys.group_jobs
    await queue.set_group_options(g, max_concurrency=1)
    old = await queue.enqueue_scheduled_many(
        [(f"old-{i}", "x") for i in range(3)], JobEnqueueOptions(group=g)
    )
    members = await client.execute("ZRANGE", jobs, 0, -1)
    assert len(members) == 3
    prefix = len(genc(g)) + 15  # group encoding and due time
    for member in members:
        m = text(member)
        staging = m[prefix + 1 :].rsplit(":", 1)[0]
        unpadded = "-".join(str(int(part)) for part in staging.split("-"))
        await client.execute("ZREM", jobs, m)
        await client.execute("ZADD", jobs, 0, f"{m[:prefix]}:{unpadded}:0")
    new = await queue.enqueue_scheduled_many(
        [(f"new-{i}", "x") for i in range(2)], JobEnqueueOptions(group=g)
    )
    new_format = re.compile(re.escape(genc(g)) + r"\d{15}:\d{20}-\d{20}:0")
    current = [text(m) for m in await client.execute("ZRANGE", jobs, 0, -1)]
    assert sum(1 for m in current if new_format.fullmatch(m)) == len(new)
    assert sum(1 for m in current if any(f":{r.entry_id}:" in m for r in old)) == len(old)
    started = await serve(client, queue, 5)
    assert sorted(started[g]) == ["new-0", "new-1", "old-0", "old-1", "old-2"]
    assert [j for j in started[g] if j.startswith("old")] == ["old-0", "old-1", "old-2"]
    assert await client.execute("ZCARD", jobs) == 0
