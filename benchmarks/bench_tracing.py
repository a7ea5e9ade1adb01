"""Telemetry overhead: no-op job throughput with telemetry off, with the OpenTelemetry API only
(no SDK, the library's default state), with the SDK and in-memory exporters, and the cost of the
per-minute completion metrics in Redis (``queue-options``: the API-only worker with
``QueueOptions()``; ``redis-metrics``: the same with ``metrics_retention_minutes=60``; compare
these two, since queue options alone switch reads to the scheduling-aware script).

    python benchmarks/bench_tracing.py [--redis-url URL] [--backend trio|asyncio] [--jobs N]
                                       [--rounds R] [--concurrency C]

Each mode runs in its own process (a global tracer provider can be set only once), rounds
interleaved (off, api, sdk, off, ...) so drift of a shared machine hits every mode alike; the
table shows the median of the rounds. ``off`` bypasses the handler wrapper and the producer
spans entirely (the code before telemetry); ``api`` is what an application without an SDK
pays; ``sdk`` records every span (SimpleSpanProcessor + InMemorySpanExporter) and the handler
histogram (InMemoryMetricReader).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio

MODES = ("off", "api", "sdk", "queue-options", "redis-metrics")
SCRIPT = str(Path(__file__).resolve())


def _set_mode(mode: str) -> None:
    from respire_actors import tracing
    from respire_actors.actors import runner

    if mode == "off":

        async def direct(rt: Any, delivery: Any, arg: Any) -> Any:
            return await rt.handler(arg)

        @contextlib.contextmanager
        def no_span(*args: Any, **kwargs: Any) -> Iterator[None]:
            yield None

        runner.run_handler = direct  # type: ignore[assignment]
        tracing.producer_span = no_span  # type: ignore[assignment]
        tracing.context_fields = lambda *args, **kwargs: []  # type: ignore[assignment]
    elif mode == "sdk":
        from opentelemetry import metrics, trace
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(InMemorySpanExporter()))
        trace.set_tracer_provider(provider)
        metrics.set_meter_provider(MeterProvider(metric_readers=[InMemoryMetricReader()]))


async def _child(url: str, args: argparse.Namespace) -> None:
    from bench_jobs import bench_enqueue, bench_process

    from respire_actors import QueueOptions, connect

    _set_mode(args.mode)
    qo = None
    if args.mode == "queue-options":
        qo = QueueOptions()
    elif args.mode == "redis-metrics":
        qo = QueueOptions(metrics_retention_minutes=60)
    async with connect(url) as client:
        single, piped = await bench_enqueue(client, args.jobs)
        rate, _ = await bench_process(client, args.jobs, args.concurrency, queue_options=qo)
    print(json.dumps({"single": single, "piped": piped, "process": rate}))


async def _parent(url: str, args: argparse.Namespace) -> None:
    from _common import print_table

    results: dict[str, list[dict[str, float]]] = {m: [] for m in MODES}
    for _ in range(args.rounds):
        for mode in MODES:
            done = await anyio.run_process(
                [sys.executable, SCRIPT, "--redis-url", url, "--backend", args.backend,
                 "--jobs", str(args.jobs), "--concurrency", str(args.concurrency),
                 "--mode", mode],
            )  # fmt: skip
            out = done.stdout.decode()
            results[mode].append(json.loads(out.strip().splitlines()[-1]))
    rows = []
    for mode in MODES:
        base = statistics.median(
            r["process"] for r in results["queue-options" if mode == "redis-metrics" else "off"]
        )
        process = statistics.median(r["process"] for r in results[mode])
        single = statistics.median(r["single"] for r in results[mode])
        piped = statistics.median(r["piped"] for r in results[mode])
        rows.append(
            (
                mode if mode in ("queue-options", "redis-metrics") else f"tracing {mode}",
                f"process {process:,.0f} jobs/s ({(process / base - 1) * 100:+.1f}%), "
                f"enqueue {single:,.0f}/s, enqueue_many {piped:,.0f}/s",
            )
        )
    print(f"median of {args.rounds} rounds, concurrency {args.concurrency}, {args.jobs} jobs")
    print_table(rows)


def _options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--jobs", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--mode", choices=MODES, default=None, help=argparse.SUPPRESS)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    if "--mode" in sys.argv:
        # a child: one mode, one result line (no machine line)
        parser = argparse.ArgumentParser()
        parser.add_argument("--redis-url", required=True)
        parser.add_argument("--backend", default="trio")
        _options(parser)
        child_args = parser.parse_args()
        anyio.run(_child, child_args.redis_url, child_args, backend=child_args.backend)
    else:
        from _common import run_benchmark

        run_benchmark(__doc__, _parent, _options)
