"""OpenTelemetry tracing: producer spans at enqueue, consumer spans around each delivery.

Only the OpenTelemetry *API* is used: the application chooses an SDK and exporter (see
docs/observability.md). Without a configured tracer provider no span is created at all, and an
enqueue only copies an ambient W3C context that some other instrumentation made current.

The W3C ``traceparent`` / ``tracestate`` values travel in reserved envelope fields
(:data:`JOB_TRACE_FIELDS` for job queues and reliable queues; stream workers read
``traceparent`` / ``tracestate`` by default). A processing span is always a new root with a
*link* to the producer context: it never adopts the worker host's ambient context, and an
invalid or missing incoming context only means "no link".

Telemetry never changes an outcome: an exception raised by a span processor or exporter while
a span starts or ends is logged (DEBUG) and swallowed.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Link, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

log = logging.getLogger("respire_actors.telemetry")


def no_job_fields(event: str, queue: str = "") -> dict[str, Any]:
    """The structured fields of a ``respire_actors.telemetry`` record about no one job: every
    documented field is there (a formatter naming them never fails), the job's ones empty."""
    return {
        "event": event,
        "queue": queue,
        "job_id": "",
        "entry_id": "",
        "attempt": 0,
        "trace_id": "",
    }


_FAILED = no_job_fields("telemetry-failed")

TRACER_NAME = "respire_actors"
"""The instrumentation scope of every span (and the meter name, see ``metrics``)."""

JOB_TRACE_FIELDS = ("_respire.trace.parent", "_respire.trace.state")
"""Envelope fields of a job (and of a reliable-queue message) holding the W3C ``traceparent``
and ``tracestate`` of its winning enqueue. Reserved: whatever else is configured, job queues
read and write these."""

STREAM_TRACE_FIELDS = ("traceparent", "tracestate")
"""Default entry fields a stream worker reads the producer's context from (see
:func:`trace_fields` to write them with your own XADD)."""

SYSTEM = "respire"
"""``messaging.system`` of every span."""

_PROPAGATOR = TraceContextTextMapPropagator()
_EMPTY = otel_context.Context()
_tracer = trace.get_tracer(TRACER_NAME)  # a proxy: binds to the provider once one is set


_on = False


def enabled() -> bool:
    """True once an application installed a tracer provider (an SDK): only then are spans
    created. Cheap enough for the per-job path: a global provider can be set only once, so once
    true it stays true, and until then only the API's own global is looked at (its public
    getter reads the environment on every call)."""
    global _on
    if _on:
        return True
    provider = getattr(trace, "_TRACER_PROVIDER", _UNKNOWN)
    if provider is _UNKNOWN:  # an API without that global: ask it properly
        provider = trace.get_tracer_provider()
    if provider is None or isinstance(
        provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider
    ):
        return False
    _on = True
    return True


_UNKNOWN = object()
if os.environ.get("OTEL_PYTHON_TRACER_PROVIDER"):
    trace.get_tracer_provider()  # loads the configured provider into the API's global


def _start(name: str, **kwargs: Any) -> trace.Span | None:
    try:
        return _tracer.start_span(name, **kwargs)
    except Exception:
        log.debug(
            "starting span %r failed; continuing without it", name, exc_info=True, extra=_FAILED
        )
        return None


def end(span: trace.Span | None) -> None:
    """End ``span`` (None: nothing), never raising (processor and exporter errors are
    logged at DEBUG)."""
    if span is None:
        return
    try:
        span.end()
    except Exception:
        log.debug("ending a span failed; ignored", exc_info=True, extra=_FAILED)


def _carrier_fields(ctx: otel_context.Context, names: Sequence[str]) -> list[bytes | str | int]:
    carrier: dict[str, str] = {}
    try:
        _PROPAGATOR.inject(carrier, context=ctx)
    except Exception:
        log.debug(
            "injecting the trace context failed; no trace fields", exc_info=True, extra=_FAILED
        )
        return []
    parent = carrier.get("traceparent")
    if not parent:
        return []
    out: list[bytes | str | int] = [names[0], parent]
    state = carrier.get("tracestate")
    if state:
        out += [names[1], state]
    return out


def context_fields(
    span: trace.Span | None, names: Sequence[str] = JOB_TRACE_FIELDS
) -> list[bytes | str | int]:
    """Field/value pairs carrying the context to persist with a message: the producer
    ``span``'s when it is sampled, else the ambient context's (if valid), else none."""
    if span is not None and span.get_span_context().trace_flags.sampled:
        return _carrier_fields(trace.set_span_in_context(span, _EMPTY), names)
    ambient = trace.get_current_span().get_span_context()
    if ambient.is_valid:
        return _carrier_fields(otel_context.get_current(), names)
    return []


def trace_fields(names: Sequence[str] = STREAM_TRACE_FIELDS) -> list[bytes | str | int]:
    """The current context as field/value pairs for an entry you append yourself (``XADD
    stream * *fields, *trace_fields()``): a stream worker links its processing span to it.
    Empty when no valid context is current."""
    return context_fields(None, names)


_NO_SPAN: AbstractContextManager[None] = nullcontext(None)


def producer_span(
    operation: str, destination: str, attributes: Mapping[str, Any] | None = None
) -> AbstractContextManager[trace.Span | None]:
    """A PRODUCER span named ``"<operation>"`` around one send; None when tracing is off.

    Not made current: the persisted context comes from :func:`context_fields`. An exception
    from the body marks the span as failed (type only, no message) and propagates."""
    if not enabled():
        return _NO_SPAN
    return _producer_span(operation, destination, attributes)


