"""Handler runners: each runs one handler at a time inside a cancel scope.

With lease renewal (the default) the runner registers each running delivery in
``rt.leases``; the lease renewer keeps its visibility fresh and cancels the scope only when the
lease is really lost (renewal finds another owner or no pending entry, or no renewal could be
confirmed for a whole visibility timeout); a fenced call (progress, log) that finds another
delivery owning the job cancels it too. The scope's deadline is the execution budget
(``WorkerOptions.timeout``), if any. Without renewal the deadline is also the fixed lease:
the visibility timeout counted from the moment the read returned.

A handler cancelled because its lease was lost leaves no outcome: the entry stays pending for
recovery. A handler cancelled by its budget takes the nack path (``processing-failed``).
Outcomes go to the completer's mailbox; the admission permit comes back once the outcome is
handed over.
"""

from __future__ import annotations

import asyncio
import inspect
import math
from dataclasses import replace
from typing import Any

import anyio
import anyio.abc

from supervisors import current_child

from ..codecs import EncodeError, encode_with, safe_str
from ..errors import ValidationError
from .messages import (
    MAX_DETAIL_BYTES,
    Ack,
    Complete,
    Completion,
    DeadLetter,
    DeadLetterReason,
    Delivery,
    Nack,
    RetryAfter,
    check_outcome,
)
from .runtime import Lease, QueueRuntime, log
from .telemetry import HandlerRecord, finish_handler, is_cancellation, run_handler


def _raised_by_handler() -> bool:
    """Whether the ``asyncio.CancelledError`` being handled is the handler's own (it awaited a
    future or task that was cancelled, or raised one) rather than a cancellation of this task.

    On asyncio a cancel scope cancels its task with ``Task.cancel()``, which counts in
    ``Task.cancelling()``; a handler's own CancelledError does not. Under trio cancellation is
    ``trio.Cancelled``, so any ``asyncio.CancelledError`` is the handler's. Left to propagate,
    it would end the runners' task group and cancel every other running handler.
    """
    if anyio.get_cancelled_exc_class() is not asyncio.CancelledError:
        return True  # trio
    task = asyncio.current_task()
    return task is not None and task.cancelling() == 0


def _cancel_requested() -> bool:
    """Whether a cancel scope around this task has been cancelled (the job's lease or budget,
    the runners' stop). A cancellation exception seen without one is the handler's own doing
    (``asyncio.current_task().cancel()``, a hand-made ``trio.Cancelled``): a failure of that
    job, not a reason to end the runners and every handler beside it."""
    return anyio.current_effective_deadline() == -math.inf


def _own_cancellation(exc: BaseException) -> bool:
    """``exc`` is a cancellation no scope asked for (see :func:`_cancel_requested`); on asyncio
    the task's pending cancel request is withdrawn so it does not linger."""
    if not is_cancellation(exc) or _cancel_requested():
        return False
    if isinstance(exc, asyncio.CancelledError):
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            task.uncancel()
    return True


