"""delete_acknowledged_entries: XACKDEL ACKED on Redis 8.2+, XACK + XDEL elsewhere, decided per
call inside each script (spec: "Delay, priority and expiry", DeleteAcknowledgedEntries)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from jobs_helpers import create_group, deliver, pending_count, wait_until
from sched_helpers import sched_options, scheduling_worker, xlen

from respire_actors.actors.messages import Completion
from respire_actors.errors import ServerError
from respire_actors.jobs import Job, JobEnqueueOptions, JobQueue
from respire_actors.jobs.source import JobSource
from respire_actors.redis.client import RedisClient

pytestmark = pytest.mark.anyio


async def test_the_deletion_is_decided_per_call_by_the_scripts_not_cached(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    """A failover to a server without XACKDEL must not break completions: the worker passes only
    "delete" and each script picks XACKDEL or XACK + XDEL on the server it runs on. (Neither test
    server has XACKDEL, so the XACK + XDEL branch is what runs here; the XACKDEL branch was not
    exercised on a real server.)"""
    from jobs_helpers import new_runtime

    import respire_actors.jobs.worker as worker_module

    assert not (await client.server_info()).has_xackdel
    assert not hasattr(worker_module, "_deletion_mode")  # no start-up decision any more
    await queue.enqueue("a", "x")
    await create_group(client, queue.keys)
    (delivery,) = await deliver(client, queue.keys, "c1")
    rt = new_runtime(client, queue.name, consumer="c1")
    try:
        source = JobSource(client, queue.keys, queue.keys.dead, "respire", delete_acknowledged=True)
        assert not hasattr(source, "ack_mode")
        assert await source.complete("c1", [Completion(delivery, "ack")]) == [1]
    finally:
        rt.deliveries.close()
        rt.completions.close()
    assert await xlen(client, queue.keys.ready) == 0  # XACK + XDEL ran inside the script
    assert await pending_count(client, queue.keys) == 0


@pytest.mark.parametrize("mode", ["xdel", "ackdel", ""])
async def test_scripts_refuse_a_precomputed_acknowledgement_mode(
    client: RedisClient, queue: JobQueue[str], mode: str
) -> None:
    await queue.enqueue("a", "x")
    await create_group(client, queue.keys)
    (delivery,) = await deliver(client, queue.keys, "c1")
    source = JobSource(client, queue.keys, queue.keys.dead, "respire")
    source.settle = mode
    with pytest.raises(ServerError, match="ack or delete"):
        await source.complete("c1", [Completion(delivery, "ack")])
    with pytest.raises(ServerError, match="ack or delete"):
        await source.read("c1", 1)
    assert await pending_count(client, queue.keys) == 1
    assert await xlen(client, queue.keys.events) == 0


async def test_acknowledged_expired_and_retried_entries_are_deleted(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    async def handler(job: Job[str]) -> Any:
        if job.id == "retry" and job.total_attempts == 1:
            return job.retry_after(0)
        return None

    await queue.enqueue("ack", "x")
    await queue.enqueue("retry", "x")
    await queue.enqueue_scheduled("expire", "x", JobEnqueueOptions(ttl=timedelta(hours=1)))
    qo = sched_options(delete_acknowledged_entries=True)
    async with scheduling_worker(client, queue.name, handler, queue_options=qo) as worker:
        stats = worker.statistics(queue.name)
        await wait_until(lambda: stats.acked == 3 and stats.retried == 1)
    assert await xlen(client, queue.keys.ready) == 0
    assert await pending_count(client, queue.keys) == 0
