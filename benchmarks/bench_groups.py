"""Grouped job throughput: one worker process draining jobs spread over 1, 100 and 10,000
application groups (fair selection, one job per group visit, leases taken and released).

    python benchmarks/bench_groups.py [--redis-url URL] [--backend trio|asyncio] [--jobs N]

Without --redis-url an embedded valkey-server (no persistence) is started. Jobs are staged
first (not timed); the figure is staged-and-due -> acknowledged with a no-op handler, and the
round trips are counted on the worker's client while it drains.
"""

from __future__ import annotations

import argparse
import time
import uuid

import anyio
from _common import cleanup, print_table, run_benchmark

from respire_actors import (
    ACK,
    BytesCodec,
    Job,
    JobEnqueueOptions,
    JobQueue,
    QueueOptions,
    Worker,
    WorkerOptions,
    connect,
)


async def bench_groups(url: str, n: int, groups: int, concurrency: int) -> tuple[float, float]:
    async with connect(url) as producer:
        q = JobQueue(producer, f"bench-{uuid.uuid4().hex[:8]}", BytesCodec())
        per_group: dict[int, list[tuple[str, bytes]]] = {}
        for i in range(n):
            per_group.setdefault(i % groups, []).append((f"j{i}", b"x"))
        for g, jobs in per_group.items():
            await q.enqueue_scheduled_many(jobs, JobEnqueueOptions(group=f"tenant-{g}"))
        done = anyio.Event()
        count = 0

        async def handler(job: Job[bytes]):
            nonlocal count
            count += 1
            if count == n:
                done.set()
            return ACK

        async with connect(url) as client:
            worker = Worker()
            worker.register(
                q.name,
                handler,
                BytesCodec(),
                WorkerOptions(consumer_count=concurrency, read_batch=concurrency),
                queue_options=QueueOptions(
                    scheduling_batch_size=64,
                    scheduling_poll_interval=0.05,
                ),
            )
            async with anyio.create_task_group() as tg:
                before = client.round_trips
                t = time.perf_counter()
                await tg.start(worker.run, client)
                await done.wait()
                elapsed = time.perf_counter() - t
                while worker.statistics(q.name).acked < n:  # noqa: ASYNC110 - counter
                    await anyio.sleep(0.01)
                trips = client.round_trips - before
                await worker.stop()
                tg.cancel_scope.cancel()
        await cleanup(producer, q)
    return n / elapsed, trips / n


async def run(url: str, jobs: int) -> None:
    rows = []
    for groups in (1, 100, 10_000):
        rate, trips = await bench_groups(url, jobs, groups, 64)
        rows.append(
            (f"grouped, {groups:,} groups", f"{rate:,.0f} jobs/s, {trips:.2f} round trips/job")
        )
    print_table(rows)


def _options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--jobs", type=int, default=20000)


if __name__ == "__main__":
    run_benchmark(__doc__, lambda url, a: run(url, a.jobs), _options)
