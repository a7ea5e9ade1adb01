"""When a handler sees cancellation (docs/job-queue.md, "Cancellation: when a handler sees it").

With lease renewal (the default) a handler is cancelled only when its lease is really lost (the
renewer or a fenced call finds another delivery owns the job) or its budget ends, never merely
because the visibility timeout passed while this worker still owns the job. With renewal off the
visibility timeout is a fixed deadline. Either way: code blocked without an await is not
interrupted (its late outcome only counts if the fence still holds), and progress and log calls
after a lease loss raise cancellation instead of returning False. (A fenced call that finds
another delivery owns the job returns False: test_jobs_fencing.py.)"""

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


def options(*, renew: bool = True, lease: timedelta = LEASE) -> WorkerOptions:
    # One runner, a short lease, and no recovery pass while the test looks (only the startup
    # replay, which finds nothing).
    return fast_options(
        consumer_count=1,
        visibility_timeout=lease,
        recovery_interval=timedelta(seconds=60),
        renew_leases=renew,
    )


async def steal(client: RedisClient, queue: JobQueue[str], entry_id: str) -> None:
    """Another consumer takes the delivery over, as another worker's recovery would."""
    claimed = await client.execute("XCLAIM", queue.keys.ready, CONSUMER_GROUP, "thief", 0, entry_id)
    assert len(claimed) == 1