async def process(
    rt: QueueRuntime, delivery: Delivery, deadline: float, budget: float = 0.0
) -> None:
    """Run one delivery under its lease and hand its outcome (if any) to the completer.

    ``deadline`` is the fixed lease's end (without renewal; ``math.inf`` with it) and
    ``budget`` the execution budget in seconds (0: none), counted from the handler's start.

    The handler argument comes from ``rt.bind`` (a ``Job`` for job workers, the raw entry for
    stream workers). It must have ``cancel_scope`` and ``lease_lost`` attributes.

    What the handler returns decides the outcome: ``None``, ``ACK`` or any value that is not
    an outcome is a success (with result retention, the value is kept); ``NACK``,
    ``RetryAfter`` and ``DeadLetter`` are failures; an exception, or an outcome object that
    fails validation (built around its checks), takes the nack path as a processing failure.
    """
    label = delivery.job_id or delivery.entry_id
    if rt.gate is not None:
        try:
            skipped = await rt.gate(rt, delivery)
        except Exception as exc:
            # the check could not be made (Redis unreachable, unknown state): do not run the
            # handler of a job that may have been cancelled; recovery delivers it again
            log.warning(
                "%r of %s was not started: its pre-start check failed (%s); left pending for "
                "recovery",
                label,
                rt.name,
                exc,
            )
            return
        if skipped is not None:
            await rt.completions.send(skipped)
            return
    try:
        arg = rt.bind(rt, delivery)
    except Exception as exc:  # DecodeError, or a codec that failed some other way
        rt.stats.decode_failures += 1
        if rt.options.dead_letter_undecodable:
            log.warning(
                "%r of %s cannot be decoded (%s); dead-lettering without calling the handler",
                label,
                rt.name,
                exc,
            )
            await rt.completions.send(
                _dead(rt, delivery, DeadLetterReason.PROCESSING_FAILED.value, _short(exc))
            )
        else:
            log.warning(
                "%r of %s cannot be decoded (%s); the nack policy applies (attempt %d)",
                label,
                rt.name,
                exc,
                delivery.attempt,
            )
            await _nack(rt, delivery, DeadLetterReason.PROCESSING_FAILED.value, detail=_short(exc))
        return
    rt.stats.started += 1
    budget_end = math.inf
    if budget:
        budget_end = anyio.current_time() + budget
    lease_box: list[Lease] = []
    record = HandlerRecord()
    try:
        await _run_and_settle(
            rt, delivery, arg, label, deadline, budget, budget_end, lease_box, record
        )
    except BaseException as exc:
        if is_cancellation(exc) and not arg.lease_lost:
            # cancelled from outside (the worker's stop after its grace): no outcome is sent,
            # the entry stays pending for recovery, but its group permit is handed back now
            release_abandoned(rt, delivery)
        raise
    finally:
        finish_handler(rt, delivery, arg, record)
        # a lease not handed to a completion ends with the handler; one handed over is renewed
        # until the completer has committed it (a commit delayed by an outage or a slot
        # migration must not let the entry be recovered and run again meanwhile)
        for held in lease_box:
            if not held.handed:
                rt.leases.discard(held)


