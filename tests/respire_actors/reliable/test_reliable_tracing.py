"""Reliable queues and topics: a ``message send`` PRODUCER span whose W3C context is stored
with the message (a deduplicated send keeps the first), and a ``message receive`` CONSUMER span
linked to every received message's send; messages expose the context for the application's own
processing span."""

from __future__ import annotations

import pytest
from helpers.otel import Otel
from opentelemetry import trace
from opentelemetry.trace import SpanKind, format_span_id, format_trace_id

from respire_actors import tracing
from respire_actors.codecs import StrCodec
from respire_actors.errors import ScriptError
from respire_actors.redis.client import RedisClient
from respire_actors.redis.scripts import load
from respire_actors.reliable import ReliableQueue, ReliableTopic

pytestmark = pytest.mark.anyio

TRACER = trace.get_tracer("tests")


def parent_of(span: object) -> str:
    ctx = span.context  # type: ignore[attr-defined]
    flags = f"{int(ctx.trace_flags):02x}"
    return f"00-{format_trace_id(ctx.trace_id)}-{format_span_id(ctx.span_id)}-{flags}"


async def test_send_and_receive_are_linked(
    otel: Otel, client: RedisClient, unique_name: str
) -> None:
    queue = ReliableQueue(client, unique_name, StrCodec())
    with TRACER.start_as_current_span("request"):
        first = await queue.send("a", dedup_id="d1")
        again = await queue.send("changed", dedup_id="d1")
        many = await queue.send_many(["b", "c"])
    assert again == first
    sends = otel.spans("message send")
    assert len(sends) == 4 and all(s.kind is SpanKind.PRODUCER for s in sends)
    by_id: dict[str, list[object]] = {}
    for s in sends:
        by_id.setdefault(str((s.attributes or {})["messaging.message.id"]), []).append(s)
    assert (by_id[first][1].attributes or {})["respire.deduplicated"] is True  # type: ignore[attr-defined]

    with TRACER.start_as_current_span("poll") as poll:
        batch = await queue.receive(30, max=10)
    assert [m.id for m in batch] == [first, *many]
    assert batch[0].traceparent == parent_of(by_id[first][0])  # the first send's context
    for message in batch[1:]:
        assert message.traceparent == parent_of(by_id[message.id][0])
    [receive] = otel.spans("message receive")
    assert receive.kind is SpanKind.CONSUMER
    assert receive.parent is not None and receive.parent.span_id == poll.get_span_context().span_id
    assert [link.context.span_id for link in receive.links] == [
        by_id[m.id][0].context.span_id
        for m in batch  # type: ignore[attr-defined]
    ]
    attrs = receive.attributes or {}
    assert attrs["messaging.batch.message_count"] == 3
    assert attrs["messaging.destination.name"] == unique_name
    link = tracing.link_to(batch[0].traceparent, batch[0].tracestate)
    assert link is not None and link.context.span_id == by_id[first][0].context.span_id  # type: ignore[attr-defined]

    # a redelivery carries the same context
    assert await queue.nack(batch[0])
    [again_delivered] = await queue.receive(30, max=1)
    assert again_delivered.delivery_count == 2
    assert again_delivered.traceparent == batch[0].traceparent


async def test_topic_publications_carry_the_context_to_every_subscription(
    otel: Otel, client: RedisClient, unique_name: str
) -> None:
    topic = ReliableTopic(client, unique_name, StrCodec())
    await topic.create_subscription("billing", start="tail")
    await topic.create_subscription("audit", start="tail")
    published = await topic.publish("order")
    [send] = otel.spans("message send")
    for name in ("billing", "audit"):
        [message] = await topic.subscription(name).receive(30)
        assert message.id == published
        assert message.traceparent == parent_of(send)


async def test_without_a_context_no_trace_fields_are_stored(
    monkeypatch: pytest.MonkeyPatch, client: RedisClient, unique_name: str
) -> None:
    monkeypatch.setattr(tracing, "enabled", lambda: False)
    queue = ReliableQueue(client, unique_name, StrCodec())
    await queue.send("a")
    await queue.send("b", dedup_id="x")
    rows = await client.execute("XRANGE", queue.stream_key, "-", "+")
    assert [len(fields) for _, fields in rows] == [2, 2]  # only the payload field
    assert [m.traceparent for m in await queue.receive(30, max=2)] == ["", ""]


async def test_rq_send_refuses_an_odd_field_list(client: RedisClient, unique_name: str) -> None:
    queue = ReliableQueue(client, unique_name, StrCodec())
    with pytest.raises(ScriptError, match="RESPIRE_ARGUMENT"):
        await load("rq_send")(
            client, [queue.stream_key, queue.keys.dedup("x")], [b"p", 1000, "_respire.trace.parent"]
        )
    assert await client.execute("EXISTS", queue.stream_key) == 0
