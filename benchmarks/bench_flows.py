"""Flow benchmark: 256-node flows per second on one worker, and plain jobs per second on a
queue with and without flows present (the coordination marker set), medians of 3 runs.

    python benchmarks/bench_flows.py [--redis-url URL] [--backend trio|asyncio]
                                     [--flows N] [--jobs N] [--concurrency N]

Without --redis-url an embedded valkey-server (no persistence) is started. Each flow is a
four-level tree of exactly 256 nodes (a root, 5 children, 25 grandchildren, 225 leaves); the
handler is a no-op that keeps a 16-byte result per node, and the parents read their children's
results. The figure runs from the first enqueue to the last root's completion.
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid

import anyio
from _common import cleanup, print_table, run_benchmark
from bench_jobs import server_usec

from respire_actors import (
    ACK,
    BytesCodec,
    FlowNode,
    Job,
    JobQueue,
    Outcome,
    Worker,
    WorkerOptions,
    connect,
)


def tree_256(flow: int) -> FlowNode[bytes]:
    def node(name: str, children: list[FlowNode[bytes]]) -> FlowNode[bytes]:
        return FlowNode(f"{flow}:{name}", b"x", children)

    return node(
        "r",
        [
            node(
                f"{a}",
                [node(f"{a}.{b}", [node(f"{a}.{b}.{c}", []) for c in range(9)]) for b in range(5)],
            )
            for a in range(5)
        ],
    )


PARENTS = 31
"""Nodes 1..31 (breadth-first) of a tree_256 are parents; 32..256 are leaves."""


async def bench_flows(url: str, flows: int, concurrency: int) -> float:
    """256-node flows per second, enqueue to the last root completed."""
    async with connect(url) as client:
        queue = JobQueue(client, f"bench-{uuid.uuid4().hex[:8]}", BytesCodec())
        roots = 0
        done = anyio.Event()

        async def handler(job: Job[bytes]) -> Outcome:
            nonlocal roots
            node = job.flow_node or 0
            if node <= PARENTS:
                await job.child_results()
            if node == 1:
                roots += 1
                if roots == flows:
                    done.set()
            return job.complete(b"0123456789abcdef")

        worker = Worker()
        worker.register(
            queue.name,
            handler,
            BytesCodec(),
            WorkerOptions(consumer_count=concurrency, read_batch=max(concurrency, 32)),
        )
        trees = [tree_256(i) for i in range(flows)]
        async with anyio.create_task_group() as tg:
            await tg.start(worker.run, client)
            t = time.perf_counter()
            for i, tree in enumerate(trees):
                await queue.enqueue_flow(f"flow-{i}", tree)
            await done.wait()
            elapsed = time.perf_counter() - t
            await worker.stop()
            tg.cancel_scope.cancel()
        await cleanup(client, queue)
    return flows / elapsed


async def bench_plain(
    url: str, jobs: int, concurrency: int, with_flows: bool
) -> tuple[float, float]:
    """Plain no-op jobs per second and server CPU (µs) per job; ``with_flows``: the queue has
    the coordination marker and a flow's state, as a queue that also runs flows would."""
    async with connect(url) as client:
        queue = JobQueue(client, f"bench-{uuid.uuid4().hex[:8]}", BytesCodec())
        if with_flows:
            await queue.enqueue_flow("present", FlowNode("solo", b"x"))
        await queue.enqueue_many((f"j{i}", b"x") for i in range(jobs))
        count = 0
        done = anyio.Event()

        async def handler(job: Job[bytes]) -> Outcome:
            nonlocal count
            if job.flow_id is None:
                count += 1
                if count == jobs:
                    done.set()
            return ACK

        worker = Worker()
        worker.register(
            queue.name,
            handler,
            BytesCodec(),
            WorkerOptions(consumer_count=concurrency, read_batch=max(concurrency, 32)),
        )
        usec = await server_usec(client)
        async with anyio.create_task_group() as tg:
            t = time.perf_counter()
            await tg.start(worker.run, client)
            await done.wait()
            elapsed = time.perf_counter() - t
            usec = await server_usec(client) - usec
            await worker.stop()
            tg.cancel_scope.cancel()
        marked = await client.execute("EXISTS", queue.keys.coordinated)
        assert bool(marked) == with_flows
        await cleanup(client, queue)
    return jobs / elapsed, usec / jobs


async def run(url: str, args: argparse.Namespace) -> None:
    async with connect(url) as client:
        print(f"server: {(await client.server_info()).describe()}")
    flow_rates = [await bench_flows(url, args.flows, args.concurrency) for _ in range(3)]
    rows = [
        (
            f"256-node flows (4 levels), {args.flows} per run",
            f"{statistics.median(flow_rates):,.2f} flows/s "
            f"({statistics.median(flow_rates) * 256:,.0f} nodes/s); runs "
            + ", ".join(f"{r:,.2f}" for r in flow_rates),
        )
    ]
    for with_flows in (False, True):
        runs = [await bench_plain(url, args.jobs, args.concurrency, with_flows) for _ in range(3)]
        rates = [r for r, _ in runs]
        label = "with flows (marker set)" if with_flows else "without flows"
        rows.append(
            (
                f"plain no-op jobs, {label}",
                f"{statistics.median(rates):,.0f} jobs/s, server "
                f"{statistics.median(u for _, u in runs):.1f} µs/job; runs "
                + ", ".join(f"{r:,.0f}" for r in rates),
            )
        )
    print(f"concurrency {args.concurrency}, medians of 3")
    print_table(rows)


def _options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--flows", type=int, default=20)
    parser.add_argument("--jobs", type=int, default=20000)
    parser.add_argument("--concurrency", type=int, default=64)


if __name__ == "__main__":
    run_benchmark(__doc__, run, _options)
