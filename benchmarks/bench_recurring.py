"""Recurring scheduler benchmark: ticks committed per second with 10,000 due schedules, and the
time and Redis work of one bounded pass (due and not due).

    python benchmarks/bench_recurring.py [--redis-url URL] [--backend trio|asyncio]
                                         [--schedules N] [--budget 1..256]

Without --redis-url an embedded valkey-server (no persistence) is started, so the server-side
figures (INFO commandstats: microseconds spent in scripts) belong to this run alone. A fake
clock makes every schedule due at once; the passes are the real ones (scan script, then the
tick scripts pipelined in one round trip).
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid
from datetime import timedelta

import anyio
from _common import cleanup, print_table, run_benchmark

from respire_actors import BytesCodec, JobQueue, connect
from respire_actors.testing import FakeClock


async def _script_usec(client) -> int:
    """Microseconds the server has spent in EVAL/EVALSHA so far."""
    info = await client.execute("INFO", "commandstats")
    text = info.decode() if isinstance(info, bytes) else str(info)
    total = 0
    for line in text.splitlines():
        if line.startswith(("cmdstat_evalsha:", "cmdstat_eval:")):
            fields = dict(p.split("=") for p in line.split(":", 1)[1].split(","))
            total += int(fields["usec"])
    return total


async def _passes(client, scheduler, budget: int, until_enqueued: int | None, count: int):
    """Run passes; returns (seconds, enqueued, per-pass wall ms, round trips, server usec)."""
    walls: list[float] = []
    trips: list[int] = []
    usecs: list[int] = []
    enqueued = 0
    started = time.perf_counter()
    while (until_enqueued is None and len(walls) < count) or (
        until_enqueued is not None and enqueued < until_enqueued
    ):
        before_usec = await _script_usec(client)
        before_trips = client.round_trips
        t = time.perf_counter()
        result = await scheduler.run_pass(budget)
        walls.append((time.perf_counter() - t) * 1000)
        trips.append(client.round_trips - before_trips)
        usecs.append(await _script_usec(client) - before_usec)
        enqueued += result.enqueued
    # the INFO calls are outside each pass's wall time but inside the total
    return time.perf_counter() - started, enqueued, walls, trips, usecs


def _summary(values: list[float]) -> str:
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.95))]
    return f"median {statistics.median(ordered):.2f}, p95 {p95:.2f}, max {ordered[-1]:.2f}"


async def run(url: str, n: int, budget: int) -> None:
    async with connect(url) as client:
        queue = JobQueue(client, f"bench-rec-{uuid.uuid4().hex[:8]}", BytesCodec())
        clock = FakeClock()
        scheduler = queue.scheduler(clock=clock)
        try:
            t = time.perf_counter()
            async with anyio.create_task_group() as tg:
                for worker in range(64):

                    async def upsert_some(w: int = worker) -> None:
                        for i in range(w, n, 64):
                            await scheduler.upsert(
                                f"s{i:06d}", b"payload", interval=timedelta(hours=1)
                            )

                    tg.start_soon(upsert_some)
            upsert_rate = n / (time.perf_counter() - t)
            clock.advance(timedelta(hours=1))  # every schedule is due now
            seconds, enqueued, walls, trips, usecs = await _passes(client, scheduler, budget, n, 0)
            tick_rate = enqueued / seconds
            _, _, idle_walls, idle_trips, idle_usecs = await _passes(
                client, scheduler, budget, None, max(1, n // budget)
            )
            rows = [
                ("schedules", f"{n}"),
                ("upserts/s (64 concurrent callers)", f"{upsert_rate:,.0f}"),
                (f"ticks committed/s (passes of {budget})", f"{tick_rate:,.0f}"),
                ("passes to commit every tick", f"{len(walls)}"),
                ("due pass wall ms", _summary(walls)),
                ("due pass round trips", f"{min(trips)}-{max(trips)}"),
                ("due pass server script ms", _summary([u / 1000 for u in usecs])),
                ("idle pass wall ms (nothing due)", _summary(idle_walls)),
                ("idle pass round trips", f"{min(idle_trips)}-{max(idle_trips)}"),
                ("idle pass server script ms", _summary([u / 1000 for u in idle_usecs])),
            ]
            print_table(rows)
        finally:
            await cleanup(client, queue)


def _options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--schedules", type=int, default=10_000)
    parser.add_argument("--budget", type=int, default=256)


if __name__ == "__main__":
    run_benchmark(__doc__, lambda url, a: run(url, a.schedules, a.budget), _options)
