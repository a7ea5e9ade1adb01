"""Enqueue-to-processing tracing (spec: "Enqueue-to-processing tracing"): a PRODUCER span per
enqueue whose W3C context is persisted with the winning enqueue, a CONSUMER span per delivery
attempt that is a new root linked to it, on both servers and both backends."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from datetime import timedelta
from typing import Any

import anyio
import pytest
from helpers.otel import Otel
from jobs_helpers import (
    create_group,
    deliver,
    fast_options,
    fields_of,
    running_worker,
    wait_until,
    wait_until_async,
)
from opentelemetry import trace
from opentelemetry.trace import (
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    StatusCode,
    TraceFlags,
    format_span_id,
    format_trace_id,
)
from sched_helpers import sched_options, scheduling_worker

from respire_actors import tracing
from respire_actors.errors import QueueFull
from respire_actors.jobs import ACK, NACK, EnqueueResult, Job, JobEnqueueOptions, JobQueue
from respire_actors.redis.client import RedisClient

pytestmark = pytest.mark.anyio

TRACER = trace.get_tracer("tests")


def traceparent(ctx: SpanContext) -> str:
    flags = f"{int(ctx.trace_flags):02x}"
    return f"00-{format_trace_id(ctx.trace_id)}-{format_span_id(ctx.span_id)}-{flags}"


def ids(ctx: SpanContext) -> tuple[int, int]:
    return ctx.trace_id, ctx.span_id


def linked(span: Any) -> list[tuple[int, int]]:
    return [ids(link.context) for link in span.links]


async def envelope(client: RedisClient, queue: JobQueue[Any], entry_id: str) -> dict[str, str]:
    rows = await client.execute("XRANGE", queue.keys.ready, entry_id, entry_id)
    return {k: bytes(v).decode() for k, v in fields_of(rows[0][1]).items()}


async def test_enqueue_is_a_producer_span_whose_context_is_persisted(
    otel: Otel, queue: JobQueue[str], client: RedisClient
) -> None:
    with TRACER.start_as_current_span("request") as request:
        result = await queue.enqueue("j1", "hello")
    [span] = otel.spans("job enqueue")
    assert span.kind is SpanKind.PRODUCER
    assert span.parent is not None and span.parent.span_id == request.get_span_context().span_id
    assert span.attributes is not None
    assert span.attributes["messaging.system"] == "respire"
    assert span.attributes["messaging.destination.name"] == queue.name
    assert span.attributes["messaging.operation.type"] == "send"
    assert span.attributes["messaging.message.id"] == result.entry_id
    assert span.attributes["respire.job.id"] == "j1"
    assert "hello" not in str(dict(span.attributes))  # no payloads
    fields = await envelope(client, queue, result.entry_id)
    assert fields["_respire.trace.parent"] == traceparent(span.context)


async def test_tracestate_is_persisted_with_the_parent(
    otel: Otel, queue: JobQueue[str], client: RedisClient
) -> None:
    remote = SpanContext(
        trace_id=0x1234,
        span_id=0x5678,
        is_remote=True,
        trace_flags=TraceFlags(TraceFlags.SAMPLED),
        trace_state=trace.TraceState([("vendor", "v1")]),
    )
    with trace.use_span(NonRecordingSpan(remote)):
        result = await queue.enqueue("j1", "x")
    fields = await envelope(client, queue, result.entry_id)
    assert fields["_respire.trace.state"] == "vendor=v1"
    [span] = otel.spans("job enqueue")
    assert span.context.trace_id == 0x1234  # a child of the remote caller
    assert fields["_respire.trace.parent"] == traceparent(span.context)


async def test_a_deduplicated_enqueue_keeps_the_first_context(
    otel: Otel, queue: JobQueue[str], client: RedisClient
) -> None:
    first = await queue.enqueue("j1", "a")
    again = await queue.enqueue("j1", "b")
    assert again.entry_id == first.entry_id and not again.enqueued
    one, two = otel.spans("job enqueue")
    assert one.context.trace_id != two.context.trace_id
    assert two.attributes is not None and two.attributes["respire.job.deduplicated"] is True
    fields = await envelope(client, queue, first.entry_id)
    assert fields["_respire.trace.parent"] == traceparent(one.context)


async def test_without_a_sampled_span_the_ambient_context_propagates(
    otel: Otel, queue: JobQueue[str], client: RedisClient
) -> None:
    ambient = SpanContext(trace_id=0xABC, span_id=0xDEF, is_remote=True, trace_flags=TraceFlags(0))
    with trace.use_span(NonRecordingSpan(ambient)):
        result = await queue.enqueue("j1", "x")
    assert otel.spans("job enqueue") == []  # the parent-based sampler dropped the producer span
    fields = await envelope(client, queue, result.entry_id)
    assert fields["_respire.trace.parent"] == (
        f"00-{format_trace_id(0xABC)}-{format_span_id(0xDEF)}-00"
    )


async def test_without_any_context_no_trace_fields_are_written(
    monkeypatch: pytest.MonkeyPatch, queue: JobQueue[str], client: RedisClient
) -> None:
    monkeypatch.setattr(tracing, "enabled", lambda: False)  # as with no SDK installed
    result = await queue.enqueue("j1", "x")
    fields = await envelope(client, queue, result.entry_id)
    assert not any(k.startswith("_respire.trace") for k in fields)
    # an ambient context still propagates without an SDK
    ambient = SpanContext(trace_id=7, span_id=8, is_remote=True, trace_flags=TraceFlags(1))
    with trace.use_span(NonRecordingSpan(ambient)):
        second = await queue.enqueue("j2", "x")
    fields = await envelope(client, queue, second.entry_id)
    assert fields["_respire.trace.parent"].endswith("-01")


async def test_pipelined_and_scheduled_enqueues_each_get_a_producer_span(
    otel: Otel, queue: JobQueue[str], client: RedisClient
) -> None:
    many = await queue.enqueue_many([("a", "1"), ("b", "2")])
    staged = await queue.enqueue_scheduled("c", "3", JobEnqueueOptions(delay=timedelta(hours=1)))
    staged_many = await queue.enqueue_scheduled_many([("d", "4")])
    spans = otel.spans("job enqueue")
    assert sorted(str((s.attributes or {})["respire.job.id"]) for s in spans) == [
        "a",
        "b",
        "c",
        "d",
    ]
    by_job = {(s.attributes or {})["respire.job.id"]: s for s in spans}
    for job_id, result in zip("ab", many, strict=True):
        fields = await envelope(client, queue, result.entry_id)
        assert fields["_respire.trace.parent"] == traceparent(by_job[job_id].context)
    for job_id, result in zip("cd", (staged, *staged_many), strict=True):
        rows = await client.execute(
            "XRANGE", queue.keys.scheduled, result.entry_id, result.entry_id
        )
        fields = fields_of(rows[0][1])
        assert bytes(fields["_respire.trace.parent"]).decode() == traceparent(
            by_job[job_id].context
        )
        assert (by_job[job_id].attributes or {})["messaging.message.id"] == result.entry_id


@pytest.mark.parametrize("scheduled", [False, True], ids=["enqueue_many", "scheduled_many"])
async def test_a_refused_job_of_a_many_call_fails_only_its_own_span(
    otel: Otel, queue: JobQueue[str], client: RedisClient, scheduled: bool
) -> None:
    """A job refused by the backlog bound used to mark every span of the call failed (the
    error went through all of them), the accepted jobs' included."""
    await queue.set_max_backlog(2)
    jobs = [("a", "1"), ("b", "2"), ("c", "3")]
    with pytest.raises(QueueFull) as refused:
        if scheduled:
            await queue.enqueue_scheduled_many(jobs)
        else:
            await queue.enqueue_many(jobs)
    outcomes = refused.value.partial_results
    assert outcomes is not None
    by_job = {(s.attributes or {})["respire.job.id"]: s for s in otel.spans("job enqueue")}
    for (job_id, _), outcome in zip(jobs, outcomes, strict=True):
        span = by_job[job_id]
        if isinstance(outcome, EnqueueResult):
            assert span.status.status_code is StatusCode.UNSET, job_id
            assert (span.attributes or {})["messaging.message.id"] == outcome.entry_id
        else:
            assert span.status.status_code is StatusCode.ERROR, job_id
            assert (span.attributes or {})["error.type"] == "QueueFull"
    assert sum(isinstance(o, EnqueueResult) for o in outcomes) == 2


