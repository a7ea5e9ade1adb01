"""Retention soak: push many jobs through a worker and sample Redis memory and stream lengths.

    python benchmarks/soak_retention.py [--redis-url URL] [--backend trio|asyncio]
        [--jobs N] [--max-age SECONDS] [--no-retention] [--json]

Without --redis-url an embedded valkey-server (no persistence) is started: ``used_memory`` is
then this run's alone. A producer keeps the backlog at most ``--backlog`` jobs ahead of the
worker (so what grows is what processing leaves behind, not an unprocessed backlog); jobs use a
1 s deduplication window so deduplication records do not accumulate either. Every
``--sample`` seconds it records jobs processed, ``used_memory`` and the lengths of the ready
and event streams and the age of each stream's oldest entry. With the retention keeper on
(``--max-age``, default 2 s) memory stops growing once the window is reached; ``--no-retention``
shows the growth per job without it.
"""

from __future__ import annotations

import argparse
import json
import time
import uuid
from datetime import timedelta

import anyio
from _common import cleanup, print_table, run_benchmark

from respire_actors import JobQueue, Retention, StrCodec, Worker, WorkerOptions, connect


async def used_memory(client) -> int:
    info = await client.execute("INFO", "memory")
    text = info.decode() if isinstance(info, bytes) else str(info)
    for line in text.splitlines():
        if line.startswith("used_memory:"):
            return int(line.split(":", 1)[1])
    raise RuntimeError("INFO memory has no used_memory")


def oldest_ms(first: list, now_ms: int) -> int:
    """The age in ms of a stream's first entry (from its id), 0 for an empty stream."""
    if not first:
        return 0
    entry_id = first[0][0]
    text = entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)
    return max(0, now_ms - int(text.split("-", 1)[0]))


async def soak(url: str, args: argparse.Namespace) -> None:
    retention = (
        None
        if args.no_retention
        else Retention(max_age=timedelta(seconds=args.max_age), interval=timedelta(seconds=0.2))
    )
    async with connect(url) as client:
        queue = JobQueue(client, f"soak-{uuid.uuid4().hex[:8]}", StrCodec())
        processed = 0
        all_done = anyio.Event()

        async def handler(job) -> None:
            nonlocal processed
            processed += 1
            if processed >= args.jobs:
                all_done.set()

        worker = Worker()
        worker.register(
            queue.name, handler, StrCodec(), WorkerOptions(consumer_count=64, retention=retention)
        )
        samples: list[dict[str, float]] = []
        started = time.perf_counter()

        async def sample() -> None:
            ready, events, first_ready, first_event, now = await client.pipeline(
                [
                    ("XLEN", queue.keys.ready),
                    ("XLEN", queue.keys.events),
                    ("XRANGE", queue.keys.ready, "-", "+", "COUNT", 1),
                    ("XRANGE", queue.keys.events, "-", "+", "COUNT", 1),
                    ("TIME",),
                ]
            )
            now_ms = int(now[0]) * 1000 + int(now[1]) // 1000
            samples.append(
                {
                    "seconds": round(time.perf_counter() - started, 2),
                    "processed": processed,
                    "enqueued": enqueued,
                    "used_memory": await used_memory(client),
                    "ready": int(ready),
                    "events": int(events),
                    "ready_oldest_ms": oldest_ms(first_ready, now_ms),
                    "events_oldest_ms": oldest_ms(first_event, now_ms),
                }
            )

        async def sampler() -> None:
            while True:
                await sample()
                await anyio.sleep(args.sample)

        enqueued = 0
        async with anyio.create_task_group() as tg:
            await tg.start(worker.run, client)
            tg.start_soon(sampler)
            while enqueued < args.jobs:
                if enqueued - processed >= args.backlog:
                    await anyio.sleep(0.005)
                    continue
                chunk = min(500, args.jobs - enqueued)
                await queue.enqueue_many(
                    [(f"j{enqueued + i}", "x" * 32) for i in range(chunk)], dedup_window=1.0
                )
                enqueued += chunk
            await all_done.wait()
            await anyio.sleep(args.settle)
            await sample()
            worker.request_stop()
            await worker.stop()
            tg.cancel_scope.cancel()
        elapsed = time.perf_counter() - started
        await cleanup(client, queue)
    half = [s for s in samples if s["processed"] >= args.jobs / 2]
    first_half_end = half[0] if half else samples[-1]
    growth = samples[-1]["used_memory"] - first_half_end["used_memory"]
    jobs_in_half = args.jobs - first_half_end["processed"]
    report = {
        "jobs": args.jobs,
        "retention_max_age_s": None if args.no_retention else args.max_age,
        "seconds": round(elapsed, 1),
        "jobs_per_second": round(args.jobs / elapsed),
        "used_memory_start": samples[0]["used_memory"],
        "used_memory_end": samples[-1]["used_memory"],
        "used_memory_max": max(s["used_memory"] for s in samples),
        "second_half_growth_bytes": growth,
        "second_half_bytes_per_job": round(growth / jobs_in_half, 1) if jobs_in_half else 0.0,
        "ready_max_second_half": max((s["ready"] for s in half), default=0),
        "events_max_second_half": max((s["events"] for s in half), default=0),
        "oldest_entry_ms_max_second_half": max(
            (max(s["ready_oldest_ms"], s["events_oldest_ms"]) for s in half), default=0
        ),
        "samples": samples,
    }
    if args.json:
        print(json.dumps(report))
        return
    print_table(
        [(k, str(v)) for k, v in report.items() if k != "samples"]
        + [("samples (s, processed, used_memory, ready, events)", "")]
    )
    step = max(1, len(samples) // 20)
    for s in samples[::step] + ([samples[-1]] if len(samples) % step else []):
        print(
            f"  {s['seconds']:8.1f}s {s['processed']:>9} jobs {s['used_memory']:>12} B "
            f"ready {s['ready']:>8} events {s['events']:>8}"
        )


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--max-age", type=float, default=2.0, help="retention window, seconds")
    parser.add_argument("--no-retention", action="store_true")
    parser.add_argument("--backlog", type=int, default=5_000)
    parser.add_argument("--sample", type=float, default=0.5, help="sampling period, seconds")
    parser.add_argument("--settle", type=float, default=3.0, help="wait after the last job")
    parser.add_argument("--json", action="store_true", help="print one JSON report")


if __name__ == "__main__":
    run_benchmark(__doc__, soak, arguments)
