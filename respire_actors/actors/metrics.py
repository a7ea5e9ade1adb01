"""OpenTelemetry metrics of consumer registrations (meter ``respire_actors``).

Counters are *observed* from each registration's :class:`WorkerStatistics` (the runtime counts
them anyway), so the job path pays nothing for them; only the handler duration histogram is
recorded per job. Gauges that need Redis (pending count and age, backlog age, group lag,
paused) come from the registration's sampler actor (:mod:`.sampler`): a collection asks for a
sample and reads the previous one, so Redis is read at most once per collection and never
while no metric reader collects.

Dimensions are bounded: ``respire.telemetry_name`` (the name the user registered) and fixed
values (``respire.outcome``, ``respire.dead_letter.reason``, ``respire.recovery.mode``,
``respire.handler.result``). Never job ids, entry ids, payloads or keys.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Observation

from ..tracing import TRACER_NAME, ConsumerTelemetry
from .runtime import QueueRuntime, WorkerStatistics

NAME_ATTR = "respire.telemetry_name"
DEAD_LETTER_REASONS = ("explicit", "nack", "processing-failed", "delivery-limit")
"""Fixed ``respire.dead_letter.reason`` values; ``unclassified`` counts dead letters committed
by the completer whose reason was not recorded (see :func:`note_dead_letter`)."""


@dataclass(slots=True)
class Sample:
    """What the sampler last read from Redis for one registration (None: unknown)."""

    pending: int | None = None
    oldest_pending_age_s: float | None = None
    oldest_backlog_age_s: float | None = None
    lag: int | None = None
    paused: bool | None = None
    # pending entries idle past the visibility timeout plus a recovery interval: what recovery
    # should have reclaimed by now (counted up to OVERDUE_CAP)
    overdue: int | None = None


OVERDUE_CAP = 100
"""Most overdue pending entries a sample counts (one XPENDING page)."""


@dataclass(slots=True, eq=False)
class Observed:
    """One running registration as the metric callbacks see it."""

    rt: QueueRuntime
    telemetry: ConsumerTelemetry
    sample: Sample = field(default_factory=Sample)
    # set by a collection (any thread), cleared by the sampler when it reads Redis
    wanted: threading.Event = field(default_factory=threading.Event)
    samples_taken: int = 0


_lock = threading.Lock()
_observed: dict[int, Observed] = {}


def telemetry_of(rt: QueueRuntime) -> ConsumerTelemetry:
    """The registration's telemetry names (defaults for a runtime built without them)."""
    if rt.telemetry is not None:
        return rt.telemetry
    return ConsumerTelemetry(rt.options.telemetry_name or rt.name, rt.name)


def register(rt: QueueRuntime) -> Observed:
    """Start observing ``rt`` (the sampler does this when it starts)."""
    observed = Observed(rt, telemetry_of(rt))
    with _lock:
        _observed[id(rt)] = observed
    return observed


def unregister(rt: QueueRuntime) -> None:
    with _lock:
        _observed.pop(id(rt), None)


def _by_name() -> dict[str, list[Observed]]:
    with _lock:
        items = list(_observed.values())
    out: dict[str, list[Observed]] = {}
    for o in items:
        out.setdefault(o.telemetry.name, []).append(o)
    return out


def _counter(
    values: Callable[[WorkerStatistics], Iterable[tuple[dict[str, str], int]]],
) -> Callable[[CallbackOptions], Iterator[Observation]]:
    """A callback summing ``values`` of every registration with the same telemetry name (two
    workers of one name in a process report one series)."""

    def callback(_options: CallbackOptions) -> Iterator[Observation]:
        for name, group in _by_name().items():
            totals: dict[tuple[tuple[str, str], ...], int] = {}
            for o in group:
                for attrs, value in values(o.rt.stats):
                    key = tuple(sorted(attrs.items()))
                    totals[key] = totals.get(key, 0) + value
            for key, value in totals.items():
                yield Observation(value, {NAME_ATTR: name, **dict(key)})

    return callback


def _outcomes(s: WorkerStatistics) -> Iterator[tuple[dict[str, str], int]]:
    yield {"respire.outcome": "completed"}, s.acked
    yield {"respire.outcome": "nack"}, s.nacked
    yield {"respire.outcome": "retry"}, s.retried
    yield {"respire.outcome": "expired"}, s.expired
    yield {"respire.outcome": "cancelled"}, s.cancelled
    classified = 0
    for reason, count in s.dead_letter_reasons.items():
        classified += count
        yield {"respire.outcome": "dead-letter", "respire.dead_letter.reason": reason}, count
    # dead-lettered inside the recovery script at the delivery limit (no handler call)
    recovery = s.dead_lettered_by_recovery
    yield (
        {"respire.outcome": "dead-letter", "respire.dead_letter.reason": "recovery-limit"},
        (recovery),
    )
    rest = s.dead_lettered - classified
    if rest > 0:
        yield {"respire.outcome": "dead-letter", "respire.dead_letter.reason": "unclassified"}, rest


