"""A tracing demo for ``python -m respire_actors serve examples.tracing_app:app``.

It wires the OpenTelemetry SDK with its console exporters (one compact line per span, and the
``respire.*`` metrics once at the end), enqueues a few jobs inside a ``checkout`` span, and
runs a worker whose handler opens its own child span. One job fails its first attempt and is
retried durably: both of its ``job process`` spans link to the same ``job enqueue`` span.

The library itself only uses the OpenTelemetry API; choosing the SDK and the exporter (here the
console, in production usually OTLP to a collector) is the application's job, done once at
start-up before anything is traced.

Environment: ``DEMO_JOBS`` (default 3), ``DEMO_RUN`` (default: a fresh id per run).
"""

from __future__ import annotations

import os
import uuid
from datetime import timedelta

import anyio
import anyio.abc
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    ConsoleMetricExporter,
    MetricsData,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor

from respire_actors import (
    NACK,
    Job,
    JobQueue,
    QueueOptions,
    RedisClient,
    StrCodec,
    Worker,
    WorkerOptions,
)
from supervisors import current_child

QUEUE = "demo-tracing"


def _span_line(span: ReadableSpan) -> str:
    links = ",".join(f"{link.context.span_id:016x}" for link in span.links)
    parent = f"{span.parent.span_id:016x}" if span.parent else "root"
    attrs = span.attributes or {}
    job = attrs.get("respire.job.id", "")
    return (
        f"span {span.name:<14} id={span.context.span_id:016x} parent={parent:<16} "
        f"links=[{links}] job={job} outcome={attrs.get('respire.outcome', '')}\n"
    )


def _metric_lines(data: MetricsData) -> str:
    lines = []
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                if not m.name.startswith("respire."):
                    continue
                for p in m.data.data_points:
                    attrs = {k: v for k, v in (p.attributes or {}).items() if k != NAME}
                    value = getattr(p, "value", None)
                    if value is None:
                        value = f"count={getattr(p, 'count', '?')}"
                    lines.append(f"metric {m.name} {attrs} {value}")
    return "\n".join(lines) + "\n"


NAME = "respire.telemetry_name"

# Once per process, before anything is traced: the SDK and its exporters.
trace.set_tracer_provider(TracerProvider())
trace.get_tracer_provider().add_span_processor(  # type: ignore[attr-defined]
    SimpleSpanProcessor(ConsoleSpanExporter(formatter=_span_line))
)
_reader = PeriodicExportingMetricReader(
    ConsoleMetricExporter(formatter=_metric_lines), export_interval_millis=3_600_000
)
_meter_provider = MeterProvider(metric_readers=[_reader], shutdown_on_exit=False)
metrics.set_meter_provider(_meter_provider)

tracer = trace.get_tracer("examples.tracing_app")
worker = Worker("tracing-demo")
failed_once: set[str] = set()


@worker.job(
    QUEUE,
    StrCodec(),
    WorkerOptions(consumer_count=2),
    queue_options=QueueOptions(retry_backoff=timedelta(milliseconds=100)),
)
async def send_receipt(job: Job[str]) -> object:
    with tracer.start_as_current_span("send receipt"):  # a child of "job process"
        await anyio.sleep(0.01)
    if job.id.endswith(":0") and job.id not in failed_once:
        failed_once.add(job.id)
        return NACK  # a durable retry: the next attempt links to the same enqueue
    return None


class TracingDemo:
    def __init__(self, jobs: int, run_id: str) -> None:
        self.jobs = jobs
        self.run_id = run_id

    async def run(
        self,
        client: RedisClient,
        *,
        task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        queue = JobQueue(client, QUEUE, StrCodec())
        ids = [f"receipt:{self.run_id}:{i}" for i in range(self.jobs)]
        async with anyio.create_task_group() as tg:
            await tg.start(worker.run, client)
            task_status.started()
            with current_child().stop_scope():
                async with queue.read_events("$") as events:
                    with tracer.start_as_current_span("checkout"):
                        await queue.enqueue_many((job_id, "order") for job_id in ids)
                    done: set[str] = set()
                    async for event in events:
                        if event.job_id in ids and event.kind in ("completed", "dead-letter"):
                            done.add(event.job_id)
                            if len(done) == len(ids):
                                break
            _meter_provider.force_flush()  # export the counters while the worker still runs
            await worker.stop()
            tg.cancel_scope.cancel()
        print(f"{len(done)} of {len(ids)} jobs completed; {worker.statistics(QUEUE)}")


app = TracingDemo(
    int(os.environ.get("DEMO_JOBS", "3")), os.environ.get("DEMO_RUN", uuid.uuid4().hex[:8])
)
