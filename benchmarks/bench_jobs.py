"""Job queue benchmark: prints enqueue and processing throughput, latency and round trips.

    python benchmarks/bench_jobs.py [--redis-url URL] [--backend trio|asyncio] [--jobs N]

Without --redis-url an embedded valkey-server (no persistence) is started. Every figure uses
the real runtime: fencing, completion events and admission are on.
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid

import anyio
from _common import cleanup, print_table, run_benchmark, top_level_usec

from respire_actors import (
    ACK,
    BytesCodec,
    Job,
    JobQueue,
    QueueOptions,
    RateLimit,
    Worker,
    WorkerOptions,
    connect,
)
from respire_actors.jobs.source import JobSource


async def bench_enqueue(client, n: int) -> tuple[float, float]:
    q = JobQueue(client, f"bench-{uuid.uuid4().hex[:8]}", BytesCodec())
    single = min(n, 2000)
    t = time.perf_counter()
    for i in range(single):
        await q.enqueue(f"s{i}", b"x")
    single_rate = single / (time.perf_counter() - t)
    t = time.perf_counter()
    await q.enqueue_many((f"p{i}", b"x") for i in range(n))
    piped_rate = n / (time.perf_counter() - t)
    await cleanup(client, q)
    return single_rate, piped_rate


def _counting_handler(n: int):
    """A no-op handler that sets the returned event after its n-th job."""
    done = anyio.Event()
    count = 0

    async def handler(job: Job[bytes]):
        nonlocal count
        count += 1
        if count == n:
            done.set()
        return ACK

    return done, handler


async def server_usec(client) -> int:
    """Server CPU (µs) spent so far in the commands this runtime sends (``INFO commandstats``)."""
    return top_level_usec(await client.execute("INFO", "commandstats"))


SERVER_USEC_PER_JOB: dict[int, float] = {}
"""Server CPU per processed job (µs) of the last plain bench_process run, by concurrency."""


async def bench_process(
    client,
    n: int,
    concurrency: int,
    keep_results: float | None = None,
    queue_options: QueueOptions | None = None,
    rate_limit: RateLimit | None = None,
) -> tuple[float, float]:
    q = JobQueue(client, f"bench-{uuid.uuid4().hex[:8]}", BytesCodec())
    if rate_limit is not None:
        await q.set_rate_limit(rate_limit)
    await q.enqueue_many((f"j{i}", b"x") for i in range(n))
    done, handler = _counting_handler(n)
    usec_before = await server_usec(client)

    worker = Worker()
    worker.register(
        q.name,
        handler,
        BytesCodec(),
        WorkerOptions(
            consumer_count=concurrency,
            read_batch=max(concurrency, 32),
            keep_results=keep_results,
        ),
        queue_options=queue_options,
    )
    async with anyio.create_task_group() as tg:
        await tg.start(worker.run, client)
        before = client.round_trips
        t = time.perf_counter()
        await done.wait()
        elapsed = time.perf_counter() - t
        # let the completer commit the tail before counting
        while worker.statistics(q.name).acked < n:  # noqa: ASYNC110 - polling a counter
            await anyio.sleep(0.01)
        trips = client.round_trips - before
        # reading the stats costs one INFO call, noise next to n jobs
        if keep_results is None:
            SERVER_USEC_PER_JOB[concurrency] = (await server_usec(client) - usec_before) / n
        await worker.stop()
        tg.cancel_scope.cancel()
    await cleanup(client, q)
    return n / elapsed, trips / n


async def bench_promotion(client, n: int, batch: int) -> tuple[float, float]:
    """Delayed-job promotion alone: stage n due jobs, then time job_promote passes of ``batch``
    (one script call each) until everything is ready. Returns (jobs/s, ms per pass)."""
    q = JobQueue(client, f"bench-{uuid.uuid4().hex[:8]}", BytesCodec())
    await q.enqueue_scheduled_many((f"d{i}", b"x") for i in range(n))
    source = JobSource(client, q.keys, q.keys.dead, "respire")
    moved = passes = 0
    t = time.perf_counter()
    while moved < n:
        moved += (await source.promote(batch)).promoted
        passes += 1
    elapsed = time.perf_counter() - t
    await cleanup(client, q)
    return n / elapsed, elapsed * 1000 / passes


async def bench_scheduled_process(client, n: int, concurrency: int) -> float:
    """End to end: n zero-delay scheduled jobs promoted and processed by one worker."""
    q = JobQueue(client, f"bench-{uuid.uuid4().hex[:8]}", BytesCodec())
    done, handler = _counting_handler(n)

    worker = Worker()
    worker.register(
        q.name,
        handler,
        BytesCodec(),
        WorkerOptions(consumer_count=concurrency, read_batch=max(concurrency, 32)),
        # Promotion moves at most one batch per poll interval (so a due backlog cannot flood the
        # ready stream): 256 per 10 ms caps this row at 25,600 jobs/s.
        queue_options=QueueOptions(scheduling_batch_size=256, scheduling_poll_interval=0.01),
    )
    await q.enqueue_scheduled_many((f"s{i}", b"x") for i in range(n))
    async with anyio.create_task_group() as tg:
        t = time.perf_counter()
        await tg.start(worker.run, client)
        await done.wait()
        elapsed = time.perf_counter() - t
        await worker.stop()
        tg.cancel_scope.cancel()
    await cleanup(client, q)
    return n / elapsed


async def bench_latency(client, rate: int, seconds: float) -> tuple[float, float]:
    q = JobQueue(client, f"bench-{uuid.uuid4().hex[:8]}", BytesCodec())
    latencies: list[float] = []
    total = int(rate * seconds)
    done = anyio.Event()

    async def handler(job: Job[bytes]):
        latencies.append(time.perf_counter() - float(job.payload))
        if len(latencies) >= total:
            done.set()
        return ACK

    worker = Worker()
    worker.register(q.name, handler, BytesCodec(), WorkerOptions(consumer_count=16))
    async with anyio.create_task_group() as tg:
        await tg.start(worker.run, client)
        interval = 1 / rate
        start = time.perf_counter()
        for i in range(total):
            target = start + i * interval
            delay = target - time.perf_counter()
            if delay > 0:
                await anyio.sleep(delay)
            await q.enqueue(f"l{i}", str(time.perf_counter()).encode())
        with anyio.fail_after(30):
            await done.wait()
        await worker.stop()
        tg.cancel_scope.cancel()
    await cleanup(client, q)
    ms = sorted(x * 1000 for x in latencies)
    return statistics.median(ms), ms[int(len(ms) * 0.99) - 1]


async def run(url: str, jobs: int) -> None:
    async with connect(url) as client:
        info = await client.server_info()
        print(f"server: {info.describe()}")
        single, piped = await bench_enqueue(client, jobs)
        rows = [
            ("enqueue, one at a time", f"{single:,.0f} jobs/s"),
            ("enqueue_many (pipelined)", f"{piped:,.0f} jobs/s"),
        ]
        for c in (1, 16, 64):
            rate, trips = await bench_process(client, jobs, c)
            rows.append(
                (
                    f"process no-op, concurrency {c}",
                    f"{rate:,.0f} jobs/s, {trips:.2f} round trips/job, "
                    f"server {SERVER_USEC_PER_JOB[c]:.1f} µs/job",
                )
            )
        rate, trips = await bench_process(client, jobs, 64, keep_results=600)
        rows.append(
            (
                "process no-op, concurrency 64, keep_results",
                f"{rate:,.0f} jobs/s, {trips:.2f} round trips/job",
            )
        )
        # a queue-wide rate limit far above what one worker does: it must not slow it down
        rate, trips = await bench_process(client, jobs, 64, rate_limit=RateLimit(1_000_000, 1))
        rows.append(
            (
                "process no-op, concurrency 64, rate limit 1,000,000/s",
                f"{rate:,.0f} jobs/s, {trips:.2f} round trips/job",
            )
        )
        t = time.perf_counter()
        q = JobQueue(client, f"bench-{uuid.uuid4().hex[:8]}", BytesCodec())
        await q.enqueue_scheduled_many((f"e{i}", b"x") for i in range(jobs))
        staged_rate = jobs / (time.perf_counter() - t)
        await cleanup(client, q)
        rows.append(("enqueue_scheduled_many (pipelined)", f"{staged_rate:,.0f} jobs/s"))
        for batch in (64, 256):
            rate, per_pass = await bench_promotion(client, jobs, batch)
            rows.append(
                (
                    f"promotion, batch {batch}",
                    f"{rate:,.0f} jobs/s, {per_pass:.2f} ms per pass",
                )
            )
        rate = await bench_scheduled_process(client, jobs, 64)
        rows.append(
            (
                "scheduled -> processed, conc. 64, batch 256 per 10 ms",
                f"{rate:,.0f} jobs/s",
            )
        )
        p50, p99 = await bench_latency(client, 500, 4)
        rows.append(("end-to-end latency at 500 jobs/s", f"p50 {p50:.2f} ms, p99 {p99:.2f} ms"))
        print_table(rows)


def _options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--jobs", type=int, default=20000)


if __name__ == "__main__":
    run_benchmark(__doc__, lambda url, a: run(url, a.jobs), _options)