@contextmanager
def _producer_span(
    operation: str, destination: str, attributes: Mapping[str, Any] | None
) -> Iterator[trace.Span | None]:
    attrs: dict[str, Any] = {
        "messaging.system": SYSTEM,
        "messaging.destination.name": destination,
        "messaging.operation.type": "send",
        "messaging.operation.name": operation.rpartition(" ")[2],
    }
    if attributes:
        attrs.update(attributes)
    span = _start(operation, kind=SpanKind.PRODUCER, attributes=attrs)
    try:
        yield span
    except BaseException as exc:
        fail(span, exc)
        raise
    finally:
        end(span)


def fail(span: trace.Span | None, exc: BaseException) -> None:
    """Mark ``span`` failed by ``exc``: its type goes in ``error.type`` and the status; the
    message is not recorded (it may carry payload data)."""
    if span is None:
        return
    try:
        span.set_attribute("error.type", type(exc).__qualname__)
        span.set_status(Status(StatusCode.ERROR, type(exc).__qualname__))
    except Exception:
        log.debug("recording a span error failed; ignored", exc_info=True, extra=_FAILED)


def set_attributes(span: trace.Span | None, attributes: Mapping[str, Any]) -> None:
    """Set attributes, never raising."""
    if span is None:
        return
    try:
        span.set_attributes(dict(attributes))
    except Exception:
        log.debug("setting span attributes failed; ignored", exc_info=True, extra=_FAILED)


def incoming_link(fields: Mapping[bytes, bytes], names: Sequence[str]) -> Link | None:
    """A link to the producer context stored in ``fields`` under ``names`` (parent, state);
    None when absent or invalid (a malformed value is ignored, never an error)."""
    parent = fields.get(names[0].encode())
    if not parent:
        return None
    state = fields.get(names[1].encode()) or b""
    return link_to(parent.decode("ascii", "replace"), state.decode("ascii", "replace"))


def link_to(traceparent: str, tracestate: str = "") -> Link | None:
    """A link to the W3C context ``traceparent`` (+ ``tracestate``), None when it is empty or
    invalid. Use it to link your own processing span to a received message::

        link = tracing.link_to(message.traceparent, message.tracestate)
        with tracer.start_as_current_span("handle", links=[link] if link else None): ...
    """
    if not traceparent:
        return None
    carrier = {"traceparent": traceparent}
    if tracestate:
        carrier["tracestate"] = tracestate
    try:
        ctx = _PROPAGATOR.extract(carrier, context=_EMPTY)
    except Exception:
        return None
    span_context = trace.get_current_span(ctx).get_span_context()
    if not span_context.is_valid:
        return None
    return Link(span_context)


def consumer_span(name: str, link: Link | None, attributes: Mapping[str, Any]) -> trace.Span | None:
    """Start a CONSUMER span as a new root (the ambient context is ignored) linked to
    ``link``; None when tracing is off or the SDK failed to start it."""
    if not enabled():
        return None
    return _start(
        name,
        context=_EMPTY,
        kind=SpanKind.CONSUMER,
        links=[link] if link is not None else None,
        attributes=dict(attributes),
    )


def receive_span(
    name: str, links: Sequence[Link], attributes: Mapping[str, Any], start_time: int
) -> trace.Span | None:
    """A CONSUMER span for a pull-based receive that already happened (from ``start_time``,
    ns since the epoch): a child of the caller's context, linked to every received message's
    producer context. None when tracing is off."""
    if not enabled():
        return None
    return _start(
        name,
        kind=SpanKind.CONSUMER,
        links=list(links) or None,
        attributes=dict(attributes),
        start_time=start_time,
    )


def activate(span: trace.Span | None) -> object | None:
    """Make ``span`` current in this task (its children are the handler's spans); returns the
    token for :func:`deactivate`."""
    if span is None:
        return None
    return otel_context.attach(trace.set_span_in_context(span, _EMPTY))


def deactivate(token: object | None) -> None:
    if token is not None:
        otel_context.detach(token)  # type: ignore[arg-type]


def enqueue_trace_id(args: Sequence[bytes | str | int]) -> str:
    """The trace id an enqueue persisted, from its field/value arguments (for the ``accepted``
    log record), '' when it persisted none."""
    for i, value in enumerate(args[:-1]):
        if value == JOB_TRACE_FIELDS[0]:
            parent = args[i + 1]
            raw = parent.encode() if isinstance(parent, str) else bytes(str(parent), "ascii")
            return trace_id({JOB_TRACE_FIELDS[0].encode(): raw})
    return ""


def trace_id(fields: Mapping[bytes, bytes], names: Sequence[str] = JOB_TRACE_FIELDS) -> str:
    """The producer's trace id (32 hex digits) from an entry's ``traceparent`` field, '' when
    there is none or it is malformed: the structured logs' ``trace_id`` (the same for every
    attempt of a job, so its enqueue, deliveries and outcome share it)."""
    parent = fields.get(names[0].encode())
    if not parent or len(parent) < 35 or parent[2:3] != b"-":
        return ""
    value = parent[3:35].decode("ascii", "replace").lower()
    if value.strip("0123456789abcdef") or value == "0" * 32:
        return ""
    return value


@dataclass(frozen=True, slots=True)
class ConsumerTelemetry:
    """How one consumer registration names itself to tracing, metrics and logs.

    ``name`` is the bounded telemetry name (the only per-registration metric dimension);
    ``destination`` the queue or stream name for spans; ``span_name`` the processing span's
    name; ``fields`` the (traceparent, tracestate) field names its entries carry."""

    name: str
    destination: str
    span_name: str = "job process"
    fields: tuple[str, str] = JOB_TRACE_FIELDS
