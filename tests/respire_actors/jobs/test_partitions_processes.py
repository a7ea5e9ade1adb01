"""A partitioned queue with real worker processes: the jobs a SIGKILLed worker held in several
partitions are recovered by a survivor after about the visibility timeout, each exactly in its
own partition, and every job of the queue completes."""

from __future__ import annotations

import signal

import anyio
import pytest
from jobs_helpers import python_process, text, wait_until_async

from respire_actors import PartitionedJobQueue, StrCodec
from respire_actors.redis.client import RedisClient

pytestmark = pytest.mark.anyio

PARTITIONS = 16

WORKER_SCRIPT = r"""
import sys, anyio
from datetime import timedelta
from respire_actors import connect, StrCodec, Worker, WorkerOptions

url, queue, record, tag = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]

async def main():
    async with connect(url) as client:
        async def handler(job):
            if job.id.startswith("victim") and tag == "doomed":
                await client.execute("RPUSH", record, f"started:{job.id}:{job.partition}")
                await anyio.sleep_forever()
            await client.execute("RPUSH", record, f"{tag}:{job.id}:{job.partition}")
        worker = Worker()
        worker.register(
            queue, handler, StrCodec(),
            WorkerOptions(consumer_count=4, visibility_timeout=timedelta(seconds=2),
                          recovery_interval=timedelta(milliseconds=500),
                          poll_interval=timedelta(milliseconds=200),
                          shutdown_grace=timedelta(seconds=1)),
            partitions=16,
        )
        await worker.run(client)

anyio.run(main)
"""


async def records(client: RedisClient, record: str) -> list[str]:
    return [text(v) for v in await client.execute("LRANGE", record, 0, -1)]


async def test_a_killed_workers_jobs_come_back_in_their_partitions(
    client: RedisClient, server_url: str, unique_name: str
) -> None:
    await killed_worker_scenario(client, server_url, unique_name)


async def test_a_killed_workers_jobs_come_back_on_the_cluster(
    cluster_client: RedisClient, cluster_url: str, unique_name: str
) -> None:
    await killed_worker_scenario(cluster_client, cluster_url, unique_name)


async def killed_worker_scenario(client: RedisClient, server_url: str, unique_name: str) -> None:
    queue = PartitionedJobQueue(client, unique_name, StrCodec(), partitions=PARTITIONS)
    record = queue.partition(0).keys.custom("handled")  # one slot: RPUSH works on a cluster
    victims = [f"victim{i}" for i in range(4)]
    assert len({queue.partition_of(v) for v in victims}) > 1  # held in several partitions
    await queue.enqueue_many([(v, "x") for v in victims])
    with anyio.fail_after(60):
        async with python_process(
            WORKER_SCRIPT, server_url, unique_name, record, "doomed"
        ) as doomed:

            async def victims_started() -> bool:
                done = await records(client, record)
                return sum(r.startswith("started:") for r in done) == len(victims)

            await wait_until_async(victims_started, timeout=20)
            doomed.send_signal(signal.SIGKILL)  # no cleanup, no acknowledgement
            killed = anyio.current_time()
            await queue.enqueue_many([(f"j{i}", "x") for i in range(50)])
            async with python_process(WORKER_SCRIPT, server_url, unique_name, record, "survivor"):

                async def everything_done() -> bool:
                    done = await records(client, record)
                    return sum(r.startswith("survivor:") for r in done) == 54

                await wait_until_async(everything_done, timeout=30)
                took = anyio.current_time() - killed

                async def nothing_pending() -> bool:
                    # a handler's record lands before its completion commits (batched):
                    # wait for the commits while the survivor runs (SIGTERM kills it at once)
                    for i in range(PARTITIONS):
                        partition = queue.partition(i).keys.ready
                        pending = await client.execute("XPENDING", partition, "respire")
                        if int(pending[0]):
                            return False
                    return True

                await wait_until_async(nothing_pending, timeout=10)
    done = await records(client, record)
    for v in victims:
        assert f"survivor:{v}:{queue.partition_of(v)}" in done
        assert f"started:{v}:{queue.partition_of(v)}" in done
    assert len([r for r in done if r.startswith("survivor:")]) == 54  # each job once
    assert took < 30
    for i in range(PARTITIONS):
        pending = await client.execute("XPENDING", queue.partition(i).keys.ready, "respire")
        assert int(pending[0]) == 0
