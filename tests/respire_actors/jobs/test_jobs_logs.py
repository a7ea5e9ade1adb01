"""Per-job logs and progress reports from inside a handler (spec: "Per-job logs",
"Progress and completion observers")."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from jobs_helpers import (
    create_group,
    deliver,
    events_of_kind,
    fast_options,
    forbid_commands,
    running_worker,
    wait_until,
    wait_until_async,
)

from respire_actors.actors.runtime import QueueRuntime
from respire_actors.codecs import StrCodec
from respire_actors.errors import ValidationError
from respire_actors.jobs import ACK, Job, JobQueue, LogPolicy, Outcome
from respire_actors.redis.client import RedisClient

pytestmark = pytest.mark.anyio


async def live_job(
    client: RedisClient,
    queue: JobQueue[str],
    make_runtime: Callable[..., QueueRuntime],
    policy: LogPolicy | None = None,
    job_id: str = "j",
) -> Job[str]:
    """A current delivery of a freshly enqueued job, as a handler would hold it."""
    await queue.enqueue(job_id, "x")
    await create_group(client, queue.keys)
    rt = make_runtime(queue.name, consumer="c1", options=fast_options(logs=policy or LogPolicy()))
    (delivery,) = await deliver(client, queue.keys, "c1")
    return Job(rt, delivery, "x")


async def test_handler_logs_are_read_back_in_order(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    await queue.enqueue_many([("logged", "x"), ("silent", "y")])

    async def handler(job: Job[str]) -> Outcome:
        if job.id == "logged":
            assert await job.log("started")
            assert await job.log("halfway: ünïcode ✓")
            assert await job.log("")
        return ACK

    async with running_worker(client, queue.name, handler) as worker:
        await wait_until(lambda: worker.statistics(queue.name).acked == 2)

    assert await queue.get_logs("logged") == ["started", "halfway: ünïcode ✓", ""]
    assert await queue.get_logs("logged", count=2) == ["halfway: ünïcode ✓", ""]
    # A job that never logs adds no key.
    assert await queue.get_logs("silent") == []
    assert await client.execute("EXISTS", queue.keys.logs("silent")) == 0


async def test_the_line_cap_drops_the_oldest_lines(
    client: RedisClient, queue: JobQueue[str], make_runtime: Callable[..., QueueRuntime]
) -> None:
    job = await live_job(client, queue, make_runtime, LogPolicy(max_lines=3))
    for i in range(5):
        assert await job.log(f"line {i}")
    assert await queue.get_logs("j") == ["line 2", "line 3", "line 4"]
    assert await client.execute("LLEN", queue.keys.logs("j")) == 3


@pytest.mark.parametrize(
    "line",
    ["ééa", "abcde", b"abc", 42, None, "bad\ud800surrogate"],
    ids=["multibyte-over", "ascii-over", "bytes", "int", "none", "surrogate"],
)
async def test_invalid_lines_are_rejected_before_sending(
    client: RedisClient,
    queue: JobQueue[str],
    make_runtime: Callable[..., QueueRuntime],
    line: Any,
) -> None:
    job = await live_job(client, queue, make_runtime, LogPolicy(max_line_bytes=4))
    with forbid_commands(client), pytest.raises(ValidationError):
        await job.log(line)
    assert await queue.get_logs("j") == []
    # At the limit exactly (4 UTF-8 bytes) a line is kept whole, never truncated.
    assert await job.log("éé")
    assert await queue.get_logs("j") == ["éé"]


async def test_retention_is_set_once_and_never_extended(
    client: RedisClient, queue: JobQueue[str], make_runtime: Callable[..., QueueRuntime]
) -> None:
    job = await live_job(client, queue, make_runtime, LogPolicy(retention=timedelta(seconds=60)))
    key = queue.keys.logs("j")
    assert await job.log("first")
    assert 55_000 < await client.execute("PTTL", key) <= 60_000
    # Shorten it by hand: a later append that re-armed the retention would undo this.
    assert await client.execute("PEXPIRE", key, 5_000) == 1
    assert await job.log("second")
    assert 0 < await client.execute("PTTL", key) <= 5_000
    assert await queue.get_logs("j") == ["first", "second"]


async def test_an_expired_list_starts_again_with_a_fresh_retention(
    client: RedisClient, queue: JobQueue[str], make_runtime: Callable[..., QueueRuntime]
) -> None:
    job = await live_job(client, queue, make_runtime, LogPolicy(retention=timedelta(seconds=60)))
    key = queue.keys.logs("j")
    assert await job.log("old")
    await client.execute("PEXPIRE", key, 1)

    async def expired() -> bool:
        return not await client.execute("EXISTS", key)

    await wait_until_async(expired, timeout=5)
    assert await job.log("new")
    assert await queue.get_logs("j") == ["new"]
    assert 55_000 < await client.execute("PTTL", key) <= 60_000


@pytest.mark.parametrize("count", [0, -1, 1001, True, "5", 2.0])
async def test_get_logs_count_is_validated(
    client: RedisClient, queue: JobQueue[str], count: Any
) -> None:
    with forbid_commands(client), pytest.raises(ValidationError):
        await queue.get_logs("j", count=count)


async def test_get_logs_bounds(queue: JobQueue[str]) -> None:
    assert await queue.get_logs("never-logged", count=1) == []
    assert await queue.get_logs("never-logged", count=1000) == []
    with pytest.raises(ValidationError):
        await queue.get_logs("")


@pytest.mark.parametrize("percent", [-1, 101, 50.5, True, False, "50", None])
async def test_progress_is_validated_before_sending(
    client: RedisClient,
    queue: JobQueue[str],
    make_runtime: Callable[..., QueueRuntime],
    percent: Any,
) -> None:
    job = await live_job(client, queue, make_runtime)
    with forbid_commands(client), pytest.raises(ValidationError):
        await job.report_progress(percent)
    assert not job.lease_lost
    assert await events_of_kind(client, queue.keys, "progress") == []


async def test_progress_bounds_are_accepted_and_need_not_be_monotonic(
    client: RedisClient, queue: JobQueue[str], make_runtime: Callable[..., QueueRuntime]
) -> None:
    job = await live_job(client, queue, make_runtime)
    for percent in (0, 100, 40):
        assert await job.report_progress(percent)
    progress = await events_of_kind(client, queue.keys, "progress")
    assert [(e.percent, e.entry_id, e.attempt) for e in progress] == [
        (0, job.entry_id, 1),
        (100, job.entry_id, 1),
        (40, job.entry_id, 1),
    ]


# -- a TTL-refused line is not a lost lease (issue 8, item 6) ---------------------------------


async def test_a_log_after_the_ttl_returns_false_without_cancelling(
    client: RedisClient, queue: JobQueue[str], make_runtime: Callable[..., QueueRuntime]
) -> None:
    """Before the fix the TTL refusal looked like a stale fence: the handler's scope was
    cancelled and the lease counted as lost."""
    import anyio

    job = await live_job(client, queue, make_runtime)
    now = await client.time_ms()
    job.delivery.fields = {**job.delivery.fields, b"_respire.job.expires_at": str(now - 1).encode()}
    with anyio.CancelScope() as scope:
        job.cancel_scope = scope
        assert await job.log("too late") is False
        await anyio.lowlevel.checkpoint()
    assert not scope.cancelled_caught
    assert not job.lease_lost
    assert job._rt.stats.leases_lost == 0
    assert await queue.get_logs("j") == []


async def test_a_handler_logging_past_its_ttl_still_completes(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    import anyio

    from respire_actors.jobs import JobEnqueueOptions, QueueOptions, Worker

    await queue.enqueue_scheduled("short", "x", JobEnqueueOptions(ttl=3.0))
    logged: list[bool] = []

    async def handler(job: Job[str]) -> Outcome:
        assert job.expires_at is not None
        # sleep past the TTL (server clock), then log
        await anyio.sleep((job.expires_at - await client.time_ms()) / 1000 + 0.05)
        assert await client.time_ms() >= job.expires_at
        logged.append(await job.log("after the ttl"))
        return ACK

    worker = Worker()
    worker.register(
        queue.name,
        handler,
        StrCodec(),
        fast_options(),
        queue_options=QueueOptions(scheduling_poll_interval=0.05),
    )
    async with anyio.create_task_group() as tg:
        await tg.start(worker.run, client)
        stats = worker.statistics(queue.name)
        await wait_until(lambda: stats.acked == 1, timeout=20)
        assert stats.leases_lost == 0
        await worker.stop()
    assert logged == [False]
    assert [e.kind for e in await events_of_kind(client, queue.keys, "completed")] == ["completed"]


async def test_a_stale_log_still_cancels_the_handler(
    client: RedisClient, queue: JobQueue[str], make_runtime: Callable[..., QueueRuntime]
) -> None:
    import anyio

    job = await live_job(client, queue, make_runtime)
    await client.execute("XACK", queue.keys.ready, "respire", job.entry_id)
    with anyio.CancelScope() as scope:
        job.cancel_scope = scope
        assert await job.log("stale") is False
        await anyio.lowlevel.checkpoint()
    assert scope.cancelled_caught
    assert job.lease_lost
