"""Partitioned job queue benchmark: enqueue and processing throughput and server CPU per job
for a plain queue and partitioned queues, on one server and on a 3-master cluster; plus the
server load of an idle worker waiting on every partition.

    python benchmarks/bench_partitions.py [--redis-url URL] [--backend trio|asyncio]
                                          [--jobs N] [--concurrency C] [--repeat R]
                                          [--no-cluster]

Without --redis-url an embedded valkey-server (no persistence) is the single server. The
cluster is three throwaway valkey-server masters started like the tests' cluster fixture
(tests/helpers/servers.py). Each throughput figure is the best of --repeat runs (the lowest
server CPU). Server CPU is the ``usec`` of the commands the runtime sends
(EVALSHA, EVAL, XREAD, XREADGROUP) in ``INFO commandstats``, summed over every node.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import anyio
from _common import print_table, run_benchmark

from respire_actors import (
    ACK,
    BytesCodec,
    Job,
    JobQueue,
    PartitionedJobQueue,
    Worker,
    WorkerOptions,
    connect,
)

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from helpers.keyspace import delete_matching
from helpers.servers import start_cluster

_TOP_LEVEL = ("cmdstat_evalsha:", "cmdstat_eval:", "cmdstat_xread:", "cmdstat_xreadgroup:")


def _stats(text: Any) -> tuple[int, int]:
    """(usec, calls) of the top-level commands in one INFO commandstats reply."""
    usec = calls = 0
    for line in (text.decode() if isinstance(text, bytes) else str(text)).splitlines():
        if line.startswith(_TOP_LEVEL):
            fields = dict(kv.split("=", 1) for kv in line.partition(":")[2].split(","))
            usec += int(fields["usec"])
            calls += int(fields["calls"])
    return usec, calls


class Server:
    """INFO commandstats of one server, or of every node of a cluster."""

    def __init__(self, client: Any, nodes: list[Any] | None = None) -> None:
        self.client, self.nodes = client, nodes

    async def stats(self) -> tuple[int, int]:
        if self.nodes is None:
            return _stats(await self.client.execute("INFO", "commandstats"))
        usec = calls = 0
        for node in self.nodes:
            u, c = _stats(node.execute("INFO", "commandstats"))
            usec, calls = usec + u, calls + c
        return usec, calls


def _queue(client: Any, partitions: int | None) -> Any:
    name = f"bench-{uuid.uuid4().hex[:8]}"
    if partitions is None:
        return JobQueue(client, name, BytesCodec())
    return PartitionedJobQueue(client, name, BytesCodec(), partitions=partitions)


async def bench(
    client: Any, server: Server, partitions: int | None, n: int, concurrency: int
) -> tuple[float, float, float]:
    """(enqueue_many jobs/s, processing jobs/s, server µs per processed job)."""
    q = _queue(client, partitions)
    t = time.perf_counter()
    for start in range(0, n, 10_000):
        await q.enqueue_many((f"j{i}", b"x") for i in range(start, min(n, start + 10_000)))
    enqueue_rate = n / (time.perf_counter() - t)
    done = anyio.Event()
    count = 0

    async def handler(job: Job[bytes]) -> object:
        nonlocal count
        count += 1
        if count == n:
            done.set()
        return ACK

    worker = Worker()
    worker.register(
        q.name,
        handler,
        BytesCodec(),
        WorkerOptions(consumer_count=concurrency, read_batch=max(concurrency, 32)),
        partitions=partitions,
    )
    async with anyio.create_task_group() as tg:
        usec_before, _ = await server.stats()
        t = time.perf_counter()
        await tg.start(worker.run, client)
        await done.wait()
        while worker.statistics(q.name).acked < n:  # noqa: ASYNC110 - polling a counter
            await anyio.sleep(0.01)
        elapsed = time.perf_counter() - t
        usec_after, _ = await server.stats()
        await worker.stop()
    await delete_matching(client, f"*{q.name}*")
    return enqueue_rate, n / elapsed, (usec_after - usec_before) / n


async def idle_load(client: Any, server: Server, partitions: int, seconds: float) -> float:
    """Server calls per second of one idle worker waiting on every partition."""
    q = _queue(client, partitions)

    async def handler(job: Job[bytes]) -> object:
        return ACK

    worker = Worker()
    worker.register(q.name, handler, BytesCodec(), WorkerOptions(), partitions=partitions)
    async with anyio.create_task_group() as tg:
        await tg.start(worker.run, client)
        await anyio.sleep(1.5)  # start-up replay and first reads done
        _, before = await server.stats()
        await anyio.sleep(seconds)
        _, after = await server.stats()
        await worker.stop()
    await delete_matching(client, f"*{q.name}*")
    return (after - before) / seconds


async def suite(
    label: str, client: Any, server: Server, args: argparse.Namespace
) -> list[tuple[str, str]]:
    rows = []
    for partitions in (None, 16, 256):
        # best of --repeat runs: the figures of a shared machine are noisy
        runs = [
            await bench(client, server, partitions, args.jobs, args.concurrency)
            for _ in range(args.repeat)
        ]
        enq = max(r[0] for r in runs)
        proc = max(r[1] for r in runs)
        usec = min(r[2] for r in runs)
        what = "plain queue" if partitions is None else f"{partitions} partitions"
        rows.append(
            (
                f"{label}: {what}",
                f"enqueue_many {enq:,.0f} jobs/s; processing {proc:,.0f} jobs/s "
                f"(concurrency {args.concurrency}); server {usec:.1f} µs/job",
            )
        )
    for partitions in (16, 256):
        calls = await idle_load(client, server, partitions, 3.0)
        rows.append((f"{label}: idle worker, {partitions} partitions", f"{calls:,.0f} calls/s"))
    return rows


async def run(url: str, args: argparse.Namespace) -> None:
    rows = []
    async with connect(url) as client:
        rows += await suite("one server", client, Server(client), args)
    if not args.no_cluster:
        with tempfile.TemporaryDirectory() as tmp:
            cluster = start_cluster(Path(tmp), masters=3)
            try:
                async with connect(cluster.url) as client:
                    rows += await suite(
                        "3-master cluster", client, Server(client, cluster.nodes), args
                    )
            finally:
                cluster.stop()
    print_table(rows)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=3, help="runs per figure (best kept)")
    parser.add_argument("--no-cluster", action="store_true")


if __name__ == "__main__":
    run_benchmark(__doc__, run, add_arguments)
