"""Recurring schedulers as real processes (issue 12): three processes racing on one schedule
commit each tick once; a scheduler SIGKILLed right after its tick scripts ran (the replies
unread, the pass unfinished) leaves no duplicate when a new one takes over; a lost tick reply
is not repeated either."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta

import anyio
import anyio.abc
import pytest
from helpers.proxy import open_fault_proxy
from jobs_helpers import text, wait_until_async

from respire_actors.errors import RedisUnavailable
from respire_actors.jobs import CATCH_UP, JobQueue
from respire_actors.jobs.queue import _pairs
from respire_actors.redis.client import ConnectionSettings, RedisClient, connect
from respire_actors.testing import FakeClock

pytestmark = pytest.mark.anyio

HOUR = timedelta(hours=1)
T0 = datetime(2030, 1, 1, tzinfo=UTC)

# argv: url, queue, fixed clock (ISO), budget per pass, go-key ("" = start at once),
# record key, "stop-when-drained" or "forever"
SCHEDULER_SCRIPT = r"""
import sys, anyio
from datetime import datetime
from respire_actors import connect, StrCodec, JobQueue
from respire_actors.testing import FakeClock

url, name, now, budget, go, record, mode = sys.argv[1:8]

async def main():
    async with connect(url) as client:
        queue = JobQueue(client, name, StrCodec())
        clock = FakeClock(datetime.fromisoformat(now))
        scheduler = queue.scheduler(clock=clock)
        if go:
            await client.execute("INCR", go + ":ready")
            while not await client.execute("GET", go):
                await anyio.sleep(0.005)
        idle = 0
        while True:
            result = await scheduler.run_pass(int(budget))
            if result.enqueued:
                await client.execute("INCRBY", record, result.enqueued)
            if mode == "stop-when-drained":
                drained = all(
                    s.next_due is None or s.next_due > clock.now()
                    for s in (await scheduler.list(count=1000)).schedules
                )
                idle = idle + 1 if drained else 0
                if idle >= 3:
                    return

anyio.run(main)
"""


@asynccontextmanager
async def scheduler_process(*args: str) -> AsyncIterator[anyio.abc.Process]:
    proc = await anyio.open_process(
        [sys.executable, "-c", SCHEDULER_SCRIPT, *args], stdout=subprocess.DEVNULL
    )
    try:
        yield proc
    finally:
        if proc.returncode is None:
            proc.kill()
        with anyio.fail_after(20, shield=True):
            await proc.wait()
            await proc.aclose()


async def ticks(client: RedisClient, queue: JobQueue[str]) -> list[tuple[str, int]]:
    rows = await client.execute("XRANGE", queue.keys.ready, "-", "+")
    out = []
    for _, flat in rows or []:
        fields = {text(k): text(v) for k, v in _pairs(flat)}
        out.append((fields["_respire.job.schedule"], int(fields["_respire.job.tick"])))
    return out


def ms(when: datetime) -> int:
    return int(when.timestamp() * 1000)


async def test_three_scheduler_processes_racing_commit_each_tick_once(
    client: RedisClient, server_url: str, queue: JobQueue[str]
) -> None:
    clock = FakeClock(T0)
    minute = timedelta(minutes=1)
    await queue.scheduler(clock=clock).upsert("race", "x", interval=minute, missed=CATCH_UP)
    now = (T0 + 600 * minute).isoformat()
    go, record = queue.keys.custom("go"), queue.keys.custom("record")
    args = (server_url, queue.name, now, "2", go, record, "stop-when-drained")
    async with (
        scheduler_process(*args) as a,
        scheduler_process(*args) as b,
        scheduler_process(*args) as c,
    ):

        async def all_ready() -> bool:
            return int(await client.execute("GET", go + ":ready") or 0) == 3

        await wait_until_async(all_ready, timeout=60)
        await client.execute("SET", go, "1")
        with anyio.fail_after(60):
            for proc in (a, b, c):
                assert await proc.wait() == 0
    committed = await ticks(client, queue)
    assert committed == [("race", ms(T0 + k * minute)) for k in range(1, 601)]
    assert int(await client.execute("GET", record)) == 600  # the processes' own counts agree


async def test_a_scheduler_killed_right_after_its_tick_scripts_leaves_no_duplicate(
    client: RedisClient, server_url: str, queue: JobQueue[str]
) -> None:
    clock = FakeClock(T0)
    scheduler = queue.scheduler(clock=clock)
    for i in range(20):
        await scheduler.upsert(f"s{i:02d}", "x", interval=HOUR, missed=CATCH_UP)
    now = (T0 + 30 * HOUR).isoformat()  # 20 schedules x 30 overdue ticks
    record = queue.keys.custom("record")
    args = (server_url, queue.name, now, "64", "", record, "forever")
    for threshold in (37, 211, 433):
        async with scheduler_process(*args) as proc:

            async def past_threshold(n: int = threshold) -> bool:
                return int(await client.execute("XLEN", queue.keys.ready)) >= n

            await wait_until_async(past_threshold, timeout=60)
            proc.send_signal(signal.SIGKILL)  # mid-pipeline: replies of committed ticks unread
            await proc.wait()
        committed = await ticks(client, queue)
        assert len(committed) == len(set(committed)), "a tick was committed twice"
    # a fresh scheduler finishes the backlog: every tick exactly once, in order per schedule
    args = (server_url, queue.name, now, "64", "", record, "stop-when-drained")
    async with scheduler_process(*args) as proc:
        with anyio.fail_after(60):
            assert await proc.wait() == 0
    committed = await ticks(client, queue)
    assert len(committed) == len(set(committed)) == 20 * 30
    for i in range(20):
        mine = [t for s, t in committed if s == f"s{i:02d}"]
        assert mine == [ms(T0 + k * HOUR) for k in range(1, 31)]


async def test_a_lost_tick_reply_is_not_repeated(
    client: RedisClient, server_url: str, queue: JobQueue[str]
) -> None:
    settings = ConnectionSettings.from_url(server_url)
    clock = FakeClock(T0)
    await queue.scheduler(clock=clock).upsert("lost", "x", interval=HOUR)
    clock.advance(HOUR)
    async with open_fault_proxy(settings.port) as proxy, connect(proxy.url) as through:
        lossy = JobQueue(through, queue.name, queue.codec).scheduler(clock=clock)
        proxy.cut_on_reply(lambda chunk: b"committed" in chunk)
        with pytest.raises(RedisUnavailable):
            await lossy.run_due()
        assert proxy.cut_done.is_set()
    assert await ticks(client, queue) == [("lost", ms(T0 + HOUR))]  # the script ran
    for _ in range(3):
        assert await queue.scheduler(clock=clock).run_due() == 0
    assert len(await ticks(client, queue)) == 1
