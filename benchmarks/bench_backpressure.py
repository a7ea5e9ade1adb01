"""Backpressure benchmark: what the backlog bound costs an enqueue (docs/job-queue.md).

    python benchmarks/bench_backpressure.py [--redis-url URL] [--backend trio|asyncio]
        [--jobs N] [--rounds R]

Prints the median of R rounds of single and pipelined enqueues, and the server's CPU time
per enqueue script call (INFO commandstats; needs CONFIG RESETSTAT, so run it on a server of
your own or the embedded default), for a queue without a bound,
with a bound far above the backlog (admitted after two XLENs) and with a bound the stored
entries exceed (acknowledged entries kept: every enqueue reads XINFO GROUPS). Without a bound
an enqueue runs one extra HGET compared to before the feature; compare with
``bench_jobs.py``'s enqueue rows of an older checkout on the same machine.
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid

from _common import cleanup, print_table, run_benchmark

from respire_actors import BytesCodec, JobQueue, connect


async def _rates(client, n: int, bound: str) -> tuple[float, float, float]:
    q = JobQueue(client, f"bench-{uuid.uuid4().hex[:8]}", BytesCodec())
    if bound != "none" and hasattr(q, "set_max_backlog"):
        await client.execute("XGROUP", "CREATE", q.keys.ready, "respire", "0", "MKSTREAM")
        if bound == "near":
            # n acknowledged entries kept in the stream: XLEN says "maybe full", XINFO says not
            await q.enqueue_many((f"old{i}", b"x") for i in range(n))
            await client.execute(
                "XREADGROUP", "GROUP", "respire", "c", "COUNT", n, "STREAMS", q.keys.ready, ">"
            )
            ids = await client.execute("XRANGE", q.keys.ready, "-", "+")
            await client.execute("XACK", q.keys.ready, "respire", *[i for i, _ in ids])
        await q.set_max_backlog(10**9 if bound == "far" else 2 * n + 10)
    single = min(n, 2000)
    await client.execute("CONFIG", "RESETSTAT")
    t = time.perf_counter()
    for i in range(single):
        await q.enqueue(f"s{i}", b"x")
    single_rate = single / (time.perf_counter() - t)
    t = time.perf_counter()
    await q.enqueue_many((f"p{i}", b"x") for i in range(n))
    piped_rate = n / (time.perf_counter() - t)
    server_us = await _script_usec(client)
    await cleanup(client, q)
    return single_rate, piped_rate, server_us


async def _script_usec(client) -> float:
    """Server CPU per script call (INFO commandstats: EVALSHA usec_per_call), which the
    machine's load disturbs far less than the client-side rates."""
    info = await client.execute("INFO", "commandstats")
    text = info.decode() if isinstance(info, bytes) else str(info)
    for line in text.splitlines():
        if line.startswith("cmdstat_evalsha:"):
            fields = dict(kv.split("=") for kv in line.split(":", 1)[1].split(","))
            return float(fields["usec_per_call"])
    return float("nan")


async def run(url: str, args: argparse.Namespace) -> None:
    rows = []
    async with connect(url) as client:
        for bound in ("none", "far", "near"):
            results = [await _rates(client, args.jobs, bound) for _ in range(args.rounds)]
            single = statistics.median(r[0] for r in results)
            piped = statistics.median(r[1] for r in results)
            server = statistics.median(r[2] for r in results)
            rows.append((f"enqueue, one at a time, bound {bound}", f"{single:,.0f} jobs/s"))
            rows.append((f"enqueue_many (pipelined), bound {bound}", f"{piped:,.0f} jobs/s"))
            rows.append((f"server CPU per enqueue script, bound {bound}", f"{server:.2f} us"))
    print_table(rows)


def _options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--jobs", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=5)


if __name__ == "__main__":
    run_benchmark(__doc__, run, _options)
