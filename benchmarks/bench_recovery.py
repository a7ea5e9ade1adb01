"""Recovery benchmark: how fast a worker takes back the jobs of a worker that died holding them.

    python benchmarks/bench_recovery.py [--redis-url URL] [--backend trio|asyncio]
        [--jobs N] [--consumer-count C] [--handler-ms MS] [--fresh N]
        [--recovery-interval S] [--page-size P] [--max-pages M]

Enqueues N jobs and delivers them all to a consumer that never acknowledges (a worker killed
with SIGKILL after its reads), waits past the visibility timeout, then starts one worker with
the given options and reports the time until every stale job has run, the recovery rate, the
recovery passes (from the ``recovery-pass`` telemetry records) and, with ``--fresh N``, how
long N jobs enqueued at the worker's start took meanwhile (the reader's turns between passes).
With the defaults a pass asks for at most ``max_pages x page_size`` entries per
``recovery_interval`` (docs/job-queue.md, "Recovery and shutdown").
"""

from __future__ import annotations

import argparse
import logging
import time
import uuid
from datetime import timedelta

import anyio
from _common import cleanup, print_table, run_benchmark

from respire_actors import BytesCodec, Job, JobQueue, Worker, WorkerOptions, connect
from respire_actors.jobs.options import CONSUMER_GROUP

VISIBILITY = timedelta(seconds=1)


class _Passes(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.passes: list[tuple[float, int, int]] = []

    def emit(self, record: logging.LogRecord) -> None:
        if getattr(record, "event", None) == "recovery-pass":
            claimed, pages = getattr(record, "claimed", 0), getattr(record, "pages", 0)
            self.passes.append((time.monotonic(), claimed, pages))


async def bench(url: str, args: argparse.Namespace) -> None:
    async with connect(url) as client:
        queue = JobQueue(client, f"bench-recovery-{uuid.uuid4().hex[:8]}", BytesCodec())
        try:
            await queue.enqueue_many((f"stale-{i}", b"x") for i in range(args.jobs))
            ready = queue.keys.ready
            await client.execute("XGROUP", "CREATE", ready, CONSUMER_GROUP, "0", "MKSTREAM")
            # the dead worker read everything and never acknowledged
            await client.execute(
                "XREADGROUP", "GROUP", CONSUMER_GROUP, "dead", "COUNT", args.jobs,
                "STREAMS", ready, ">",
            )  # fmt: skip
            await anyio.sleep(VISIBILITY.total_seconds() + 0.1)
            stale_done: list[float] = []
            fresh_done: list[float] = []

            all_done = anyio.Event()

            async def handler(job: Job[bytes]) -> None:
                if args.handler_ms:
                    await anyio.sleep(args.handler_ms / 1000)
                (stale_done if job.id.startswith("stale-") else fresh_done).append(time.monotonic())
                if len(stale_done) >= args.jobs and len(fresh_done) >= args.fresh:
                    all_done.set()

            options = WorkerOptions(
                consumer_count=args.consumer_count,
                visibility_timeout=VISIBILITY,
                recovery_interval=timedelta(seconds=args.recovery_interval),
                recovery_page_size=args.page_size,
                recovery_max_pages=args.max_pages,
            )
            worker = Worker()
            worker.register(queue.name, handler, BytesCodec(), options)
            telemetry = logging.getLogger("respire_actors.telemetry")
            passes, level = _Passes(), telemetry.level
            telemetry.addHandler(passes)
            telemetry.setLevel(logging.INFO)
            try:
                async with anyio.create_task_group() as tg:
                    started = time.monotonic()
                    await tg.start(worker.run, client)
                    if args.fresh:
                        await queue.enqueue_many((f"fresh-{i}", b"x") for i in range(args.fresh))
                    await all_done.wait()
                    await worker.stop()
            finally:
                telemetry.removeHandler(passes)
                telemetry.setLevel(level)
            took = max(stale_done) - started
            rows = [
                ("stale jobs recovered and run", f"{args.jobs} in {took:.2f} s"),
                ("recovery rate", f"{args.jobs / took:,.0f} jobs/s"),
                ("first stale job ran after", f"{min(stale_done) - started:.2f} s"),
                (
                    "recovery passes (claimed / pages)",
                    ", ".join(f"{c}/{p}" for _, c, p in passes.passes[:8])
                    + (" ..." if len(passes.passes) > 8 else ""),
                ),
            ]
            if args.fresh:
                rows.append(
                    ("fresh jobs done after", f"{max(fresh_done) - started:.2f} s ({args.fresh})")
                )
            print_table(rows)
        finally:
            await cleanup(client, queue)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--jobs", type=int, default=2500)
    parser.add_argument("--consumer-count", type=int, default=16)
    parser.add_argument("--handler-ms", type=float, default=0.0)
    parser.add_argument("--fresh", type=int, default=0)
    parser.add_argument("--recovery-interval", type=float, default=5.0)
    parser.add_argument("--page-size", type=int, default=64)
    parser.add_argument("--max-pages", type=int, default=4)


if __name__ == "__main__":
    run_benchmark(__doc__, bench, add_arguments)
