"""The retention keeper: registers its job queue, then applies the queue's retention policy.

At start it adds the queue to the registry (``respire_actors.admin.list_queues``; safe to
repeat). Then, with a :class:`~respire_actors.actors.options.Retention` policy, each pass trims
the acknowledged ready entries, the events and the dead letters that are out of policy, in
calls of at most ``Retention.batch`` entries (repeated while a call removes a full batch, up to
:data:`MAX_CALLS_PER_PASS` calls per stream per pass), then sleeps ``Retention.interval``.
Every call is the atomic ``job_trim`` script (docs/retention.md): a pending entry, an entry not
yet delivered to every consumer group, and staged jobs are never removed. Several workers of
one queue each run a keeper; their trims are idempotent. A failed pass is logged and retried
after the interval; it never crashes the tree. With ``retention=None`` the keeper only
registers the queue.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial

import anyio
import anyio.abc
import anyio.lowlevel

from supervisors import current_child

from ..errors import RedisUnavailable, ServerError
from ..redis.client import RedisClient
from ..registry import register_queue
from ..retention import apply_trim
from ..startup import retry_while_loading
from .options import Retention, duration_ms
from .runtime import log

MAX_CALLS_PER_PASS = 100


@dataclass(slots=True)
class KeeperStatistics:
    """Counters of one queue's retention keeper (this process only): passes run, passes that
    failed, trim calls made and entries removed per stream (``ready``, ``events``, ``dead``)."""

    passes: int = 0
    failed_passes: int = 0
    calls: int = 0
    removed: dict[str, int] = field(default_factory=dict)


async def run_retention_keeper(
    client: RedisClient,
    queue: str | Sequence[str],
    streams: Sequence[tuple[str, str]],
    retention: Retention | None,
    stats: KeeperStatistics,
    *,
    task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """``queue``: the job queue (or the partitions of a partitioned one) to register;
    ``streams``: (stream name, key) pairs to apply ``retention`` to."""
    ctx = current_child()
    names = [queue] if isinstance(queue, str) else list(queue)
    for name in names:
        try:
            await retry_while_loading(partial(register_queue, client, name))
        except ServerError as exc:  # e.g. an ACL user without the registry key: not fatal
            log.warning("could not register job queue %s (list_queues will miss it): %s", name, exc)
    queue = names[0] if len(names) == 1 else f"{names[0]}..{names[-1]}"
    task_status.started()
    if retention is None:
        with ctx.stop_scope():
            await anyio.sleep_forever()
        return
    interval = duration_ms(retention.interval, what="retention interval") / 1000
    while not ctx.stop_requested:
        try:
            for name, key in streams:
                await _trim_stream(client, name, key, retention, stats)
            stats.passes += 1
        except (RedisUnavailable, ServerError) as exc:
            stats.failed_passes += 1
            log.warning("retention of %s: %s; retrying in %.1fs", queue, exc, interval)
        with ctx.stop_scope():
            await anyio.sleep(interval)


async def _trim_stream(
    client: RedisClient, name: str, key: str, retention: Retention, stats: KeeperStatistics
) -> None:
    ctx = current_child()
    for _ in range(MAX_CALLS_PER_PASS):
        with anyio.CancelScope(shield=True):
            result = await apply_trim(
                client,
                key,
                max_age=retention.max_age,
                max_length=retention.max_length,
                limit=retention.batch,
            )
        stats.calls += 1
        stats.removed[name] = stats.removed.get(name, 0) + result.removed
        if result.removed < retention.batch or ctx.stop_requested:
            return
        await anyio.lowlevel.checkpoint()  # let the rest of the worker run between full batches
