"""When a handler sees cancellation (docs/job-queue.md, "Cancellation"): its scope's deadline is
the lease; code blocked without an await is not interrupted (its late outcome only counts if the
fence still holds); progress and log calls after the deadline raise cancellation instead of
returning False. (A fenced call that finds another delivery owns the job returns False:
test_jobs_fencing.py.)"""

from __future__ import annotations

import time
from datetime import timedelta

import anyio
import anyio.to_thread
import pytest
from helpers.resp import SyncRedis
from jobs_helpers import all_events, fast_options, pending_rows, running_worker, wait_until

from respire_actors.jobs import ACK, Job, JobQueue, Outcome, WorkerOptions
from respire_actors.jobs.options import CONSUMER_GROUP
from respire_actors.redis.client import RedisClient

pytestmark = pytest.mark.anyio

LEASE = timedelta(milliseconds=300)
PAST_THE_LEASE = 0.8  # seconds of blocking: always past the lease, which starts before the call


def options() -> WorkerOptions:
    # One runner, a short lease, and no recovery pass while the test looks (only the startup
    # replay, which finds nothing).
    return fast_options(
        consumer_count=1, visibility_timeout=LEASE, recovery_interval=timedelta(seconds=60)
    )


@pytest.mark.parametrize("call", ["log", "progress"])
async def test_report_after_the_lease_deadline_raises_cancellation(
    client: RedisClient, queue: JobQueue[str], call: str
) -> None:
    enqueued = await queue.enqueue("j", "x")
    seen: list[object] = []

    async def handler(job: Job[str]) -> Outcome:
        time.sleep(PAST_THE_LEASE)  # noqa: ASYNC251 - blocking on purpose: nothing interrupts it
        try:
            reply = await (job.log("late") if call == "log" else job.report_progress(10))
            seen.append(reply)
        except anyio.get_cancelled_exc_class():
            seen.append("cancelled")
            raise
        return ACK

    async with running_worker(client, queue.name, handler, options=options()) as worker:
        stats = worker.statistics(queue.name)
        await wait_until(lambda: stats.leases_lost == 1)
        consumer = worker.consumer_name(queue.name)
        assert stats.acked == stats.stale_completions == stats.completion_batches == 0

    assert seen == ["cancelled"]  # not False: the lease ran out, nobody else took the job
    assert await pending_rows(client, queue.keys) == [(enqueued.entry_id, consumer, 1)]
    # The call itself may have reached Redis before the cancellation surfaced (seen on Redis
    # 7.0): the fence still held, so at most this delivery's own progress event was written.
    assert all((e.kind, e.attempt) == ("progress", 1) for e in await all_events(client, queue.keys))


async def test_blocking_handler_is_not_interrupted_and_its_late_outcome_is_fenced(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    enqueued = await queue.enqueue("j", "x")
    settings = client.settings
    finished: list[str] = []

    async def handler(job: Job[str]) -> Outcome:
        # Stuck without an await past the lease; meanwhile another consumer recovers the job
        # (done here, synchronously, because this handler holds the event loop).
        time.sleep(PAST_THE_LEASE)  # noqa: ASYNC251 - the blocking handler under test
        with SyncRedis(settings.host, settings.port) as other:
            other.execute("XCLAIM", queue.keys.ready, CONSUMER_GROUP, "thief", 0, job.entry_id)
        finished.append(job.id)
        return ACK  # returned without a checkpoint: the runner hands it to the completer

    async with running_worker(client, queue.name, handler, options=options()) as worker:
        stats = worker.statistics(queue.name)
        await wait_until(lambda: stats.stale_completions == 1)
        assert stats.acked == 0

    assert finished == ["j"]  # ran to the end: the deadline did not interrupt it
    assert await pending_rows(client, queue.keys) == [(enqueued.entry_id, "thief", 2)]
    assert await all_events(client, queue.keys) == []  # the fence rejected the late ACK


async def test_thread_work_is_not_interrupted_and_cancellation_comes_at_the_next_checkpoint(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    enqueued = await queue.enqueue("j", "x")
    seen: list[str] = []

    async def handler(job: Job[str]) -> Outcome:
        try:
            await anyio.to_thread.run_sync(time.sleep, PAST_THE_LEASE)
            seen.append("thread finished")
            await job.log("done")
            seen.append("logged")
        except anyio.get_cancelled_exc_class():
            seen.append("cancelled")
            raise
        return ACK

    async with running_worker(client, queue.name, handler, options=options()) as worker:
        stats = worker.statistics(queue.name)
        await wait_until(lambda: stats.leases_lost == 1)
        consumer = worker.consumer_name(queue.name)
        assert stats.acked == 0

    assert seen == ["thread finished", "cancelled"]
    assert await pending_rows(client, queue.keys) == [(enqueued.entry_id, consumer, 1)]
