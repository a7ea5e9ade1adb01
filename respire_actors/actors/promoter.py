"""The promoter: moves due scheduled jobs (delayed jobs and durable retries) to the ready stream.

One ``job_promote`` call per pass moves at most ``scheduling_batch_size`` jobs, oldest due first,
that batch ordered by descending priority. The script is the whole transition, so a crash or a
lost reply leaves each job either staged or ready, never both and never twice. After a full batch
the promoter still waits a whole scheduling poll interval, so each reader's promoter moves at most
``scheduling_batch_size`` jobs per poll interval: a due backlog reaches the ready stream at a
bounded rate instead of flooding it. Otherwise the promoter sleeps until the next staged job is
due, but never longer than the poll interval (jobs staged by other clients are found by then);
a durable retry this worker commits wakes it for the retry's due time.
Promotion continues while the queue is paused: pause governs deliveries, not scheduling.
"""

from __future__ import annotations

import anyio
import anyio.abc

from supervisors import current_child

from .. import faults
from ..errors import RedisUnavailable, ServerLoading
from .runtime import QueueRuntime, log
from .source import PromotingSource


def next_wait_ms(promoted: int, batch_size: int, next_due_ms: int, poll_ms: int) -> int:
    """How long to sleep after a pass (pure): a whole poll interval after a full batch or when
    more is due now (at most one batch per poll interval), else until the next due job, capped
    by the poll interval. Never 0: a due backlog must not make the promoter spin."""
    if promoted >= batch_size or next_due_ms <= 0:
        return poll_ms
    return min(poll_ms, next_due_ms)


async def run_promoter(
    rt: QueueRuntime, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
) -> None:
    ctx = current_child()
    qo = rt.queue_options
    source = rt.source
    if qo is None or not isinstance(source, PromotingSource):
        raise RuntimeError("the promoter needs a job queue registered with QueueOptions")
    poll_ms, batch = qo.poll_ms, qo.scheduling_batch_size
    task_status.started()
    backoff = 0.05
    while not ctx.stop_requested:
        try:
            with anyio.CancelScope(shield=True):
                result = await source.promote(batch)
            if result.promoted:
                faults.point("promoter.after-promote")
        except (RedisUnavailable, ServerLoading) as exc:  # an outage: wait it out
            log.warning("promotion for %s: %s; retrying in %.2fs", rt.name, exc, backoff)
            with ctx.stop_scope():
                await anyio.sleep(backoff)
            backoff = min(backoff * 2, min(3.2, poll_ms / 1000))
            continue
        backoff = 0.05
        rt.stats.promotion_passes += 1
        rt.stats.promoted += result.promoted
        rt.stats.expired_staged += result.expired
        rt.stats.missing_staged += result.missing
        if result.missing:
            log.warning(
                "%s: %d scheduled index entries had no staged body (deleted); skipped",
                rt.name,
                result.missing,
            )
        wait = next_wait_ms(result.promoted, batch, result.next_due_ms, poll_ms)
        with ctx.stop_scope():
            await _wait_for_due(rt, wait / 1000, honour_staged=result.promoted < batch)


async def _wait_for_due(rt: QueueRuntime, seconds: float, *, honour_staged: bool) -> None:
    """Sleep ``seconds``, or less when this registration stages a job due sooner (a durable
    retry: the completer calls ``rt.note_staged``). After a full batch the whole wait stands
    (a due backlog is promoted at most one batch per poll interval; the retry is in it)."""
    deadline = anyio.current_time() + seconds
    while True:
        if rt.staged_due is not None:
            if honour_staged:
                deadline = min(deadline, rt.staged_due)
            rt.staged_due = None
        remaining = deadline - anyio.current_time()
        if remaining <= 0:
            return
        rt.staged = anyio.Event()  # no await since staged_due was read: nothing is missed
        with anyio.move_on_after(remaining):
            await rt.staged.wait()
