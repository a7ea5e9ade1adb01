"""Helpers for the stream worker tests: running workers, waiting on state, reading Redis state."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import replace
from datetime import timedelta
from typing import Any

import anyio
from helpers.waiting import text, wait_until, wait_until_async  # noqa: F401 - re-exported

from respire_actors.actors.runtime import QueueRuntime, WorkerStatistics
from respire_actors.redis.client import RedisClient
from respire_actors.streams import StreamHandler, StreamWorker, StreamWorkerOptions

FAST = timedelta(milliseconds=150)


def fast_options(**changes: Any) -> StreamWorkerOptions:
    """Options tuned for tests: short blocking reads, quick recovery cadence and shutdown."""
    base = StreamWorkerOptions(
        start_id="0-0",
        concurrency=4,
        block=timedelta(milliseconds=100),
        visibility_timeout=timedelta(seconds=30),
        recovery_interval=timedelta(milliseconds=50),
        shutdown_grace=timedelta(seconds=5),
    )
    return replace(base, **changes)


@asynccontextmanager
async def running(
    client: RedisClient,
    stream: str,
    handler: StreamHandler,
    options: StreamWorkerOptions | None = None,
) -> AsyncIterator[StreamWorker]:
    """Run a stream worker with one registration for the block; stop it gracefully on exit."""
    worker = StreamWorker()
    worker.register(stream, handler, options or fast_options())
    async with anyio.create_task_group() as tg:
        await tg.start(worker.run, client)
        try:
            yield worker
        finally:
            with anyio.fail_after(15, shield=True):
                await worker.stop()


def runtime(worker: StreamWorker, stream: str) -> QueueRuntime:
    return worker._runtimes[stream]


def stats(worker: StreamWorker, stream: str) -> WorkerStatistics:
    return worker.statistics(stream)


def pairs(flat: Any) -> dict[str, bytes]:
    items = flat.items() if isinstance(flat, dict) else zip(flat[0::2], flat[1::2], strict=True)
    return {text(k): v for k, v in items}


async def add(client: RedisClient, stream: str, **fields: str) -> str:
    flat: list[str] = []
    for k, v in (fields or {"n": "x"}).items():
        flat += [k, v]
    return text(await client.execute("XADD", stream, "*", *flat))


async def add_many(client: RedisClient, stream: str, count: int) -> list[str]:
    return [await add(client, stream, n=str(i)) for i in range(count)]


async def entries(client: RedisClient, stream: str) -> list[tuple[str, dict[str, bytes]]]:
    rows = await client.execute("XRANGE", stream, "-", "+")
    return [(text(i), pairs(f)) for i, f in rows or []]


async def pending_rows(client: RedisClient, stream: str, group: str) -> list[tuple[str, str, int]]:
    """(entry id, consumer, delivery count) of every pending entry of ``group``."""
    rows = await client.execute("XPENDING", stream, group, "-", "+", 1000)
    return [(text(r[0]), text(r[1]), int(r[3])) for r in rows]


async def pending_idle(client: RedisClient, stream: str, group: str) -> list[int]:
    rows = await client.execute("XPENDING", stream, group, "-", "+", 1000)
    return [int(r[2]) for r in rows]


async def groups(client: RedisClient, stream: str) -> dict[str, dict[str, Any]]:
    reply = await client.execute("XINFO", "GROUPS", stream)
    out = {}
    for flat in reply:
        info = pairs(flat)
        out[text(info["name"])] = {k: v for k, v in info.items()}
    return out


async def deliver_by_hand(
    client: RedisClient, stream: str, group: str, consumer: str, count: int = 10
) -> list[str]:
    """XREADGROUP as another (crashed) consumer would: the entries become pending for it."""
    reply = await client.execute(
        "XREADGROUP", "GROUP", group, consumer, "COUNT", count, "STREAMS", stream, ">"
    )
    if not reply:
        return []
    first = reply[0] if isinstance(reply, list) else next(iter(reply.items()))
    rows = first[1]
    return [text(r[0]) for r in rows]


@contextmanager
def forbid_commands(client: RedisClient) -> Iterator[None]:
    """Inside the block, any command sent through ``client`` fails the test."""

    async def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"a command was sent: {args[:1]!r}")

    client.execute = refuse  # type: ignore[method-assign]
    client.pipeline = refuse  # type: ignore[method-assign]
    try:
        yield
    finally:
        del client.execute, client.pipeline


def id_key(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def ordered(ids: Any) -> list[str]:
    """Entry ids in stream order (handlers run concurrently, trio schedules in any order)."""
    return sorted(ids, key=id_key)


def child_state(worker: StreamWorker, child: str) -> str | None:
    """The run state of one actor (``reader``, ``sweeper``, ...) of the first registration."""
    snap = worker.snapshot()
    if snap is None or snap.children[0].supervisor is None:
        return None
    for c in snap.children[0].supervisor.children:
        if c.name == child:
            return c.state.value
    return None


def child_error(worker: StreamWorker, child: str) -> str | None:
    """The last error one actor of the first registration exited with, if any."""
    snap = worker.snapshot()
    assert snap is not None and snap.children[0].supervisor is not None
    for c in snap.children[0].supervisor.children:
        if c.name == child:
            return c.last_error
    raise LookupError(child)
