"""Queue-wide pause and resume (spec: "Queue-wide pause and rate limits"): persistent state,
atomic events, idempotence, and what pause does and does not stop."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import anyio
import pytest
from jobs_helpers import (
    all_events,
    events_of_kind,
    fast_options,
    running_worker,
    wait_until,
    wait_until_async,
)
from sched_helpers import scheduling_worker, xlen

from respire_actors.errors import WrongKeyType
from respire_actors.jobs import ACK, Job, JobEnqueueOptions, JobQueue, QueueState
from respire_actors.redis.client import RedisClient

pytestmark = pytest.mark.anyio


async def test_pause_and_resume_report_changes_and_emit_one_event_each(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    assert await queue.get_state() == QueueState(paused=False, rate_limit_hits=0)
    assert await queue.pause() is True
    assert await queue.pause() is False
    assert (await queue.get_state()).paused is True
    assert await queue.resume() is True
    assert await queue.resume() is False
    assert (await queue.get_state()).paused is False
    events = await all_events(client, queue.keys)
    assert [e.kind for e in events] == ["paused", "resumed"]
    for event in events:
        assert (event.job_id, event.entry_id, event.attempt) == ("", "0-0", 0)


async def test_resume_of_a_never_paused_queue_changes_nothing(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    assert await queue.resume() is False
    assert await all_events(client, queue.keys) == []
    assert await client.execute("EXISTS", queue.keys.control) == 0


async def test_pause_state_is_shared_by_independent_queue_objects(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    other = JobQueue(client, queue.name, queue.codec)
    assert await queue.pause() is True
    assert (await other.get_state()).paused is True
    assert await other.pause() is False
    assert await other.resume() is True
    assert len(await events_of_kind(client, queue.keys, "paused")) == 1


async def test_pause_refuses_a_wrong_control_key_type_and_writes_nothing(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    await client.execute("SET", queue.keys.control, "x")
    with pytest.raises(WrongKeyType):
        await queue.pause()
    assert await client.execute("EXISTS", queue.keys.events) == 0


async def test_paused_workers_admit_nothing_until_resumed_and_enqueue_continues(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    """Paused before the worker starts: startup replay is refused (so reads wait), and
    nothing is admitted until resume."""
    seen: list[str] = []

    async def handler(job: Job[str]) -> Any:
        seen.append(job.id)
        return ACK

    assert await queue.pause()
    await queue.enqueue("a", "x")  # enqueue continues while paused
    async with running_worker(client, queue.name, handler) as worker:
        stats = worker.statistics(queue.name)
        # paused at start-up: replay is refused, so the reader has not started reading yet
        await wait_until(lambda: stats.denied_claims >= 2)
        await queue.enqueue("b", "y")
        await wait_until(lambda: stats.denied_claims >= 4)
        assert seen == []
        assert stats.admitted == 0
        assert await queue.resume()
        await wait_until(lambda: sorted(seen) == ["a", "b"])


async def test_a_worker_started_paused_starts_within_its_poll_interval_of_the_resume(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    """The startup replay, refused while paused, is retried every poll interval: the reader
    (which waits for it) used to stay idle for a whole recovery interval after the resume."""
    seen: list[str] = []

    async def handler(job: Job[str]) -> Any:
        seen.append(job.id)
        return ACK

    assert await queue.pause()
    await queue.enqueue("a", "x")
    options = fast_options(
        poll_interval=timedelta(milliseconds=100), recovery_interval=timedelta(seconds=30)
    )
    async with running_worker(client, queue.name, handler, options=options) as worker:
        stats = worker.statistics(queue.name)
        await wait_until(lambda: stats.denied_claims >= 1)
        assert await queue.resume()
        with anyio.fail_after(5):  # a recovery interval is 30 s
            await wait_until(lambda: seen == ["a"])


async def test_reads_of_a_running_worker_are_refused_while_paused(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    seen: list[str] = []

    async def handler(job: Job[str]) -> Any:
        seen.append(job.id)
        return ACK

    async with running_worker(client, queue.name, handler) as worker:
        stats = worker.statistics(queue.name)
        await wait_until(lambda: stats.read_calls >= 1)
        assert await queue.pause()
        await queue.enqueue("a", "x")  # wakes the blocked reader, whose read is refused
        await wait_until(lambda: stats.paused_reads >= 2)
        assert seen == [] and stats.admitted == 0
        assert await queue.resume()
        await wait_until(lambda: seen == ["a"])


async def test_pause_does_not_interrupt_a_running_handler(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    started, release = anyio.Event(), anyio.Event()

    async def handler(job: Job[str]) -> Any:
        started.set()
        await release.wait()
        return ACK

    await queue.enqueue("a", "x")
    async with running_worker(client, queue.name, handler) as worker:
        with anyio.fail_after(10):
            await started.wait()
        assert await queue.pause()
        release.set()
        await wait_until(lambda: worker.statistics(queue.name).acked == 1)
    assert len(await events_of_kind(client, queue.keys, "completed")) == 1


async def test_scheduling_continues_while_paused(client: RedisClient, queue: JobQueue[str]) -> None:
    seen: list[str] = []

    async def handler(job: Job[str]) -> Any:
        seen.append(job.id)
        return ACK

    assert await queue.pause()
    async with scheduling_worker(client, queue.name, handler) as worker:
        await queue.enqueue_scheduled("s", "x", JobEnqueueOptions(priority=3))
        await wait_until(lambda: worker.statistics(queue.name).promoted == 1)
        assert await xlen(client, queue.keys.ready) == 1
        await wait_until(lambda: worker.statistics(queue.name).denied_claims >= 2)
        assert seen == []
        await queue.resume()
        await wait_until(lambda: seen == ["s"])


async def test_recovery_respects_pause(client: RedisClient, queue: JobQueue[str]) -> None:
    """An abandoned delivery is not recovered while the queue is paused."""
    from jobs_helpers import create_group, deliver, fast_options, pending_rows

    await queue.enqueue("a", "x")
    await create_group(client, queue.keys)
    (abandoned,) = await deliver(client, queue.keys, "gone")
    assert await queue.pause()
    seen: list[int] = []

    async def handler(job: Job[str]) -> Any:
        seen.append(job.attempt)
        return ACK

    options = fast_options(visibility_timeout=0.05)
    async with running_worker(client, queue.name, handler, options=options) as worker:
        # every recovery pass (50 ms apart) is refused while paused
        await wait_until(lambda: worker.statistics(queue.name).denied_claims >= 4)
        assert seen == []
        assert await pending_rows(client, queue.keys) == [(abandoned.entry_id, "gone", 1)]
        await queue.resume()
        await wait_until(lambda: seen == [2])
    await wait_until_async(lambda: _no_pending(client, queue))


async def _no_pending(client: RedisClient, queue: JobQueue[str]) -> bool:
    from jobs_helpers import pending_count

    return await pending_count(client, queue.keys) == 0