async def test_enqueue_in_a_transaction_carries_the_context(
    otel: Otel, queue: JobQueue[str], client: RedisClient
) -> None:
    async with client.transaction() as tx:
        pending = queue.enqueue_in(tx, "j1", "x")
        assert await tx.commit()
    result = pending.result()
    [span] = otel.spans("job enqueue")
    fields = await envelope(client, queue, result.entry_id)
    assert fields["_respire.trace.parent"] == traceparent(span.context)
    # the span stays open until EXEC, to carry the reply (it used to end before the commit
    # with the job id only); a repeat is recorded as deduplicated, a discard as failed
    assert (span.attributes or {})["messaging.message.id"] == result.entry_id
    assert (span.attributes or {})["respire.job.deduplicated"] is False
    async with client.transaction() as tx:
        again = queue.enqueue_scheduled_in(tx, "j1", "x")
        assert await tx.commit()
    assert again.result().enqueued is False
    async with client.transaction() as tx:
        queue.enqueue_in(tx, "j2", "x")
        await tx.discard()
    _, repeat, discarded = otel.spans("job enqueue")
    assert (repeat.attributes or {})["respire.job.deduplicated"] is True
    assert discarded.status.status_code is StatusCode.ERROR
    # refused before it was queued (the transaction is over): its span ends at once, failed
    with pytest.raises(RuntimeError):
        queue.enqueue_in(tx, "j3", "x")
    refused = otel.spans("job enqueue")[-1]
    assert (refused.attributes or {})["respire.job.id"] == "j3"
    assert (refused.attributes or {})["error.type"] == "RuntimeError"


