"""Stream workers link each processing span to the producer context an application wrote
with ``respire_actors.tracing.trace_fields()`` (or under its own field names)."""

from __future__ import annotations

import anyio
import pytest
from helpers.otel import Otel
from opentelemetry import trace
from opentelemetry.trace import SpanKind
from streams_helpers import fast_options, running, stats, wait_until

from respire_actors import ACK, StreamEntry, tracing
from respire_actors.redis.client import RedisClient

pytestmark = pytest.mark.anyio

TRACER = trace.get_tracer("tests")


async def test_a_stream_entry_links_to_the_context_written_with_it(
    otel: Otel, client: RedisClient, unique_name: str
) -> None:
    stream = f"{{{unique_name}}}:orders"
    with TRACER.start_as_current_span("publish") as publish:
        await client.execute("XADD", stream, "*", "order", "1", *tracing.trace_fields())
    await client.execute("XADD", stream, "*", "order", "2")  # no context: no link
    done = anyio.Event()
    seen: list[str] = []

    async def handler(entry: StreamEntry) -> object:
        seen.append(entry.fields[b"order"].decode())
        with TRACER.start_as_current_span("bill"):
            pass
        if len(seen) == 2:
            done.set()
        return ACK

    options = fast_options(telemetry_name=f"{unique_name}-orders")
    with TRACER.start_as_current_span("host"):
        async with running(client, stream, handler, options) as worker:
            with anyio.fail_after(10):
                await done.wait()
            await wait_until(lambda: stats(worker, stream).acked == 2)
    spans = {(s.attributes or {})["messaging.message.id"]: s for s in otel.spans("stream process")}
    assert len(spans) == 2
    first, second = sorted(
        spans.values(), key=lambda s: str((s.attributes or {})["messaging.message.id"])
    )
    assert first.kind is SpanKind.CONSUMER and first.parent is None
    assert [(link.context.trace_id, link.context.span_id) for link in first.links] == [
        (publish.get_span_context().trace_id, publish.get_span_context().span_id)
    ]
    assert second.links == () and second.parent is None
    attrs = first.attributes or {}
    assert attrs["messaging.destination.name"] == stream
    assert attrs["messaging.consumer.group.name"] == "respire"
    assert attrs["respire.telemetry_name"] == f"{unique_name}-orders"
    assert "respire.job.id" not in attrs
    bills = otel.spans("bill")
    assert {b.parent.span_id for b in bills if b.parent} == {
        s.context.span_id for s in spans.values()
    }


async def test_custom_trace_field_names(otel: Otel, client: RedisClient, unique_name: str) -> None:
    stream = f"{{{unique_name}}}:events"
    names = ("tp", "ts")
    with TRACER.start_as_current_span("publish") as publish:
        await client.execute("XADD", stream, "*", "n", "1", *tracing.trace_fields(names))
    done = anyio.Event()

    async def handler(entry: StreamEntry) -> object:
        assert b"tp" in entry.fields
        done.set()
        return ACK

    async with running(client, stream, handler, fast_options(trace_fields=names)) as worker:
        with anyio.fail_after(10):
            await done.wait()
        await wait_until(lambda: stats(worker, stream).acked == 1)
    [span] = otel.spans("stream process")
    assert [link.context.span_id for link in span.links] == [publish.get_span_context().span_id]


def test_trace_field_names_are_validated() -> None:
    from respire_actors.errors import ValidationError
    from respire_actors.streams import StreamWorkerOptions

    for bad in [("a",), ("a", "a"), ("a", ""), ["a", "b"]]:
        with pytest.raises(ValidationError, match="trace_fields"):
            StreamWorkerOptions(trace_fields=bad)  # type: ignore[arg-type]
