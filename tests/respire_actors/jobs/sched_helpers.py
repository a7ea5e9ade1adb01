"""Helpers for the scheduling, retry and queue-control tests (on top of ``jobs_helpers``)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any

import anyio
from jobs_helpers import fast_options, text

from respire_actors.actors.runtime import Handler
from respire_actors.codecs import Codec, StrCodec
from respire_actors.jobs import QueueOptions, Worker, WorkerOptions
from respire_actors.keys import JobQueueKeys
from respire_actors.redis.client import RedisClient

FAST_POLL = timedelta(milliseconds=30)


def sched_options(**changes: Any) -> QueueOptions:
    """Queue options tuned for tests: a short scheduling poll."""
    values: dict[str, Any] = dict(scheduling_poll_interval=FAST_POLL)
    values.update(changes)
    return QueueOptions(**values)


@asynccontextmanager
async def scheduling_worker(
    client: RedisClient,
    queue: str,
    handler: Handler,
    *,
    queue_options: QueueOptions | None = None,
    options: WorkerOptions | None = None,
    codec: Codec[Any] | None = None,
) -> AsyncIterator[Worker]:
    """Run a worker whose registration has queue options; stop it gracefully on exit."""
    worker = Worker()
    worker.register(
        queue,
        handler,
        codec or StrCodec(),
        options or fast_options(),
        queue_options=queue_options or sched_options(),
    )
    async with anyio.create_task_group() as tg:
        await tg.start(worker.run, client)
        try:
            yield worker
        finally:
            with anyio.fail_after(15, shield=True):
                await worker.stop()


async def staged(client: RedisClient, keys: JobQueueKeys) -> list[tuple[str, int]]:
    """(staging id, due ms) of every indexed staged job, due order."""
    flat = await client.execute("ZRANGE", keys.due, 0, -1, "WITHSCORES")
    if isinstance(flat, dict):
        return [(text(k), int(float(v))) for k, v in flat.items()]
    if flat and isinstance(flat[0], list | tuple):
        return [(text(k), int(float(v))) for k, v in flat]
    return [(text(k), int(float(v))) for k, v in zip(flat[0::2], flat[1::2], strict=True)]


async def ready_job_ids(client: RedisClient, keys: JobQueueKeys) -> list[str]:
    rows = await client.execute("XRANGE", keys.ready, "-", "+")
    out = []
    for _, flat in rows or []:
        items = flat.items() if isinstance(flat, dict) else zip(flat[0::2], flat[1::2], strict=True)
        fields = {text(k): text(v) for k, v in items}
        out.append(fields["_respire.job.id"])
    return out


async def xlen(client: RedisClient, key: str) -> int:
    return int(await client.execute("XLEN", key))


def id_ms(entry_id: str) -> int:
    return int(entry_id.split("-")[0])
