"""A producer that keeps an outbox-style ledger of what it asked for and what was accepted."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ..errors import RespireError
from ..jobs import JobQueue
from .ledger import Ledger


async def produce(
    queue: JobQueue[Any],
    jobs: Iterable[tuple[str, Mapping[str, Any]]],
    ledger: Ledger,
    *,
    stop_on_error: bool = False,
    wait: float | None = None,
) -> tuple[int, int]:
    """Enqueue ``(job_id, spec)`` pairs one at a time. Each job gets an ``intent`` line before
    its enqueue and an ``accepted`` line once the server's reply says it is stored (the
    outbox's view). A failed enqueue gets a ``failed`` line with the error and whether the
    command may have run (``ran``: True / False / None for unknown), and the producer goes on
    unless ``stop_on_error``. ``wait`` (seconds) is passed to the enqueue: a full queue is
    waited out that long before the refusal counts as failed. Returns (accepted, failed)."""
    accepted = failed = 0
    for job_id, spec in jobs:
        ledger.record(kind="intent", job=job_id)
        try:
            await queue.enqueue(job_id, dict(spec), wait=wait)
        except RespireError as exc:
            failed += 1
            ledger.record(
                kind="failed", job=job_id, error=repr(exc)[:500], ran=getattr(exc, "ran", None)
            )
            if stop_on_error:
                raise
            continue
        ledger.record(kind="accepted", job=job_id)
        accepted += 1
    return accepted, failed