async def _run_and_settle(
    rt: QueueRuntime,
    delivery: Delivery,
    arg: Any,
    label: str,
    deadline: float,
    budget: float,
    budget_end: float,
    lease_box: list[Lease],
    record: HandlerRecord,
) -> None:
    """Run the handler under its lease, then send its outcome; a Lease registered for it is
    put in ``lease_box`` (the caller discards it unless a completion took it over)."""
    outcome: object = None
    failed = False
    failure: BaseException | None = None  # what the handler raised, for the dead letter
    # a suspect of crashing its workers runs alone (actors/isolation.py)
    alone = delivery.alone
    with anyio.CancelScope(deadline=deadline if alone else min(deadline, budget_end)) as scope:
        arg.cancel_scope = scope
        lease: Lease | None = None
        if rt.options.renew_leases:
            # the renewer's view of this delivery: one set insert and removal per job
            lease = Lease(delivery, arg, scope, delivery.received_at or anyio.current_time())
            job_group = delivery.fields.get(b"_respire.job.group")
            if job_group is not None:
                # its group lease may be shorter than the renewer's pace: tell it
                lease.grouped = True
                lease.term = rt.group_terms.get(
                    (delivery.origin, job_group.decode("utf-8", "replace"))
                )
                rt.lease_added.set()
            rt.leases.add(lease)
            lease_box.append(lease)
        running_alone = False
        try:
            if alone:
                # it waits, under its lease (renewed), for the handlers beside it to end, and
                # nothing else is admitted until it ends; its budget starts after the wait
                log.warning(
                    "%r of %s is on its delivery %d, the earlier ones ended without a durable "
                    "outcome (a crash, a lost lease, an exception or NACK left for recovery): "
                    "it runs alone, in case it is what crashed its workers",
                    label,
                    rt.name,
                    delivery.attempt,
                )
                with current_child().stop_scope():
                    await rt.admission.wait_alone()
                    running_alone = True
                if not running_alone:
                    # the worker is stopping: a suspect not started yet stays pending
                    log.info("%r of %s was not started: the worker is stopping", label, rt.name)
                    release_abandoned(rt, delivery)
                    return
                rt.stats.isolated += 1
                if budget:
                    budget_end = anyio.current_time() + budget
                scope.deadline = min(deadline, budget_end)
            outcome = await run_handler(rt, delivery, arg, record)
        except Exception as exc:
            failed, failure = True, exc
            rt.stats.failed += 1
            log.exception(
                "handler for %s failed on %r (attempt %d)", rt.name, label, delivery.attempt
            )
        except asyncio.CancelledError as exc:
            if not _raised_by_handler() and not _own_cancellation(exc):
                raise  # this task is being cancelled (lease, budget, shutdown)
            failed, failure = True, exc
            rt.stats.failed += 1
            log.exception(
                "handler for %s raised a CancelledError of its own on %r (attempt %d): a "
                "failure, the nack policy applies",
                rt.name,
                label,
                delivery.attempt,
            )
        except BaseException as exc:
            if is_cancellation(exc) and not _own_cancellation(exc):
                raise
            # Not an Exception (SystemExit, KeyboardInterrupt, GeneratorExit, a BaseException
            # subclass or group): still this job's failure. Let through, it would end the
            # runners' task group, cancel every handler beside it and charge each a delivery.
            failed, failure = True, exc
            rt.stats.failed += 1
            log.error(
                "handler for %s raised %s, which is not an Exception, on %r (attempt %d): a "
                "failure, the nack policy applies",
                rt.name,
                type(exc).__name__,
                label,
                delivery.attempt,
                exc_info=exc,
            )
            if isinstance(exc, SystemExit | KeyboardInterrupt):
                # the handler asked the process to end: stop the worker gracefully (the jobs
                # beside it finish and commit), then ``run`` raises it
                rt.fail(exc)
        finally:
            if running_alone:
                rt.admission.alone_done()
    if arg.lease_lost:
        log.warning("%r of %s lost its lease; left pending for recovery", label, rt.name)
        return
    # the budget ran out and cancelled the handler; a handler that swallowed or shielded that
    # cancellation and returned anyway overran its budget all the same (its outcome is ignored)
    over_budget = (
        scope.cancel_called and budget_end <= deadline and anyio.current_time() >= budget_end
    )
    if lease is not None and not scope.cancelled_caught and not over_budget:
        lease.returned = True  # the outcome is decided: a later loss is the commit's to report
    if scope.cancelled_caught or over_budget:
        if over_budget:
            rt.stats.timed_out += 1
            record.decided = "timeout"
            record.error = TimeoutError(f"the handler ran out of its {budget:g}s budget")
            log.warning(
                "handler for %s ran out of its %.3fs budget on %r (attempt %d); cancelled, "
                "the nack policy applies",
                rt.name,
                budget,
                label,
                delivery.attempt,
            )
            await _nack(
                rt,
                delivery,
                DeadLetterReason.PROCESSING_FAILED.value,
                detail=f"timeout: the handler ran out of its {budget:g}s budget",
                lease=lease,
            )
            return
        # the fixed lease ran out (no renewal), or the handler cancelled its own scope
        arg.lease_lost = True
        record.decided = "lease-lost"
        rt.stats.leases_lost += 1
        log.warning("%r of %s lost its lease; left pending for recovery", label, rt.name)
        return
    if not failed and inspect.isawaitable(outcome):
        # ``return do_work()`` without await: the work never ran, so it is no success
        if inspect.iscoroutine(outcome):
            outcome.close()  # no "never awaited" warning on top of the error below
        failed = True
        rt.stats.failed += 1
        rt.stats.invalid_outcomes += 1
        record.decided = "invalid"
        record.error = TypeError("the handler returned an awaitable without awaiting it")
        log.error(
            "handler for %s returned %r for %r without awaiting it: the work did not run; "
            "treating it as a failure (await it in the handler)",
            rt.name,
            type(outcome).__name__,
            label,
        )
    if not failed and (
        isinstance(outcome, Ack | Nack | DeadLetter | RetryAfter | Complete)
        or _outcome_class(outcome)
    ):
        try:
            if _outcome_class(outcome):
                raise ValidationError(f"{outcome!r} is an outcome class, not an outcome")
            check_outcome(outcome)  # type: ignore[arg-type]
        except ValidationError as exc:
            failed = True
            rt.stats.failed += 1
            rt.stats.invalid_outcomes += 1
            record.decided, record.error = "invalid", exc
            log.error(
                "handler for %s returned an invalid outcome for %r (%s); treating it as a failure",
                rt.name,
                label,
                exc,
            )
    if failed:
        if failure is None:
            failure = record.error
        detail = _short(failure) if failure is not None else ""
        await _nack(
            rt, delivery, DeadLetterReason.PROCESSING_FAILED.value, detail=detail, lease=lease
        )
    elif isinstance(outcome, DeadLetter):
        await _hand(rt, lease, _dead(rt, delivery, outcome.reason, outcome.detail))
    elif isinstance(outcome, Nack):
        await _nack(rt, delivery, DeadLetterReason.NACK.value, lease=lease)
    elif isinstance(outcome, RetryAfter):
        if rt.queue_options is None and "retry-after" not in rt.warned:
            rt.warned.add("retry-after")
            log.warning(
                "a handler for %s returned retry_after(...), but the registration has no "
                "QueueOptions, so it cannot stage a durable retry: the job is retried after the "
                "visibility timeout (%.3fs) instead, like NACK. Register it with "
                "queue_options=QueueOptions() (warned once)",
                rt.name,
                rt.visibility_ms / 1000,
            )
        await _nack(rt, delivery, DeadLetterReason.NACK.value, outcome.delay_ms, lease=lease)
    elif isinstance(outcome, Complete):
        await _hand(rt, lease, _ack(rt, delivery, outcome.result, flow_result=outcome.result))
    else:
        # None, ACK, or a plain return value: success
        await _hand(rt, lease, _ack(rt, delivery, None if isinstance(outcome, Ack) else outcome))


