"""What flows between the actors and the handlers they run: deliveries claimed from a stream,
the outcomes handlers return, and the completions the completer commits.

Shared by every consumer (job workers, stream workers), so it lives with the actors.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from ..errors import ResultTooLarge, ValidationError

MAX_DETAIL_BYTES = 1024
"""Longest free-text dead-letter detail, in UTF-8 bytes (longer is refused, never truncated)."""
MAX_RETRY_DELAY_MS = 2**31 - 1
MAX_FLOW_RESULT_BYTES = 4096
"""Largest result a flow node may keep with :meth:`Job.complete` (larger is refused)."""


class DeadLetterReason(StrEnum):
    """Why a job ended in the dead-letter stream."""

    EXPLICIT = "explicit"
    NACK = "nack"
    PROCESSING_FAILED = "processing-failed"
    DELIVERY_LIMIT = "delivery-limit"


@dataclass(frozen=True, slots=True)
class Ack:
    """Success: publish a completed event and acknowledge, atomically."""


@dataclass(frozen=True, slots=True)
class Nack:
    """Failure: leave the delivery for visibility recovery, or dead-letter it at the limit."""


def _reason(value: object) -> str:
    if isinstance(value, DeadLetterReason):
        return value.value
    if isinstance(value, str):
        try:
            return DeadLetterReason(value).value
        except ValueError:
            pass
    allowed = ", ".join(repr(r.value) for r in DeadLetterReason)
    raise ValidationError(
        f"dead-letter reason must be a DeadLetterReason or one of {allowed}, got {value!r}; "
        "put free text in detail="
    )


def _detail(value: object) -> str:
    if not isinstance(value, str):
        raise ValidationError(f"dead-letter detail must be a str, got {type(value).__name__}")
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        raise ValidationError("dead-letter detail is not valid Unicode") from None
    if size > MAX_DETAIL_BYTES:
        raise ValidationError(
            f"dead-letter detail is {size} bytes; the limit is {MAX_DETAIL_BYTES} (not truncated)"
        )
    return value


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """Give up now: copy the job to the dead-letter stream with a reason, and acknowledge.

    ``reason`` is one of the bounded :class:`DeadLetterReason` values (the enum or its string,
    default ``explicit``); ``detail`` is optional free text for people, at most
    :data:`MAX_DETAIL_BYTES` UTF-8 bytes, stored with the dead letter. Anything else raises
    :class:`~respire_actors.errors.ValidationError` here, in the handler.
    """

    reason: str = DeadLetterReason.EXPLICIT.value
    detail: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "reason", _reason(self.reason))
        _detail(self.detail)


@dataclass(frozen=True, slots=True)
class RetryAfter:
    """Failure with an explicit retry delay (from :meth:`Job.retry_after`): a durable retry due
    ``delay_ms`` after the retry transition commits, overriding the queue's backoff (and its
    cap) but never the delivery limit or the job's TTL. Needs :class:`QueueOptions` on the
    registration; without them it behaves as :class:`Nack`."""

    delay_ms: int

    def __post_init__(self) -> None:
        _delay(self.delay_ms)


def _delay(value: object) -> int:
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or not 0 <= value <= MAX_RETRY_DELAY_MS
    ):
        raise ValidationError(
            f"retry delay must be an integer from 0 to {MAX_RETRY_DELAY_MS} ms, got {value!r}"
        )
    return value


def _flow_result(value: object) -> bytes:
    if not isinstance(value, bytes | bytearray | memoryview):
        raise ValidationError(
            f"a completion result must be bytes, got {type(value).__name__}; encode it first"
        )
    data = bytes(value)
    if len(data) > MAX_FLOW_RESULT_BYTES:
        raise ResultTooLarge(
            f"the result is {len(data)} bytes; the limit is {MAX_FLOW_RESULT_BYTES} (store "
            "larger data elsewhere and return a reference)"
        )
    return data


@dataclass(frozen=True, slots=True)
class Complete:
    """Success with a retained binary result (from :meth:`Job.complete`): a flow node keeps
    ``result`` for its parent's :meth:`Job.child_results` and for ``flow_results``. ``b""`` is a
    result; a plain return or ``ACK`` completes with none. Outside a flow it is an ordinary
    success (with ``keep_results``, the bytes are the kept value)."""

    result: bytes

    def __post_init__(self) -> None:
        object.__setattr__(self, "result", _flow_result(self.result))


def check_outcome(outcome: Ack | Nack | DeadLetter | RetryAfter | Complete) -> None:
    """Re-validate an outcome where the runner receives it: a handler can still build one that
    bypasses ``__post_init__`` (``object.__setattr__``, a subclass). Raises
    :class:`~respire_actors.errors.ValidationError`."""
    if isinstance(outcome, DeadLetter):
        _reason(outcome.reason)
        _detail(outcome.detail)
    elif isinstance(outcome, RetryAfter):
        _delay(outcome.delay_ms)
    elif isinstance(outcome, Complete):
        _flow_result(outcome.result)


Outcome = Ack | Nack | DeadLetter | RetryAfter | Complete

ACK = Ack()
NACK = Nack()


@dataclass(slots=True)
class Delivery:
    """A claimed stream entry, before decoding. ``attempt`` is its delivery count;
    ``received_at`` the local monotonic time the claiming read returned (lease start);
    ``origin`` the index of the stream it came from when one source reads several (the
    partition of a partitioned job queue; see ``source.ManySources``), else 0."""

    entry_id: str
    fields: Mapping[bytes, bytes]
    attempt: int
    received_at: float = 0.0
    origin: int = 0
    alone: bool = False
    """A suspect of crashing its workers, to run with no other handler (actors/isolation.py);
    set when recovery dispatches it, which holds every other admission back until it ends."""

    @property
    def job_id(self) -> str:
        return self.fields.get(b"_respire.job.id", b"").decode("utf-8", "replace")

    @property
    def prior_attempts(self) -> int:
        raw = self.fields.get(b"_respire.job.attempts")
        return int(raw) if raw else 0

    @property
    def expires_at(self) -> int | None:
        """Absolute expiry in unix ms (server clock), or None."""
        raw = self.fields.get(b"_respire.job.expires_at")
        return int(raw) if raw else None

    @property
    def priority(self) -> int:
        raw = self.fields.get(b"_respire.job.priority")
        return int(raw) if raw else 0

    @property
    def group(self) -> str | None:
        """The application group (``_respire.job.group``), None for an ungrouped job."""
        raw = self.fields.get(b"_respire.job.group")
        return raw.decode("utf-8", "surrogateescape") if raw is not None else None

    @property
    def payload(self) -> bytes:
        return self.fields.get(b"_respire.job.payload", b"")


@dataclass(frozen=True, slots=True)
class Completion:
    """An outcome on its way to the completer."""

    delivery: Delivery
    # 'ack' | 'dead' | 'expired' | 'retry' | 'release' (a grouped nack's lease) | 'cancelled'
    # (a batch member skipped because its batch's cancellation was requested)
    kind: str
    reason: str = ""
    delay_ms: int = 0  # 'retry': stage the new entry due this long after the transition
    detail: str = ""  # 'dead': the handler's free-text detail (validated, bounded)
    # Result retention (job workers with keep_results): how long to keep the record (0: none),
    # what happened to the value ('value', 'result-too-large', 'result-unencodable', '' none)
    # and the encoded value itself.
    keep_ms: int = 0
    result_state: str = ""
    result: bytes = b""
    # 'ack' from Job.complete: the flow node's retained result (None: no result; b"" is one)
    flow_result: bytes | None = None
    # The handler's lease (runtime.Lease) when renewal is on: renewed until this completion is
    # committed, then discarded by the completer.
    lease: object | None = field(default=None, compare=False, repr=False)
