"""The recurring ticker: runs bounded scheduling passes of one queue's recurring schedules.

Each pass asks the scheduler (``TickingScheduler``, implemented by
``respire_actors.jobs.recurring.RecurringScheduler``) to visit at most ``max_ticks`` schedules
round-robin and commit their due ticks. Between passes the ticker sleeps on the scheduler's
clock, so a test clock (:class:`respire_actors.testing.FakeClock`) wakes it without real
sleeping: until the earliest next due time the pass saw, but never longer than the poll
interval (schedules added or changed by other clients are found by then). A pass that left a
catch-up backlog is followed at once by another (each visits every schedule at most once, so a
schedule behind by many ticks needs a pass per tick) until ``max_ticks`` ticks were committed
in the current poll interval; then the ticker waits for the next one, so a backlog reaches the
ready stream at a bounded rate. A failed pass (Redis unreachable, a refused script, a malformed
definition) is logged and retried after the poll interval; it never crashes the tree.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Protocol, runtime_checkable

import anyio
import anyio.abc
import anyio.lowlevel

from supervisors import current_child

from ..clock import Clock

log = logging.getLogger("respire_actors.worker")

DEFAULT_MAX_TICKS = 64
MAX_TICKS_PER_PASS = 256


@dataclass(frozen=True, slots=True)
class TickPass:
    """What one scheduling pass did.

    ``visited``: schedules looked at (the budget counts them, due or not). ``enqueued``: ticks
    committed. ``stale``: ticks another scheduler (or an upsert/removal) got to first.
    ``backlog``: schedules still due after their tick (catch-up). ``next_due``: the earliest due
    time among the visited schedules after the pass, None when none is due again.
    """

    visited: int = 0
    enqueued: int = 0
    stale: int = 0
    backlog: int = 0
    next_due: datetime | None = None


@runtime_checkable
class TickingScheduler(Protocol):
    """What the ticker needs from a recurring scheduler."""

    @property
    def clock(self) -> Clock: ...

    async def run_pass(self, max_ticks: int) -> TickPass: ...


@dataclass(slots=True)
class TickerStatistics:
    """Counters of one queue's hosted ticker (read with ``Worker.ticker_statistics``)."""

    passes: int = 0
    failed_passes: int = 0
    enqueued: int = 0
    stale: int = 0


def _utc_now(clock: Clock) -> datetime:
    """The clock's time in UTC: arithmetic on an aware datetime of another zone runs in its
    local time (``+ poll`` across a DST change would land an hour off)."""
    return clock.now().astimezone(UTC)


def next_wake(started: datetime, result: TickPass | None, poll: timedelta) -> datetime:
    """When to run the next pass (pure): ``poll`` after the start of this one, earlier when a
    visited schedule falls due before that; never earlier after a failure or with a backlog."""
    wake = started + poll
    if result is not None and not result.backlog and result.next_due is not None:
        wake = min(wake, result.next_due)
    return wake


async def run_ticker(
    queue: str,
    scheduler: TickingScheduler,
    poll_ms: int,
    max_ticks: int,
    stats: TickerStatistics,
    *,
    task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    ctx = current_child()
    clock = scheduler.clock
    poll = timedelta(milliseconds=poll_ms)
    task_status.started()
    # ticks committed since window_start: a catch-up backlog drains at up to max_ticks per
    # poll interval, in as many passes as that takes
    window_start, window_ticks = _utc_now(clock), 0
    follow_up = False
    while not ctx.stop_requested:
        started = _utc_now(clock)
        if started >= window_start + poll:
            window_start, window_ticks = started, 0
        result: TickPass | None = None
        try:
            # a pass is two round trips; finishing it keeps the counters honest at shutdown
            with anyio.CancelScope(shield=True):
                # a follow-up pass (draining a backlog) has what is left of the interval's
                # budget; any other pass the whole budget (it must see the schedules due)
                budget = max_ticks - window_ticks if follow_up else max_ticks
                done = await scheduler.run_pass(max(1, budget))
        except Exception as exc:  # a failed pass must never crash the tree
            stats.failed_passes += 1
            log.warning(
                "recurring pass for %s failed: %s; retrying in %.2fs", queue, exc, poll_ms / 1000
            )
        else:
            result = done
            stats.passes += 1
            stats.enqueued += done.enqueued
            stats.stale += done.stale
            window_ticks += done.enqueued
        wake = next_wake(started, result, poll)
        if result is not None and result.backlog:
            if result.enqueued and window_ticks < max_ticks:
                with ctx.stop_scope():
                    await anyio.lowlevel.checkpoint()
                follow_up = True
                continue  # behind, and this interval's budget is not spent: go on
            wake = window_start + poll
        follow_up = False
        with ctx.stop_scope():
            await clock.sleep_until(wake)
