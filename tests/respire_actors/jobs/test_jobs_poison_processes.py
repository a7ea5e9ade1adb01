"""Crash-loop isolation with real processes (004 "Bound retries and isolate poison jobs"): a
job whose handler kills its worker process reaches its delivery limit alone, while the jobs
that were running beside it when it crashed finish; without isolation it drags them all into
the dead letters."""

from __future__ import annotations

import anyio
import pytest
from jobs_helpers import events_of_kind, python_process

from respire_actors.jobs import JobQueue
from respire_actors.redis.client import RedisClient

pytestmark = pytest.mark.anyio

WORKER_SCRIPT = r"""
import os, signal, sys
from datetime import timedelta
import anyio
from respire_actors import ACK, StrCodec, Worker, WorkerOptions, connect

url, queue, record, isolate = sys.argv[1:5]

async def main():
    async with connect(url) as client:
        async def handler(job):
            if job.id == "poison":
                await anyio.sleep(0.3)  # the others have started by now
                os.kill(os.getpid(), signal.SIGKILL)
            await anyio.sleep(0.5)
            await client.execute("RPUSH", record, job.id)
            return ACK
        worker = Worker()
        worker.register(
            queue, handler, StrCodec(),
            WorkerOptions(consumer_count=8, delivery_limit=3,
                          visibility_timeout=timedelta(seconds=1),
                          recovery_interval=timedelta(milliseconds=200),
                          poll_interval=timedelta(milliseconds=200),
                          isolate_suspects=isolate == "1"),
        )
        await worker.run(client)

anyio.run(main)
"""

INNOCENT = [f"ok{i}" for i in range(5)]


async def run_until_settled(
    client: RedisClient, server_url: str, queue: JobQueue[str], record: str, isolate: bool
) -> int:
    """Run worker processes, starting a new one whenever one dies, until every job is either
    done or dead-lettered; returns how many processes were killed."""
    kills = 0
    args = (server_url, queue.name, record, str(int(isolate)))
    with anyio.fail_after(120):
        while True:
            async with python_process(WORKER_SCRIPT, *args) as proc:
                while proc.returncode is None:
                    done = len(await client.execute("LRANGE", record, 0, -1))
                    dead = await client.execute("XLEN", queue.keys.dead)
                    if done + dead == len(INNOCENT) + 1:
                        return kills
                    with anyio.move_on_after(0.1):
                        await proc.wait()
                kills += 1


@pytest.mark.parametrize("isolate", [True, False], ids=["isolated", "not-isolated"])
async def test_a_job_that_kills_its_worker_reaches_its_limit_alone(
    client: RedisClient, server_url: str, queue: JobQueue[str], isolate: bool
) -> None:
    record = queue.keys.custom("done")
    await queue.enqueue_many([("poison", "x"), *((job, "x") for job in INNOCENT)])
    kills = await run_until_settled(client, server_url, queue, record, isolate)
    dead = {e.job_id: e.reason for e in await events_of_kind(client, queue.keys, "dead-letter")}
    done = sorted(v.decode() for v in await client.execute("LRANGE", record, 0, -1))
    assert kills == 3  # the poison's three deliveries, each the death of a worker
    if isolate:
        assert dead == {"poison": "delivery-limit"}
        assert done == INNOCENT  # each once
    else:
        # what isolation prevents: every job running beside the poison was charged a delivery
        # at each of its crashes and reached the limit with it
        assert "poison" in dead and len(dead) > 1
