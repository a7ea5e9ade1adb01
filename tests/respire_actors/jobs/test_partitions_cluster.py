"""Partitioned job queues on the 3-master cluster fixture: partitions spread over every master
(each partition its own hash tag), and one worker registration drains, waits on and recovers
all of them (a wait there is a pipelined probe per node, not one XREAD over many slots)."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta

import pytest
from helpers.servers import Cluster, key_slot
from jobs_helpers import fast_options, running_worker, wait_until
from test_partitions import transactional_enqueue_in_its_partition

from respire_actors import ACK, NACK, Job, PartitionedJobQueue, StrCodec
from respire_actors.redis.client import RedisClient

pytestmark = pytest.mark.anyio


async def test_partitions_spread_over_every_master(
    cluster_client: RedisClient, cluster_nodes: Cluster, unique_name: str
) -> None:
    queue = PartitionedJobQueue(cluster_client, unique_name, StrCodec(), partitions=64)
    await queue.enqueue_many([(f"j{i}", "x") for i in range(1000)])
    owners: Counter[int] = Counter()
    slots, tags = set(), set()
    for i in range(64):
        key = queue.partition(i).keys.ready
        tags.add(key[key.index("{") : key.index("}") + 1])
        slots.add(key_slot(key))
        node = cluster_nodes.owner_of(key_slot(key))
        assert node.execute("EXISTS", key) == 1  # the stream really lives on that master
        owners[node.port] += 1
    assert len(tags) == 64  # every partition has its own hash tag
    # and nearly always its own slot. CRC16 is linear, so tags of the same length (indexes of
    # the same digit count) never share a slot; for about 1 name in 200, some of the ten
    # 1-digit indexes share a slot with a 2-digit one (each with at most one, since 2-digit
    # ones never collide among themselves): at most 10 of 64, which only puts two partitions
    # in one slot of one master
    assert len(slots) >= 54
    assert set(owners) == set(cluster_nodes.ports)
    assert min(owners.values()) >= 8  # 64 tags over 3 masters: none nearly empty
    assert (await queue.backlog()).backlog == 1000


async def test_one_registration_drains_and_recovers_a_cluster_queue(
    cluster_client: RedisClient, unique_name: str
) -> None:
    queue = PartitionedJobQueue(cluster_client, unique_name, StrCodec(), partitions=16)
    await queue.enqueue_many([(f"j{i}", "x") for i in range(200)])
    done: Counter[str] = Counter()

    async def handler(job: Job[str]) -> object:
        done[job.id] += 1
        if job.id.startswith("flaky") and job.attempt == 1:
            return NACK  # recovered after the visibility timeout, in its partition
        return ACK

    # a poll interval longer than the test: the late jobs are found by the probe itself
    async with running_worker(
        cluster_client,
        unique_name,
        handler,
        options=fast_options(
            visibility_timeout=timedelta(milliseconds=300), poll_interval=timedelta(seconds=60)
        ),
        partitions=16,
    ) as worker:
        await wait_until(lambda: len(done) == 200, timeout=30)
        # jobs enqueued while the reader waits (the probe covers every node)
        await queue.enqueue_many([(f"flaky{i}", "x") for i in range(20)])
        stats = worker.statistics(unique_name)
        await wait_until(lambda: stats.acked == 220, timeout=30)
    assert all(done[f"flaky{i}"] == 2 for i in range(20))
    assert stats.recovered >= 20


async def test_a_transactional_enqueue_goes_to_its_partition_on_a_cluster(
    cluster_client: RedisClient, unique_name: str
) -> None:
    await transactional_enqueue_in_its_partition(cluster_client, unique_name)
