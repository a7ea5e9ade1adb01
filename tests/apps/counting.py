"""A test app for ``serve``: enqueues a batch of jobs and counts every handler run in Redis.

``python -m respire_actors serve tests.apps.counting:app`` enqueues ``COUNT_JOBS`` jobs with
ids ``<COUNT_BATCH>:<n>`` (a batch enqueued twice is deduplicated), waits until this process
acknowledged them, then prints one line::

    done: <distinct job ids run> distinct, <handler runs> runs, <pending> pending, <keys> keys

and returns (exit code 0), or with ``COUNT_STAY=1`` keeps serving until stopped. With
``COUNT_SLEEP=<seconds>`` each handler run sleeps that long after counting. Every run of
the handler increments the job's field in the hash ``test-runs:<queue>``, so a job run twice
shows up as more runs than distinct ids. ``tests.apps.counting:worker`` is the bare worker
(a worker-only serve).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import anyio
import anyio.abc

from respire_actors import (
    ACK,
    Job,
    JobQueue,
    JsonCodec,
    Outcome,
    RedisClient,
    Worker,
    WorkerOptions,
)
from respire_actors.jobs.options import CONSUMER_GROUP
from respire_actors.keys import JobQueueKeys
from supervisors import current_child


@dataclass(frozen=True)
class Item:
    n: int


CODEC = JsonCodec(Item)
QUEUE = os.environ.get("COUNT_QUEUE", "counting")
RUNS = f"test-runs:{QUEUE}"

worker = Worker("counting")
_clients: list[RedisClient] = []


@worker.job(QUEUE, CODEC, WorkerOptions(consumer_count=16))
async def count_run(job: Job[Item]) -> Outcome:
    if _clients:
        await _clients[0].execute("HINCRBY", RUNS, job.id, 1)
    await anyio.sleep(float(os.environ.get("COUNT_SLEEP", "0")))
    return ACK


class CountingApp:
    async def run(
        self,
        client: RedisClient,
        *,
        task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        _clients[:] = [client]
        jobs = int(os.environ.get("COUNT_JOBS", "0"))
        batch = os.environ.get("COUNT_BATCH", "a")
        queue = JobQueue(client, QUEUE, CODEC)
        async with anyio.create_task_group() as tg:
            await tg.start(worker.run, client)
            task_status.started()
            new = 0
            for start in range(0, jobs, 1000):
                results = await queue.enqueue_many(
                    (f"{batch}:{n}", Item(n)) for n in range(start, min(jobs, start + 1000))
                )
                new += sum(r.enqueued for r in results)
            print(f"enqueued {new}", flush=True)
            while worker.statistics(QUEUE).acked < new:  # noqa: ASYNC110 - no event for it
                await anyio.sleep(0.1)
            runs = await client.execute("HVALS", RUNS)
            ready = JobQueueKeys(QUEUE, client.key_prefix).ready
            pending = await client.execute("XPENDING", ready, CONSUMER_GROUP)
            keys = await client.execute("DBSIZE")
            print(
                f"done: {len(runs)} distinct, {sum(int(v) for v in runs)} runs, "
                f"{int(pending[0])} pending, {keys} keys",
                flush=True,
            )
            if os.environ.get("COUNT_STAY") == "1":
                with current_child().stop_scope():
                    await anyio.sleep_forever()
            await worker.stop()
            tg.cancel_scope.cancel()


app = CountingApp()
