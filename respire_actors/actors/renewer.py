"""The lease renewer: keeps the leases of running handlers alive, and ends the lost ones.

Every pass renews the visibility of each delivery whose handler is running (``rt.leases``,
maintained by the runners) with one batched, fenced script call per
:data:`~respire_actors.actors.source.MAX_RENEW_BATCH` deliveries (``Source.renew``: the entry
must still be pending for this consumer with this delivery count; then ``XCLAIM ... JUSTID``
resets its idle time without counting a delivery). A long handler therefore keeps its job for
as long as it runs, and a crashed process's jobs are recovered one visibility timeout after
their last renewal.

A grouped job also holds its group's concurrency lease (``lease_duration``, 100 ms and up),
renewed in the same call. The renewer paces itself by the shortest term among the running
leases: a third of the visibility timeout, or of a group lease when that is shorter. A group's
duration is learned from the first renewal of one of its jobs (the script returns it); until
then a grouped lease is assumed to last the shortest a group lease may (100 ms), so a runner
adding one wakes the renewer to plan again.

A handler's scope is cancelled here only when its lease is really lost:

- a renewal reports the entry lost (pending for another consumer, delivered again, settled)
  or its body deleted;
- no renewal could be confirmed (Redis unreachable, the call failed or timed out) for a whole
  visibility timeout since the last confirmed one (for a grouped job, its group lease if that
  is shorter): other consumers may recover the entry, or start another job of its group,
  from then on, so the lease is lost even though nobody said so.

A lease whose handler has returned (its outcome on the way to the completer) is renewed until
the commit, even past such an expiry: an outage longer than the visibility timeout leaves the
entry pending for this consumer unless another worker claimed it (the renewal is fenced and
says so), and this worker's recovery renews its own leases before claiming, so it never takes
an entry from its own completer and runs a finished job again.

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
from .source import (
    GONE,
    GROUP_RENEWED_MIN,
    MAX_RENEW_BATCH,
    RENEWED,
    UNCONFIRMED,
    renew_deliveries,
)

MIN_RENEW_INTERVAL = 0.003
"""Shortest pause between renewal passes, in seconds (for the 10 ms minimum visibility)."""
MIN_GROUP_LEASE = 0.1
"""The shortest group concurrency lease, in seconds: what a grouped job's lease is assumed to
last until its first renewal tells the renewer its group's real duration."""


def renew_interval(visibility: float) -> float:
    """The pause between passes for a visibility timeout (seconds): a third of it, so a lease
    survives two missed passes, and at least :data:`MIN_RENEW_INTERVAL`."""
    return max(visibility / 3, MIN_RENEW_INTERVAL)


def term(lease: Lease, visibility: float) -> float:
    """How long ``lease`` holds after a confirmation (seconds): the visibility timeout, or its
    group's concurrency lease when that is shorter (pure)."""
    if lease.term is not None:
        return min(visibility, lease.term)
    return visibility


def pass_interval(leases: Sequence[Lease], visibility: float) -> float:
    """The pause between passes while ``leases`` run: a third of the shortest term among them,
    a grouped lease whose group's duration is not known yet counting as the shortest a group
    may have (pure)."""
    interval = renew_interval(visibility)
    for lease in leases:
        if lease.lost or not lease.grouped:
            continue
        known = lease.term if lease.term is not None else MIN_GROUP_LEASE
        interval = min(interval, renew_interval(min(visibility, known)))
    return interval


def expired(leases: Sequence[Lease], now: float, visibility: float) -> list[Lease]:
    """The leases with no confirmation for a whole term (pure)."""
    return [
        lease
        for lease in leases
        if not lease.lost and now - lease.confirmed_at >= term(lease, visibility)
    ]


def next_wake(leases: Sequence[Lease], now: float, visibility: float, interval: float) -> float:
    """When the next pass is due: after ``interval``, or earlier if a lease would otherwise
    expire before (pure). A lease already past its expiry (an outcome waiting for its commit
    through an outage) does not bring the pass forward: it is renewed every ``interval``."""
    wake = now + interval
    for lease in leases:
        if not lease.lost:
            expiry = lease.confirmed_at + term(lease, visibility)
            if expiry > now:
                wake = min(wake, expiry)
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
        bound = min(term(lease, visibility) for lease in chunk) * 2 / 3
        if not late:
            # a running handler must not outlive its lease waiting on a hung server (an
            # outcome past its expiry has no handler left to cancel)
            expiries = [
                lease.confirmed_at + term(lease, visibility)
                for lease in chunk
                if not (lease.handed or lease.returned)
            ]
            if expiries:
                bound = min(bound, min(expiries) - sent)
        statuses: list[int] | None = None
        rt.stats.renewal_calls += 1
        try:
            statuses = await renew_deliveries(
                rt.source, rt.consumer, [lease.delivery for lease in chunk], max(bound, 0.0)
            )
        except RespireError as exc:
            log.warning("%s: lease renewal failed: %s", rt.name, exc)
        if statuses is None:
            rt.stats.renewal_failures += 1
            continue
        for lease, status in zip(chunk, statuses, strict=True):
            verdict = renewal_verdict(lease, status)
            if verdict == "unconfirmed":
                continue  # its partition's node was unreachable: not confirmed, not lost
            if verdict == "renewed":
                rt.stats.leases_renewed += 1
                if sent > lease.confirmed_at:
                    lease.confirmed_at = sent
                if status >= GROUP_RENEWED_MIN:
                    _learn_term(rt, lease, status / 1000)
            elif verdict == "settled":
                lose_lease(rt, lease)  # no longer renewed; nothing to cancel or report
            elif lease in rt.leases and not lease.lost:
                log.warning(
                    "%r of %s: lease lost (%s); cancelling its handler",
                    lease.delivery.job_id or lease.delivery.entry_id,
                    rt.name,
                    "entry deleted" if status == GONE else "not pending for this delivery",
                )
                lose_lease(rt, lease)
    _expire(rt, anyio.current_time(), visibility)


