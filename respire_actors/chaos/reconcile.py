"""Reconcile accepted intents against what Redis and the handlers' effect ledgers say happened."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..jobs.queue import JobQueue, _s, _to_event
from .ledger import read_ledger
from .model import Verdict


@dataclass
class Outcomes:
    """Per job id: ``completed`` events, ``dead`` (dead-letter events) and handler
    ``executions`` (effect-ledger lines of kind ``effect``)."""

    completed: Counter[str] = field(default_factory=Counter)
    dead: Counter[str] = field(default_factory=Counter)
    executions: Counter[str] = field(default_factory=Counter)


async def read_outcomes(queue: JobQueue[Any], effects: Path | Iterable[Path] = ()) -> Outcomes:
    """Read every retained event of ``queue`` (paged XRANGE, so a large run is fine while the
    queue's event retention keeps them) and count the effect-ledger lines of ``effects``."""
    out = Outcomes()
    start = "-"
    while True:
        rows = await queue.client.execute("XRANGE", queue.keys.events, start, "+", "COUNT", 1000)
        if not rows:
            break
        for entry_id, flat in rows:
            event = _to_event(_s(entry_id), flat)
            if event.kind == "completed":
                out.completed[event.job_id] += 1
            elif event.kind == "dead-letter":
                out.dead[event.job_id] += 1
        if len(rows) < 1000:
            break
        start = "(" + _s(rows[-1][0])
    paths = [effects] if isinstance(effects, Path) else list(effects)
    for path in paths:
        for line in read_ledger(path):
            if line.get("kind") == "effect":
                out.executions[str(line["job"])] += 1
    return out


def accepted_jobs(producer_ledger: Path) -> list[str]:
    """Job ids whose enqueue the producer saw succeed (ledger lines of kind ``accepted``)."""
    return [str(line["job"]) for line in read_ledger(producer_ledger) if line["kind"] == "accepted"]


def reconcile(
    scenario: str,
    case: str,
    accepted: Iterable[str],
    outcomes: Outcomes,
    seconds: float,
    *,
    allowed_loss: int = 0,
    expect_dead: Iterable[str] = (),
    violations: Iterable[str] = (),
    details: dict[str, Any] | None = None,
) -> Verdict:
    """The verdict for ``accepted`` jobs given their ``outcomes``.

    Violations found here: a job completed more than once, completed and dead-lettered, or
    dead-lettered unexpectedly (when ``expect_dead`` is given, only those may be dead); a
    completed job that never ran its handler (when effects are recorded). ``lost`` counts
    accepted jobs with no outcome; the case passes when there is no violation and ``lost <=
    allowed_loss``."""
    accepted = list(dict.fromkeys(accepted))
    expected_dead = set(expect_dead)
    found = list(violations)
    completed = dead = lost = duplicates = 0
    for job in accepted:
        done, died, runs = outcomes.completed[job], outcomes.dead[job], outcomes.executions[job]
        if done > 1:
            found.append(f"{job}: {done} completed events")
        if done and died:
            found.append(f"{job}: completed and dead-lettered")
        if died and expected_dead and job not in expected_dead:
            found.append(f"{job}: dead-lettered unexpectedly")
        if done and outcomes.executions and not runs:
            found.append(f"{job}: completed without running its handler")
        completed += bool(done)
        dead += bool(died)
        lost += not (done or died)
        duplicates += max(0, runs - 1)
    return Verdict(
        scenario=scenario,
        case=case,
        accepted=len(accepted),
        completed=completed,
        duplicates=duplicates,
        lost=lost,
        dead_lettered=dead,
        seconds=round(seconds, 2),
        passed=not found and lost <= allowed_loss,
        violations=tuple(found[:50])
        + ((f"... {len(found) - 50} more",) if len(found) > 50 else ()),
        details=details or {},
    )
