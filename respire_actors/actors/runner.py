"""Handler runners: each runs one handler at a time inside a cancel scope owned by the lease.

The lease of a delivery is its visibility timeout, counted from the moment the read returned:
after it another consumer may recover the entry, so the handler's scope is cancelled then (and
as soon as a fenced call reports that another delivery owns the job). A cancelled handler leaves
no outcome: the entry stays pending for recovery. Outcomes go to the completer's mailbox; the
admission permit comes back once the outcome is handed over.
"""

from __future__ import annotations

import anyio
import anyio.abc

from supervisors import current_child

from ..codecs import DecodeError
from .messages import Ack, Completion, DeadLetter, DeadLetterReason, Delivery, Nack, RetryAfter
from .runtime import QueueRuntime, log


async def process(rt: QueueRuntime, delivery: Delivery, deadline: float) -> None:
    """Run one delivery under its lease and hand its outcome (if any) to the completer.

    The handler argument comes from ``rt.bind`` (a ``Job`` for job workers, the raw entry for
    stream workers). It must have ``cancel_scope`` and ``lease_lost`` attributes.
    """
    label = delivery.job_id or delivery.entry_id
    try:
        arg = rt.bind(rt, delivery)
    except DecodeError as exc:
        rt.stats.decode_failures += 1
        log.warning(
            "%r of %s cannot be decoded (%s); dead-lettering without calling the handler",
            label,
            rt.name,
            exc,
        )
        await rt.completions.send(
            Completion(delivery, "dead", DeadLetterReason.PROCESSING_FAILED.value)
        )
        return
    rt.stats.started += 1
    outcome: object = None
    failed = False
    with anyio.CancelScope(deadline=deadline) as scope:
        arg.cancel_scope = scope
        try:
            outcome = await rt.handler(arg)
        except Exception:
            failed = True
            rt.stats.failed += 1
            log.exception(
                "handler for %s failed on %r (attempt %d)", rt.name, label, delivery.attempt
            )
    if scope.cancelled_caught or arg.lease_lost:
        if not arg.lease_lost:
            arg.lease_lost = True
            rt.stats.leases_lost += 1
        log.warning("%r of %s lost its lease; left pending for recovery", label, rt.name)
        return
    if failed:
        await _nack(rt, delivery, DeadLetterReason.PROCESSING_FAILED.value)
    elif outcome is None or isinstance(outcome, Ack):
        await rt.completions.send(Completion(delivery, "ack"))
    elif isinstance(outcome, DeadLetter):
        await rt.completions.send(Completion(delivery, "dead", outcome.reason))
    elif isinstance(outcome, Nack):
        await _nack(rt, delivery, DeadLetterReason.NACK.value)
    elif isinstance(outcome, RetryAfter):
        await _nack(rt, delivery, DeadLetterReason.NACK.value, outcome.delay_ms)
    else:
        log.error(
            "handler for %s returned %r, not an outcome; treating it as a failure",
            rt.name,
            outcome,
        )
        rt.stats.failed += 1
        await _nack(rt, delivery, DeadLetterReason.PROCESSING_FAILED.value)


def retry_decision(
    rt: QueueRuntime, delivery: Delivery, retry_after_ms: int | None
) -> tuple[str, int]:
    """The pure nack decision: ``("dead", 0)`` when the total attempt count (prior attempts
    across durable retries plus this entry's deliveries) reached the delivery limit;
    ``("retry", delay_ms)`` when queue options are set and either ``retry_after`` gave a delay
    (it overrides the backoff and its cap) or a backoff is configured; else ``("pending", 0)``:
    the entry stays pending for visibility recovery."""
    total = delivery.prior_attempts + delivery.attempt
    limit = rt.options.delivery_limit
    if limit is not None and total >= limit:
        return "dead", 0
    qo = rt.queue_options
    if qo is not None:
        if retry_after_ms is not None:
            return "retry", retry_after_ms
        backoff = qo.retry_delay_ms(total)
        if backoff is not None:
            return "retry", backoff
    return "pending", 0


async def _nack(
    rt: QueueRuntime, delivery: Delivery, reason: str, retry_after_ms: int | None = None
) -> None:
    """Nack path: dead-letter at the delivery limit, stage a durable retry when configured,
    otherwise leave the entry pending so visibility recovery delivers it again."""
    rt.stats.nacked += 1
    decision, delay = retry_decision(rt, delivery, retry_after_ms)
    if decision == "dead":
        await rt.completions.send(Completion(delivery, "dead", reason))
    elif decision == "retry":
        await rt.completions.send(Completion(delivery, "retry", reason, delay))


async def _runner_loop(rt: QueueRuntime) -> None:
    ctx = current_child()
    visibility = rt.visibility_ms / 1000
    while not ctx.stop_requested:
        delivery: Delivery | None = None
        with ctx.stop_scope():
            delivery = await rt.deliveries.receive()
        if delivery is None:
            break
        try:
            # The lease is counted from when the read that claimed the entry returned, which is
            # after Redis delivered it; fencing keeps the short overlap harmless.
            await process(rt, delivery, delivery.received_at + visibility)
        finally:
            rt.admission.release(1)


async def run_runner_pool(
    rt: QueueRuntime, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
) -> None:
    """``consumer_count`` runners. On a stop request each finishes its current handler (the
    child's shutdown deadline bounds them all together); admitted deliveries not yet started stay
    pending in Redis for recovery."""
    async with anyio.create_task_group() as tg:
        for _ in range(rt.options.consumer_count):
            tg.start_soon(_runner_loop, rt)
        task_status.started()
