"""Added after a mutation review: crash-loop isolation guarantees no test protected.

* a suspect's execution budget starts after its wait to run alone ("The wait happens under the
  delivery's lease (renewed meanwhile) and before its execution budget starts",
  actors/isolation.py);
* with a delivery limit of 3 or less a delivery is a suspect from its second delivery
  ("2 when the limit is 3 or less (isolated before its last attempt)", suspect_from)."""

from __future__ import annotations

from datetime import timedelta

import anyio
import pytest
from jobs_helpers import create_group, deliver, fast_options, wait_until

from respire_actors.actors.isolation import suspect_from
from respire_actors.codecs import StrCodec
from respire_actors.jobs import ACK, Job, JobQueue, Outcome, Worker
from respire_actors.jobs.options import CONSUMER_GROUP
from respire_actors.redis.client import RedisClient

pytestmark = pytest.mark.anyio


def test_a_limit_of_three_isolates_before_the_last_attempt() -> None:
    assert [suspect_from(n) for n in (2, 3, 4, 10, 0)] == [2, 2, 3, 3, 3]


async def test_a_suspects_budget_starts_after_its_wait_to_run_alone(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    await queue.enqueue("suspect", "x")
    await create_group(client, queue.keys)
    # delivered twice to a consumer that died: its next delivery makes it a suspect
    entry = (await deliver(client, queue.keys, "dead", 1))[0]
    await client.execute("XCLAIM", queue.keys.ready, CONSUMER_GROUP, "dead", 0, entry.entry_id)
    await queue.enqueue("long2", "x")  # read at once by the worker; the suspect waits for it
    done: list[str] = []
    long_started = anyio.Event()

    async def handler(job: Job[str]) -> Outcome:
        if job.id == "long2":
            long_started.set()
            await anyio.sleep(1.5)  # the suspect waits for it to end
        else:
            await anyio.sleep(1.0)  # well within its 2 s budget, counted from its start
        done.append(job.id)
        return ACK

    worker = Worker()
    worker.register(
        queue.name,
        handler,
        StrCodec(),
        fast_options(
            consumer_count=2,
            timeout=timedelta(seconds=2),
            visibility_timeout=timedelta(milliseconds=300),
            recovery_interval=timedelta(milliseconds=20),
            poll_interval=timedelta(milliseconds=50),
        ),
    )
    async with anyio.create_task_group() as tg:
        await tg.start(worker.run, client)
        stats = worker.statistics(queue.name)
        await wait_until(lambda: len(done) == 2 or stats.timed_out > 0, timeout=20)
        await worker.stop()
    assert long_started.is_set()
    assert stats.isolated == 1
    assert stats.timed_out == 0 and sorted(done) == ["long2", "suspect"], (stats.timed_out, done)
