"""Scenario 4: transient, permanent, poison, ambiguous and hanging handlers through the retry
and dead-letter limits, with immediate retries (visibility-timeout recovery) and durable
retries (``QueueOptions.retry_backoff``)."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from typing import Any, ClassVar

from ...codecs import JsonValueCodec
from ...jobs import JobQueue
from ...jobs.model import JobEvent
from ...redis.client import connect
from ..ledger import Ledger, read_ledger
from ..model import ChaosContext, Verdict
from ..observe import DeadLetterEntry, read_dead_letters, read_events, wait_until_settled
from ..processes import start_worker
from ..producer import produce
from ..reconcile import Outcomes, accepted_jobs, reconcile, with_violations
from . import register

DELIVERY_LIMIT = 4
TIMEOUT_MS = 300  # the execution budget: a hanging handler is cancelled after this
VISIBILITY_MS = 1000
RECOVERY_MS = 100
BACKOFF_MS = 100

KINDS: dict[str, dict[str, Any]] = {
    "transient": {"fail": "transient", "times": 2},
    "permanent": {"fail": "permanent"},
    "poison": {"fail": "poison"},
    "ambiguous": {"fail": "ambiguous", "times": 1},
    "hang": {"fail": "hang"},
}
MODES = {"immediate": (), "durable-retries": ("--durable-retries",)}


def _attempts(dead: DeadLetterEntry, mode: str) -> int:
    return dead.total_attempts if mode == "durable-retries" else dead.attempt


def judge(
    kind: str,
    mode: str,
    jobs: Sequence[str],
    outcomes: Outcomes,
    events: Sequence[JobEvent],
    dead: Sequence[DeadLetterEntry],
    settled_after: dict[str, float],
) -> tuple[list[str], dict[str, Any]]:
    """The kind's expectations beyond :func:`reconcile`'s (violations, evidence)."""
    found: list[str] = []
    completed = {e.job_id: e for e in events if e.kind == "completed"}
    dead_by_job = {d.job_id: d for d in dead}
    attempts = Counter[int]()
    for job in jobs:
        runs = outcomes.executions[job]
        if kind in ("transient", "ambiguous"):
            if job not in completed:
                continue  # counted as lost by reconcile
            want_runs = 2 if kind == "ambiguous" else 1
            if runs != want_runs:
                found.append(f"{job}: {runs} handler effects, expected {want_runs}")
        else:
            d = dead_by_job.get(job)
            if d is None:
                continue  # lost or completed: reconcile reports it
            n = _attempts(d, mode)
            attempts[n] += 1
            want = 1 if kind == "permanent" else DELIVERY_LIMIT
            if n != want:
                found.append(f"{job}: dead-lettered after {n} attempts, expected {want}")
            want_reason = "handler" if kind == "permanent" else "processing-failed"
            if kind != "permanent" and d.reason != want_reason:
                found.append(f"{job}: dead-letter reason {d.reason!r}, expected {want_reason!r}")
            if runs:
                found.append(f"{job}: a {kind} handler recorded {runs} effects")
    details: dict[str, Any] = {}
    if attempts:
        details["attempts before dead letter"] = dict(sorted(attempts.items()))
    if kind in ("transient", "ambiguous"):
        seen = Counter(
            outcomes.executions[j] if kind == "ambiguous" else 1 for j in jobs if j in completed
        )
        details["effects per completed job"] = dict(sorted(seen.items()))
    if kind == "hang" and settled_after:
        slowest = max(settled_after.values())
        # each attempt: the budget, then recovery after the visibility timeout (immediate) or
        # the backoff (durable); generous slack for a loaded machine
        per_attempt = TIMEOUT_MS + (VISIBILITY_MS if mode == "immediate" else 800) + RECOVERY_MS
        bound = DELIVERY_LIMIT * per_attempt / 1000 + 10
        details["slowest dead letter s"] = round(slowest, 2)
        details["bound s"] = round(bound, 2)
        if slowest > bound:
            found.append(f"a hanging job took {slowest:.1f} s to dead-letter (bound {bound} s)")
    if any(d.job_id in set(jobs) for d in dead):
        details["reasons"] = dict(Counter(d.reason for d in dead if d.job_id in set(jobs)))
    return found, details


@register
class FailuresScenario:
    number: ClassVar[int] = 4
    name: ClassVar[str] = "failures"
    title: ClassVar[str] = (
        "transient, permanent, poison, ambiguous and hanging handlers through retry and "
        "dead-letter limits (immediate and durable retries)"
    )
    ci: ClassVar[bool] = True
    own_servers: ClassVar[bool] = False

    async def run(self, ctx: ChaosContext) -> list[Verdict]:
        verdicts: list[Verdict] = []
        for mode, flags in MODES.items():
            verdicts += await self._mode(ctx, mode, flags)
        return verdicts

    async def _mode(self, ctx: ChaosContext, mode: str, flags: tuple[str, ...]) -> list[Verdict]:
        assert ctx.redis_url is not None
        per_kind = 40 if ctx.full else 4
        name = ctx.name(f"failures-{mode}")
        effects = ctx.path(name, "effects.jsonl")
        producer_ledger = ctx.path(name, "producer.jsonl")
        ctx.progress(f"failures/{mode}: {per_kind} jobs of each kind")
        started = time.monotonic()
        worker = start_worker(
            ctx.redis_url,
            name,
            effects,
            ctx.path(name, "workers"),
            "--consumers",
            "16",
            "--delivery-limit",
            str(DELIVERY_LIMIT),
            "--timeout-ms",
            str(TIMEOUT_MS),
            "--visibility-ms",
            str(VISIBILITY_MS),
            "--recovery-ms",
            str(RECOVERY_MS),
            "--retry-backoff-ms",
            str(BACKOFF_MS),
            *flags,
            backend=ctx.backend,
        )
        async with connect(ctx.redis_url) as client:
            queue = JobQueue(client, name, JsonValueCodec())
            try:
                specs = [
                    (f"{kind}-{i}", spec) for i in range(per_kind) for kind, spec in KINDS.items()
                ]
                enqueued_ms = await _server_ms(client)
                with Ledger(producer_ledger) as ledger:
                    await produce(queue, specs, ledger)
                accepted = accepted_jobs(producer_ledger)
                await wait_until_settled(queue, accepted, 60 if ctx.full else 40)
            finally:
                exit_code = worker.stop()
            budget_cancellations = worker.log.read_text(errors="replace").count("budget on")
            events = await read_events(queue)
            dead = await read_dead_letters(queue)
        settled_at = {
            e.job_id: _event_time(e) for e in events if e.kind in ("completed", "dead-letter")
        }
        outcomes = Outcomes()
        for e in events:
            if e.kind == "completed":
                outcomes.completed[e.job_id] += 1
            elif e.kind == "dead-letter":
                outcomes.dead[e.job_id] += 1
        for line in read_ledger(effects):
            if line.get("kind") == "effect":
                outcomes.executions[str(line["job"])] += 1
        elapsed = time.monotonic() - started
        verdicts = []
        for kind in KINDS:
            jobs = [j for j in accepted if j.startswith(f"{kind}-")]
            settled_after = {
                j: (settled_at[j] - enqueued_ms) / 1000 for j in jobs if j in settled_at
            }
            found, details = judge(kind, mode, jobs, outcomes, events, dead, settled_after)
            if kind == "hang":
                # evidence that the execution budget, not something else, ended each attempt
                details["budget cancellations logged"] = budget_cancellations
                if budget_cancellations < DELIVERY_LIMIT * len(jobs):
                    found.append(
                        f"{budget_cancellations} budget cancellations logged, expected "
                        f"{DELIVERY_LIMIT * len(jobs)}"
                    )
            if exit_code != 0:
                found.append(f"the worker exited with {exit_code}: {worker.tail(5)}")
            # a non-empty expect_dead makes every other dead letter a violation
            expect_dead = jobs if kind in ("permanent", "poison", "hang") else ["(no job)"]
            verdict = reconcile(
                self.name,
                f"{kind}/{mode}",
                jobs,
                outcomes,
                elapsed,
                expect_dead=expect_dead,
                violations=found,
                details=details,
            )
            if kind in ("permanent", "poison", "hang") and verdict.dead_lettered != len(jobs):
                verdict = _failed(verdict, f"{len(jobs) - verdict.dead_lettered} not dead-lettered")
            verdicts.append(verdict)
        return verdicts


def _event_time(event: JobEvent) -> float:
    return float(event.id.split("-")[0])


async def _server_ms(client: Any) -> float:
    seconds, micros = await client.execute("TIME")
    return int(seconds) * 1000 + int(micros) / 1000


def _failed(verdict: Verdict, violation: str) -> Verdict:
    return with_violations(verdict, [violation])
