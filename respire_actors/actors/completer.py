"""The completer: commits outcomes in batches, one fenced script call per batch.

Fencing makes a commit safe to repeat: after a lost reply the retry finds the entry no longer
pending for this attempt and writes nothing (no second event). On stop the completer drains
its mailbox before returning, so handlers that finished are committed.
"""

from __future__ import annotations

import anyio
import anyio.abc

from supervisors import MailboxClosed, current_child

from ..errors import RedisUnavailable, ServerError
from .intake import group_lost
from .messages import Completion
from .runtime import QueueRuntime, log

MAX_BATCH = 256


async def commit(rt: QueueRuntime, batch: list[Completion]) -> list[int]:
    """Commit one batch (retrying transient failures); returns per completion 1 committed,
    0 stale, 2 (a retry) acknowledged as expired instead of staged."""
    backoff = 0.05
    while True:
        try:
            with anyio.CancelScope(shield=True):
                statuses = await rt.source.complete(rt.consumer, batch)
            break
        except RedisUnavailable as exc:
            log.warning("completing %d deliveries of %s: %s; retrying", len(batch), rt.name, exc)
            await anyio.sleep(backoff)
            backoff = min(backoff * 2, 3.2)
        except ServerError as exc:
            if exc.code != "NOGROUP":
                raise
            # The group vanished with its pending entries: nothing can be committed (stale).
            await group_lost(rt)
            statuses = [0] * len(batch)
            break
    rt.stats.completion_batches += 1
    for c, status in zip(batch, statuses, strict=True):
        if not status:
            rt.stats.stale_completions += 1
        elif c.kind == "ack":
            rt.stats.acked += 1
        elif c.kind == "dead":
            rt.stats.dead_lettered += 1
        elif c.kind == "expired" or (c.kind == "retry" and status == 2):
            rt.stats.expired += 1
        elif c.kind == "retry":
            rt.stats.retried += 1
    return statuses


def _drain(rt: QueueRuntime, batch: list[Completion]) -> None:
    while len(batch) < MAX_BATCH:
        try:
            batch.append(rt.completions.receive_nowait())
        except Exception:
            return


async def run_completer(
    rt: QueueRuntime, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
) -> None:
    ctx = current_child()
    task_status.started()
    while True:
        batch: list[Completion] = []
        if ctx.stop_requested:
            _drain(rt, batch)
            if not batch:
                return
        else:
            with ctx.stop_scope():
                try:
                    batch.append(await rt.completions.receive())
                except MailboxClosed:
                    return
            _drain(rt, batch)
            if not batch:
                continue
        await commit(rt, batch)