async def test_processing_is_a_new_root_linked_to_the_enqueue(
    otel: Otel, queue: JobQueue[str], client: RedisClient
) -> None:
    done = anyio.Event()
    child_parent: list[int] = []

    async def handler(job: Job[str]) -> object:
        with TRACER.start_as_current_span("send email") as child:
            assert child.get_span_context().is_valid
        child_parent.append(trace.get_current_span().get_span_context().span_id)
        done.set()
        return ACK

    result = await queue.enqueue("j1", "x")
    with TRACER.start_as_current_span("worker host"):  # the host's ambient context
        async with running_worker(client, queue.name, handler):
            with anyio.fail_after(10):
                await done.wait()
    [producer] = otel.spans("job enqueue")
    [process] = otel.spans("job process")
    [child] = otel.spans("send email")
    assert process.kind is SpanKind.CONSUMER
    assert process.parent is None  # never the worker host's ambient span
    assert process.context.trace_id != producer.context.trace_id
    assert linked(process) == [ids(producer.context)]
    assert child.parent is not None and child.parent.span_id == process.context.span_id
    assert child_parent == [process.context.span_id]
    attrs = process.attributes or {}
    assert attrs["messaging.message.id"] == result.entry_id
    assert attrs["messaging.destination.name"] == queue.name
    assert attrs["messaging.operation.type"] == "process"
    assert attrs["respire.job.id"] == "j1"
    assert attrs["respire.outcome"] == "ack"


async def _one_processed(
    otel: Otel, client: RedisClient, queue: JobQueue[str], handler: Any, **options: Any
) -> Any:
    await queue.enqueue("j1", "x")
    async with running_worker(client, queue.name, handler, options=fast_options(**options)):
        await wait_until(lambda: bool(otel.spans("job process")))
    return otel.spans("job process")[0]


async def test_a_handler_out_of_its_budget_is_a_failed_timeout_span(
    otel: Otel, queue: JobQueue[str], client: RedisClient
) -> None:
    """A budget timeout was recorded like a shutdown: status unset, outcome cancelled."""

    async def handler(job: Job[str]) -> object:
        await anyio.sleep(10)
        return ACK

    span = await _one_processed(otel, client, queue, handler, timeout=0.2, delivery_limit=1)
    assert span.status.status_code is StatusCode.ERROR
    assert (span.attributes or {})["error.type"] == "TimeoutError"
    assert (span.attributes or {})["respire.outcome"] == "timeout"


async def test_an_unawaited_return_is_a_failed_invalid_span(
    otel: Otel, queue: JobQueue[str], client: RedisClient
) -> None:
    """The runner treats it as a failure; the span used to say ack."""

    async def work() -> None:
        pass

    async def handler(job: Job[str]) -> object:
        return work()  # no await: the work never ran

    span = await _one_processed(otel, client, queue, handler, delivery_limit=1)
    assert span.status.status_code is StatusCode.ERROR
    assert (span.attributes or {})["respire.outcome"] == "invalid"


