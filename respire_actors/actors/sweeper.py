"""The recovery sweeper: startup replay of this consumer's own pending entries, then bounded
recovery passes over deliveries idle past the visibility timeout.

Every page takes admission permits first and re-checks the queue in the claiming script; PEL
references to deleted entries are cleared and counted; entries past the delivery limit are
dead-lettered inside the script without calling a handler.
"""

from __future__ import annotations

import anyio
import anyio.abc

from supervisors import current_child

from ..errors import RedisUnavailable
from ..jobs.model import Delivery
from ..jobs.options import duration_ms
from ..jobs.runtime import QueueRuntime, log
from ..redis.scripts import load
from ._util import field_map, text

_CLAIM = load("job_claim_pending")


async def _pass(rt: QueueRuntime, mode: str) -> bool:
    """One pass, page by page; True when it completed (cursor back to 0-0)."""
    ctx = current_child()
    cursor = "0-0"
    page_max = rt.options.recovery_page_size
    while not ctx.stop_requested:
        with ctx.stop_scope():
            taken = await rt.admission.take(page_max)
        if ctx.stop_requested:
            rt.admission.release(taken)
            return False
        try:
            with anyio.CancelScope(shield=True):
                reply = await _CLAIM(
                    rt.client,
                    (rt.keys.ready, rt.keys.control, rt.keys.events, rt.dead_key),
                    (
                        rt.group,
                        rt.consumer,
                        mode,
                        rt.visibility_ms,
                        cursor,
                        taken,
                        rt.delivery_limit,
                    ),
                )
        except BaseException:
            rt.admission.release(taken)
            raise
        if text(reply[0]) == "paused":
            rt.admission.release(taken)
            return False
        next_cursor, claimed = text(reply[1]), reply[2]
        rt.stats.cleared_deleted_refs += int(reply[3])
        rt.stats.dead_lettered_by_recovery += int(reply[4])
        rt.admission.release(taken - len(claimed))
        for entry_id, flat, deliveries in claimed:
            if mode == "replay":
                rt.stats.replayed += 1
            else:
                rt.stats.recovered += 1
            rt.deliveries.send_nowait(Delivery(text(entry_id), field_map(flat), int(deliveries)))
        if next_cursor == "0-0":
            return True
        cursor = next_cursor
    return False


async def run_sweeper(
    rt: QueueRuntime, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
) -> None:
    ctx = current_child()
    interval = duration_ms(rt.options.recovery_interval, what="recovery_interval") / 1000
    await rt.ensure_group()
    # Replay re-claims every entry pending for this consumer name, so it must only see entries
    # delivered before this run: the reader (started after us) waits for replay_done, and a
    # restarted sweeper skips replay because its consumer's pending entries are in flight in the
    # runners (re-claiming them would run each one twice; visibility recovery covers the rest).
    if ctx.restart_count == 0:
        mode = "replay"
        rt.replay_done = anyio.Event()  # a fresh run of the tree: its reader starts after us
    else:
        mode = "recover"
        rt.replay_done.set()  # the reader may be waiting on it, if replay had not finished
    task_status.started()
    while not ctx.stop_requested:
        try:
            if await _pass(rt, mode):
                mode = "recover"
                rt.replay_done.set()
        except RedisUnavailable as exc:
            log.warning("recovery for %s: %s", rt.keys.name, exc)
        with ctx.stop_scope():
            await anyio.sleep(interval)