@pytest.mark.parametrize("call", ["log", "progress"])
async def test_without_renewal_a_report_after_the_lease_deadline_raises_cancellation(
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

    opts = options(renew=False)
    async with running_worker(client, queue.name, handler, options=opts) as worker:
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


async def test_without_renewal_thread_work_is_not_interrupted_and_cancelled_at_the_checkpoint(
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

    async with running_worker(client, queue.name, handler, options=options(renew=False)) as worker:
        stats = worker.statistics(queue.name)
        await wait_until(lambda: stats.leases_lost == 1)
        consumer = worker.consumer_name(queue.name)
        assert stats.acked == 0

    assert seen == ["thread finished", "cancelled"]
    assert await pending_rows(client, queue.keys) == [(enqueued.entry_id, consumer, 1)]


@pytest.mark.parametrize("call", ["log", "progress"])
async def test_with_renewal_a_blocked_handler_past_the_visibility_timeout_keeps_its_job(
    client: RedisClient, queue: JobQueue[str], call: str
) -> None:
    """The event loop stalls past the visibility timeout, but nobody took the job: the lease
    is not lost, the report is written and the job completes once."""
    await queue.enqueue("j", "x")
    seen: list[object] = []

    async def handler(job: Job[str]) -> Outcome:
        time.sleep(PAST_THE_LEASE)  # noqa: ASYNC251 - blocking on purpose
        seen.append(await (job.log("late") if call == "log" else job.report_progress(10)))
        await anyio.sleep(0.2)  # a checkpoint after the stall: the renewer confirms the lease
        return ACK

    async with running_worker(client, queue.name, handler, options=options()) as worker:
        stats = worker.statistics(queue.name)
        await wait_until(lambda: stats.acked == 1)
        assert stats.leases_lost == 0

    assert seen == [True]
    kinds = [e.kind for e in await all_events(client, queue.keys)]
    assert kinds == (["completed"] if call == "log" else ["progress", "completed"])
    assert await pending_rows(client, queue.keys) == []


async def test_a_stall_past_the_visibility_timeout_does_not_let_recovery_rerun_own_jobs(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    """One worker, handlers blocking the event loop past the visibility timeout, frequent
    recovery passes: its own recovery used to claim its own running (or returned, not yet
    committed) deliveries before the renewer had confirmed them, so every job ran twice. A
    recovery pass now confirms this worker's overdue leases first."""
    for i in range(3):
        await queue.enqueue(f"j{i}", "x")
    runs: list[str] = []

    async def handler(job: Job[str]) -> Outcome:
        runs.append(job.id)
        time.sleep(PAST_THE_LEASE)  # noqa: ASYNC251 - blocking on purpose
        return ACK

    opts = fast_options(
        consumer_count=3, visibility_timeout=LEASE, recovery_interval=timedelta(milliseconds=20)
    )
    async with running_worker(client, queue.name, handler, options=opts) as worker:
        stats = worker.statistics(queue.name)
        await wait_until(lambda: stats.acked + stats.stale_completions >= 3, timeout=15)
        await anyio.sleep(0.5)  # a rerun would start here
        assert stats.stale_completions == 0
    assert sorted(runs) == ["j0", "j1", "j2"]
    assert await pending_rows(client, queue.keys) == []


async def test_with_renewal_a_report_after_a_lost_lease_raises_cancellation(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    """The renewer finds another consumer owns the job and cancels the scope: the handler's
    next report raises cancellation (it does not return False, and writes nothing)."""
    enqueued = await queue.enqueue("j", "x")
    started, lost = anyio.Event(), anyio.Event()
    seen: list[object] = []

    async def handler(job: Job[str]) -> Outcome:
        started.set()
        with anyio.CancelScope(shield=True):  # wait here until the test saw the loss
            await lost.wait()
        try:
            seen.append(await job.log("after the loss"))
        except anyio.get_cancelled_exc_class():
            seen.append("cancelled")
            raise
        return ACK

    async with running_worker(client, queue.name, handler, options=options()) as worker:
        stats = worker.statistics(queue.name)
        with anyio.fail_after(10):
            await started.wait()
        await steal(client, queue, enqueued.entry_id)
        await wait_until(lambda: stats.leases_lost == 1)
        lost.set()
        await wait_until(lambda: seen != [])
        assert stats.acked == stats.stale_completions == 0

    assert seen == ["cancelled"]
    assert await queue.get_logs("j") == []
    assert await pending_rows(client, queue.keys) == [(enqueued.entry_id, "thief", 2)]


async def test_with_renewal_thread_work_past_the_visibility_timeout_completes(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    """A thread keeps the event loop free, so the renewer keeps the lease: nothing is cancelled.
    The lease is 1.5 s here, not 300 ms: a renewal pass is allowed to be late by two thirds of
    the lease, and on a loaded machine (parallel test workers, a busy shared Redis) 200 ms of
    slack was sometimes not enough, which is the lease being really lost, not what this test is
    about. The thread blocks for more than two leases."""
    await queue.enqueue("j", "x")
    seen: list[str] = []

    async def handler(job: Job[str]) -> Outcome:
        await anyio.to_thread.run_sync(time.sleep, 3.5)
        seen.append("thread finished")
        assert await job.log("done")
        seen.append("logged")
        return ACK

    lease = timedelta(seconds=1.5)
    async with running_worker(client, queue.name, handler, options=options(lease=lease)) as worker:
        stats = worker.statistics(queue.name)
        await wait_until(lambda: stats.acked == 1)
        assert stats.leases_lost == 0 and stats.leases_renewed >= 2

    assert seen == ["thread finished", "logged"]
    assert await queue.get_logs("j") == ["done"]


async def test_with_renewal_a_lease_lost_during_thread_work_cancels_at_the_next_checkpoint(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    enqueued = await queue.enqueue("j", "x")
    in_thread = anyio.Event()
    seen: list[str] = []

    async def handler(job: Job[str]) -> Outcome:
        in_thread.set()
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
        with anyio.fail_after(10):
            await in_thread.wait()
        await steal(client, queue, enqueued.entry_id)
        await wait_until(lambda: stats.leases_lost == 1)
        await wait_until(lambda: seen != [] and seen[-1] == "cancelled")
        assert stats.acked == 0

    assert seen == ["thread finished", "cancelled"]
    assert await queue.get_logs("j") == []
    assert await pending_rows(client, queue.keys) == [(enqueued.entry_id, "thief", 2)]