def _gauge(
    value: Callable[[Observed], float | int | None],
) -> Callable[[CallbackOptions], Iterator[Observation]]:
    """A callback reporting each registration's last sample and asking for a new one."""

    def callback(_options: CallbackOptions) -> Iterator[Observation]:
        for name, group in _by_name().items():
            for o in group[:1]:  # several workers of one name sample the same Redis state
                o.wanted.set()
                v = value(o)
                if v is not None:
                    yield Observation(v, {NAME_ATTR: name})
            for o in group[1:]:
                o.wanted.set()

    return callback


def _admission(_options: CallbackOptions) -> Iterator[Observation]:
    for name, group in _by_name().items():
        in_use = sum(o.rt.admission.statistics().in_use for o in group)
        yield Observation(in_use, {NAME_ATTR: name})


meter = metrics.get_meter(TRACER_NAME)  # a proxy: binds to the provider once one is set

handler_duration = meter.create_histogram(
    "respire.handler.duration",
    unit="s",
    description="Time a handler call took, by how it ended (returned, raised, cancelled)",
)
meter.create_observable_counter(
    "respire.outcomes",
    [_counter(_outcomes)],
    unit="{job}",
    description="Committed outcomes (completed, retry, dead-letter, expired, cancelled) and nack "
    "decisions",
)
meter.create_observable_counter(
    "respire.lease.losses",
    [_counter(lambda s: [({}, s.leases_lost)])],
    unit="{delivery}",
    description="Running deliveries whose lease was lost (left pending for recovery)",
)
meter.create_observable_counter(
    "respire.recovery.claims",
    [
        _counter(
            lambda s: [
                ({"respire.recovery.mode": "recover"}, s.recovered),
                ({"respire.recovery.mode": "replay"}, s.replayed),
            ]
        )
    ],
    unit="{delivery}",
    description="Deliveries claimed by visibility recovery or by startup replay",
)
meter.create_observable_counter(
    "respire.recovery.lost_payloads",
    [_counter(lambda s: [({}, s.cleared_deleted_refs)])],
    unit="{entry}",
    description="Pending entries recovery found without a payload (deleted by a trim or XDEL "
    "while unacknowledged) and cleared: lost work",
)
meter.create_observable_counter(
    "respire.decode.failures",
    [_counter(lambda s: [({}, s.decode_failures)])],
    unit="{delivery}",
    description="Deliveries whose payload the codec could not decode",
)
meter.create_observable_counter(
    "respire.rate_limit.hits",
    [_counter(lambda s: [({}, s.rate_limited_reads)])],
    unit="{read}",
    description="Reads refused by the queue-wide rate limit",
)
meter.create_observable_up_down_counter(
    "respire.admission.in_use",
    [_admission],
    unit="{permit}",
    description="Admission permits held: deliveries admitted and not yet handed over",
)
meter.create_observable_gauge(
    "respire.pending.count",
    [_gauge(lambda o: o.sample.pending)],
    unit="{entry}",
    description="Entries delivered to the consumer group and not acknowledged (PEL size)",
)
meter.create_observable_gauge(
    "respire.pending.oldest_age",
    [_gauge(lambda o: o.sample.oldest_pending_age_s)],
    unit="s",
    description="Age of the oldest pending entry (since it was appended), server clock",
)
meter.create_observable_gauge(
    "respire.pending.overdue",
    [_gauge(lambda o: o.sample.overdue)],
    unit="{entry}",
    description="Pending entries idle longer than the visibility timeout plus one recovery "
    "interval (what recovery should have reclaimed), counted up to 100",
)
meter.create_observable_gauge(
    "respire.backlog.oldest_age",
    [_gauge(lambda o: o.sample.oldest_backlog_age_s)],
    unit="s",
    description="Age of the oldest entry not yet delivered to the group (0: none waiting)",
)
meter.create_observable_gauge(
    "respire.consumer_group.lag",
    [_gauge(lambda o: o.sample.lag)],
    unit="{entry}",
    description="XINFO GROUPS lag (absent when Redis cannot tell; see the docs)",
)
meter.create_observable_gauge(
    "respire.queue.paused",
    [_gauge(lambda o: None if o.sample.paused is None else int(o.sample.paused))],
    unit="1",
    description="1 while the job queue is paused (job queues only)",
)


def note_dead_letter(rt: QueueRuntime, reason: str) -> None:
    """Count a committed dead letter by its fixed reason (called where the completer counts
    ``dead_lettered``; an unknown reason counts as ``unclassified``)."""
    if reason in DEAD_LETTER_REASONS:
        reasons = rt.stats.dead_letter_reasons
        reasons[reason] = reasons.get(reason, 0) + 1
