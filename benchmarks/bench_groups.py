"""Grouped job throughput: one worker process draining jobs spread over 1, 100 and 10,000
application groups (fair selection, one job per group visit, leases taken and released).

    python benchmarks/bench_groups.py [--redis-url URL] [--backend trio|asyncio] [--jobs N]

Without --redis-url an embedded valkey-server (no persistence) is started. Jobs are staged
first (not timed); the figure is staged-and-due -> acknowledged with a no-op handler, and the
round trips are counted on the worker's client while it drains.
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time
import uuid
from pathlib import Path

import anyio

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
from respire_actors.embedded import EmbeddedConfig, open_embedded_server


async def _cleanup(client, queue: JobQueue[bytes]) -> None:
    cursor = 0
    pattern = queue.keys.base.replace("{", "[{]").replace("}", "[}]") + "*"
    while True:
        cursor, keys = await client.execute("SCAN", cursor, "MATCH", pattern, "COUNT", 1000)
        if keys:
            await client.execute("UNLINK", *keys)
        if int(cursor) == 0:
            return


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
        await _cleanup(producer, q)
    return n / elapsed, trips / n


async def run(url: str, jobs: int) -> None:
    rows = []
    for groups in (1, 100, 10_000):
        rate, trips = await bench_groups(url, jobs, groups, 64)
        rows.append(
            (f"grouped, {groups:,} groups", f"{rate:,.0f} jobs/s, {trips:.2f} round trips/job")
        )
    width = max(len(r[0]) for r in rows)
    print(f"{'measure':<{width}}  result")
    print(f"{'-' * width}  {'-' * 40}")
    for name, value in rows:
        print(f"{name:<{width}}  {value}")


async def main(args: argparse.Namespace) -> None:
    if args.redis_url:
        await run(args.redis_url, args.jobs)
        return
    with tempfile.TemporaryDirectory() as tmp:
        async with open_embedded_server(
            EmbeddedConfig(data_dir=Path(tmp), persistent=False)
        ) as url:
            await run(url, args.jobs)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--redis-url", default=os.environ.get("RESPIRE_REDIS_URL"))
    parser.add_argument("--backend", choices=("trio", "asyncio"), default="trio")
    parser.add_argument("--jobs", type=int, default=20000)
    a = parser.parse_args()
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}, backend {a.backend}"
    )
    anyio.run(main, a, backend=a.backend)
