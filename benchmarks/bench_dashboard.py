"""Dashboard benchmark: how long each page takes with a million jobs in a queue.

    python benchmarks/bench_dashboard.py [--redis-url URL] [--backend trio|asyncio]
                                         [--jobs 1000000] [--requests 20]

Without --redis-url an embedded valkey-server (no persistence) is started. The queue is filled
with --jobs jobs through pipelined ``enqueue_many``; a tenth of them (at most 100,000) are
delivered to a consumer and left pending, 10,000 are scheduled an hour ahead (a tenth of those
in application groups) and 10,000 dead letters are added. Then the dashboard is served by
Hypercorn on the chosen backend and each page is fetched --requests times over HTTP on
loopback; the table gives the median, the 95th percentile and the slowest time per page
(client-measured: request, every Redis read and rendering).
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid

import anyio
import httpx
from _common import cleanup, print_table, run_benchmark

from respire_actors import BytesCodec, JobEnqueueOptions, JobQueue, connect
from respire_actors.admin import QueueAdmin, register_queue, unregister_queue
from respire_actors.dashboard import Dashboard, DashboardConfig, serve_dashboard
from respire_actors.jobs.options import CONSUMER_GROUP

DEAD_LETTERS = 10_000
SCHEDULED = 10_000


async def fill(client, queue: JobQueue[bytes], jobs: int) -> None:
    t = time.perf_counter()
    chunk = 50_000
    for start in range(0, jobs, chunk):
        await queue.enqueue_many(
            (f"job-{i}", b'{"to": "someone@example.com"}')
            for i in range(start, min(jobs, start + chunk))
        )
    print(f"enqueued {jobs} jobs in {time.perf_counter() - t:.1f} s")
    # a consumer takes a tenth of them and never acknowledges: a long pending list
    keys = queue.keys
    await client.execute("XGROUP", "CREATE", keys.ready, CONSUMER_GROUP, "0", "MKSTREAM")
    pending = min(jobs // 10, 100_000)
    for taken in range(0, pending, 10_000):
        await client.execute(
            "XREADGROUP", "GROUP", CONSUMER_GROUP, "bench-consumer",
            "COUNT", min(10_000, pending - taken), "STREAMS", keys.ready, ">",
        )  # fmt: skip
    later = JobEnqueueOptions(delay=3600)
    grouped = JobEnqueueOptions(delay=3600, group="tenant-a")
    for start in range(0, SCHEDULED, 1000):
        for i in range(start, start + 1000):
            opts = grouped if i % 10 == 0 else later
            await queue.enqueue_scheduled(f"later-{i}", b"{}", opts)

    def dead_letter(i: int) -> tuple[str | bytes, ...]:
        reason = "processing-failed" if i % 2 else "delivery-limit"
        fields = {
            "_respire.job.id": f"dead-{i}",
            "_respire.job.payload": b"{}",
            "_respire.reason": reason,
            "_respire.attempt": "3",
            "_respire.detail": "boom",
            "_respire.source_id": "1-1",
            "_respire.consumer": "bench-consumer",
        }
        return ("XADD", keys.dead, "*", *(x for pair in fields.items() for x in pair))

    commands = [dead_letter(i) for i in range(DEAD_LETTERS)]
    for start in range(0, len(commands), 1000):
        await client.pipeline(commands[start : start + 1000])
    print(f"pending {pending}, scheduled {SCHEDULED}, dead letters {DEAD_LETTERS}")


async def time_pages(url: str, pages: dict[str, str], requests: int) -> list[tuple[str, str]]:
    rows = []
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        for label, path in pages.items():
            first = await http.get(path)  # warm-up (and a check that the page works)
            assert first.status_code == 200, (path, first.status_code, first.text[:500])
            times = []
            for _ in range(requests):
                t = time.perf_counter()
                response = await http.get(path)
                times.append((time.perf_counter() - t) * 1000)
                assert response.status_code == 200
            times.sort()
            p95 = times[min(len(times) - 1, int(len(times) * 0.95))]
            rows.append(
                (
                    label,
                    f"median {statistics.median(times):6.1f} ms, p95 {p95:6.1f} ms, "
                    f"max {times[-1]:6.1f} ms ({len(first.content) // 1024} KiB)",
                )
            )
    return rows


async def run(url: str, args: argparse.Namespace) -> None:
    async with connect(url) as client:
        name = f"bench-dash-{uuid.uuid4().hex[:8]}"
        queue = JobQueue(client, name, BytesCodec())
        try:
            await register_queue(client, name)
            await fill(client, queue, args.jobs)
            admin = QueueAdmin(client, name)
            summary = await admin.summary()
            print(
                f"queue {name}: stream length {summary.ready}, pending {summary.pending}, "
                f"scheduled {summary.scheduled}, dead letters {summary.dead_letters}"
            )
            pending = await admin.pending(count=50)
            entry = pending.rows[0].entry_id
            dead = await admin.dead_letters(count=50)
            pages = {
                "overview": "/",
                "queue (first pages)": f"/queue?queue={name}",
                "queue (pending page 2)": f"/queue?queue={name}&pending={pending.next_start}",
                "job detail": f"/job?queue={name}&entry={entry}",
                "dead letters": f"/dead?queue={name}",
                "dead letters (older page)": f"/dead?queue={name}&before={dead.next_before}",
                "dead letters (by reason)": f"/dead?queue={name}&reason=delivery-limit",
                "groups": f"/groups?queue={name}",
                "batches and flows": f"/batches?queue={name}",
            }
            dashboard = Dashboard(DashboardConfig(queues=(name,)), client=client)
            async with anyio.create_task_group() as tg:
                bound = await tg.start(lambda **kw: serve_dashboard(dashboard, port=0, **kw))
                rows = await time_pages(bound.url.rstrip("/"), pages, args.requests)
                tg.cancel_scope.cancel()
            print_table([("jobs in the queue", f"{args.jobs}"), *rows])
        finally:
            await unregister_queue(client, name)
            await cleanup(client, queue)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--requests", type=int, default=20)


if __name__ == "__main__":
    run_benchmark(__doc__, run, add_arguments)
