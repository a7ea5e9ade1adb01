"""Rate-limited queues with real worker processes (issue 8, item 11): a worker that joins a
saturated queue gets its share, and a SIGKILLed worker's job comes back after about the
visibility timeout, not after the backlog. Measured before the fix (2 processes, 10 jobs/s): the
second worker read nothing for 11-20 s and the crashed job came back after 15 s.

The bounds are timed from the moment the joining worker has started (it pushes its tag to
``<record>:ready`` once ``Worker.run`` reports every actor started): starting a Python process
takes from a fraction of a second to tens of seconds on a loaded machine (parallel test
workers), and that is not what these tests measure."""

from __future__ import annotations

import signal
from contextlib import AbstractAsyncContextManager
from datetime import timedelta

import anyio
import anyio.abc
import pytest
from jobs_helpers import python_process, text, wait_until_async

from respire_actors.jobs import JobQueue, RateLimit
from respire_actors.redis.client import RedisClient

pytestmark = pytest.mark.anyio

WORKER_SCRIPT = r"""
import sys, anyio
from datetime import timedelta
from respire_actors import connect, StrCodec, Worker, WorkerOptions, QueueOptions, RateLimit

url, queue, record, tag = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]

async def main():
    async with connect(url) as client, anyio.create_task_group() as tg:
        async def handler(job):
            if job.id == "victim" and tag == "doomed":
                await client.execute("RPUSH", record, "victim-started")
                await anyio.sleep_forever()
            await client.execute("RPUSH", record, f"{tag}:{job.id}")
        worker = Worker()
        # default consumer_count / read_batch: one read could take a whole window before
        worker.register(
            queue, handler, StrCodec(),
            WorkerOptions(visibility_timeout=timedelta(seconds=2),
                          recovery_interval=timedelta(seconds=1),
                          shutdown_grace=timedelta(seconds=1)),
            queue_options=QueueOptions(rate_limit=RateLimit(10, timedelta(seconds=1))),
        )
        await tg.start(worker.run, client)
        await client.execute("RPUSH", record + ":ready", tag)

anyio.run(main)
"""


def worker_process(
    server_url: str, queue: JobQueue[str], record: str, tag: str
) -> AbstractAsyncContextManager[anyio.abc.Process]:
    return python_process(WORKER_SCRIPT, server_url, queue.name, record, tag)


async def records(client: RedisClient, record: str) -> list[str]:
    return [text(v) for v in await client.execute("LRANGE", record, 0, -1)]


STARTUP = 60  # seconds a worker process may take to start on a loaded machine


async def wait_started(client: RedisClient, record: str, tag: str) -> None:
    async def started() -> bool:
        return tag in await records(client, record + ":ready")

    await wait_until_async(started, timeout=STARTUP)


async def test_a_worker_joining_a_saturated_queue_gets_its_share(
    client: RedisClient, server_url: str, queue: JobQueue[str]
) -> None:
    record = queue.keys.custom("handled")
    await queue.set_rate_limit(RateLimit(10, timedelta(seconds=1)))
    await queue.enqueue_many([(f"j{i}", "x") for i in range(400)])
    async with worker_process(server_url, queue, record, "first"):
        await wait_started(client, record, "first")

        async def first_busy() -> bool:
            return len(await records(client, record)) >= 15

        await wait_until_async(first_busy, timeout=15)
        async with worker_process(server_url, queue, record, "second"):
            await wait_started(client, record, "second")
            joined = anyio.current_time()

            async def second_served() -> bool:
                done = await records(client, record)
                return sum(r.startswith("second:") for r in done) >= 5

            # fair share is ~5 jobs/s each: 5 jobs take ~1 s; before the fix, 11-20 s
            await wait_until_async(second_served, timeout=8)
            took = anyio.current_time() - joined
    assert took < 8


async def test_a_killed_workers_job_comes_back_after_the_visibility_timeout(
    client: RedisClient, server_url: str, queue: JobQueue[str]
) -> None:
    record = queue.keys.custom("handled")
    await queue.set_rate_limit(RateLimit(10, timedelta(seconds=1)))
    await queue.enqueue("victim", "x")
    await queue.enqueue_many([(f"j{i}", "x") for i in range(400)])  # a backlog of 40 s
    async with worker_process(server_url, queue, record, "doomed") as doomed:
        await wait_started(client, record, "doomed")

        async def victim_started() -> bool:
            return "victim-started" in await records(client, record)

        await wait_until_async(victim_started, timeout=15)
        async with worker_process(server_url, queue, record, "survivor"):
            await wait_started(client, record, "survivor")
            doomed.send_signal(signal.SIGKILL)  # no cleanup, no acknowledgement
            killed = anyio.current_time()

            async def victim_back() -> bool:
                return "survivor:victim" in await records(client, record)

            # visibility 2 s + recovery/poll 1 s (+ a rate-limit window); was ~15 s
            await wait_until_async(victim_back, timeout=10)
            took = anyio.current_time() - killed
    assert took < 10
