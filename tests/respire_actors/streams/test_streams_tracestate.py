"""Mutation-testing gap: a stream worker's link to the producer keeps its ``tracestate``
. tracing.incoming_link: "A link to the producer context stored in ``fields`` under
``names`` (parent, state)".

Added after a mutation review: no test failed with these guarantees broken.
"""

from __future__ import annotations

import anyio
import pytest
from helpers.otel import Otel
from streams_helpers import fast_options, running, stats, wait_until

from respire_actors import ACK, StreamEntry
from respire_actors.redis.client import RedisClient

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
SPAN_ID = "00f067aa0ba902b7"


@pytest.mark.anyio
async def test_the_link_carries_the_producers_tracestate(
    otel: Otel, client: RedisClient, unique_name: str
) -> None:
    stream = f"{{{unique_name}}}:orders"
    await client.execute(
        "XADD",
        stream,
        "*",
        "order",
        "1",
        "traceparent",
        f"00-{TRACE_ID}-{SPAN_ID}-01",
        "tracestate",
        "vendor=abc,other=x",
    )
    done = anyio.Event()

    async def handler(entry: StreamEntry) -> object:
        done.set()
        return ACK

    async with running(client, stream, handler, fast_options()) as worker:
        with anyio.fail_after(10):
            await done.wait()
        await wait_until(lambda: stats(worker, stream).acked == 1)
    (span,) = otel.spans("stream process")
    (link,) = span.links
    assert f"{link.context.trace_id:032x}" == TRACE_ID
    assert f"{link.context.span_id:016x}" == SPAN_ID
    assert dict(link.context.trace_state.items()) == {"vendor": "abc", "other": "x"}