async def test_a_trio_nursery_handler_cancelled_at_shutdown_is_a_cancelled_span(
    otel: Otel, queue: JobQueue[str], client: RedisClient, anyio_backend: str
) -> None:
    """A trio nursery cancelled from outside raises its Cancelled wrapped in a group: it was
    recorded as a failure (ERROR, outcome raised)."""
    if anyio_backend != "trio":
        pytest.skip("a trio nursery")
    import trio

    started = anyio.Event()

    async def handler(job: Job[str]) -> object:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.sleep, 30)
            started.set()
            await trio.sleep(30)
        return ACK

    await queue.enqueue("j1", "x")
    options = fast_options(shutdown_grace=timedelta(milliseconds=300))
    async with running_worker(client, queue.name, handler, options=options):
        with anyio.fail_after(10):
            await started.wait()
    await wait_until(lambda: bool(otel.spans("job process")))
    [span] = otel.spans("job process")
    assert span.status.status_code is StatusCode.UNSET
    assert (span.attributes or {})["respire.outcome"] == "cancelled"


async def test_a_fixed_lease_running_out_is_a_lease_lost_span(
    otel: Otel, queue: JobQueue[str], client: RedisClient
) -> None:
    async def handler(job: Job[str]) -> object:
        await anyio.sleep(10)
        return ACK

    span = await _one_processed(
        otel,
        client,
        queue,
        handler,
        renew_leases=False,
        visibility_timeout=timedelta(milliseconds=300),
        recovery_interval=timedelta(seconds=60),
    )
    assert (span.attributes or {})["respire.outcome"] == "lease-lost"


async def test_an_invalid_incoming_context_is_ignored(
    otel: Otel, queue: JobQueue[str], client: RedisClient
) -> None:
    await create_group(client, queue.keys)
    for i, bad in enumerate([b"garbage", b"00-" + b"0" * 32 + b"-" + b"1" * 16 + b"-01", b""]):
        await client.execute(
            "XADD", queue.keys.ready, "*", "_respire.job.id", f"j{i}", "_respire.job.payload",
            "x", "_respire.trace.parent", bad, "_respire.trace.state", "bad state ,,",
        )  # fmt: skip
    seen: list[str] = []

    async def handler(job: Job[str]) -> object:
        seen.append(job.id)
        return ACK

    async with running_worker(client, queue.name, handler) as worker:
        await wait_until(lambda: worker.statistics(queue.name).acked == 3)
    spans = otel.spans("job process")
    assert sorted(seen) == ["j0", "j1", "j2"]
    assert len(spans) == 3 and all(s.links == () for s in spans)


async def test_a_durable_retry_links_every_attempt_to_the_original_enqueue(
    otel: Otel, queue: JobQueue[str], client: RedisClient
) -> None:
    attempts: list[int] = []

    async def handler(job: Job[str]) -> object:
        attempts.append(job.total_attempts)
        return NACK if len(attempts) == 1 else ACK

    with TRACER.start_as_current_span("request"):
        await queue.enqueue("j1", "x")
    [producer] = otel.spans("job enqueue")
    qo = sched_options(retry_backoff=timedelta(milliseconds=1))
    async with scheduling_worker(client, queue.name, handler, queue_options=qo) as worker:
        await wait_until(lambda: worker.statistics(queue.name).acked == 1)
        assert worker.statistics(queue.name).retried == 1
    first, second = otel.spans("job process")
    assert attempts == [1, 2]
    assert (first.attributes or {})["messaging.message.id"] != (
        (second.attributes or {})["messaging.message.id"]
    )  # the retry is a new entry...
    for span in (first, second):  # ...linked to the same producer context
        assert linked(span) == [ids(producer.context)]
        assert span.parent is None
    assert first.context.trace_id != second.context.trace_id
    assert (first.attributes or {})["respire.outcome"] == "nack"


async def test_recovery_by_another_consumer_links_to_the_enqueue(
    otel: Otel, queue: JobQueue[str], client: RedisClient
) -> None:
    await create_group(client, queue.keys)
    await queue.enqueue("j1", "x")
    [producer] = otel.spans("job enqueue")
    [crashed] = await deliver(client, queue.keys, "crashed-host")  # delivered, never finished
    done = anyio.Event()

    async def handler(job: Job[str]) -> object:
        done.set()
        return ACK

    options = fast_options(visibility_timeout=timedelta(milliseconds=200))
    async with running_worker(client, queue.name, handler, options=options) as worker:
        with anyio.fail_after(10):
            await done.wait()
        await wait_until(lambda: worker.statistics(queue.name).acked == 1)
        assert worker.statistics(queue.name).recovered == 1
    [process] = otel.spans("job process")
    assert (process.attributes or {})["messaging.message.id"] == crashed.entry_id
    assert (process.attributes or {})["respire.delivery.attempt"] == 2
    assert linked(process) == [ids(producer.context)]


