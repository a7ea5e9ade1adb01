"""Connection-layer benchmark: enqueue throughput, server CPU per enqueue, import time.

    python benchmarks/bench_connection.py [--redis-url URL] [--backend trio|asyncio|both]
                                          [--jobs N]

Prints, per backend: one-at-a-time ``JobQueue.enqueue`` (what a web request does), 32
concurrent enqueuing tasks, pipelined ``enqueue_many``, round trips per enqueue, the server CPU
per enqueue (``INFO commandstats``: ``cmdstat_evalsha`` usec_per_call over the calls this run
made), and ``import respire_actors`` time. Uses only the public API, so the same script
measures any version of the package (before/after comparisons).

Without --redis-url an embedded valkey-server (no persistence) is started; on a server shared
with other clients the commandstats figure includes their EVALSHA calls.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import anyio
from _common import cleanup

from respire_actors import BytesCodec, JobQueue, connect
from respire_actors.embedded import EmbeddedConfig, open_embedded_server


async def _evalsha_stats(client: Any) -> tuple[int, int]:
    """(calls, usec) of EVALSHA so far on the server."""
    text = await client.execute("INFO", "commandstats")
    if isinstance(text, bytes):
        text = text.decode()
    for line in text.splitlines():
        if line.startswith("cmdstat_evalsha:"):
            fields = dict(p.split("=", 1) for p in line.split(":", 1)[1].split(","))
            return int(fields["calls"]), int(fields["usec"])
    return 0, 0


async def bench(url: str, n: int) -> dict[str, float]:
    out: dict[str, float] = {}
    async with connect(url) as client:
        q = JobQueue(client, f"bench-{uuid.uuid4().hex[:8]}", BytesCodec())
        await q.enqueue("warm-up", b"x")

        calls0, usec0 = await _evalsha_stats(client)
        trips0 = client.round_trips
        single = min(n, 5000)
        t = time.perf_counter()
        for i in range(single):
            await q.enqueue(f"s{i}", b"x")
        out["one at a time (jobs/s)"] = single / (time.perf_counter() - t)
        out["round trips per enqueue"] = (client.round_trips - trips0) / single
        calls1, usec1 = await _evalsha_stats(client)
        if calls1 > calls0:
            out["server CPU per enqueue (us)"] = (usec1 - usec0) / (calls1 - calls0)

        per_task = max(1, n // 32)

        async def enqueuer(task: int) -> None:
            for i in range(per_task):
                await q.enqueue(f"c{task}-{i}", b"x")

        t = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for task in range(32):
                tg.start_soon(enqueuer, task)
        out["32 concurrent tasks (jobs/s)"] = 32 * per_task / (time.perf_counter() - t)

        t = time.perf_counter()
        await q.enqueue_many((f"p{i}", b"x") for i in range(n))
        out["enqueue_many, pipelined (jobs/s)"] = n / (time.perf_counter() - t)
        await cleanup(client, q)
    return out


def import_time(runs: int = 5) -> float:
    """Best of ``runs`` fresh interpreters: seconds to ``import respire_actors``."""
    code = "import time; t=time.perf_counter(); import respire_actors; print(time.perf_counter()-t)"
    best = float("inf")
    for _ in range(runs):
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        best = min(best, float(done.stdout.strip()))
    return best


async def run(url: str, n: int, backend: str) -> None:
    results = await bench(url, n)
    print(f"[{backend}]")
    for name, value in results.items():
        print(f"  {name:36} {value:,.2f}" if value < 100 else f"  {name:36} {value:,.0f}")


async def main(args: argparse.Namespace, backend: str) -> None:
    if args.redis_url:
        await run(args.redis_url, args.jobs, backend)
        return
    with tempfile.TemporaryDirectory() as tmp:
        async with open_embedded_server(
            EmbeddedConfig(data_dir=Path(tmp), persistent=False)
        ) as url:
            await run(url, args.jobs, backend)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--redis-url", default=os.environ.get("RESPIRE_REDIS_URL"))
    parser.add_argument("--backend", choices=("trio", "asyncio", "both"), default="both")
    parser.add_argument("--jobs", type=int, default=20000)
    a = parser.parse_args()
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}, load average {os.getloadavg()[0]:.2f}"
    )
    print(f"import respire_actors: {import_time():.3f} s")
    for chosen in ("asyncio", "trio") if a.backend == "both" else (a.backend,):
        anyio.run(main, a, chosen, backend=chosen)
