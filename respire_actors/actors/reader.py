"""The ready reader: admits never-delivered jobs in batches sized by free local capacity.

Per turn: take permits (waiting for at least one), run ``job_read`` (queue checks and a
non-blocking XREADGROUP in one script), hand the entries to the runners, return unused permits.
When nothing is ready the reader waits with a non-claiming ``XREAD BLOCK`` on its own connection,
so cancelling that wait never strands a delivery; it wakes at least every poll interval.
"""

from __future__ import annotations

import anyio
import anyio.abc

from supervisors import current_child

from ..errors import RedisUnavailable, ServerError
from ..jobs.model import Delivery
from ..jobs.options import duration_ms
from ..jobs.runtime import QueueRuntime, log
from ..redis.scripts import load
from ._util import field_map, text

_READ = load("job_read")


async def run_reader(
    rt: QueueRuntime, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
) -> None:
    ctx = current_child()
    poll_ms = duration_ms(rt.options.poll_interval, what="poll_interval")
    await rt.ensure_group()
    task_status.started()
    backoff = 0.05
    with ctx.stop_scope():
        await rt.replay_done.wait()  # pending replay precedes new reads
    async with rt.client.open_blocking() as blocking:
        while not ctx.stop_requested and not rt.stopping.is_set():
            with ctx.stop_scope():
                taken = await rt.admission.take(rt.options.read_batch)
            if ctx.stop_requested:
                rt.admission.release(taken)
                break
            try:
                # Shielded: a read cancelled mid-flight would strand its entries until recovery.
                with anyio.CancelScope(shield=True):
                    reply = await _READ(
                        rt.client, (rt.keys.ready, rt.keys.control), (rt.group, rt.consumer, taken)
                    )
            except ServerError as exc:
                rt.admission.release(taken)
                if exc.code == "NOGROUP":
                    log.warning("consumer group of %s vanished; recreating it", rt.keys.name)
                    await rt.ensure_group()
                    continue
                raise
            except RedisUnavailable as exc:
                rt.admission.release(taken)
                log.warning("reader for %s: %s; retrying in %.2fs", rt.keys.name, exc, backoff)
                await anyio.sleep(backoff)
                backoff = min(backoff * 2, 3.2)
                continue
            backoff = 0.05
            rt.stats.read_calls += 1
            status = text(reply[0])
            if status == "ok":
                entries = reply[1]
                rt.admission.release(taken - len(entries))
                rt.stats.admitted += len(entries)
                for entry_id, flat in entries:
                    rt.deliveries.send_nowait(Delivery(text(entry_id), field_map(flat), 1))
                continue
            rt.admission.release(taken)
            if status == "paused":
                rt.stats.paused_reads += 1
                with ctx.stop_scope():
                    await anyio.sleep(poll_ms / 1000)
                continue
            # empty: wait for an entry newer than the last one, without claiming it
            last_id = text(reply[1])
            with ctx.stop_scope():
                try:
                    await blocking.execute(
                        "XREAD", "COUNT", 1, "BLOCK", poll_ms, "STREAMS", rt.keys.ready, last_id
                    )
                except RedisUnavailable:
                    await anyio.sleep(backoff)