def renewal_verdict(lease: Lease, status: int) -> str:
    """What one renewal status means for ``lease``: ``"renewed"``, ``"unconfirmed"`` (its
    node was unreachable), ``"settled"`` (not renewed, but its handler already returned: the
    entry was or is being acknowledged by the completer, which reports a real loss as a stale
    commit, so no lost lease is logged or counted) or ``"lost"``."""
    if status == UNCONFIRMED:
        return "unconfirmed"
    if status == RENEWED or status >= GROUP_RENEWED_MIN:
        return "renewed"
    if lease.handed or lease.returned:
        return "settled"
    return "lost"


async def confirm_before_recovery(rt: QueueRuntime) -> None:
    """Renew this worker's own leases first when the renewer is behind (the event loop or the
    process stalled): a recovery claim takes every delivery idle past the visibility timeout,
    this consumer's own included, so it would otherwise take a delivery from its own running
    handler (or from an outcome waiting for its commit) and run the job again."""
    if not rt.leases:
        return
    visibility = rt.visibility_ms / 1000
    now = anyio.current_time()
    if any(
        not lease.lost and now - lease.confirmed_at >= term(lease, visibility) / 2
        for lease in rt.leases
    ):
        await renew_pass(rt, visibility, late=True)


def _learn_term(rt: QueueRuntime, lease: Lease, seconds: float) -> None:
    """Remember a grouped job's group lease duration, for this lease and the group's next."""
    lease.term = seconds
    delivery = lease.delivery
    job_group = delivery.fields.get(b"_respire.job.group", b"").decode("utf-8", "replace")
    rt.group_terms[(delivery.origin, job_group)] = seconds


def _expire(rt: QueueRuntime, now: float, visibility: float) -> None:
    for lease in expired(list(rt.leases), now, visibility):
        if lease.handed or lease.returned:
            # its handler returned: the outcome waits for its commit (an outage), so its lease
            # is still renewed, fenced: if nobody took the entry meanwhile it is still this
            # worker's, and this worker's own recovery (which renews first) must not take it
            # from its completer and run the job again
            continue
        rt.stats.leases_expired += 1
        log.warning(
            "%r of %s: no renewal confirmed for a visibility timeout (or its group lease); "
            "others may recover it, cancelling its handler",
            lease.delivery.job_id or lease.delivery.entry_id,
            rt.name,
        )
        lose_lease(rt, lease)


LEASE_MARK_INTERVAL = 1.0
"""Seconds between the marks of this worker's visibility timeout while it holds running
deliveries (a mark lasts 3 s on the server: lib/fence.lua). Workers with a shorter timeout
wait for a marked longer one before recovering anything, so they never take the running jobs
of a worker configured with a longer timeout; once this worker dies its mark lapses."""


async def mark_leases_while_running(rt: QueueRuntime) -> None:
    """Every :data:`LEASE_MARK_INTERVAL`, while the registration holds running deliveries,
    mark its visibility timeout (job queues only; a failed mark is retried next time)."""
    mark = getattr(rt.source, "mark_leases", None)
    if mark is None:
        return
    while True:
        await anyio.sleep(LEASE_MARK_INTERVAL)
        origins = sorted({lease.delivery.origin for lease in rt.leases if not lease.lost})
        if not origins:
            continue
        try:
            with anyio.fail_after(LEASE_MARK_INTERVAL * 2):
                await mark(rt.consumer, origins)
        except (RespireError, TimeoutError) as exc:
            log.debug("%s: marking the visibility timeout in use failed: %s", rt.name, exc)


async def run_renewer(
    rt: QueueRuntime, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
) -> None:
    """The lease renewer, with :func:`mark_leases_while_running` beside it."""
    async with anyio.create_task_group() as tg:
        tg.start_soon(mark_leases_while_running, rt)
        await _renew_until_stopped(rt, task_status=task_status)
        tg.cancel_scope.cancel()


async def _renew_until_stopped(
    rt: QueueRuntime, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
) -> None:
    """The lease renewer of one registration: a pass every third of the visibility timeout, or
    of the shortest group lease among running grouped jobs (sooner when a lease could
    otherwise expire), until stopped. Started before the completer and the runners and stopped
    after them, so handlers finishing within the shutdown grace, and outcomes still being
    committed, keep their leases."""
    ctx = current_child()
    visibility = rt.visibility_ms / 1000
    task_status.started()
    # the next pass is due an interval after the previous one, whatever happened in between: a
    # replan (a grouped lease added) may bring it forward, never push it back
    last_pass = anyio.current_time()
    while not ctx.stop_requested:
        # a fresh event before looking at the leases: a grouped lease added from here on wakes
        # this planning up again (its group lease may need renewing before ``wake``)
        added = rt.lease_added = anyio.Event()
        leases = list(rt.leases)
        interval = pass_interval(leases, visibility)
        wake = next_wake(leases, last_pass, visibility, interval)
        with ctx.stop_scope(), anyio.move_on_after(max(wake - anyio.current_time(), 0.0)):
            await added.wait()
        if ctx.stop_requested:
            break
        now = anyio.current_time()
        if now < wake:
            continue  # a grouped lease was added: plan again from the same last pass
        last_pass = now
        if rt.leases:
            # woken much later than planned: the event loop was blocked, not Redis
            late = now - wake > interval
            await renew_pass(rt, visibility, late=late)
