"""Helpers for the end-to-end cluster tests: queue names whose slots are served by different
masters, and a worker with several registrations run for a block."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any

import anyio
from helpers.servers import Cluster, key_slot

from respire_actors.actors.runtime import Handler
from respire_actors.codecs import StrCodec
from respire_actors.jobs import QueueOptions, RecurringOptions, Worker, WorkerOptions
from respire_actors.keys import JobQueueKeys


def names_on_distinct_masters(cluster: Cluster, base: str, count: int = 3) -> list[str]:
    """``count`` queue names built from ``base`` whose keys live on ``count`` different
    masters (asserted against the cluster's current slot map)."""
    found: dict[int, str] = {}
    for i in range(10_000):
        name = f"{base}-{i}"
        port = cluster.owner_of(key_slot(JobQueueKeys(name).ready)).port
        found.setdefault(port, name)
        if len(found) == count:
            break
    names = list(found.values())
    assert len(names) == count, "not enough masters"
    ports = {cluster.owner_of(key_slot(JobQueueKeys(n).ready)).port for n in names}
    assert len(ports) == count  # one master per queue
    return names


def fast_options(**changes: Any) -> WorkerOptions:
    values: dict[str, Any] = dict(
        consumer_count=4,
        visibility_timeout=timedelta(seconds=30),
        recovery_interval=timedelta(milliseconds=50),
        poll_interval=timedelta(milliseconds=100),
        shutdown_grace=timedelta(seconds=5),
    )
    values.update(changes)
    return WorkerOptions(**values)


def queue_options(**changes: Any) -> QueueOptions:
    values: dict[str, Any] = dict(
        scheduling_poll_interval=timedelta(milliseconds=50),
        retry_backoff=timedelta(milliseconds=20),
        metrics_retention_minutes=5,
    )
    values.update(changes)
    return QueueOptions(**values)


@asynccontextmanager
async def running(
    client: Any,
    names: Sequence[str],
    handler: Handler,
    *,
    options: WorkerOptions | None = None,
    with_queue_options: bool = True,
    queue_opts: QueueOptions | None = None,
    recurring: bool = False,
) -> AsyncIterator[Worker]:
    """One worker serving every queue in ``names`` (same handler), stopped on exit."""
    worker = Worker()
    for name in names:
        worker.register(
            name,
            handler,
            StrCodec(),
            options or fast_options(),
            queue_options=(queue_opts or queue_options()) if with_queue_options else None,
            recurring=(
                RecurringOptions(poll_interval=timedelta(milliseconds=50)) if recurring else None
            ),
        )
    async with anyio.create_task_group() as tg:
        await tg.start(worker.run, client)
        try:
            yield worker
        finally:
            with anyio.fail_after(20, shield=True):
                await worker.stop()
