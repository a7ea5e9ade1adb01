"""The operator API on a Redis Cluster: a queue's keys share one slot, the registry lives in
its own; summary, dead-letter retry and trim work through the cluster client."""

from __future__ import annotations

import pytest

from respire_actors.admin import QueueAdmin, list_queues, register_queue, unregister_queue
from respire_actors.codecs import StrCodec
from respire_actors.jobs import JobQueue
from respire_actors.redis.client import RedisClient

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


async def test_admin_on_a_cluster(cluster_client: RedisClient, unique_name: str) -> None:
    queue = JobQueue(cluster_client, unique_name, StrCodec())
    admin = QueueAdmin(cluster_client, unique_name)
    await register_queue(cluster_client, unique_name)
    try:
        assert unique_name in await list_queues(cluster_client)
        await queue.enqueue("a", "x")
        await cluster_client.execute(
            "XADD", admin.dead_key, "*", "_respire.job.id", "d", "_respire.job.payload", "y"
        )
        summary = await admin.summary()
        assert (summary.ready, summary.dead_letters) == (1, 1)
        page = await admin.dead_letters()
        assert await admin.retry_dead_letters([page.rows[0].dead_id]) == 1
        # no consumer group yet: every ready entry is still to be processed, nothing goes
        plan = await admin.trim_plan("ready", max_length=0)
        assert plan.count == 0 and not plan.groups
        assert (await admin.trim(plan)).removed == 0
        # a group past both entries (as if processed): both go
        await cluster_client.execute("XGROUP", "CREATE", plan.key, "respire", "$")
        plan = await admin.trim_plan("ready", max_length=0)
        assert plan.count == 2 and len(plan.groups) == 1
        assert (await admin.trim(plan)).removed == 2
    finally:
        await unregister_queue(cluster_client, unique_name)
