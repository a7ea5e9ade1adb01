"""OpenTelemetry SDK providers for tests.

The global tracer and meter providers can be set only once per process, so the session installs
one of each (an in-memory span exporter, an in-memory metric reader and a span processor that
raises on demand) and each test clears what it collected. Metrics are cumulative: tests select
their own series by their unique telemetry name.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.context import Context
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import (
    SimpleSpanProcessor,
    SpanExporter,
    SpanExportResult,
)
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter


class Raising(SpanProcessor, SpanExporter):
    """A span processor and exporter that raise at the steps named in ``failing`` (a set of
    ``"start"``, ``"end"``, ``"export"``)."""

    def __init__(self) -> None:
        self.failing: set[str] = set()

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        if "start" in self.failing:
            raise RuntimeError("span processor on_start failed")

    def on_end(self, span: ReadableSpan) -> None:
        if "end" in self.failing:
            raise RuntimeError("span processor on_end failed")

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if "export" in self.failing:
            raise RuntimeError("exporter failed")
        return SpanExportResult.SUCCESS


@dataclass
class Otel:
    exporter: InMemorySpanExporter
    reader: InMemoryMetricReader
    raising: Raising
    provider: TracerProvider = field(repr=False)

    def spans(self, name: str | None = None) -> list[ReadableSpan]:
        found = list(self.exporter.get_finished_spans())
        return [s for s in found if name is None or s.name == name]

    def points(self, metric: str, telemetry_name: str) -> list[tuple[dict[str, Any], Any]]:
        """(attributes, point) of ``metric`` for one telemetry name, from a fresh collection."""
        data = self.reader.get_metrics_data()
        out: list[tuple[dict[str, Any], Any]] = []
        for rm in data.resource_metrics if data else []:
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    if m.name != metric:
                        continue
                    for p in m.data.data_points:
                        attrs = dict(p.attributes or {})
                        if attrs.get("respire.telemetry_name") == telemetry_name:
                            out.append((attrs, p))
        return out

    def values(self, metric: str, telemetry_name: str) -> dict[tuple[tuple[str, Any], ...], Any]:
        """{attributes other than the name: value} of a counter or gauge."""
        return {
            tuple(sorted((k, v) for k, v in attrs.items() if k != "respire.telemetry_name")): (
                p.value
            )
            for attrs, p in self.points(metric, telemetry_name)
        }


_installed: Otel | None = None


def install() -> Otel:
    """Install the SDK providers once per process."""
    global _installed
    if _installed is None:
        exporter = InMemorySpanExporter()
        raising = Raising()
        provider = TracerProvider()
        provider.add_span_processor(raising)
        provider.add_span_processor(SimpleSpanProcessor(raising))
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        trace.set_tracer_provider(provider)
        reader = InMemoryMetricReader()
        metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
        _installed = Otel(exporter, reader, raising, provider)
    return _installed


def session() -> Iterator[Otel]:
    """Per test: the shared providers with no finished spans and no raising."""
    otel = install()
    otel.exporter.clear()
    otel.raising.failing = set()
    try:
        yield otel
    finally:
        otel.raising.failing = set()
        otel.exporter.clear()
