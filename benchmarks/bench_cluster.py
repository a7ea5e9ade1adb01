"""Cluster benchmark: one producer and one worker over three queues, with the queues on three
different masters of a Redis Cluster, then on one master, so the figures show what spreading
queues over masters buys.

    python benchmarks/bench_cluster.py [--backend trio|asyncio] [--jobs N]

A throwaway 3-master cluster (valkey, no persistence) is started with the test suite's helper
(tests/helpers/servers.py) and stopped at the end. Every figure uses the real runtime: fencing,
completion events and admission are on.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
import uuid
from pathlib import Path

import anyio
from _common import print_table

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from helpers.servers import Cluster, key_slot, start_cluster

from respire_actors import ACK, BytesCodec, Job, JobQueue, Worker, WorkerOptions, connect
from respire_actors.keys import JobQueueKeys

QUEUES = 3


def queue_names(cluster: Cluster, spread: bool) -> list[str]:
    """Three fresh queue names: on three masters (``spread``) or all on the first one."""
    base = f"bench-{uuid.uuid4().hex[:8]}"
    first = cluster.nodes[0].port
    found: dict[int, str] = {}
    names: list[str] = []
    for i in range(100_000):
        name = f"{base}-{i}"
        port = cluster.owner_of(key_slot(JobQueueKeys(name).ready)).port
        if spread:
            found.setdefault(port, name)
            if len(found) == QUEUES:
                return list(found.values())
        elif port == first:
            names.append(name)
            if len(names) == QUEUES:
                return names
    raise RuntimeError("no such names")


async def enqueue(queues: list[JobQueue[bytes]], per_queue: int) -> float:
    """Jobs per second for enqueue_many on every queue at once."""
    body = b"x" * 64
    started = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for q in queues:
            jobs = [(f"j{i}", body) for i in range(per_queue)]
            tg.start_soon(q.enqueue_many, jobs)
    return len(queues) * per_queue / (time.perf_counter() - started)


async def process(client: object, names: list[str], per_queue: int) -> float:
    """Jobs per second for one worker draining every queue."""
    done = 0
    finished = anyio.Event()
    total = len(names) * per_queue

    async def handler(job: Job[bytes]) -> object:
        nonlocal done
        done += 1
        if done == total:
            finished.set()
        return ACK

    worker = Worker()
    for name in names:
        worker.register(
            name, handler, BytesCodec(), WorkerOptions(consumer_count=32, read_batch=64)
        )
    async with anyio.create_task_group() as tg:
        started = time.perf_counter()
        await tg.start(worker.run, client)
        await finished.wait()
        elapsed = time.perf_counter() - started
        await worker.stop()
    return total / elapsed


async def run(cluster: Cluster, per_queue: int) -> None:
    rows = []
    async with connect(cluster.url) as client:
        for spread in (True, False):
            names = queue_names(cluster, spread)
            queues = [JobQueue(client, n, BytesCodec()) for n in names]
            layout = "3 queues on 3 masters" if spread else "3 queues on 1 master"
            rate = await enqueue(queues, per_queue)
            rows.append((f"enqueue_many, {layout}", f"{rate:,.0f} jobs/s"))
            rate = await process(client, names, per_queue)
            rows.append((f"one worker processing, {layout}", f"{rate:,.0f} jobs/s"))
    print_table(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--backend", choices=("trio", "asyncio"), default="trio")
    parser.add_argument("--jobs", type=int, default=30_000, help="jobs in all (split over 3)")
    args = parser.parse_args()
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}, backend {args.backend}, jobs {args.jobs}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        cluster = start_cluster(Path(tmp), masters=3)
        try:
            anyio.run(run, cluster, args.jobs // QUEUES, backend=args.backend)
        finally:
            cluster.stop()


if __name__ == "__main__":
    main()
