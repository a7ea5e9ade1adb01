"""Server-rendered charts: bar geometry for per-minute completed/failed counts (drawn as inline
SVG by the templates, so the page needs no script to show them)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..jobs.metrics import MinuteMetrics


@dataclass(frozen=True, slots=True)
class Bar:
    x: float
    y: float
    width: float
    height: float
    kind: str  # "completed" or "failed"
    title: str


@dataclass(frozen=True, slots=True)
class MinuteChart:
    width: int
    height: int
    bars: tuple[Bar, ...]
    peak: int
    completed: int
    failed: int


def minute_chart(
    minutes: Sequence[MinuteMetrics], *, width: int = 360, height: int = 60
) -> MinuteChart:
    """Stacked bars, one per minute (failed on top of completed), scaled to the busiest minute."""
    peak = max((m.completed + m.failed for m in minutes), default=0)
    slot = width / max(len(minutes), 1)
    bars: list[Bar] = []
    for i, m in enumerate(minutes):
        if peak == 0:
            break
        x = i * slot + slot * 0.1
        bar_width = max(slot * 0.8, 1.0)
        ok = height * m.completed / peak
        bad = height * m.failed / peak
        stamp = m.minute.strftime("%H:%M")
        title = f"{stamp} UTC: {m.completed} completed, {m.failed} failed"
        if ok:
            bars.append(Bar(x, height - ok, bar_width, ok, "completed", title))
        if bad:
            bars.append(Bar(x, height - ok - bad, bar_width, bad, "failed", title))
    return MinuteChart(
        width,
        height,
        tuple(bars),
        peak,
        sum(m.completed for m in minutes),
        sum(m.failed for m in minutes),
    )


__all__ = ["Bar", "MinuteChart", "minute_chart"]
