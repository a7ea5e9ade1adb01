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

from ..errors import RedisUnavailable, ServerError, ServerLoading
from .intake import dispatch_page, group_lost, jittered
from .options import duration_ms
from .renewer import confirm_before_recovery
from .runtime import QueueRuntime, log
from .source import remove_idle_consumers, stream_keys
from .telemetry import log_recovery_pass


async def _pass(rt: QueueRuntime, mode: str, cursor: str) -> tuple[bool, str]:
    """One pass, page by page, from ``cursor``. Returns (complete, cursor to resume from):
    complete when the cursor came back to 0-0. A recovery pass asks for at most
    ``recovery_page_size * recovery_max_pages`` entries (a page asks for up to
    ``recovery_page_size``, fewer when fewer permits are free, so a busy or small worker takes
    more, smaller pages for the same budget) and stops there (the next pass resumes where it
    stopped, after the recovery interval, so fresh jobs get read turns in between) or at a
    denied page. A denied replay page is retried within the poll interval (jittered; sooner
    when the rate limit's window reopens): the reader waits for replay, so a queue paused when
    the worker started must not hold it up for a recovery interval after its resume."""
    ctx = current_child()
    page_max = rt.options.recovery_page_size
    budget = page_max * rt.options.recovery_max_pages  # entries one recovery pass may ask for
    pages = claimed = asked = 0
    poll = duration_ms(rt.options.poll_interval, what="poll_interval") / 1000
    try:
        while not ctx.stop_requested:
            want = page_max
            if mode == "recover":
                if asked >= budget:
                    return False, cursor
                want = min(page_max, budget - asked)
            taken = 0  # a stop request may cancel the wait before anything is taken
            with ctx.stop_scope():
                taken = await rt.admission.take(want)
            if ctx.stop_requested:
                rt.admission.release(taken)
                return False, cursor
            try:
                with anyio.CancelScope(shield=True):
                    if mode == "recover":
                        await confirm_before_recovery(rt)
                    result = await rt.source.claim(
                        rt.consumer, mode, cursor, taken, rt.visibility_ms, rt.delivery_limit
                    )
            except BaseException:
                rt.admission.release(taken)
                raise
            pages += 1
            asked += taken
            if result.denied:
                rt.admission.release(taken)
                rt.stats.denied_claims += 1
                if mode == "replay":
                    # the reader waits for replay: retry within the poll interval (a pause, or
                    # sooner when the rate limit's window reopens), never a recovery interval
                    wait = poll
                    if result.retry_after_ms > 0:
                        wait = min(poll, result.retry_after_ms / 1000)
                    with ctx.stop_scope():
                        await anyio.sleep(jittered(wait, min(0.1, poll / 4)))
                    continue
                return False, cursor
            claimed += len(result.deliveries)
            dispatch_page(rt, mode, result, taken)
            if result.next_cursor == "0-0":
                return True, "0-0"
            cursor = result.next_cursor
        return False, cursor
    finally:
        if mode == "recover":
            log_recovery_pass(rt, claimed, pages)


async def run_sweeper(
    rt: QueueRuntime, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
) -> None:
    ctx = current_child()
    interval = duration_ms(rt.options.recovery_interval, what="recovery_interval") / 1000
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
    idle_ms = (
        None
        if rt.options.consumer_idle_timeout is None
        else duration_ms(rt.options.consumer_idle_timeout, what="consumer_idle_timeout")
    )
    # Idle consumers are looked for at most once a minute (or once per idle timeout, if
    # shorter): XINFO CONSUMERS lists them all.
    cleanup_every = None if idle_ms is None else max(interval, min(60.0, idle_ms / 1000))
    next_cleanup = anyio.current_time()
    cursor = "0-0"  # a bounded recovery pass resumes where the previous one stopped
    while not ctx.stop_requested:
        if (
            idle_ms is not None
            and cleanup_every is not None
            and anyio.current_time() >= next_cleanup
        ):
            next_cleanup = anyio.current_time() + cleanup_every
            await _remove_idle_consumers(rt, idle_ms)
        try:
            complete, cursor = await _pass(rt, mode, cursor)
            if complete and mode == "replay":
                mode = "recover"
                rt.replay_done.set()
                # the first recovery pass follows replay at once: a crashed worker's jobs that
                # are already idle past the visibility timeout need not wait an interval more
                continue
        except (RedisUnavailable, ServerLoading) as exc:  # an outage: the next pass retries
            log.warning("recovery for %s: %s", rt.name, exc)
        except ServerError as exc:
            if exc.code != "NOGROUP":
                raise
            if not await group_lost(rt):
                rt.replay_done.set()
                with ctx.stop_scope():  # the host is stopping the tree; no restart wanted
                    await anyio.sleep_forever()
                return
        with ctx.stop_scope():
            await anyio.sleep(interval)


async def _remove_idle_consumers(rt: QueueRuntime, idle_ms: int) -> None:
    """Remove other consumers idle past ``consumer_idle_timeout`` with nothing pending (dead
    processes, or ones that stopped without cleaning up)."""
    try:
        removed = 0
        with anyio.CancelScope(shield=True):
            for stream in stream_keys(rt.source):
                removed += await remove_idle_consumers(
                    rt.client, stream, rt.group, rt.consumer, idle_ms
                )
    except (RedisUnavailable, ServerError) as exc:
        log.warning("removing idle consumers of %s: %s", rt.name, exc)
        return
    if removed:
        rt.stats.consumers_removed += removed
        log.info("%s: removed %d idle consumers with nothing pending", rt.name, removed)
