"""Queue-wide fixed-window rate limits (spec: "Queue-wide pause and rate limits")."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from datetime import timedelta
from typing import Any

import anyio
import pytest
from jobs_helpers import (
    create_group,
    deliver,
    events_of_kind,
    pending_rows,
    text,
    wait_until_async,
)
from sched_helpers import sched_options, scheduling_worker

from respire_actors.errors import ConfigurationError, ValidationError
from respire_actors.jobs import Job, JobQueue, QueueState, RateLimit
from respire_actors.jobs.options import CONSUMER_GROUP
from respire_actors.jobs.source import JobSource
from respire_actors.redis.client import RedisClient

pytestmark = pytest.mark.anyio

DAY = timedelta(days=1)  # windows are aligned to the server clock: a day never ends mid-test


def source_of(queue: JobQueue[str]) -> JobSource:
    return JobSource(queue.client, queue.keys, queue.keys.dead, CONSUMER_GROUP)


def test_rate_limit_is_validated() -> None:
    with pytest.raises(ValidationError):
        RateLimit(0, 1)
    with pytest.raises(ValidationError):
        RateLimit(1, 0)
    with pytest.raises(ValidationError):
        RateLimit(True, 1)
    assert RateLimit(3, 0.0015).window_ms == 2


async def test_reads_are_limited_per_window_and_denials_counted(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    assert await queue.set_rate_limit(RateLimit(2, DAY)) is True
    assert await queue.set_rate_limit(RateLimit(2, DAY)) is False
    await queue.enqueue_many([(f"j{i}", "x") for i in range(5)])
    await create_group(client, queue.keys)
    source = source_of(queue)
    # one read takes at most a tenth of the window's permits (here 1 of 2), so the readers of
    # several processes share a window (this used to admit both at once)
    first = await source.read("c1", 5)
    assert first.status == "ok" and len(first.deliveries) == 1
    assert first.pace_ms == 43_200_000  # a tenth of the window per slice: 1 permit per 12 h
    second = await source.read("c1", 5)
    assert second.status == "ok" and len(second.deliveries) == 1
    denied = await source.read("c1", 5)
    assert denied.status == "limited" and 0 < denied.retry_after_ms <= 86_400_000
    assert await queue.get_state() == QueueState(False, 1, RateLimit(2, DAY))
    # denial changed no entry: three never-delivered entries remain
    assert len(await pending_rows(client, queue.keys)) == 2
    # raising the limit keeps the two admissions already counted in this window
    assert await queue.set_rate_limit(RateLimit(3, DAY)) is True
    third = await source.read("c1", 5)
    assert third.status == "ok" and len(third.deliveries) == 1
    # a longer window moves the usage to the window containing now
    assert await queue.set_rate_limit(RateLimit(3, 2 * DAY)) is True
    assert (await source.read("c1", 5)).status == "limited"
    assert (await queue.get_state()).rate_limit_hits == 2
    assert await queue.set_rate_limit(None) is True
    assert await queue.set_rate_limit(None) is False
    rest = await source.read("c1", 5)
    assert rest.status == "ok" and len(rest.deliveries) == 2
    assert (await queue.get_state()).rate_limit is None


async def test_recovery_is_limited_without_touching_the_entry(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    await queue.enqueue("a", "x")
    await create_group(client, queue.keys)
    (abandoned,) = await deliver(client, queue.keys, "gone")
    await queue.set_rate_limit(RateLimit(1, DAY))
    await client.execute("HSET", queue.keys.control, "rate.used", 1)
    ws = await client.execute("TIME")
    now = int(ws[0]) * 1000 + int(ws[1]) // 1000
    await client.execute("HSET", queue.keys.control, "rate.window_start", now - now % 86_400_000)
    source = source_of(queue)
    for mode in ("recover", "replay"):
        result = await source.claim("other" if mode == "recover" else "gone", mode, "0-0", 5, 0, 5)
        assert result.denied and result.retry_after_ms > 0
    assert await pending_rows(client, queue.keys) == [(abandoned.entry_id, "gone", 1)]
    assert (await queue.get_state()).rate_limit_hits == 2


async def test_recovered_entries_use_the_windows_permits(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    """Recovery takes one permit per entry it delivers, like a read: with one permit in the
    window one of two abandoned entries is recovered and the next page is denied (found by a
    mutation review: no test failed when recovery recorded no usage)."""
    await queue.enqueue_many([("a", "x"), ("b", "x")])
    await create_group(client, queue.keys)
    await deliver(client, queue.keys, "gone", 2)
    await queue.set_rate_limit(RateLimit(1, DAY))
    source = source_of(queue)
    first = await source.claim("other", "recover", "0-0", 5, 0, 5)
    assert not first.denied and len(first.deliveries) == 1
    assert [c for _, c, _ in await pending_rows(client, queue.keys)].count("other") == 1
    assert (await source.claim("other", "recover", "0-0", 5, 0, 5)).denied
    assert (await queue.get_state()).rate_limit_hits == 1


async def test_a_worker_with_a_different_startup_policy_refuses_to_start(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    from respire_actors.codecs import StrCodec
    from respire_actors.jobs import Worker

    async def handler(job: Job[str]) -> Any:
        return None

    await queue.set_rate_limit(RateLimit(5, 1))
    worker = Worker()
    worker.register(
        queue.name,
        handler,
        StrCodec(),
        queue_options=sched_options(rate_limit=RateLimit(6, 1)),
    )
    with pytest.raises(ConfigurationError, match="differs from the one stored"):
        await worker.run(client)
    assert (await queue.get_state()).rate_limit == RateLimit(5, timedelta(seconds=1))


async def test_a_startup_policy_is_stored_when_absent_and_accepted_when_equal(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    async def handler(job: Job[str]) -> Any:
        return None

    qo = sched_options(rate_limit=RateLimit(7, 2))
    async with scheduling_worker(client, queue.name, handler, queue_options=qo):
        pass
    assert (await queue.get_state()).rate_limit == RateLimit(7, timedelta(seconds=2))
    async with scheduling_worker(client, queue.name, handler, queue_options=qo):
        pass


WORKER_SCRIPT = r"""
import sys, anyio
from datetime import timedelta
from respire_actors import connect, StrCodec, Worker, WorkerOptions, QueueOptions, RateLimit
from respire_actors.redis.scripts import load