def _outcome_class(value: object) -> bool:
    """``return DeadLetter`` (the class) is a mistake, not a plain success value."""
    return isinstance(value, type) and issubclass(
        value, Ack | Nack | DeadLetter | RetryAfter | Complete
    )


def _short(exc: BaseException) -> str:
    """An exception as a dead-letter detail: its type and text, cut to the bound at a
    character boundary. It is a summary (documented as such); the whole exception and its
    traceback are in the worker's log, never lost."""
    text = f"{type(exc).__name__}: {safe_str(exc)}"
    data = text.encode("utf-8", "replace")[:MAX_DETAIL_BYTES]
    return data.decode("utf-8", "ignore")


def _ack(
    rt: QueueRuntime, delivery: Delivery, value: object, *, flow_result: bytes | None = None
) -> Completion:
    """The 'ack' completion; with result retention, ``value`` encoded (None is kept as a
    value too) or the reason it could not be. ``flow_result``: a flow node's retained result
    (from ``Job.complete``)."""
    keep = rt.options.keep_results_ms
    if not keep or rt.result_codec is None:
        return Completion(delivery, "ack", flow_result=flow_result)
    try:
        data = encode_with(rt.result_codec, value)
    except EncodeError as exc:
        rt.stats.results_not_kept += 1
        log.warning(
            "the result of %r of %s cannot be encoded (%s); the job completes without it",
            delivery.job_id or delivery.entry_id,
            rt.name,
            exc,
        )
        return Completion(
            delivery,
            "ack",
            keep_ms=keep,
            result_state="result-unencodable",
            flow_result=flow_result,
        )
    if len(data) > rt.options.max_result_bytes:
        rt.stats.results_not_kept += 1
        log.warning(
            "the result of %r of %s is %d bytes, over max_result_bytes (%d); the job completes "
            "without it",
            delivery.job_id or delivery.entry_id,
            rt.name,
            len(data),
            rt.options.max_result_bytes,
        )
        return Completion(
            delivery, "ack", keep_ms=keep, result_state="result-too-large", flow_result=flow_result
        )
    return Completion(
        delivery, "ack", keep_ms=keep, result_state="value", result=data, flow_result=flow_result
    )


