"""Lease renewer benchmark: the cost of keeping N long handlers' leases alive.

    python benchmarks/bench_renewer.py [--redis-url URL] [--backend trio|asyncio] [--handlers N]

Starts one worker registration with ``consumer_count=N`` and N jobs whose handlers wait until
released, so N deliveries are running; then reports, for the renewer's own passes:

- round trips per pass (``lease_renew`` calls: one per 500 running deliveries);
- server time per pass (``INFO commandstats`` for EVALSHA; only meaningful on a server nothing
  else uses, such as the embedded one started without ``--redis-url``);
- pass duration as the worker sees it (``renew_pass`` timed directly, many times).

Nothing else sends commands meanwhile: every permit is taken, so the reader does not read, and
the recovery interval is longer than the measurement.
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid
from datetime import timedelta

import anyio
from _common import cleanup, print_table, run_benchmark

from respire_actors import BytesCodec, Job, JobQueue, Worker, WorkerOptions, connect
from respire_actors.actors.renewer import renew_pass


async def _evalsha_stats(client) -> tuple[int, int]:
    """(calls, usec) of EVALSHA since the server started."""
    raw = await client.execute("INFO", "commandstats")
    text = raw.decode() if isinstance(raw, bytes) else str(raw)
    for line in text.splitlines():
        if line.startswith("cmdstat_evalsha:"):
            fields = dict(part.split("=") for part in line.split(":", 1)[1].split(","))
            return int(fields["calls"]), int(fields["usec"])
    return 0, 0


async def bench(client, handlers: int, window: float, direct: int) -> list[tuple[str, str]]:
    q = JobQueue(client, f"bench-renew-{uuid.uuid4().hex[:8]}", BytesCodec())
    await q.enqueue_many((f"j{i}", b"x") for i in range(handlers))
    release = anyio.Event()

    async def handler(job: Job[bytes]) -> None:
        await release.wait()

    visibility = 3.0  # a pass every second
    worker = Worker()
    worker.register(
        q.name,
        handler,
        BytesCodec(),
        WorkerOptions(
            consumer_count=handlers,
            read_batch=min(handlers, 1000),
            visibility_timeout=timedelta(seconds=visibility),
            recovery_interval=timedelta(seconds=3600),
            shutdown_grace=timedelta(seconds=30),
        ),
    )
    rows: list[tuple[str, str]] = []
    async with anyio.create_task_group() as tg:
        await tg.start(worker.run, client)
        stats = worker.statistics(q.name)
        while stats.started < handlers:  # noqa: ASYNC110 - polling a counter
            await anyio.sleep(0.05)
        await anyio.sleep(0.5)  # let intake settle (the reader now waits for permits)
        rt = worker._runtimes[q.name]  # the benchmark reads the runtime

        # the renewer actor's own passes over a window
        passes0, calls0, renewed0 = stats.renewal_passes, stats.renewal_calls, stats.leases_renewed
        trips0 = client.round_trips
        ev_calls0, ev_usec0 = await _evalsha_stats(client)
        await anyio.sleep(window)
        ev_calls1, ev_usec1 = await _evalsha_stats(client)
        passes = stats.renewal_passes - passes0
        calls = stats.renewal_calls - calls0
        trips = client.round_trips - trips0 - 2  # minus the two INFO calls
        renewed = stats.leases_renewed - renewed0
        rows.append(("running handlers", f"{len(rt.leases):,}"))
        rows.append(("renewer passes in the window", f"{passes} in {window:.0f} s"))
        if passes:
            rows.append(
                (
                    "round trips per pass",
                    f"{trips / passes:.2f} ({calls / passes:.2f} lease_renew calls, "
                    f"{renewed / passes:,.0f} leases renewed)",
                )
            )
            evalsha = ev_calls1 - ev_calls0
            if evalsha:
                rows.append(
                    (
                        "server time per pass (EVALSHA usec)",
                        f"{(ev_usec1 - ev_usec0) / passes:,.0f} us "
                        f"({(ev_usec1 - ev_usec0) / max(renewed, 1):.2f} us per lease; "
                        f"{evalsha} EVALSHA in the window)",
                    )
                )
        # pass duration as the worker sees it, timed directly
        durations = []
        for _ in range(direct):
            t = time.perf_counter()
            await renew_pass(rt, visibility)
            durations.append((time.perf_counter() - t) * 1000)
        durations.sort()
        rows.append(
            (
                "pass duration (renew_pass, direct)",
                f"median {statistics.median(durations):.2f} ms, "
                f"p90 {durations[int(len(durations) * 0.9) - 1]:.2f} ms, "
                f"max {durations[-1]:.2f} ms over {direct} passes",
            )
        )
        rows.append(
            ("leases lost during the run", f"{stats.leases_lost} (must be 0)"),
        )
        release.set()
        while stats.acked < handlers:  # noqa: ASYNC110 - polling a counter
            await anyio.sleep(0.05)
        await worker.stop()
        tg.cancel_scope.cancel()
    await cleanup(client, q)
    return rows


async def run(url: str, handlers: int, window: float, direct: int) -> None:
    async with connect(url) as client:
        info = await client.server_info()
        print(f"server: {info.describe()}")
        rows = await bench(client, handlers, window, direct)
        print_table(rows)


def _options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--handlers", type=int, default=1000)
    parser.add_argument("--window", type=float, default=10.0, help="seconds of actor passes")
    parser.add_argument("--direct", type=int, default=50, help="passes timed directly")


if __name__ == "__main__":
    run_benchmark(__doc__, lambda url, a: run(url, a.handlers, a.window, a.direct), _options)