url, queue, record = sys.argv[1], sys.argv[2], sys.argv[3]
STAMP = '''
local row = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[2], ARGV[2], 1)[1]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('RPUSH', KEYS[2], string.format('%d', now - tonumber(row[3])))
return 1
'''

async def main():
    async with connect(url) as client:
        async def handler(job):
            await client.execute("EVAL", STAMP, 2, job._rt.job_keys.ready, record,
                                 "respire", job.entry_id)
        worker = Worker()
        worker.register(
            queue, handler, StrCodec(),
            WorkerOptions(consumer_count=4, poll_interval=timedelta(milliseconds=50),
                          recovery_interval=timedelta(milliseconds=50),
                          shutdown_grace=timedelta(seconds=1)),
            queue_options=QueueOptions(scheduling_poll_interval=timedelta(milliseconds=50),
                                       rate_limit=RateLimit(3, timedelta(milliseconds=400))),
        )
        print("starting", flush=True)
        await worker.run(client)

anyio.run(main)
"""


async def test_two_worker_processes_never_exceed_the_permits_of_any_window(
    client: RedisClient, server_url: str, queue: JobQueue[str]
) -> None:
    record = queue.keys.custom("admitted-at")
    total = 15
    await queue.enqueue_many([(f"j{i}", "x") for i in range(total)])
    procs = [
        await anyio.open_process(
            [sys.executable, "-c", WORKER_SCRIPT, server_url, queue.name, record],
            stdout=subprocess.DEVNULL,
        )
        for _ in range(2)
    ]
    try:

        async def all_done() -> bool:
            return len(await events_of_kind(client, queue.keys, "completed")) == total

        await wait_until_async(all_done, timeout=60)
    finally:
        for proc in procs:
            proc.terminate()
        with anyio.fail_after(20, shield=True):
            for proc in procs:
                await proc.wait()
                await proc.aclose()
    stamps = [int(text(v)) for v in await client.execute("LRANGE", record, 0, -1)]
    assert len(stamps) == total
    per_window = Counter(ms // 400 for ms in stamps)
    assert max(per_window.values()) <= 3, sorted(per_window.items())
    assert (await queue.get_state()).rate_limit_hits > 0
