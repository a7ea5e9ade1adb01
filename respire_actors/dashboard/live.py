"""Live updates as server-sent events: queue counts every ``live_interval`` and, on a queue's
page, its events as they are appended. The pages work without them (a reload shows the same).

Each stream does bounded work per tick (the summaries of at most one page of queues) and
ends when the browser goes away.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Sequence
from datetime import timedelta
from typing import Any

import anyio
import anyio.abc
from anyio.streams.memory import MemoryObjectSendStream
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from ..codecs import BytesCodec
from ..errors import RespireError
from ..jobs import JobQueue
from .formatting import counts, event_row
from .pages import summaries
from .web import config_of, dashboard_of, log, page, queue_param

Producer = Callable[[MemoryObjectSendStream[str]], Awaitable[None]]


def sse(event: str, data: Any) -> str:
    return f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"


class EventStreamResponse(Response):
    """A ``text/event-stream`` response fed by ``producers`` until the client disconnects
    (or every producer returned)."""

    media_type = "text/event-stream"

    def __init__(self, producers: Sequence[Producer], closing: anyio.Event | None = None) -> None:
        super().__init__(None)
        self.closing = closing
        # no content-length: the body is a stream
        self.raw_headers = [
            (b"content-type", b"text/event-stream; charset=utf-8"),
            (b"cache-control", b"no-store"),
            (b"x-accel-buffering", b"no"),
        ]
        self.producers = producers

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        sender, receiver = anyio.create_memory_object_stream[str](16)
        async with anyio.create_task_group() as tg:

            async def watch_disconnect() -> None:
                while (await receive())["type"] != "http.disconnect":
                    pass
                tg.cancel_scope.cancel()

            async def run(producer: Producer, out: MemoryObjectSendStream[str]) -> None:
                async with out:
                    try:
                        await producer(out)
                    except RespireError as exc:  # Redis went away: end the stream, the
                        log.warning("dashboard live update stopped: %r", exc)  # page retries
                    except BaseExceptionGroup as group:  # the same from a producer's tasks
                        errors, rest = group.split(RespireError)
                        if errors is None or rest is not None:
                            raise
                        log.warning("dashboard live update stopped: %r", errors.exceptions[0])

            tg.start_soon(watch_disconnect)
            streaming = anyio.CancelScope()
            if self.closing is not None:
                closing = self.closing

                async def watch_closing() -> None:
                    await closing.wait()  # the server shuts down: end the stream cleanly
                    streaming.cancel()

                tg.start_soon(watch_closing)
            async with sender:
                for producer in self.producers:
                    tg.start_soon(run, producer, sender.clone())
            with streaming:
                async with receiver:
                    async for chunk in receiver:
                        await send(
                            {
                                "type": "http.response.body",
                                "body": chunk.encode(),
                                "more_body": True,
                            }
                        )
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            tg.cancel_scope.cancel()


def _counts_producer(request: Request, names: Sequence[str]) -> Producer:
    interval = config_of(request).live_interval

    async def produce(out: MemoryObjectSendStream[str]) -> None:
        while True:
            found, _ = await summaries(request, names)
            await out.send(sse("counts", {n: counts(s) for n, s in found.items()}))
            await anyio.sleep(interval)

    return produce


@page
async def overview_live(request: Request) -> Response:
    names = [queue_param(request, n) for n in request.query_params.getlist("queue")]
    return EventStreamResponse(
        [_counts_producer(request, names[: config_of(request).page_size])],
        dashboard_of(request).closing(),
    )


@page
async def queue_live(request: Request) -> Response:
    name = queue_param(request)
    queue = JobQueue(dashboard_of(request).client, name, BytesCodec())
    interval = timedelta(seconds=config_of(request).live_interval)

    async def events(out: MemoryObjectSendStream[str]) -> None:
        # one blocking reader per open page, from the newest event on
        async with queue.read_events("$", block=interval, batch=100) as reader:
            async for event in reader:
                await out.send(sse("job-event", event_row(event)))

    return EventStreamResponse(
        [_counts_producer(request, [name]), events], dashboard_of(request).closing()
    )


__all__ = ["EventStreamResponse", "overview_live", "queue_live", "sse"]
