"""delete_acknowledged_entries: XACKDEL ACKED on Redis 8.2+, XACK + XDEL elsewhere, decided per
server at worker start (spec: "Delay, priority and expiry", DeleteAcknowledgedEntries)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from jobs_helpers import create_group, deliver, pending_count, wait_until
from sched_helpers import sched_options, scheduling_worker, xlen

from respire_actors.actors.messages import Completion
from respire_actors.errors import ConfigurationError, PermissionDenied, ServerError
from respire_actors.jobs import Job, JobEnqueueOptions, JobQueue
from respire_actors.jobs.worker import _deletion_mode
from respire_actors.redis.client import RedisClient, ServerInfo

pytestmark = pytest.mark.anyio


async def test_servers_without_xackdel_fall_back_to_xack_and_xdel(client: RedisClient) -> None:
    info = await client.server_info()
    assert not info.has_xackdel  # neither test server offers it; the fallback is what runs
    assert await _deletion_mode(client) == "xdel"


async def test_xackdel_is_chosen_where_the_server_offers_it(
    client: RedisClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    info = ServerInfo("redis", (8, 2, 0), "standalone", "master", frozenset({"xackdel"}))

    async def fake_info(refresh: bool = False) -> ServerInfo:
        return info

    monkeypatch.setattr(client, "server_info", fake_info)
    assert await _deletion_mode(client) == "ackdel"


async def test_denied_discovery_on_redis_8_2_fails_the_start(
    client: RedisClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    info = ServerInfo("redis", (8, 2, 1), "standalone", "master", frozenset())

    async def fake_info(refresh: bool = False) -> ServerInfo:
        return info

    async def denied(*args: Any) -> Any:
        raise PermissionDenied("NOPERM this user has no permissions to run the 'command' command")

    monkeypatch.setattr(client, "server_info", fake_info)
    monkeypatch.setattr(client, "execute", denied)
    with pytest.raises(ConfigurationError, match="COMMAND INFO"):
        await _deletion_mode(client)


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


async def test_ackdel_on_a_server_without_xackdel_fails_before_writing(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    from jobs_helpers import new_runtime

    await queue.enqueue("a", "x")
    await create_group(client, queue.keys)
    (delivery,) = await deliver(client, queue.keys, "c1")
    rt = new_runtime(client, queue.name, consumer="c1")
    try:
        assert isinstance(rt.source, type(rt.source))
        rt.source.ack_mode = "ackdel"  # type: ignore[attr-defined]
        with pytest.raises(ServerError):
            await rt.source.complete("c1", [Completion(delivery, "ack")])
    finally:
        rt.deliveries.close()
        rt.completions.close()
    assert await pending_count(client, queue.keys) == 1
    assert await xlen(client, queue.keys.events) == 0
