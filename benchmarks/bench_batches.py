"""Batch member throughput on one worker: 1,000 members, as 4 batches of 250 (a batch holds at
most 256 members), each with on_success and on_complete callbacks, against 1,000 ordinary jobs
on the same worker for comparison.

    python benchmarks/bench_batches.py [--redis-url URL] [--backend trio|asyncio]
                                       [--batches 4] [--size 250] [--repeat 3]

Without --redis-url an embedded valkey-server (no persistence) is started. Figures are medians
of --repeat runs. "add" is create + add_many_to_batch + seal of every batch (producer side);
"drain" runs from worker start until every batch completed and its callbacks ran, with a
no-op handler; every member completion runs the batch's coordination (decode, count, encode
the state) in its completion script.
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid

import anyio
from _common import cleanup, print_table, run_benchmark

from respire_actors import (
    ACK,
    BytesCodec,
    Callback,
    Job,
    JobQueue,
    Worker,
    WorkerOptions,
    connect,
)

CONCURRENCY = 16


async def drain(url: str, q: JobQueue[bytes], expected: set[str], trips: list[float]) -> float:
    """Seconds from worker start until every job id in ``expected`` ran."""
    left = set(expected)
    done = anyio.Event()

    async def handler(job: Job[bytes]) -> object:
        left.discard(job.id)
        if not left:
            done.set()
        return ACK

    async with connect(url) as client:
        worker = Worker()
        worker.register(
            q.name,
            handler,
            BytesCodec(),
            WorkerOptions(consumer_count=CONCURRENCY, read_batch=CONCURRENCY),
        )
        async with anyio.create_task_group() as tg:
            before = client.round_trips
            t = time.perf_counter()
            await tg.start(worker.run, client)
            await done.wait()
            elapsed = time.perf_counter() - t
            trips.append((client.round_trips - before) / len(expected))
            await worker.stop()
            tg.cancel_scope.cancel()
    return elapsed


async def one_run(url: str, batches: int, size: int) -> tuple[float, float, float, float, float]:
    """(members added/s, batch members drained/s, round trips per member, plain jobs/s,
    round trips per plain job)."""
    members = batches * size
    async with connect(url) as producer:
        q = JobQueue(producer, f"bench-{uuid.uuid4().hex[:8]}", BytesCodec())
        t = time.perf_counter()
        for b in range(batches):
            batch = await q.create_batch(
                on_success=Callback(f"ok-{b}", b"s"),
                on_complete=Callback(f"done-{b}", b"c"),
                batch_id=f"batch-{b}",
            )
            await q.add_many_to_batch(batch, [(f"b{b}-m{i}", b"x") for i in range(size)])
            await q.seal_batch(batch)
        added = members / (time.perf_counter() - t)
        expected = {f"b{b}-m{i}" for b in range(batches) for i in range(size)}
        expected |= {f"{k}-{b}" for b in range(batches) for k in ("ok", "done")}
        trips: list[float] = []
        elapsed = await drain(url, q, expected, trips)
        for b in range(batches):
            status = await q.batch_status(f"batch-{b}")
            assert status is not None and status.completed and status.succeeded == size
        await cleanup(producer, q)

        plain = JobQueue(producer, f"bench-{uuid.uuid4().hex[:8]}", BytesCodec())
        await plain.enqueue_many((f"j{i}", b"x") for i in range(members))
        plain_elapsed = await drain(url, plain, {f"j{i}" for i in range(members)}, trips)
        await cleanup(producer, plain)
    return added, members / elapsed, trips[0], members / plain_elapsed, trips[1]


async def run(url: str, args: argparse.Namespace) -> None:
    runs = [await one_run(url, args.batches, args.size) for _ in range(args.repeat)]
    med = [statistics.median(r[i] for r in runs) for i in range(5)]
    members = args.batches * args.size
    label = f"{members:,} members as {args.batches} batches of {args.size}"
    print_table(
        [
            (f"add ({label})", f"{med[0]:,.0f} members/s"),
            (
                f"drain ({label}, {CONCURRENCY} handlers)",
                f"{med[1]:,.0f} members/s, {med[2]:.2f} round trips/job",
            ),
            (
                f"drain ({members:,} ordinary jobs, same worker)",
                f"{med[3]:,.0f} jobs/s, {med[4]:.2f} round trips/job",
            ),
            ("runs", f"median of {args.repeat}"),
        ]
    )


def _options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--batches", type=int, default=4)
    parser.add_argument("--size", type=int, default=250)
    parser.add_argument("--repeat", type=int, default=3)


if __name__ == "__main__":
    run_benchmark(__doc__, run, _options)
