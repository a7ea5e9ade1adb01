"""Helpers for the job queue tests: running workers, waiting on state, reading Redis state."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from datetime import timedelta
from typing import Any

import anyio
import anyio.abc
from helpers.waiting import text, wait_until, wait_until_async  # noqa: F401 - re-exported

from respire_actors.actors.admission import Admission
from respire_actors.actors.messages import Completion
from respire_actors.actors.runtime import Handler, QueueRuntime
from respire_actors.codecs import Codec, StrCodec
from respire_actors.jobs import Delivery, JobEvent, QueueOptions, Worker, WorkerOptions
from respire_actors.jobs.job import bind_job
from respire_actors.jobs.options import CONSUMER_GROUP
from respire_actors.jobs.queue import _pairs, _stream_entries, _to_event
from respire_actors.jobs.source import JobSource
from respire_actors.keys import JobQueueKeys
from respire_actors.redis.client import RedisClient, connect
from supervisors import Mailbox

FAST = timedelta(milliseconds=300)


def fast_options(**changes: Any) -> WorkerOptions:
    """Worker options tuned for tests: short recovery cadence, quick polls and shutdown."""
    values: dict[str, Any] = dict(
        consumer_count=4,
        visibility_timeout=timedelta(seconds=30),
        recovery_interval=timedelta(milliseconds=50),
        poll_interval=timedelta(milliseconds=200),
        shutdown_grace=timedelta(seconds=5),
    )
    values.update(changes)
    return WorkerOptions(**values)


@asynccontextmanager
async def running_worker(
    client: RedisClient,
    queue: str,
    handler: Handler,
    *,
    codec: Codec[Any] | None = None,
    options: WorkerOptions | None = None,
    queue_options: QueueOptions | None = None,
    partitions: int | None = None,
) -> AsyncIterator[Worker]:
    """Run a worker with one registration for the block; stop it gracefully on exit."""
    worker = Worker()
    worker.register(
        queue,
        handler,
        codec or StrCodec(),
        options or fast_options(),
        queue_options=queue_options,
        partitions=partitions,
    )
    async with anyio.create_task_group() as tg:
        await tg.start(worker.run, client)
        try:
            yield worker
        finally:
            with anyio.fail_after(15, shield=True):
                await worker.stop()


def fields_of(flat: Sequence[Any]) -> dict[str, bytes]:
    return {text(k): v for k, v in _pairs(flat)}


async def all_events(client: RedisClient, keys: JobQueueKeys) -> list[JobEvent]:
    rows = await client.execute("XRANGE", keys.events, "-", "+")
    return [_to_event(text(i), f) for i, f in rows or []]


async def events_of_kind(client: RedisClient, keys: JobQueueKeys, kind: str) -> list[JobEvent]:
    return [e for e in await all_events(client, keys) if e.kind == kind]


async def pending_count(client: RedisClient, keys: JobQueueKeys) -> int:
    summary = await client.execute("XPENDING", keys.ready, CONSUMER_GROUP)
    return int(summary[0])


async def pending_rows(client: RedisClient, keys: JobQueueKeys) -> list[tuple[str, str, int]]:
    """(entry id, consumer, delivery count) of every pending entry."""
    rows = await client.execute("XPENDING", keys.ready, CONSUMER_GROUP, "-", "+", 1000)
    return [(text(r[0]), text(r[1]), int(r[3])) for r in rows]


async def group_info(client: RedisClient, keys: JobQueueKeys) -> dict[str, Any]:
    groups = await client.execute("XINFO", "GROUPS", keys.ready)
    for flat in groups:
        info = {text(k): v for k, v in _pairs(flat)}
        if text(info["name"]) == CONSUMER_GROUP:
            return info
    raise LookupError("no consumer group")


async def create_group(client: RedisClient, keys: JobQueueKeys) -> None:
    await client.execute("XGROUP", "CREATE", keys.ready, CONSUMER_GROUP, "0", "MKSTREAM")


async def deliver(
    client: RedisClient, keys: JobQueueKeys, consumer: str, count: int = 1
) -> list[Delivery]:
    """Read new entries for ``consumer`` by hand (XREADGROUP), as a worker's reader would."""
    reply = await client.execute(
        "XREADGROUP",
        "GROUP",
        CONSUMER_GROUP,
        consumer,
        "COUNT",
        count,
        "STREAMS",
        keys.ready,
        ">",
    )
    return [
        Delivery(entry_id, {bytes(k): bytes(v) for k, v in _pairs(flat)}, 1)
        for entry_id, flat in _stream_entries(reply or [])
    ]


def new_runtime(
    client: RedisClient,
    queue: str,
    *,
    consumer: str = "tester",
    options: WorkerOptions | None = None,
    handler: Handler | None = None,
    codec: Codec[Any] | None = None,
) -> QueueRuntime:
    """A registration's shared state without running actors (drives Job and the completer).
    Close its mailboxes afterwards (the ``make_runtime`` fixture does)."""

    async def unused(job: Any) -> None:
        raise AssertionError("the handler is not expected to run")

    options = options or fast_options()
    keys = JobQueueKeys(queue, client.key_prefix)
    dead = keys.custom(options.dead_letter_stream) if options.dead_letter_stream else keys.dead
    return QueueRuntime(
        client=client,
        keys=keys,
        source=JobSource(client, keys, dead, CONSUMER_GROUP),
        bind=bind_job,
        codec=codec or StrCodec(),
        handler=handler or unused,
        options=options,
        consumer=consumer,
        admission=Admission(options.consumer_count),
        deliveries=Mailbox[Delivery](64, name="deliveries"),
        completions=Mailbox[Completion](64, name="completions"),
    )


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
        del client.execute, client.pipeline  # the class's methods show through again


@asynccontextmanager
async def restricted_client(
    server_url: str, client: RedisClient, user: str, *rules: str
) -> AsyncIterator[RedisClient]:
    """A client logged in as a temporary ACL user with ``rules`` (deleted afterwards)."""
    await client.execute("ACL", "SETUSER", user, "reset", "on", ">pw", "~*", "&*", "+@all", *rules)
    try:
        async with connect(server_url, username=user, password="pw") as restricted:
            yield restricted
    finally:
        await client.execute("ACL", "DELUSER", user)


@asynccontextmanager
async def python_process(script: str, *args: str) -> AsyncIterator[anyio.abc.Process]:
    """``python -c script *args`` as a real process for the block (a worker to kill, say);
    terminated, if still running, and reaped on exit."""
    proc = await anyio.open_process(
        [sys.executable, "-c", script, *args], stdout=subprocess.DEVNULL
    )
    try:
        yield proc
    finally:
        if proc.returncode is None:
            proc.terminate()
        with anyio.fail_after(20, shield=True):
            await proc.wait()
            await proc.aclose()
