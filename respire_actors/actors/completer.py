"""The completer: commits outcomes in batches, one fenced script call per batch.

Fencing makes a commit safe to repeat: after a lost reply the retry finds the entry no longer
pending for this attempt and writes nothing (no second event). On stop the completer drains
its mailbox before returning, so handlers that finished are committed.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

import anyio
import anyio.abc

from supervisors import MailboxClosed, current_child

from .. import faults
from ..errors import (
    PermissionDenied,
    RedisUnavailable,
    ServerError,
    ServerLoading,
    ValidationError,
)
from .intake import group_lost
from .messages import MAX_DETAIL_BYTES, Completion, Delivery
from .runtime import QueueRuntime, log
from .source import PartlyUnavailable
from .telemetry import observe_commits

MAX_BATCH = 256
DEFERRED = -3
"""Commit status: not committed yet, its node unreachable; retried apart (see ``commit``)."""
CANCELLED_INSTEAD = 3
"""Commit status: an 'ack' or 'dead' of a batch member committed as 'cancelled' (its batch's
cancellation was requested while it ran)."""


async def commit(
    rt: QueueRuntime, batch: list[Completion], defer: Defer | None = None
) -> list[int]:
    """Commit one batch (retrying transient failures); returns per completion 1 committed,
    0 stale (or refused, see below), 2 (a retry) acknowledged as expired instead of staged, 3
    (an ack or dead letter of a batch member) committed as cancelled.
    A source may report -1 for a completion the server refused on its own (the others
    committed): it counts as refused. A ``release`` (a grouped delivery that failed and stays
    pending gives back its group lease) reports 1 released or 0 not held.

    One bad completion must not cost the others. Completions that cannot be sent at all
    (malformed fields) are set aside before anything is sent. When the server refuses a batch
    (a script's argument or invariant check, a key of one job holding the wrong type...), the
    batch is committed again one completion at a time, so the good ones commit and the bad one
    is logged and counted in ``rejected_completions``: its entry stays pending and is recovered
    after the visibility timeout (and dead-lettered by recovery at the delivery limit). Outcomes
    the refused call had already committed report 0 (stale) on the second pass. An ACL refusal
    (``PermissionDenied``) would refuse every completion: it stops the completer, whose
    supervisor restarts it. ``RedisUnavailable`` and ``ServerLoading`` are retried as before:
    the outcome is unknown, and repeating a fenced commit is harmless. With ``defer``, the
    completions of a partitioned queue's partitions that could not be reached are handed to it
    and report :data:`DEFERRED` (the rest of the batch is counted now).
    """
    bad = {i: why for i, c in enumerate(batch) if (why := _malformed(c))}
    if bad:
        good = [c for i, c in enumerate(batch) if i not in bad]
        committed = iter(await commit(rt, good, defer) if good else [])
        out: list[int] = []
        for i, c in enumerate(batch):
            if i in bad:
                _reject(rt, c, ValidationError(bad[i]))
                out.append(0)
            else:
                out.append(next(committed))
        return out
    try:
        statuses = await _commit_retrying(rt, batch, defer)
    except PermissionDenied:
        raise
    except ServerError as exc:
        if len(batch) == 1:
            statuses = [_reject(rt, batch[0], exc)]
        else:
            log.warning(
                "a batch of %d completions of %s was refused (%s); committing them one by one",
                len(batch),
                rt.name,
                exc,
            )
            statuses = []
            for c in batch:
                try:
                    statuses += await _commit_retrying(rt, [c])
                except PermissionDenied:
                    raise
                except ServerError as single:
                    statuses.append(_reject(rt, c, single))
    rt.stats.completion_batches += 1
    for c, status in zip(batch, statuses, strict=True):
        if status == DEFERRED:
            continue  # counted when its retry commits
        if status < 0:
            if status != -2:  # -2: already counted by _reject
                rt.stats.rejected_completions += 1
            continue
        if not status:
            if c.kind != "release":  # a lease no longer held is not a stale outcome
                rt.stats.stale_completions += 1
        elif status == CANCELLED_INSTEAD:
            rt.stats.cancelled += 1
        elif c.kind == "ack":
            rt.stats.acked += 1
        elif c.kind == "dead":
            rt.stats.dead_lettered += 1
        elif c.kind == "expired" or (c.kind == "retry" and status == 2):
            rt.stats.expired += 1
        elif c.kind == "retry":
            rt.stats.retried += 1
            rt.note_staged(c.delay_ms)
        elif c.kind == "release":
            rt.stats.group_releases += 1
        elif c.kind == "cancelled":
            rt.stats.cancelled += 1
    observe_commits(rt, batch, statuses)
    return [s if s == DEFERRED else max(0, s) for s in statuses]


_KINDS = frozenset({"ack", "dead", "expired", "retry", "release", "cancelled"})


def _malformed(c: Completion) -> str:
    """Why a completion cannot be sent (the runner validates outcomes, so this guards the
    shared connection against a completion built some other way); '' when it is fine."""
    d = c.delivery
    if not isinstance(c, Completion) or not isinstance(d, Delivery):
        return "not a Completion of a Delivery"
    if c.kind not in _KINDS:
        return f"unknown completion kind {c.kind!r}"
    if not isinstance(d.entry_id, str) or not _ENTRY_ID.fullmatch(d.entry_id):
        return f"bad entry id {d.entry_id!r}"
    if isinstance(d.attempt, bool) or not isinstance(d.attempt, int) or d.attempt < 0:
        return f"bad attempt {d.attempt!r}"
    if not isinstance(c.reason, str) or len(c.reason) > 64:
        return "bad dead-letter reason"
    if not isinstance(c.detail, str) or len(c.detail.encode("utf-8", "replace")) > MAX_DETAIL_BYTES:
        return "bad dead-letter detail"
    for value in (c.delay_ms, c.keep_ms):
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 2**31 - 1:
            return "bad delay or retention"
    if not isinstance(c.result, bytes) or not isinstance(c.result_state, str):
        return "bad result"
    if c.flow_result is not None and (
        c.kind != "ack" or not isinstance(c.flow_result, bytes) or len(c.flow_result) > 4096
    ):
        return "bad flow result"
    return ""


_ENTRY_ID = re.compile(r"[0-9]{1,20}-[0-9]{1,20}")


def _reject(rt: QueueRuntime, c: Completion, exc: Exception) -> int:
    rt.stats.rejected_completions += 1
    log.error(
        "the %s completion of %r of %s was refused by the server (%s); its entry stays pending "
        "for recovery",
        c.kind,
        c.delivery.job_id or c.delivery.entry_id,
        rt.name,
        exc,
    )
    return -2


Defer = Callable[[list[Completion]], None]
"""Takes completions whose commit must wait for an unreachable node, to retry them apart."""


async def _commit_retrying(
    rt: QueueRuntime, batch: list[Completion], defer: Defer | None = None
) -> list[int]:
    """One source call, repeated while the server is unreachable or still loading: a lost
    reply is harmless to repeat (fencing). Raises any other error.

    A partitioned source may commit the partitions it reaches and report the others
    (:class:`PartlyUnavailable`): only those are retried, and with ``defer`` they are handed
    over (status :data:`DEFERRED`) so one unreachable node does not hold up the rest."""
    statuses: list[int] = [0] * len(batch)
    pending = list(range(len(batch)))
    backoff = 0.05
    while True:
        part = [batch[i] for i in pending]
        try:
            with anyio.CancelScope(shield=True):
                got = await rt.source.complete(rt.consumer, part)
            faults.point("completer.after-commit", part)
            for i, status in zip(pending, got, strict=True):
                statuses[i] = status
            return statuses
        except PartlyUnavailable as exc:
            for i, maybe in zip(pending, exc.statuses, strict=True):
                if maybe is not None:
                    statuses[i] = maybe
            pending = [i for i, maybe in zip(pending, exc.statuses, strict=True) if maybe is None]
            if defer is not None:
                defer([batch[i] for i in pending])
                for i in pending:
                    statuses[i] = DEFERRED
                return statuses
            log.warning("completing %d deliveries of %s: %s; retrying", len(pending), rt.name, exc)
            await anyio.sleep(backoff)
            backoff = min(backoff * 2, 3.2)
        except (RedisUnavailable, ServerLoading) as exc:
            log.warning("completing %d deliveries of %s: %s; retrying", len(part), rt.name, exc)
            await anyio.sleep(backoff)
            backoff = min(backoff * 2, 3.2)
        except ServerError as exc:
            if exc.code != "NOGROUP":
                raise
            # The group vanished with its pending entries: nothing can be committed (stale).
            await group_lost(rt)
            for i in pending:
                statuses[i] = 0
            return statuses


def _drain(rt: QueueRuntime, batch: list[Completion]) -> None:
    while len(batch) < MAX_BATCH:
        try:
            batch.append(rt.completions.receive_nowait())
        except Exception:
            return


async def run_completer(
    rt: QueueRuntime, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
) -> None:
    ctx = current_child()
    task_status.started()
    # completions waiting for an unreachable partition's node are retried apart, so the
    # others keep committing; on stop the completer waits for them (its shutdown deadline
    # bounds that)
    async with anyio.create_task_group() as deferred:

        def defer(rest: list[Completion]) -> None:
            deferred.start_soon(_commit_deferred, rt, rest)

        await _commit_loop(rt, ctx, defer)


async def _commit_deferred(rt: QueueRuntime, rest: list[Completion]) -> None:
    try:
        await commit(rt, rest)
    finally:
        _end_leases(rt, rest)


def _end_leases(
    rt: QueueRuntime, batch: Sequence[Completion], statuses: Sequence[int] | None = None
) -> None:
    """Committed, stale or refused: the handlers' leases handed over with the outcomes end here
    (also when the commit failed and this actor is restarted: the entries are then recovered,
    so they must not stay renewed). A deferred one's lease is renewed until its retry ends."""
    for i, c in enumerate(batch):
        if c.lease is not None and (statuses is None or statuses[i] != DEFERRED):
            rt.leases.discard(c.lease)


async def _commit_loop(rt: QueueRuntime, ctx: Any, defer: Defer) -> None:
    while True:
        batch: list[Completion] = []
        if ctx.stop_requested:
            _drain(rt, batch)
            if not batch:
                return
        else:
            with ctx.stop_scope():
                try:
                    batch.append(await rt.completions.receive())
                except MailboxClosed:
                    return
            _drain(rt, batch)
            if not batch:
                continue
        statuses: list[int] | None = None
        try:
            faults.point("completer.before-commit", batch)
            statuses = await commit(rt, batch, defer)
        finally:
            _end_leases(rt, batch, statuses)
