"""trio's MockClock drives the hosted recurring ticker through a LoopClock (issue 12): jumping
the mock clock an hour enqueues the hourly tick without real sleeping."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import anyio
import trio
from helpers.keyspace import release_keys
from helpers.waiting import wait_until
from trio.testing import MockClock

from respire_actors.codecs import StrCodec
from respire_actors.jobs import Job, JobQueue, RecurringOptions, Worker, WorkerOptions
from respire_actors.redis.client import connect
from respire_actors.testing import LoopClock

T0 = datetime(2030, 1, 1, tzinfo=UTC)


def test_jumping_trio_mock_clock_wakes_the_ticker(server_url: str, unique_name: str) -> None:
    mock = MockClock(rate=1)  # real speed, plus jumps
    seen: list[Job[str]] = []

    async def handler(job: Job[str]) -> None:
        seen.append(job)

    async def main() -> None:
        async with connect(server_url) as client:
            try:
                clock = LoopClock(T0)
                queue = JobQueue(client, unique_name, StrCodec())
                await queue.scheduler(clock=clock).upsert(
                    "hourly", "x", interval=timedelta(hours=1)
                )
                worker = Worker()
                worker.register(
                    unique_name,
                    handler,
                    StrCodec(),
                    WorkerOptions(poll_interval=timedelta(milliseconds=200)),
                    recurring=RecurringOptions(poll_interval=timedelta(days=1), clock=clock),
                )
                async with anyio.create_task_group() as tg:
                    await tg.start(worker.run, client)
                    stats = worker.ticker_statistics(unique_name)
                    await wait_until(lambda: stats.passes == 1)
                    assert seen == []
                    mock.jump(3600)
                    await wait_until(lambda: len(seen) == 1)
                    await worker.stop()
                assert seen[0].tick == T0 + timedelta(hours=1)
            finally:
                await release_keys(client, f"*{unique_name}*")

    trio.run(main, clock=mock)
