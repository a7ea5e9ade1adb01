"""The metrics sampler: reads the Redis-side gauges of one registration when a metric
collection asked for them.

A collection (the metric reader's thread, or a test calling ``collect``) sets the
registration's ``wanted`` flag and reports the previous sample; this actor notices the flag
within :data:`SAMPLE_POLL` seconds and reads Redis once: ``XPENDING`` (summary, and the entries
idle past the visibility timeout plus a recovery interval, up to 100) and ``XINFO GROUPS`` on
the stream, the queue's ``paused`` flag (job queues), ``TIME``, and the oldest entry
not yet delivered to the group (``XRANGE`` after its last-delivered id). Nothing is read while
nobody collects, and nothing on the job path. A failed sample is logged at DEBUG and the
previous values stay.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import anyio
import anyio.abc

from supervisors import current_child

from ..errors import RespireError
from . import metrics
from ._util import field_map, text
from .options import duration_ms
from .runtime import QueueRuntime
from .runtime import log as worker_log
from .source import stream_keys

SAMPLE_POLL = 0.25
"""How often (seconds) the sampler looks for a collection's request."""


def _entry_ms(entry_id: str) -> int | None:
    head = entry_id.partition("-")[0]
    return int(head) if head.isdigit() else None


def _group_info(reply: Any, group: str) -> dict[bytes, bytes] | None:
    for item in reply or []:
        fields = field_map(item)
        if fields.get(b"name") == group.encode():
            return fields
    return None


def _optional_int(value: bytes | None) -> int | None:
    if value is None or value in (b"", b"None", b"nil"):
        return None
    try:
        return int(value)
    except ValueError:
        return None


def parse_sample(
    now_ms: int,
    pending: Sequence[Any] | None,
    groups: Any,
    group: str,
    paused: Any,
    first_undelivered: Sequence[Any] | None,
    overdue: Sequence[Any] | None = None,
) -> metrics.Sample:
    """The pure part of a sample: Redis replies in, gauge values out."""
    sample = metrics.Sample()
    if overdue is not None:
        sample.overdue = len(overdue)
    if pending:
        sample.pending = int(pending[0])
        oldest = _entry_ms(text(pending[1])) if pending[1] is not None else None
        sample.oldest_pending_age_s = max(0, now_ms - oldest) / 1000 if oldest is not None else 0.0
    info = _group_info(groups, group)
    if info is not None:
        sample.lag = _optional_int(info.get(b"lag"))
    if first_undelivered:
        first = _entry_ms(text(first_undelivered[0][0]))
        sample.oldest_backlog_age_s = max(0, now_ms - first) / 1000 if first is not None else None
    elif info is not None:
        sample.oldest_backlog_age_s = 0.0
    if paused is not _NOT_A_QUEUE:
        sample.paused = text(paused) == "1" if paused is not None else False
    return sample


_NOT_A_QUEUE = object()


async def take_sample(rt: QueueRuntime) -> metrics.Sample:
    """Read one sample of ``rt``'s stream and group (three round trips); for a source over
    several streams (a partitioned queue), one sample per stream, combined."""
    if rt.partition_keys:
        samples = [
            await _sample_stream(rt, stream, keys.control)
            for stream, keys in zip(stream_keys(rt.source), rt.partition_keys, strict=True)
        ]
        return combine_samples(samples)
    control = rt.keys.control if rt.keys is not None else None
    return await _sample_stream(rt, rt.source.stream_key, control)


async def _sample_stream(rt: QueueRuntime, stream: str, control: str | None) -> metrics.Sample:
    # a running handler's entry is renewed (its idle time reset) every third of the visibility
    # timeout, and recovery reclaims the rest within one interval of it: older is overdue
    overdue_ms = rt.visibility_ms + duration_ms(
        rt.options.recovery_interval, what="recovery_interval"
    )
    commands: list[Sequence[Any]] = [
        ("XPENDING", stream, rt.group),
        ("XINFO", "GROUPS", stream),
        ("XPENDING", stream, rt.group, "IDLE", overdue_ms, "-", "+", metrics.OVERDUE_CAP),
    ]
    if control is not None:
        commands.append(("HGET", control, "paused"))
    replies = await rt.client.pipeline(commands)
    for reply in replies:
        if isinstance(reply, BaseException):
            raise reply
    seconds, micros = await rt.client.execute("TIME")
    now_ms = int(seconds) * 1000 + int(micros) // 1000
    info = _group_info(replies[1], rt.group)
    first: Sequence[Any] | None = None
    if info is not None and info.get(b"last-delivered-id"):
        last = info[b"last-delivered-id"].decode()
        first = await rt.client.execute("XRANGE", stream, f"({last}", "+", "COUNT", 1)
    paused = replies[3] if control is not None else _NOT_A_QUEUE
    return parse_sample(now_ms, replies[0], replies[1], rt.group, paused, first, replies[2])


def combine_samples(samples: Sequence[metrics.Sample]) -> metrics.Sample:
    """One sample of several streams (pure): pending and lag summed, the oldest ages kept,
    paused only when every stream is paused; a value unknown in any stream is unknown."""

    def total(values: list[int | None]) -> int | None:
        return None if any(v is None for v in values) else sum(v for v in values if v is not None)

    def oldest(values: list[float | None]) -> float | None:
        known = [v for v in values if v is not None]
        return max(known) if known else None

    paused = [s.paused for s in samples]
    return metrics.Sample(
        pending=total([s.pending for s in samples]),
        oldest_pending_age_s=oldest([s.oldest_pending_age_s for s in samples]),
        oldest_backlog_age_s=oldest([s.oldest_backlog_age_s for s in samples]),
        lag=total([s.lag for s in samples]),
        paused=None if any(p is None for p in paused) else all(paused),
        overdue=total([s.overdue for s in samples]),
    )


async def run_sampler(
    rt: QueueRuntime, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
) -> None:
    """Observe ``rt`` while running (its counters and gauges appear in collections) and sample
    Redis when a collection asked."""
    ctx = current_child()
    observed = metrics.register(rt)
    task_status.started()
    try:
        while not ctx.stop_requested:
            with ctx.stop_scope():
                await anyio.sleep(SAMPLE_POLL)
            if ctx.stop_requested or not observed.wanted.is_set():
                continue
            observed.wanted.clear()
            try:
                with anyio.CancelScope(shield=True):
                    observed.sample = await take_sample(rt)
                observed.samples_taken += 1
            except RespireError as exc:
                worker_log.debug("sampling metrics of %s failed: %s", rt.name, exc)
    finally:
        metrics.unregister(rt)


__all__ = ["SAMPLE_POLL", "combine_samples", "parse_sample", "run_sampler", "take_sample"]
