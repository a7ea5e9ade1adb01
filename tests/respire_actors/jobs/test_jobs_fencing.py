"""Fencing, leases and crashes: a delivery that is no longer current cannot complete or report;
a crashed consumer's job is recovered and completed once (spec: "Processing, retry and dead
letters", "Progress and completion observers", "Storage and delivery guarantees")."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import anyio
import pytest
from jobs_helpers import (
    FAST,
    all_events,
    create_group,
    deliver,
    events_of_kind,
    fast_options,
    pending_rows,
    running_worker,
    wait_until,
    wait_until_async,
)

from respire_actors.actors.completer import commit
from respire_actors.actors.messages import Completion
from respire_actors.actors.runtime import QueueRuntime
from respire_actors.jobs import ACK, DeadLetter, Delivery, Job, JobQueue, Outcome
from respire_actors.jobs.options import CONSUMER_GROUP
from respire_actors.redis.client import RedisClient

pytestmark = pytest.mark.anyio

LONG = timedelta(seconds=60)


async def steal(client: RedisClient, queue: JobQueue[str], entry_id: str) -> None:
    """Another consumer takes the delivery over, as visibility recovery would."""
    claimed = await client.execute("XCLAIM", queue.keys.ready, CONSUMER_GROUP, "thief", 0, entry_id)
    assert len(claimed) == 1


@pytest.mark.parametrize("outcome", [ACK, DeadLetter(detail="late")], ids=["ack", "dead-letter"])
async def test_stale_handler_cannot_complete(
    client: RedisClient, queue: JobQueue[str], outcome: Outcome
) -> None:
    enqueued = await queue.enqueue("j", "x")
    started, release = anyio.Event(), anyio.Event()

    async def handler(job: Job[str]) -> Outcome:
        started.set()
        with anyio.CancelScope(shield=True):  # keep running after the lease is lost
            await release.wait()
        return outcome

    # A long visibility timeout: no lease expiry, no recovery by the worker itself.
    options = fast_options(visibility_timeout=LONG)
    async with running_worker(client, queue.name, handler, options=options) as worker:
        stats = worker.statistics(queue.name)
        with anyio.fail_after(10):
            await started.wait()
        await steal(client, queue, enqueued.entry_id)
        release.set()
        await wait_until(lambda: stats.stale_completions == 1)
        assert stats.acked == stats.dead_lettered == 0

    assert await all_events(client, queue.keys) == []
    assert await client.execute("XLEN", queue.keys.dead) == 0
    assert await pending_rows(client, queue.keys) == [(enqueued.entry_id, "thief", 2)]


@pytest.mark.parametrize("call", ["progress", "log"])
async def test_stale_handler_cannot_report_and_is_cancelled(
    client: RedisClient, queue: JobQueue[str], call: str
) -> None:
    enqueued = await queue.enqueue("j", "x")
    started, stolen = anyio.Event(), anyio.Event()
    replies: list[bool] = []
    reached_after_checkpoint = False

    async def handler(job: Job[str]) -> Outcome:
        nonlocal reached_after_checkpoint
        started.set()
        await stolen.wait()
        if call == "progress":
            replies.append(await job.report_progress(50))
        else:
            replies.append(await job.log("too late"))
        await anyio.sleep(30)  # the next checkpoint: cancelled, the lease is gone
        reached_after_checkpoint = True
        return ACK

    options = fast_options(visibility_timeout=LONG)
    async with running_worker(client, queue.name, handler, options=options) as worker:
        stats = worker.statistics(queue.name)
        with anyio.fail_after(10):
            await started.wait()
        await steal(client, queue, enqueued.entry_id)
        stolen.set()
        await wait_until(lambda: stats.leases_lost == 1)
        assert stats.stale_completions == 0  # nothing was even sent to the completer
        assert stats.acked == 0

    assert replies == [False]
    assert not reached_after_checkpoint
    assert await all_events(client, queue.keys) == []
    assert await queue.get_logs("j") == []
    assert await pending_rows(client, queue.keys) == [(enqueued.entry_id, "thief", 2)]


async def test_handler_past_its_lease_is_cancelled_and_the_job_completed_once(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    enqueued = await queue.enqueue("slow", "x")
    calls: list[tuple[str, int]] = []
    cancelled: list[int] = []

    def handler_for(name: str) -> Callable[[Job[str]], Any]:
        async def handler(job: Job[str]) -> Outcome:
            calls.append((name, job.attempt))
            if job.attempt == 1:
                try:
                    await anyio.sleep_forever()
                except anyio.get_cancelled_exc_class():
                    cancelled.append(job.attempt)
                    raise
            return ACK

        return handler

    # the fixed lease (no renewal): the visibility timeout is the handler's deadline
    options = fast_options(consumer_count=1, visibility_timeout=FAST, renew_leases=False)
    async with running_worker(client, queue.name, handler_for("a"), options=options) as a:
        await wait_until(lambda: a.statistics(queue.name).started == 1)
        async with running_worker(client, queue.name, handler_for("b"), options=options) as b:
            done = [a.statistics(queue.name), b.statistics(queue.name)]
            await wait_until(lambda: sum(s.acked for s in done) == 1)
            assert a.statistics(queue.name).leases_lost == 1
            assert sum(s.recovered for s in done) >= 1

    assert cancelled == [1]
    assert [attempt for _, attempt in calls] == [1, 2]
    completed = await events_of_kind(client, queue.keys, "completed")
    assert [(e.entry_id, e.attempt) for e in completed] == [(enqueued.entry_id, 2)]
    assert await pending_rows(client, queue.keys) == []


CRASHING_WORKER = textwrap.dedent(
    """
    import sys
    from datetime import timedelta

    import anyio

    from respire_actors.codecs import StrCodec
    from respire_actors.jobs import Worker, WorkerOptions
    from respire_actors.redis.client import connect

    url, queue, ready_key = sys.argv[1:4]

    async def main():
        async with connect(url) as client:
            async def handler(job):
                await client.execute("SET", ready_key, job.entry_id)
                await anyio.sleep_forever()

            worker = Worker()
            options = WorkerOptions(
                consumer_name="doomed", visibility_timeout=timedelta(seconds=60)
            )
            worker.register(queue, handler, StrCodec(), options)
            await worker.run(client)

    anyio.run(main)
    """
)


@pytest.mark.slow
async def test_killed_worker_process_job_is_recovered_once(
    server_url: str, client: RedisClient, queue: JobQueue[str]
) -> None:
    enqueued = await queue.enqueue("crash", "x")
    ready_key = queue.keys.custom("crash-ready")
    process = await anyio.open_process(
        [sys.executable, "-c", CRASHING_WORKER, server_url, queue.name, ready_key],
        stdin=subprocess.DEVNULL,
        stdout=None,
        stderr=None,
    )
    try:

        async def handler_running() -> bool:
            assert process.returncode is None, "the worker process exited early"
            return bool(await client.execute("EXISTS", ready_key))

        await wait_until_async(handler_running, timeout=30)
    finally:
        process.kill()  # SIGKILL: no cleanup, no acknowledgement
        with anyio.fail_after(10, shield=True):
            await process.aclose()
    assert process.returncode == -signal.SIGKILL
    assert await client.execute("GET", ready_key) == enqueued.entry_id.encode()
    assert await pending_rows(client, queue.keys) == [(enqueued.entry_id, "doomed", 1)]

    attempts: list[int] = []

    async def handler(job: Job[str]) -> Outcome:
        attempts.append(job.attempt)
        return ACK

    options = fast_options(visibility_timeout=FAST)
    async with running_worker(client, queue.name, handler, options=options) as worker:
        stats = worker.statistics(queue.name)
        await wait_until(lambda: stats.acked == 1)
        assert stats.recovered == 1

    assert attempts == [2]
    completed = await events_of_kind(client, queue.keys, "completed")
    assert [(e.job_id, e.entry_id, e.attempt) for e in completed] == [
        ("crash", enqueued.entry_id, 2)
    ]
    assert await pending_rows(client, queue.keys) == []


async def delivered(
    client: RedisClient,
    queue: JobQueue[str],
    make_runtime: Callable[..., QueueRuntime],
    consumer: str,
    count: int,
) -> tuple[QueueRuntime, list[Delivery]]:
    await create_group(client, queue.keys)
    rt = make_runtime(queue.name, consumer=consumer)
    return rt, await deliver(client, queue.keys, consumer, count)


async def test_repeating_a_committed_completion_writes_nothing(
    client: RedisClient, queue: JobQueue[str], make_runtime: Callable[..., QueueRuntime]
) -> None:
    """A crash after the completion script ran but before its reply arrived: the retry."""
    await queue.enqueue_many([("a", "1"), ("b", "2")])
    rt, (a, b) = await delivered(client, queue, make_runtime, "c1", 2)
    batch = [Completion(a, "ack"), Completion(b, "dead", "explicit")]

    assert await commit(rt, batch) == [1, 1]
    assert await commit(rt, batch) == [0, 0]

    assert rt.stats.acked == 1 and rt.stats.dead_lettered == 1
    assert rt.stats.stale_completions == 2
    events = await all_events(client, queue.keys)
    assert [(e.kind, e.job_id) for e in events] == [("completed", "a"), ("dead-letter", "b")]
    assert await client.execute("XLEN", queue.keys.dead) == 1
    assert await pending_rows(client, queue.keys) == []


async def test_completion_is_fenced_by_consumer_and_attempt(
    client: RedisClient, queue: JobQueue[str], make_runtime: Callable[..., QueueRuntime]
) -> None:
    await queue.enqueue_many([("a", "1"), ("b", "2"), ("c", "3")])
    rt, (a, b, c) = await delivered(client, queue, make_runtime, "c1", 3)
    # b is recovered by the same consumer name (delivery count 2): attempt 1 is now stale.
    await client.execute("XCLAIM", queue.keys.ready, CONSUMER_GROUP, "c1", 0, b.entry_id)
    other = make_runtime(queue.name, consumer="c2")

    assert await commit(other, [Completion(a, "ack")]) == [0]  # wrong consumer
    assert await commit(rt, [Completion(b, "ack")]) == [0]  # old attempt
    assert await commit(rt, [Completion(c, "dead", "explicit")]) == [1]
    fresh_b = Delivery(b.entry_id, b.fields, 2)
    assert await commit(rt, [Completion(a, "ack"), Completion(fresh_b, "ack")]) == [1, 1]

    completed = await events_of_kind(client, queue.keys, "completed")
    assert [(e.job_id, e.attempt) for e in completed] == [("a", 1), ("b", 2)]
    assert len(await events_of_kind(client, queue.keys, "dead-letter")) == 1


async def test_stale_progress_and_log_write_nothing(
    client: RedisClient, queue: JobQueue[str], make_runtime: Callable[..., QueueRuntime]
) -> None:
    await queue.enqueue("j", "x")
    rt, (delivery,) = await delivered(client, queue, make_runtime, "c1", 1)
    job: Job[str] = Job(rt, delivery, "x")
    assert await job.report_progress(10)
    assert await job.log("first")

    await steal(client, queue, delivery.entry_id)
    with anyio.CancelScope() as scope:
        job.cancel_scope = scope
        assert await job.report_progress(20) is False
    assert scope.cancel_called and job.lease_lost
    stale: Job[str] = Job(rt, delivery, "x")
    assert await stale.log("second") is False
    assert rt.stats.leases_lost == 2

    progress = await events_of_kind(client, queue.keys, "progress")
    assert [e.percent for e in progress] == [10]
    assert await queue.get_logs("j") == ["first"]


async def test_progress_after_acknowledgement_or_deletion_is_refused(
    client: RedisClient, queue: JobQueue[str], make_runtime: Callable[..., QueueRuntime]
) -> None:
    await queue.enqueue_many([("a", "1"), ("b", "2")])
    rt, (a, b) = await delivered(client, queue, make_runtime, "c1", 2)
    assert await commit(rt, [Completion(a, "ack")]) == [1]
    assert await Job(rt, a, "1").report_progress(99) is False
    # b's body is deleted while it is still pending for this very delivery
    assert await client.execute("XDEL", queue.keys.ready, b.entry_id) == 1
    assert await Job(rt, b, "2").report_progress(99) is False
    assert await events_of_kind(client, queue.keys, "progress") == []
