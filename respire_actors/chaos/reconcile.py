"""Reconcile accepted intents against what Redis and the handlers' effect ledgers say happened."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import anyio

from ..jobs.queue import JobQueue
from .ledger import effect_lines, read_ledger
from .model import Verdict
from .observe import read_events


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
    for event in await read_events(queue):
        if event.kind == "completed":
            out.completed[event.job_id] += 1
        elif event.kind == "dead-letter":
            out.dead[event.job_id] += 1
    for line in effect_lines(effects):
        out.executions[str(line["job"])] += 1
    return out


async def wait_for_outcomes(
    queue: JobQueue[Any], effects: Path, jobs: set[str], timeout: float
) -> Outcomes:
    """Poll the queue's events until every job in ``jobs`` has an outcome or ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        outcomes = await read_outcomes(queue, effects)
        done = {j for j in jobs if outcomes.completed[j] or outcomes.dead[j]}
        if done == jobs or time.monotonic() > deadline:
            return outcomes
        await anyio.sleep(0.1)


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


def with_violations(
    verdict: Verdict,
    extra: Iterable[str],
    details: Mapping[str, Any] | None = None,
    *,
    once: bool = False,
) -> Verdict:
    """``verdict`` with the ``extra`` violations a scenario found itself appended (each text
    only once with ``once``) and ``details`` merged in; any extra violation fails it."""
    extra = tuple(extra)
    violations = (*verdict.violations, *extra)
    return replace(
        verdict,
        violations=tuple(dict.fromkeys(violations)) if once else violations,
        passed=verdict.passed and not extra,
        details={**verdict.details, **(details or {})},
    )
