"""Steps the reader and the sweeper share: handing claimed pages to the runners, reacting to
a vanished consumer group, and the jittered waits that keep several processes from moving in
lock step on a rate-limit window."""

from __future__ import annotations

import random

import anyio

from ..errors import ConsumerGroupMissing
from .isolation import suspect_from
from .runtime import QueueRuntime, log
from .source import ClaimResult
from .telemetry import log_claimed, log_recovery_dead_letters


def dispatch_page(rt: QueueRuntime, mode: str, result: ClaimResult, taken: int) -> None:
    """Count a claimed page, return its unused permits and hand its deliveries to the runners
    (each keeps one permit until its outcome is handed over)."""
    rt.stats.cleared_deleted_refs += result.cleared_deleted
    if result.cleared_deleted:
        # the seed's trim loss: the work is gone, only its pending reference was left
        job_queue = rt.keys is not None or bool(rt.partition_keys)
        advice = (
            "trim with the safe trim (python -m respire_actors trim), never a raw XTRIM"
            if job_queue
            # an application stream: no CLI trim takes its key; the MINID procedure does
            else "trim only below the oldest entry every group still has pending or unread "
            "(XTRIM MINID, the safe trimming procedure in docs/topics.md), never by length"
        )
        log.warning(
            "%s: recovery found %d pending entries whose payload was deleted (a trim or XDEL "
            "past unacknowledged work) and cleared them: those jobs are lost and will not run; "
            "%s",
            rt.name,
            result.cleared_deleted,
            advice,
        )
    rt.stats.dead_lettered_by_recovery += result.dead_lettered
    rt.stats.expired += result.expired
    for entry_id, error in result.refused:
        rt.stats.rejected_completions += 1
        log.error(
            "recovery left entry %s of %s pending: its delivery limit is reached but its flow or "
            "batch state refused the update (%s); repair or upgrade that state",
            entry_id,
            rt.name,
            error,
        )
    rt.admission.release(taken - len(result.deliveries))
    log_claimed(rt, mode, result.deliveries)
    log_recovery_dead_letters(rt, result.dead_lettered)
    now = anyio.current_time()
    # the claim script returns a suspect alone in its page (one suspect per page: two
    # waiting for each other's permits would never run)
    alone_from = 0
    if rt.options.isolate_suspects and len(result.deliveries) == 1:
        alone_from = suspect_from(rt.delivery_limit)
    for delivery in result.deliveries:
        if mode == "replay":
            rt.stats.replayed += 1
        else:
            rt.stats.recovered += 1
        delivery.received_at = now
        if alone_from and delivery.attempt >= alone_from:
            # a suspect (alone in its page): nothing else is admitted until it has run alone
            delivery.alone = True
            rt.admission.hold_back()
        rt.deliveries.send_nowait(delivery)


def jittered(seconds: float, spread: float) -> float:
    """``seconds`` plus up to ``spread`` seconds at random (pure but for the random draw): the
    readers of several processes denied by the same window wake at different moments."""
    return seconds + random.uniform(0.0, max(0.0, spread))


async def group_lost(rt: QueueRuntime) -> bool:
    """NOGROUP while running: recreate the group where the options allow it (True: go on), or
    stop the worker with :class:`ConsumerGroupMissing` (False). Never recreates it at ``0``,
    which would run every retained, already acknowledged entry again."""
    try:
        await rt.restore_group()
    except ConsumerGroupMissing as exc:
        rt.fail(exc)
        return False
    log.warning(
        "consumer group of %s vanished; recreated at %r as configured",
        rt.name,
        rt.options.recreate_missing_group,
    )
    return True
