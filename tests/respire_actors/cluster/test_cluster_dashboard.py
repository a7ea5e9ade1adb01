"""The dashboard over three queues on three masters of the cluster fixture: every page and the
pause / dead-letter retry actions go through the cluster client (each queue's slot on its own
node, the queue registry on another)."""

from __future__ import annotations

import re

import httpx
import pytest
from cluster_helpers import names_on_distinct_masters
from helpers.servers import Cluster

from respire_actors.admin import register_queue, unregister_queue
from respire_actors.codecs import StrCodec
from respire_actors.dashboard import Dashboard, DashboardConfig
from respire_actors.jobs import FlowNode, JobEnqueueOptions, JobQueue
from respire_actors.redis.client import RedisClient

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


def http(client: RedisClient, config: DashboardConfig) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=Dashboard(config, client=client), client=("127.0.0.1", 1))
    return httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8080")


def csrf_of(html: str) -> str:
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', html)
    assert found, "no CSRF field on the page"
    return found.group(1)


async def test_the_dashboard_over_three_masters(
    cluster_nodes: Cluster, cluster_client: RedisClient, unique_name: str
) -> None:
    names = names_on_distinct_masters(cluster_nodes, unique_name)
    entries = {}
    for name in names:
        queue = JobQueue(cluster_client, name, StrCodec())
        entries[name] = (await queue.enqueue("ready-1", "r")).entry_id
        await queue.enqueue_scheduled("g-1", "g", JobEnqueueOptions(delay=3600, group="t"))
        await queue.enqueue_flow("flow-1", FlowNode("root", "r", [FlowNode("leaf", "l")]))
        await queue.create_batch(batch_id="batch-1")
        await cluster_client.execute(
            "XADD", queue.keys.dead, "*", "_respire.job.id", "d", "_respire.job.payload", "y"
        )
        await register_queue(cluster_client, name)
    try:
        async with http(cluster_client, DashboardConfig(live_interval=0.2)) as h:
            overview = await h.get("/")
            assert overview.status_code == 200
            assert all(name in overview.text for name in names)  # listed from the registry
            for name in names:
                for path, params in (
                    ("/queue", {"queue": name}),
                    ("/job", {"queue": name, "entry": entries[name]}),
                    ("/dead", {"queue": name}),
                    ("/groups", {"queue": name}),
                    ("/batches", {"queue": name, "kind": "flow", "id": "flow-1"}),
                    ("/batches", {"queue": name, "kind": "batch", "id": "batch-1"}),
                ):
                    response = await h.get(path, params={**params})
                    assert response.status_code == 200, (path, response.text[-600:])
                token = csrf_of((await h.get("/dead", params={"queue": name})).text)
                queue = JobQueue(cluster_client, name, StrCodec())
                for path, paused in (("/queue/pause", True), ("/queue/resume", False)):
                    response = await h.post(path, data={"queue": name, "csrf": token})
                    assert response.status_code == 303, (path, response.text[-600:])
                    assert (await queue.get_state()).paused is paused
    finally:
        for name in names:
            await unregister_queue(cluster_client, name)
