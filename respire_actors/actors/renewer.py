"""The lease renewer: keeps the leases of running handlers alive, and ends the lost ones.

Every pass renews the visibility of each delivery whose handler is running (``rt.leases``,
maintained by the runners) with one batched, fenced script call per
:data:`~respire_actors.actors.source.MAX_RENEW_BATCH` deliveries (``Source.renew``: the entry
must still be pending for this consumer with this delivery count; then ``XCLAIM ... JUSTID``
resets its idle time without counting a delivery). A long handler therefore keeps its job for
as long as it runs, and a crashed process's jobs are recovered one visibility timeout after
their last renewal.

A handler's scope is cancelled here only when its lease is really lost:

- a renewal reports the entry lost (pending for another consumer, delivered again, settled)
  or its body deleted;
- no renewal could be confirmed (Redis unreachable, the call failed or timed out) for a whole
  visibility timeout since the last confirmed one: other consumers may recover the entry from
  then on, so the lease is lost even though nobody said so.

An event loop that stalls past the visibility timeout (blocking code in a handler) does not by
itself end a lease: the renewer notices it woke late, asks Redis first, and a delivery still
owned is renewed.
"""

from __future__ import annotations

from collections.abc import Sequence

import anyio
import anyio.abc

from supervisors import current_child

from ..errors import RespireError
from .runtime import Lease, QueueRuntime, log, lose_lease
from .source import GONE, MAX_RENEW_BATCH, RENEWED, renew_deliveries

MIN_RENEW_INTERVAL = 0.003
"""Shortest pause between renewal passes, in seconds (for the 10 ms minimum visibility)."""


def renew_interval(visibility: float) -> float:
    """The pause between passes for a visibility timeout (seconds): a third of it, so a lease
    survives two missed passes, and at least :data:`MIN_RENEW_INTERVAL`."""
    return max(visibility / 3, MIN_RENEW_INTERVAL)


def expired(leases: Sequence[Lease], now: float, visibility: float) -> list[Lease]:
    """The leases with no confirmation for a whole visibility timeout (pure)."""
    return [lease for lease in leases if not lease.lost and now - lease.confirmed_at >= visibility]


def next_wake(leases: Sequence[Lease], now: float, visibility: float, interval: float) -> float:
    """When the next pass is due: after ``interval``, or earlier if a lease would otherwise
    expire before (pure)."""
    wake = now + interval
    for lease in leases:
        if not lease.lost:
            wake = min(wake, lease.confirmed_at + visibility)
    return wake


async def renew_pass(rt: QueueRuntime, visibility: float, *, late: bool = False) -> None:
    """Renew every running delivery once, cancel the lost ones, and expire the ones whose
    lease could not be confirmed for a whole visibility timeout.

    A renewal call is bounded by the earliest expiry among its leases (and by two thirds of
    the visibility timeout), so a hung server cannot keep a handler running past the moment
    others may recover its entry. ``late`` says the renewer itself could not run on time (the
    event loop was blocked): leases past their expiry are then first asked about, since the
    expiry says only that nobody confirmed them, not that anybody took them."""
    rt.stats.renewal_passes += 1
    if not late:
        _expire(rt, anyio.current_time(), visibility)
    running = [lease for lease in rt.leases if not lease.lost]
    for start in range(0, len(running), MAX_RENEW_BATCH):
        chunk = running[start : start + MAX_RENEW_BATCH]
        sent = anyio.current_time()
        bound = visibility * 2 / 3
        if not late:
            earliest = min(lease.confirmed_at for lease in chunk) + visibility
            bound = min(bound, earliest - sent)
        statuses: list[int] | None = None
        rt.stats.renewal_calls += 1
        with anyio.move_on_after(max(bound, 0.0)):
            try:
                statuses = await renew_deliveries(
                    rt.source, rt.consumer, [lease.delivery for lease in chunk]
                )
            except RespireError as exc:
                log.warning("%s: lease renewal failed: %s", rt.name, exc)
        if statuses is None:
            rt.stats.renewal_failures += 1
            continue
        for lease, status in zip(chunk, statuses, strict=True):
            if status == RENEWED:
                rt.stats.leases_renewed += 1
                if sent > lease.confirmed_at:
                    lease.confirmed_at = sent
            elif lease in rt.leases and not lease.lost:
                log.warning(
                    "%r of %s: lease lost (%s); cancelling its handler",
                    lease.delivery.job_id or lease.delivery.entry_id,
                    rt.name,
                    "entry deleted" if status == GONE else "not pending for this delivery",
                )
                lose_lease(rt, lease)
    _expire(rt, anyio.current_time(), visibility)


def _expire(rt: QueueRuntime, now: float, visibility: float) -> None:
    for lease in expired(list(rt.leases), now, visibility):
        rt.stats.leases_expired += 1
        log.warning(
            "%r of %s: no renewal confirmed for a visibility timeout; others may recover it, "
            "cancelling its handler",
            lease.delivery.job_id or lease.delivery.entry_id,
            rt.name,
        )
        lose_lease(rt, lease)


async def run_renewer(
    rt: QueueRuntime, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
) -> None:
    """The lease renewer of one registration: a pass every third of the visibility timeout
    (sooner when a lease could otherwise expire), until stopped. Started before the runners and
    stopped after them, so handlers finishing within the shutdown grace keep their leases."""
    ctx = current_child()
    visibility = rt.visibility_ms / 1000
    interval = renew_interval(visibility)
    task_status.started()
    while not ctx.stop_requested:
        wake = next_wake(list(rt.leases), anyio.current_time(), visibility, interval)
        with ctx.stop_scope():
            await anyio.sleep_until(wake)
        if ctx.stop_requested:
            break
        if rt.leases:
            # woken much later than planned: the event loop was blocked, not Redis
            late = anyio.current_time() - wake > interval
            await renew_pass(rt, visibility, late=late)