@pytest.mark.parametrize("failing", ["start", "end", "export"])
async def test_failing_span_processors_and_exporters_change_no_outcome(
    otel: Otel, queue: JobQueue[str], client: RedisClient, failing: str
) -> None:
    otel.raising.failing = {failing}
    results = [await queue.enqueue(f"j{i}", "x") for i in range(3)]
    assert all(r.enqueued for r in results)
    await queue.enqueue_many([("m", "y")])

    async def handler(job: Job[str]) -> object:
        if job.id == "j0":
            raise RuntimeError("boom")
        return ACK

    options = fast_options(delivery_limit=1)
    async with running_worker(client, queue.name, handler, options=options) as worker:
        await wait_until(
            lambda: (
                worker.statistics(queue.name).acked == 3
                and worker.statistics(queue.name).dead_lettered == 1
            )
        )
        stats = worker.statistics(queue.name)
        assert (stats.failed, stats.stale_completions, stats.rejected_completions) == (1, 0, 0)


async def test_recurring_ticks_are_enqueued_under_a_producer_span(
    otel: Otel, queue: JobQueue[str], client: RedisClient
) -> None:
    scheduler = queue.scheduler()
    await scheduler.upsert("every", "tick", interval=timedelta(milliseconds=1))
    await anyio.sleep(0.01)
    assert await scheduler.run_due() == 1
    [span] = otel.spans("job enqueue")
    assert span.kind is SpanKind.PRODUCER
    attrs = span.attributes or {}
    assert attrs["respire.recurring.schedule"] == "every"
    fields = await envelope(client, queue, str(attrs["messaging.message.id"]))
    assert fields["_respire.trace.parent"] == traceparent(span.context)
    assert fields["_respire.job.id"] == str(attrs["respire.job.id"])


CRASHING_WORKER = textwrap.dedent(
    """
    import sys
    from datetime import timedelta

    import anyio

    from respire_actors.codecs import StrCodec
    from respire_actors.jobs import Worker, WorkerOptions
    from respire_actors.redis.client import connect

    url, queue, ready_key = sys.argv[1:4]

    async def main():
        async with connect(url) as client:
            async def handler(job):
                parent = job.delivery.fields.get(b"_respire.trace.parent", b"")
                await client.execute("SET", ready_key, parent)
                await anyio.sleep_forever()

            worker = Worker()
            options = WorkerOptions(
                consumer_name="doomed", visibility_timeout=timedelta(seconds=60)
            )
            worker.register(queue, handler, StrCodec(), options)
            await worker.run(client)

    anyio.run(main)
    """
)


@pytest.mark.slow
async def test_a_killed_process_job_recovered_elsewhere_links_to_its_enqueue(
    otel: Otel, server_url: str, client: RedisClient, queue: JobQueue[str]
) -> None:
    with TRACER.start_as_current_span("request"):
        enqueued = await queue.enqueue("crash", "x")
    [producer] = otel.spans("job enqueue")
    ready_key = queue.keys.custom("crash-ready")
    process = await anyio.open_process(
        [sys.executable, "-c", CRASHING_WORKER, server_url, queue.name, ready_key],
        stdin=subprocess.DEVNULL,
        stdout=None,
        stderr=None,
    )
    try:

        async def handler_running() -> bool:
            assert process.returncode is None, "the worker process exited early"
            return bool(await client.execute("EXISTS", ready_key))

        await wait_until_async(handler_running, timeout=30)
    finally:
        process.kill()  # SIGKILL: no cleanup, no acknowledgement
        with anyio.fail_after(10, shield=True):
            await process.aclose()
    assert process.returncode == -signal.SIGKILL
    # the killed process saw the producer's context in the envelope
    assert (await client.execute("GET", ready_key)).decode() == traceparent(producer.context)

    async def handler(job: Job[str]) -> object:
        return ACK

    options = fast_options(visibility_timeout=timedelta(milliseconds=300))
    async with running_worker(client, queue.name, handler, options=options) as worker:
        await wait_until(lambda: worker.statistics(queue.name).acked == 1)
        assert worker.statistics(queue.name).recovered == 1
    [process_span] = otel.spans("job process")
    attrs = process_span.attributes or {}
    assert (attrs["messaging.message.id"], attrs["respire.delivery.attempt"]) == (
        enqueued.entry_id,
        2,
    )
    assert process_span.parent is None
    assert linked(process_span) == [ids(producer.context)]