def _dead(rt: QueueRuntime, delivery: Delivery, reason: str, detail: str = "") -> Completion:
    return Completion(delivery, "dead", reason, detail=detail, keep_ms=rt.options.keep_results_ms)


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
    rt: QueueRuntime,
    delivery: Delivery,
    reason: str,
    retry_after_ms: int | None = None,
    *,
    detail: str = "",
    lease: Lease | None = None,
) -> None:
    """Nack path: dead-letter at the delivery limit (with ``detail``), stage a durable retry
    when configured, otherwise leave the entry pending so visibility recovery delivers it
    again. A dead letter or retry takes the handler's ``lease`` over (renewed until
    committed); a plain nack lets it end (the entry is to be recovered)."""
    rt.stats.nacked += 1
    decision, delay = retry_decision(rt, delivery, retry_after_ms)
    if decision == "dead":
        await _hand(rt, lease, _dead(rt, delivery, reason, detail))
    elif decision == "retry":
        await _hand(rt, lease, Completion(delivery, "retry", reason, delay))
    elif delivery.group is not None:
        # unsuccessful processing releases the grouped delivery's concurrency lease (fenced by
        # consumer and attempt); the entry itself stays pending for visibility recovery
        await rt.completions.send(Completion(delivery, "release", reason))


def release_abandoned(rt: QueueRuntime, delivery: Delivery) -> None:
    """A grouped delivery that will not reach an outcome here (its handler cancelled by the
    worker's stop, or admitted and never started before it): hand its group concurrency lease
    back (fenced by consumer and attempt) instead of leaving the group's other jobs to wait for
    the lease to expire. The entry itself stays pending for recovery. Never blocks: the
    completer drains it before it stops; with its mailbox full or closed the lease expires on
    its own."""
    if delivery.group is None:
        return
    try:
        rt.completions.send_nowait(Completion(delivery, "release", "shutdown"))
    except Exception as exc:
        log.info(
            "the group lease of %r of %s could not be handed back at stop (%s); it expires on "
            "its own",
            delivery.job_id or delivery.entry_id,
            rt.name,
            type(exc).__name__,
        )


async def _hand(rt: QueueRuntime, lease: Lease | None, completion: Completion) -> None:
    """Send ``completion`` to the completer; the handler's lease, if still held, goes with it
    and is renewed until the completer has committed (or refused) it."""
    if lease is None or lease.lost:
        await rt.completions.send(completion)
        return
    await rt.completions.send(replace(completion, lease=lease))
    # only once the completer has it: a send cancelled on the way (a full mailbox at shutdown)
    # leaves the lease to the runner, which discards it
    lease.handed = True


async def _runner_loop(rt: QueueRuntime) -> None:
    ctx = current_child()
    # With renewal the lease has no fixed end: the renewer cancels a handler whose lease is lost.
    visibility = math.inf if rt.options.renew_leases else rt.visibility_ms / 1000
    budget = rt.options.timeout_ms / 1000
    while not ctx.stop_requested:
        delivery: Delivery | None = None
        with ctx.stop_scope():
            delivery = await rt.deliveries.receive()
        if delivery is None:
            break
        try:
            # The lease is counted from when the read that claimed the entry returned, which is
            # after Redis delivered it; fencing keeps the short overlap harmless.
            await process(rt, delivery, delivery.received_at + visibility, budget)
        finally:
            rt.admission.release(1)
            if delivery.alone:
                rt.admission.let_in()


async def run_runner_pool(
    rt: QueueRuntime, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
) -> None:
    """``consumer_count`` runners. On a stop request each finishes its current handler (the
    child's shutdown deadline bounds them all together); admitted deliveries not yet started stay
    pending in Redis for recovery."""
    try:
        async with anyio.create_task_group() as tg:
            for _ in range(rt.options.consumer_count):
                tg.start_soon(_runner_loop, rt)
            task_status.started()
    finally:
        if current_child().stop_requested:
            # admitted deliveries that no runner started: their group permits go back now,
            # and their admission permits (the pool may be started again on this runtime)
            while True:
                try:
                    delivery = rt.deliveries.receive_nowait()
                except Exception:
                    break
                release_abandoned(rt, delivery)
                rt.admission.release(1)
                if delivery.alone:
                    rt.admission.let_in()
