"""Structured transition logs (logger ``respire_actors.telemetry``): every record carries the
job id, entry id, attempt, queue and the producer's trace id as fields; the per-job path logs
only at DEBUG and builds nothing when DEBUG is off."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import pytest
from helpers.otel import Otel
from jobs_helpers import create_group, deliver, fast_options, running_worker, wait_until
from opentelemetry import trace
from opentelemetry.trace import format_trace_id

from respire_actors import tracing
from respire_actors.actors import telemetry
from respire_actors.jobs import ACK, Job, JobQueue
from respire_actors.redis.client import RedisClient
from respire_actors.testing import FakeClock

pytestmark = pytest.mark.anyio

LOGGER = "respire_actors.telemetry"


def records(caplog: pytest.LogCaptureFixture, event: str) -> list[Any]:
    return [r for r in caplog.records if getattr(r, "event", None) == event]


async def test_each_transition_carries_the_structured_fields(
    otel: Otel, queue: JobQueue[str], client: RedisClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    with trace.get_tracer("tests").start_as_current_span("request"):
        result = await queue.enqueue("j1", "secret payload")
    [producer] = otel.spans("job enqueue")
    trace_id = format_trace_id(producer.context.trace_id)

    async def handler(job: Job[str]) -> object:
        return ACK

    async with running_worker(client, queue.name, handler) as worker:
        await wait_until(lambda: worker.statistics(queue.name).acked == 1)
    [accepted] = records(caplog, "accepted")
    [delivered] = records(caplog, "delivered")
    [decided] = records(caplog, "outcome-decided")
    for record in (accepted, delivered, decided):
        assert record.levelno == logging.DEBUG
        assert (record.job_id, record.entry_id, record.queue) == ("j1", result.entry_id, queue.name)
        assert record.trace_id == trace_id
        assert "secret payload" not in record.getMessage()
    assert (accepted.attempt, delivered.attempt, decided.attempt) == (0, 1, 1)
    assert decided.outcome == "ack"


async def test_the_job_path_builds_no_log_fields_above_debug(
    queue: JobQueue[str],
    client: RedisClient,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)

    def refuse(*args: Any) -> Any:
        raise AssertionError("log fields were built with DEBUG off")

    monkeypatch.setattr(telemetry, "fields", refuse)
    monkeypatch.setattr(tracing, "enqueue_trace_id", refuse)
    await queue.enqueue_many([(f"j{i}", "x") for i in range(5)])

    async def handler(job: Job[str]) -> object:
        return ACK

    async with running_worker(client, queue.name, handler) as worker:
        await wait_until(lambda: worker.statistics(queue.name).acked == 5)
        assert worker.statistics(queue.name).failed == 0
    assert [r for r in caplog.records if r.name == LOGGER] == []


async def test_a_recovery_claim_is_logged_at_info(
    queue: JobQueue[str], client: RedisClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    await create_group(client, queue.keys)
    await queue.enqueue("j1", "x")
    [crashed] = await deliver(client, queue.keys, "crashed-host")
    done = anyio.Event()

    async def handler(job: Job[str]) -> object:
        done.set()
        return ACK

    options = fast_options(visibility_timeout=timedelta(milliseconds=200))
    async with running_worker(client, queue.name, handler, options=options):
        with anyio.fail_after(10):
            await done.wait()
    [claimed] = records(caplog, "claimed")
    assert claimed.levelno == logging.INFO
    assert (claimed.job_id, claimed.entry_id, claimed.attempt) == ("j1", crashed.entry_id, 2)
    assert claimed.mode == "recover"


async def test_committed_outcomes_are_logged_by_the_completer(
    otel: Otel, queue: JobQueue[str], client: RedisClient, caplog: pytest.LogCaptureFixture
) -> None:
    """The completer reports what it committed: acknowledged (DEBUG) and dead-lettered
    (WARNING) records, and dead letters counted by their reason, not 'unclassified'."""
    from respire_actors.jobs import DeadLetter

    caplog.set_level(logging.DEBUG, logger=LOGGER)
    ok = await queue.enqueue("ok", "x")
    bad = await queue.enqueue("bad", "x")

    async def handler(job: Job[str]) -> object:
        return DeadLetter() if job.id == "bad" else ACK

    async with running_worker(client, queue.name, handler) as worker:
        stats = worker.statistics(queue.name)
        await wait_until(lambda: stats.acked == 1 and stats.dead_lettered == 1)
    [acked] = records(caplog, "acknowledged")
    [dead] = records(caplog, "dead-lettered")
    assert (acked.job_id, acked.entry_id, acked.levelno) == ("ok", ok.entry_id, logging.DEBUG)
    assert (dead.job_id, dead.entry_id, dead.levelno) == ("bad", bad.entry_id, logging.WARNING)
    assert worker.statistics(queue.name).dead_letter_reasons == {"explicit": 1}


async def test_a_recurring_tick_logs_its_acceptance_like_any_enqueue(
    otel: Otel, queue: JobQueue[str], caplog: pytest.LogCaptureFixture
) -> None:
    """Found by review: a committed tick (an enqueue, with its own 'job enqueue' span) wrote no
    ``accepted`` record."""
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    clock = FakeClock(datetime(2030, 1, 1, tzinfo=UTC))
    scheduler = queue.scheduler(clock=clock)
    await scheduler.upsert("r", "x", interval=60)
    clock.advance(61)
    assert await scheduler.run_due() == 1
    [span] = otel.spans("job enqueue")
    [accepted] = records(caplog, "accepted")
    job_id = span.attributes["respire.job.id"]
    assert str(job_id).startswith("recurring:")
    assert (accepted.job_id, accepted.queue, accepted.attempt) == (job_id, queue.name, 0)
    assert accepted.entry_id == span.attributes["messaging.message.id"]
    assert accepted.trace_id == format_trace_id(span.context.trace_id)