async def test_batch_members_carry_the_context_of_their_add(
    otel: Otel, queue: JobQueue[str], client: RedisClient
) -> None:
    batch = await queue.create_batch()
    assert await queue.add_to_batch(batch, "m1", "x")
    assert await queue.add_many_to_batch(batch, [("m2", "y"), ("m3", "z")]) == [True, True]
    one, many = otel.spans("job enqueue")
    assert (one.attributes or {})["respire.batch.id"] == batch
    rows = await client.execute("XRANGE", queue.keys.ready, "-", "+")
    parents = {
        bytes(f["_respire.job.id"]).decode(): bytes(f["_respire.trace.parent"]).decode()
        for f in (fields_of(r[1]) for r in rows)
    }
    assert parents == {
        "m1": traceparent(one.context),
        "m2": traceparent(many.context),
        "m3": traceparent(many.context),
    }


def test_a_failing_span_is_logged_with_every_documented_field() -> None:
    """Found by review: the DEBUG records of span processor or exporter failures carried none
    of the fields every ``respire_actors.telemetry`` record is documented to carry, so a
    format string naming them failed ("Formatting field not found in record: 'event'")."""
    import logging

    from respire_actors import tracing

    class Broken:
        def end(self) -> None:
            raise RuntimeError("exporter down")

        def set_attributes(self, attributes: object) -> None:
            raise RuntimeError("exporter down")

    formatted: list[str] = []

    class Capture(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            formatted.append(self.format(record))  # raises on a missing field

    handler = Capture()
    handler.setFormatter(
        logging.Formatter("%(event)s|%(queue)s|%(job_id)s|%(entry_id)s|%(attempt)s|%(trace_id)s")
    )
    logger = logging.getLogger("respire_actors.telemetry")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        tracing.end(Broken())  # type: ignore[arg-type]
        tracing.set_attributes(Broken(), {"a": 1})  # type: ignore[arg-type]
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    assert [f.splitlines()[0] for f in formatted] == ["telemetry-failed||||0|"] * 2


async def test_a_partitioned_queue_is_one_destination_on_both_sides(
    otel: Otel, client: RedisClient, unique_name: str
) -> None:
    """Found by review: producers named the partition (``<name>:p1``) and workers the
    partitioned queue, so an enqueue and its processing had two destinations."""
    from respire_actors import PartitionedJobQueue, StrCodec

    queue = PartitionedJobQueue(client, unique_name, StrCodec(), partitions=4)
    await queue.enqueue("pj1", "x")
    await queue.enqueue_many([("pj2", "x")])
    done = anyio.Event()

    async def handler(job: Job[str]) -> object:
        if job.id == "pj2":
            done.set()
        return ACK

    async with running_worker(client, unique_name, handler, partitions=4):
        with anyio.fail_after(10):
            await done.wait()
    expected = {"pj1": queue.partition_of("pj1"), "pj2": queue.partition_of("pj2")}
    for name in ("job enqueue", "job process"):
        spans = [s.attributes or {} for s in otel.spans(name)]
        assert {a["respire.job.id"]: a["respire.partition"] for a in spans} == expected, name
        assert {a["messaging.destination.name"] for a in spans} == {unique_name}, name


async def test_a_batch_add_carries_its_job_id_and_whether_it_was_new(
    otel: Otel, queue: JobQueue[str]
) -> None:
    """Found by review: an ``add_to_batch`` span had no job id and no dedup flag."""
    await queue.create_batch(batch_id="b1")
    assert await queue.add_to_batch("b1", "m1", "x") is True
    assert await queue.add_to_batch("b1", "m1", "y") is False
    first, repeat = otel.spans("job enqueue")
    for span, deduplicated in ((first, False), (repeat, True)):
        attrs = span.attributes or {}
        assert attrs["respire.job.id"] == "m1"
        assert attrs["respire.batch.id"] == "b1"
        assert attrs["respire.job.deduplicated"] is deduplicated
