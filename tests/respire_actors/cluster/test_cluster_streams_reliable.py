"""Stream workers and reliable queues/topics with their keys on three different masters of the
cluster fixture (asserted), on both backends. Their single-slot cluster paths are tested in
tests/respire_actors/streams and tests/respire_actors/reliable; here one StreamWorker serves
streams on every master and one client drives reliable queues on every master at once."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from datetime import timedelta

import anyio
import pytest
from helpers.servers import Cluster, key_slot
from helpers.waiting import wait_until

from respire_actors.codecs import StrCodec
from respire_actors.jobs.model import ACK, DeadLetter, Outcome
from respire_actors.redis.client import RedisClient
from respire_actors.reliable import ReliableQueue, ReliableTopic
from respire_actors.streams import StreamEntry, StreamWorker, StreamWorkerOptions

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


def on_distinct_masters(cluster: Cluster, base: str, key: Callable[[str], str]) -> list[str]:
    """Three names built from ``base`` whose ``key(name)`` is served by three masters."""
    found: dict[int, str] = {}
    for i in range(10_000):
        name = f"{base}-{i}"
        found.setdefault(cluster.owner_of(key_slot(key(name))).port, name)
        if len(found) == 3:
            names = list(found.values())
            assert len({cluster.owner_of(key_slot(key(n))).port for n in names}) == 3
            return names
    raise AssertionError("fewer than three masters")


async def test_one_stream_worker_serves_streams_on_three_masters(
    cluster_nodes: Cluster, cluster_client: RedisClient, unique_name: str
) -> None:
    streams = on_distinct_masters(cluster_nodes, unique_name, lambda n: f"{{{n}}}:events")
    streams = [f"{{{n}}}:events" for n in streams]
    seen: Counter[tuple[str, bytes]] = Counter()

    async def handler(entry: StreamEntry) -> Outcome:
        seen[(entry.stream, entry.fields[b"n"])] += 1
        return DeadLetter(detail="rejected") if entry.fields[b"n"] == b"bad" else ACK

    for stream in streams:
        for n in ("1", "2", "bad"):
            await cluster_client.execute("XADD", stream, "*", "n", n)
    worker = StreamWorker()
    options = StreamWorkerOptions(
        start_id="0-0",
        block=timedelta(milliseconds=100),
        recovery_interval=timedelta(milliseconds=50),
        shutdown_grace=timedelta(seconds=5),
    )
    for stream in streams:
        worker.register(stream, handler, options)
    async with anyio.create_task_group() as tg:
        await tg.start(worker.run, cluster_client)
        await wait_until(lambda: all(worker.statistics(s).acked == 2 for s in streams))
        await wait_until(lambda: all(worker.statistics(s).dead_lettered == 1 for s in streams))
        await worker.stop()
    assert set(seen.values()) == {1} and len(seen) == 9
    for stream in streams:
        assert await cluster_client.execute("XLEN", f"{stream}:dead") == 1
        pending = await cluster_client.execute("XPENDING", stream, "respire")
        assert int(pending[0]) == 0


async def test_reliable_queues_and_topics_on_three_masters(
    cluster_nodes: Cluster, cluster_client: RedisClient, unique_name: str
) -> None:
    q_names = on_distinct_masters(cluster_nodes, unique_name, lambda n: f"{{respire-queue:{n}}}")
    t_names = on_distinct_masters(cluster_nodes, unique_name, lambda n: f"{{respire-topic:{n}}}")
    queues = [ReliableQueue(cluster_client, n, StrCodec(), delivery_limit=1) for n in q_names]
    topics = [ReliableTopic(cluster_client, n, StrCodec()) for n in t_names]

    async def round_trip(queue: ReliableQueue[str], topic: ReliableTopic[str]) -> None:
        sent = await queue.send("a", dedup_id="a")
        assert await queue.send("again", dedup_id="a") == sent
        await queue.send("b")
        first, second = await queue.receive(30, max=5)
        assert await queue.ack(first)
        assert await queue.nack(second, 0)
        assert await queue.receive(30) == []  # the exhausted one is dead-lettered here
        assert [d.payload for d in await queue.dead_letters()] == [b"b"]
        await topic.create_subscription("s", start="tail")
        await topic.publish("t")
        (message,) = await topic.subscription("s").receive(30)
        assert await topic.subscription("s").ack(message)

    async with anyio.create_task_group() as tg:
        for queue, topic in zip(queues, topics, strict=True):
            tg.start_soon(round_trip, queue, topic)
