"""Telemetry around one delivery: the processing span, the handler duration and the structured
transition logs (logger ``respire_actors.telemetry``).

Every transition is logged with the same structured fields (``extra=``): ``event``,
``queue``, ``job_id``, ``entry_id``, ``attempt`` and ``trace_id`` (the producer's trace id,
the same for every attempt of a job; '' when the job carries no context). Levels:

=====================  =========  ==================================================
event                  level      where
=====================  =========  ==================================================
``accepted``           DEBUG      an enqueue appended (or deduplicated) the job
``delivered``          DEBUG      a runner starts the handler
``outcome-decided``    DEBUG      the handler returned, raised or was cancelled
``acknowledged``       DEBUG      the completer committed a success
``claimed``            INFO       recovery or startup replay claimed a delivery
``recovery-pass``      INFO       a recovery pass ended having claimed something (fields
                                  ``claimed`` and ``pages``; no job fields)
``retry-scheduled``    INFO       a durable retry was staged
``expired``            INFO       a retry found the job past its TTL
``dead-lettered``      WARNING    a dead letter was committed
``cancelled``          INFO       a batch member was acknowledged as cancelled
=====================  =========  ==================================================

DEBUG calls are guarded with ``isEnabledFor`` so they cost nothing when DEBUG is off.
Telemetry never changes an outcome: span and metric failures are swallowed (see
:mod:`respire_actors.tracing`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import Any

import anyio

from .. import tracing
from .messages import Ack, Complete, Completion, DeadLetter, Delivery, Nack, RetryAfter
from .metrics import handler_duration, note_dead_letter, telemetry_of
from .runtime import QueueRuntime

log = logging.getLogger("respire_actors.telemetry")


def fields(rt: QueueRuntime, delivery: Delivery, event: str) -> dict[str, Any]:
    """The structured fields of one transition of ``delivery``."""
    t = telemetry_of(rt)
    return {
        "event": event,
        "queue": t.destination,
        "job_id": delivery.job_id,
        "entry_id": delivery.entry_id,
        "attempt": delivery.attempt,
        "trace_id": tracing.trace_id(delivery.fields, t.fields),
    }


def _no_job(event: str, queue: str) -> dict[str, Any]:
    """The structured fields of a record about no one job (see tracing.no_job_fields)."""
    return tracing.no_job_fields(event, queue)


def _outcome_name(outcome: object) -> str:
    if isinstance(outcome, DeadLetter):
        return "dead-letter"
    if isinstance(outcome, RetryAfter):
        return "retry"
    if isinstance(outcome, Nack):
        return "nack"
    if outcome is None or isinstance(outcome, Ack | Complete):
        return "ack"
    return "ack" if not isinstance(outcome, type) else "invalid"


def is_cancellation(exc: BaseException) -> bool:
    """Whether ``exc`` is the backend's cancellation, or a group of nothing else (a trio
    nursery cancelled from outside raises its Cancelled wrapped in one)."""
    cancelled = anyio.get_cancelled_exc_class()
    if isinstance(exc, BaseExceptionGroup):
        return exc.split(cancelled)[1] is None
    return isinstance(exc, cancelled)


class HandlerRecord:
    """What :func:`run_handler` observed, kept until the runner has decided the outcome and
    calls :func:`finish_handler` (only the runner can tell a budget timeout from a lost lease,
    or a returned value it refuses from a success)."""

    __slots__ = ("debug", "decided", "elapsed", "error", "outcome", "result", "span", "started")

    def __init__(self) -> None:
        self.started = False
        self.span: Any = None
        self.result = "returned"
        # the runner's decision, when it is not what the handler's return or raise says
        self.decided: str | None = None
        self.error: BaseException | None = None
        self.outcome: object = None
        self.elapsed = 0.0
        self.debug = False


async def run_handler(rt: QueueRuntime, delivery: Delivery, arg: Any, record: HandlerRecord) -> Any:
    """``await rt.handler(arg)`` inside a CONSUMER span (a new root linked to the producer
    context in the delivery's fields; handler spans are its children), timed. Returns or
    raises exactly what the handler did; the span stays open for :func:`finish_handler`."""
    record.started = True
    debug = record.debug = log.isEnabledFor(logging.DEBUG)
    if debug:
        log.debug(
            "%s: delivering %r (attempt %d)",
            rt.name,
            delivery.job_id or delivery.entry_id,
            delivery.attempt,
            extra=fields(rt, delivery, "delivered"),
        )
    span = None
    if tracing.enabled():
        t = telemetry_of(rt)
        attributes: dict[str, Any] = {
            "messaging.system": tracing.SYSTEM,
            "messaging.destination.name": t.destination,
            "messaging.operation.type": "process",
            "messaging.operation.name": "process",
            "messaging.message.id": delivery.entry_id,
            "messaging.consumer.group.name": rt.group,
            "respire.telemetry_name": t.name,
            "respire.delivery.attempt": delivery.attempt,
        }
        if rt.partition_keys:
            attributes["respire.partition"] = delivery.origin
        if delivery.job_id:
            attributes["respire.job.id"] = delivery.job_id
            attributes["respire.job.total_attempts"] = delivery.prior_attempts + delivery.attempt
        span = tracing.consumer_span(
            t.span_name, tracing.incoming_link(delivery.fields, t.fields), attributes
        )
    record.span = span
    token = tracing.activate(span)
    started = time.perf_counter()
    try:
        record.outcome = await rt.handler(arg)
        return record.outcome
    except Exception as exc:
        record.result = "raised"
        tracing.fail(span, exc)
        raise
    except BaseException as exc:
        if is_cancellation(exc) or isinstance(exc, asyncio.CancelledError):
            record.result = "cancelled"
        else:  # SystemExit, KeyboardInterrupt, a BaseException of the handler's own
            record.result = "raised"
            tracing.fail(span, exc)
        raise
    finally:
        record.elapsed = time.perf_counter() - started
        tracing.deactivate(token)


def finish_handler(rt: QueueRuntime, delivery: Delivery, arg: Any, record: HandlerRecord) -> None:
    """End the handler's span and record its duration, with the runner's decision: its
    ``decided`` overrides the outcome read off the handler (``timeout``, ``invalid``), and its
    ``error`` marks the span failed (a budget timeout, a refused return value)."""
    if not record.started:
        return
    decided, error = record.decided, record.error
    result = record.result
    if decided == "timeout":
        result = "timed-out"
    elif decided == "invalid":
        result = "raised"
    name = rt.telemetry.name if rt.telemetry is not None else telemetry_of(rt).name
    try:
        handler_duration.record(
            record.elapsed, {"respire.telemetry_name": name, "respire.handler.result": result}
        )
    except Exception:
        log.debug(
            "recording the handler duration failed; ignored",
            exc_info=True,
            extra=_no_job("telemetry-failed", name),
        )
    span = record.span
    if span is None and not record.debug:
        return
    if decided is None:
        decided = _outcome_name(record.outcome) if record.result == "returned" else record.result
    if getattr(arg, "lease_lost", False):
        decided = "lease-lost"
    if span is not None:
        if error is not None:
            tracing.fail(span, error)
        tracing.set_attributes(span, {"respire.outcome": decided})
        tracing.end(span)
    if record.debug:
        log.debug(
            "%s: handler for %r ended: %s",
            rt.name,
            delivery.job_id or delivery.entry_id,
            decided,
            extra={**fields(rt, delivery, "outcome-decided"), "outcome": decided},
        )


def log_claimed(rt: QueueRuntime, mode: str, deliveries: Sequence[Delivery]) -> None:
    """INFO per delivery claimed by recovery or replay (not the per-job hot path)."""
    if not deliveries or not log.isEnabledFor(logging.INFO):
        return
    for delivery in deliveries:
        log.info(
            "%s: %s claimed %r (delivery %d)",
            rt.name,
            mode,
            delivery.job_id or delivery.entry_id,
            delivery.attempt,
            extra={**fields(rt, delivery, "claimed"), "mode": mode},
        )


def log_recovery_pass(rt: QueueRuntime, claimed: int, pages: int) -> None:
    """INFO once per recovery pass that claimed deliveries: how many, in how many pages (at
    most ``recovery_page_size * recovery_max_pages``; the chaos suite checks that bound)."""
    if claimed and log.isEnabledFor(logging.INFO):
        log.info(
            "%s: a recovery pass claimed %d deliveries in %d pages",
            rt.name,
            claimed,
            pages,
            extra={
                **_no_job("recovery-pass", telemetry_of(rt).destination),
                "claimed": claimed,
                "pages": pages,
            },
        )


def observe_commits(rt: QueueRuntime, batch: Sequence[Completion], statuses: Sequence[int]) -> None:
    """Log the committed transitions of one completion batch and count dead letters by
    reason; ``statuses`` as :func:`~respire_actors.actors.completer.commit` returns them
    (1 committed, 2 a retry acknowledged as expired, 3 committed as cancelled, 0 stale or
    refused)."""
    debug = log.isEnabledFor(logging.DEBUG)
    for c, status in zip(batch, statuses, strict=True):
        if status <= 0 or c.kind == "release":
            continue
        d = c.delivery
        label = d.job_id or d.entry_id
        if status == 3 or c.kind == "cancelled":  # 3: committed as cancelled (its batch)
            log.info("%s: %r cancelled", rt.name, label, extra=fields(rt, d, "cancelled"))
        elif c.kind == "ack":
            if debug:
                log.debug(
                    "%s: %r acknowledged", rt.name, label, extra=fields(rt, d, "acknowledged")
                )
        elif c.kind == "dead":
            note_dead_letter(rt, c.reason)
            log.warning(
                "%s: %r dead-lettered (%s)",
                rt.name,
                label,
                c.reason,
                extra={**fields(rt, d, "dead-lettered"), "reason": c.reason},
            )
        elif c.kind == "expired" or (c.kind == "retry" and status == 2):
            log.info("%s: %r expired", rt.name, label, extra=fields(rt, d, "expired"))
        elif c.kind == "retry":
            log.info(
                "%s: retry of %r scheduled in %d ms",
                rt.name,
                label,
                c.delay_ms,
                extra={**fields(rt, d, "retry-scheduled"), "delay_ms": c.delay_ms},
            )


def log_recovery_dead_letters(rt: QueueRuntime, count: int) -> None:
    """WARNING for entries dead-lettered inside a recovery script at the delivery limit (the
    script reports only how many)."""
    if count:
        log.warning(
            "%s: recovery dead-lettered %d deliveries at the delivery limit",
            rt.name,
            count,
            extra={
                **_no_job("dead-lettered", telemetry_of(rt).destination),
                "reason": "delivery-limit",
                "count": count,
            },
        )
