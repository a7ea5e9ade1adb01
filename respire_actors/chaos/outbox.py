"""An application's outbox, as the failover and reshard scenarios model it.

The application records an intent before enqueueing and keeps it until the server accepted the
job; an enqueue whose outcome is unknown (connection lost, cluster reconfiguring, credentials
refused meanwhile) is repeated with the same job id until accepted, and deduplication by job id
makes the repetition safe. After a failover that may have lost the last writes, the application
re-sends the intents accepted inside the loss window (:func:`resend`): the ones that survived
are deduplicated, the lost ones are enqueued again.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import anyio

from ..errors import RedisUnavailable, ServerError
from ..jobs import JobQueue
from .ledger import Ledger, read_ledger
from .reconcile import Outcomes, read_outcomes


@dataclass
class OutboxProducer:
    """Enqueue jobs one at a time, repeating each until accepted (``retry_for`` seconds at
    most, then the intent stays unaccepted and is reported ``failed``)."""

    queue: JobQueue[Any]
    ledger: Ledger
    retry_for: float = 30.0
    accepted: dict[str, float] = field(default_factory=dict)  # job id -> wall-clock accept time
    retries: int = 0
    errors: dict[str, int] = field(default_factory=dict)  # error type -> count

    async def send(self, job_id: str, spec: Mapping[str, Any]) -> bool:
        self.ledger.record(kind="intent", job=job_id)
        deadline = time.monotonic() + self.retry_for
        while True:
            sent_at = time.time()
            try:
                await self.queue.enqueue(job_id, dict(spec))
            except (RedisUnavailable, ServerError) as exc:
                name = type(exc).__name__
                self.errors[name] = self.errors.get(name, 0) + 1
                if time.monotonic() > deadline:
                    self.ledger.record(kind="failed", job=job_id, error=repr(exc)[:500])
                    return False
                self.retries += 1
                await anyio.sleep(0.05)
                continue
            at = time.time()
            self.ledger.record(kind="accepted", job=job_id, at=at, sent_at=sent_at)
            self.accepted[job_id] = at
            return True

    async def run(
        self,
        jobs: Iterable[tuple[str, Mapping[str, Any]]],
        *,
        interval: float = 0.0,
        milestone: tuple[int, anyio.Event] | None = None,
    ) -> None:
        """Send ``jobs`` in order, ``interval`` apart; set ``milestone``'s event once that many
        jobs were accepted."""
        for job_id, spec in jobs:
            await self.send(job_id, spec)
            if milestone is not None and len(self.accepted) >= milestone[0]:
                milestone[1].set()
            if interval:
                await anyio.sleep(interval)


def accepted_between(ledger_path: Any, since: float, until: float) -> list[str]:
    """Job ids the ledger shows accepted at or after ``since`` whose accepted request was sent
    at or before ``until`` (wall clock). The acceptance is recorded when the producer's task
    resumes, which on a busy machine can be well after the server ran the command: a job the
    old primary accepted just before a failover at ``until`` may be recorded after it, but it
    was sent before it."""
    found = []
    for line in read_ledger(ledger_path):
        if line.get("kind") != "accepted":
            continue
        at = float(line.get("at", 0))
        sent_at = float(line.get("sent_at", at))
        if since <= at and sent_at <= until:
            found.append(str(line["job"]))
    return found


async def resend(queue: JobQueue[Any], jobs: Iterable[str], spec: Mapping[str, Any]) -> int:
    """Re-enqueue ``jobs`` with the same ids; return how many were really enqueued again
    (the others were deduplicated: they survived)."""
    enqueued = 0
    for job_id in jobs:
        result = await queue.enqueue(job_id, dict(spec))
        enqueued += result.enqueued
    return enqueued


async def pending_count(queue: JobQueue[Any]) -> int:
    """Deliveries not yet acknowledged in the queue's consumer group."""
    try:
        summary = await queue.client.execute("XPENDING", queue.keys.ready, "respire")
    except ServerError:
        return 0  # no group yet
    return int(summary[0])


async def settle(
    queue: JobQueue[Any],
    jobs: Iterable[str],
    effects: Any,
    *,
    timeout: float,
    quiet: float = 2.0,
) -> Outcomes:
    """Wait until every job in ``jobs`` has an outcome, or nothing changed for ``quiet``
    seconds with no delivery pending (the rest are lost), or ``timeout``."""
    wanted = set(jobs)
    deadline = time.monotonic() + timeout
    last_change, last_done = time.monotonic(), -1
    while True:
        try:
            outcomes = await read_outcomes(queue, effects)
        except RedisUnavailable:
            await anyio.sleep(0.2)
            continue
        done = sum(1 for job in wanted if outcomes.completed[job] or outcomes.dead[job])
        now = time.monotonic()
        if done == len(wanted) or now > deadline:
            return outcomes
        if done != last_done:
            last_done, last_change = done, now
        elif now - last_change > quiet and await pending_count(queue) == 0:
            return outcomes
        await anyio.sleep(0.1)
