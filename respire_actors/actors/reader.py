"""The ready reader: admits never-delivered jobs in batches sized by free local capacity.

Per turn: take permits (waiting for at least one), run ``job_read`` (queue checks and a
non-blocking XREADGROUP in one script), hand the entries to the runners, return unused permits.
When nothing is ready the reader waits with a non-claiming ``XREAD BLOCK`` on its own connection,
so cancelling that wait never strands a delivery; it wakes at least every poll interval. A read
that reached the end of the stream (it took fewer entries than it asked for) says so, and the
reader then waits for a newer entry at once instead of first reading the empty stream.

Under a queue-wide rate limit the readers of all processes share each window: one read takes at
most a tenth of the window's permits and the reader then waits a tenth of the window (jittered,
at most a poll interval) before the next, and a denied reader sleeps to the window's end plus a
random spread, so no process takes a whole window in its first milliseconds and a worker that
joins a saturated queue gets turns. Recovery precedes new reads there: while an entry is idle
past the visibility timeout the read answers ``recover`` and the reader claims it with its
permits instead of taking a new job.
"""

from __future__ import annotations

import anyio
import anyio.abc

from supervisors import current_child

from ..errors import RedisUnavailable, ServerError, ServerLoading
from .intake import dispatch_page, group_lost, jittered
from .options import duration_ms
from .renewer import confirm_before_recovery
from .runtime import QueueRuntime, log
from .source import ManySources


async def run_reader(
    rt: QueueRuntime, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
) -> None:
    ctx = current_child()
    poll_ms = duration_ms(rt.options.poll_interval, what="poll_interval")
    if rt.queue_options is not None:
        # Blocked readers wake at least every scheduling poll interval.
        poll_ms = min(poll_ms, rt.queue_options.poll_ms)
    task_status.started()
    backoff = 0.05

    async def pause(seconds: float) -> None:
        with ctx.stop_scope():
            await anyio.sleep(seconds)

    async def pace(pace_ms: int) -> None:
        if pace_ms > 0:
            p = min(pace_ms, poll_ms) / 1000
            await pause(jittered(p / 2, p / 2))

    async def denied(retry_after_ms: int) -> None:
        wait = poll_ms / 1000
        if retry_after_ms > 0:
            wait = min(poll_ms, retry_after_ms) / 1000
        await pause(jittered(wait, min(0.1, poll_ms / 4000)))

    with ctx.stop_scope():
        await rt.replay_done.wait()  # pending replay precedes new reads
    # Under a rate policy a read is redirected to recover an entry idle past the visibility
    # timeout; when that page could claim nothing (the entry's group paused, rate limited or
    # at its concurrency limit), reads are not redirected again for a while, so one blocked
    # entry cannot stop every other job of the queue.
    recover_hold = 0.0
    async with rt.client.open_blocking() as blocking:

        async def wait(streams: tuple[str, ...], wait_ms: int) -> None:
            """Block until an entry newer than the given ids arrives (claiming nothing), the
            wait times out, or a stop is requested."""
            with ctx.stop_scope():
                try:
                    if isinstance(rt.source, ManySources):
                        await rt.source.wait(blocking, wait_ms)
                    else:
                        await blocking.execute(
                            "XREAD", "COUNT", 1, "BLOCK", wait_ms, "STREAMS", *streams
                        )
                except (RedisUnavailable, ServerLoading):
                    await anyio.sleep(backoff)

        while not ctx.stop_requested and not rt.stopping.is_set():
            taken = 0  # a stop request may cancel the wait before anything is taken
            with ctx.stop_scope():
                taken = await rt.admission.take(rt.options.read_batch)
            if ctx.stop_requested:
                rt.admission.release(taken)
                break
            try:
                # Shielded: a read cancelled mid-flight would strand its entries until recovery.
                with anyio.CancelScope(shield=True):
                    min_idle = rt.visibility_ms if anyio.current_time() >= recover_hold else 0
                    result = await rt.source.read(rt.consumer, taken, min_idle)
                    if result.status == "recover":
                        await confirm_before_recovery(rt)
                        page = await rt.source.claim(
                            rt.consumer,
                            "recover",
                            result.last_id,
                            taken,
                            rt.visibility_ms,
                            rt.delivery_limit,
                        )
            except (RedisUnavailable, ServerLoading) as exc:  # an outage: wait it out
                rt.admission.release(taken)
                log.warning("reader for %s: %s; retrying in %.2fs", rt.name, exc, backoff)
                await anyio.sleep(backoff)
                backoff = min(backoff * 2, 3.2)
                continue
            except ServerError as exc:
                rt.admission.release(taken)
                if exc.code == "NOGROUP":
                    if await group_lost(rt):
                        continue
                    break
                raise
            except BaseException:
                rt.admission.release(taken)
                raise
            backoff = 0.05
            rt.stats.read_calls += 1
            if result.status == "ok":
                rt.admission.release(taken - len(result.deliveries))
                rt.stats.admitted += len(result.deliveries)
                rt.stats.expired += result.expired
                now = anyio.current_time()
                for delivery in result.deliveries:
                    delivery.received_at = now
                    rt.deliveries.send_nowait(delivery)
                await pace(result.pace_ms)
                if result.drained_id is None or isinstance(rt.source, ManySources):
                    continue
                # the read reached the stream's end: wait for a newer entry rather than read
                # an empty stream first (one script call fewer each time the reader catches up)
                await wait((rt.source.stream_key, result.drained_id), poll_ms)
                continue
            if result.status == "recover":
                if page.denied:
                    rt.admission.release(taken)
                    rt.stats.denied_claims += 1
                    await denied(page.retry_after_ms)
                else:
                    dispatch_page(rt, "recover", page, taken)
                    if not (
                        page.deliveries
                        or page.dead_lettered
                        or page.expired
                        or page.cleared_deleted
                    ):
                        recover_hold = anyio.current_time() + min(1.0, rt.visibility_ms / 1000)
                    await pace(result.pace_ms)
                continue
            rt.admission.release(taken)
            if result.status in ("paused", "limited"):
                if result.status == "paused":
                    rt.stats.paused_reads += 1
                else:
                    rt.stats.rate_limited_reads += 1
                await denied(result.retry_after_ms)
                continue
            # empty: wait for an entry newer than the last one, without claiming it; a grouped
            # read also wakes for a newly staged job and when a delayed or parked group is due
            wait_ms = poll_ms
            streams: tuple[str, ...] = (rt.source.stream_key, result.last_id)
            if result.staged_last_id is not None:
                if result.wake_ms > 0:
                    wait_ms = min(poll_ms, result.wake_ms)
                streams = (
                    rt.source.stream_key,
                    rt.job_keys.scheduled,
                    result.last_id,
                    result.staged_last_id,
                )
            await wait(streams, wait_ms)
    if rt.stopping.is_set() and not ctx.stop_requested:
        with ctx.stop_scope():  # a fatal error is stopping the tree; no restart wanted
            await anyio.sleep_forever()
