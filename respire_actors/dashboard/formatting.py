"""How values read as text on the pages and in the live updates (one place, so a live update
shows exactly what a reload would)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from ..jobs import JobEvent, RateLimit


def duration(ms: int | None) -> str:
    """``1.2 s``, ``3 min 4 s``, ``2 h 5 min``, ``3 d 4 h``; an em dash for None."""
    if ms is None:
        return "—"
    if ms < 1000:
        return f"{ms} ms"
    seconds = ms / 1000
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, sec = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {sec} s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes} min"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h"


def rate_limit(policy: RateLimit | None) -> str:
    if policy is None:
        return "none"
    return f"{policy.permit_limit} per {duration(policy.window_ms)}"


def when(value: datetime | None) -> str:
    if value is None:
        return "—"
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def counts(summary: Any) -> dict[str, str]:
    """The live fields of a queue summary, as the pages show them."""
    return {
        "length": str(summary.ready),
        "waiting": "—" if summary.lag is None else str(summary.lag),
        "pending": str(summary.pending),
        "oldest": duration(summary.oldest_pending_age_ms),
        "scheduled": str(summary.scheduled),
        "dead": str(summary.dead_letters),
        "paused": "paused" if summary.paused else "running",
        "rate": rate_limit(summary.rate_limit),
        "consumers": str(summary.consumers),
    }


def event_row(event: JobEvent) -> dict[str, str]:
    ms = int(event.id.partition("-")[0])
    return {
        "id": event.id,
        "at": when(datetime.fromtimestamp(ms / 1000, UTC)),
        "kind": event.kind,
        "job_id": event.job_id,
        "entry_id": event.entry_id,
        "attempt": str(event.attempt),
        "detail": " ".join(
            part
            for part in (
                f"{event.percent}%" if event.percent is not None else "",
                event.reason or "",
            )
            if part
        ),
    }


__all__ = ["counts", "duration", "event_row", "rate_limit", "when"]
