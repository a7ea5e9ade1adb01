"""Worker outcomes: ack, dead letters, retries through visibility recovery, decode failures,
options and registration (spec: "Processing, retry and dead letters")."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import anyio
import pytest
from jobs_helpers import (
    FAST,
    all_events,
    fast_options,
    pending_count,
    running_worker,
    text,
    wait_until,
)

from respire_actors.codecs import JsonCodec, StrCodec
from respire_actors.errors import ValidationError
from respire_actors.jobs import (
    ACK,
    NACK,
    DeadLetter,
    Job,
    JobQueue,
    LogPolicy,
    Outcome,
    RetryAfter,
    Worker,
    WorkerOptions,
)
from respire_actors.redis.client import RedisClient

pytestmark = pytest.mark.anyio


async def test_ack_publishes_completed_and_acknowledges(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    enqueued = await queue.enqueue("email:1", "hello")
    seen: list[tuple[str, str, str, int, int, str]] = []

    async def handler(job: Job[str]) -> Outcome:
        seen.append((job.id, job.payload, job.entry_id, job.attempt, job.total_attempts, job.queue))
        return ACK

    async with running_worker(client, queue.name, handler) as worker:
        stats = worker.statistics(queue.name)
        await wait_until(lambda: stats.acked == 1)
        assert stats.admitted == 1 and stats.started == 1
        assert stats.dead_lettered == stats.failed == stats.stale_completions == 0

    assert seen == [("email:1", "hello", enqueued.entry_id, 1, 1, queue.name)]
    events = await all_events(client, queue.keys)
    assert [(e.kind, e.job_id, e.entry_id, e.attempt) for e in events] == [
        ("completed", "email:1", enqueued.entry_id, 1)
    ]
    assert events[0].percent is None and events[0].reason is None
    assert await pending_count(client, queue.keys) == 0
    assert await client.execute("XLEN", queue.keys.dead) == 0


async def test_returning_none_acknowledges(client: RedisClient, queue: JobQueue[str]) -> None:
    await queue.enqueue("j", "x")

    async def handler(job: Job[str]) -> None:
        return None

    async with running_worker(client, queue.name, handler) as worker:
        await wait_until(lambda: worker.statistics(queue.name).acked == 1)
    assert [e.kind for e in await all_events(client, queue.keys)] == ["completed"]
    assert await pending_count(client, queue.keys) == 0


@pytest.mark.parametrize(
    ("outcome", "reason", "detail"),
    [
        (DeadLetter(detail="poison pill"), "explicit", "poison pill"),
        (DeadLetter(), "explicit", None),
        (DeadLetter("nack", detail="gave up"), "nack", "gave up"),
    ],
)
async def test_dead_letter_copies_the_envelope_and_acknowledges(
    client: RedisClient,
    queue: JobQueue[str],
    outcome: DeadLetter,
    reason: str,
    detail: str | None,
) -> None:
    enqueued = await queue.enqueue("bad:1", "payload-bytes")

    async def handler(job: Job[str]) -> Outcome:
        return outcome

    async with running_worker(client, queue.name, handler) as worker:
        stats = worker.statistics(queue.name)
        await wait_until(lambda: stats.dead_lettered == 1)
        assert stats.acked == 0

    letters = await queue.read_dead_letters()
    assert len(letters) == 1
    fields = letters[0][1]
    assert fields["_respire.job.id"] == b"bad:1"
    assert fields["_respire.job.payload"] == b"payload-bytes"
    assert fields["_respire.source_id"] == enqueued.entry_id.encode()
    assert fields["_respire.attempt"] == b"1"
    assert fields["_respire.reason"] == reason.encode()
    # the bounded reason is the dead letter's reason; free text travels as a detail
    assert fields.get("_respire.detail") == (detail.encode() if detail else None)
    events = await all_events(client, queue.keys)
    assert [(e.kind, e.job_id, e.entry_id, e.attempt, e.reason) for e in events] == [
        ("dead-letter", "bad:1", enqueued.entry_id, 1, reason)
    ]
    assert await pending_count(client, queue.keys) == 0
    # Reading a dead letter does not requeue it.
    assert len(await queue.read_dead_letters()) == 1
    assert await client.execute("XLEN", queue.keys.ready) == 1


async def test_custom_dead_letter_stream(client: RedisClient, queue: JobQueue[str]) -> None:
    await queue.enqueue("bad:1", "x")

    async def handler(job: Job[str]) -> Outcome:
        return DeadLetter()

    options = fast_options(dead_letter_stream="graveyard")
    async with running_worker(client, queue.name, handler, options=options) as worker:
        await wait_until(lambda: worker.statistics(queue.name).dead_lettered == 1)

    assert await client.execute("XLEN", queue.keys.dead) == 0
    letters = await queue.read_dead_letters(stream="graveyard")
    assert [f["_respire.job.id"] for _, f in letters] == [b"bad:1"]


def _forged_retry() -> RetryAfter:
    """A RetryAfter whose delay bypassed the constructor's check."""
    outcome = RetryAfter(0)
    object.__setattr__(outcome, "delay_ms", -5)
    return outcome


# A plain return value used to be a failure here ("not-an-outcome"); it is a success now
# (test_results.py). An outcome built around its validation is the failure case instead.
@pytest.mark.parametrize("failure", ["raise", "nack", "invalid-outcome"])
async def test_failures_are_retried_then_dead_lettered_at_the_limit(
    client: RedisClient, queue: JobQueue[str], failure: str
) -> None:
    enqueued = await queue.enqueue("flaky", "x")
    attempts: list[int] = []

    async def handler(job: Job[str]) -> Any:
        attempts.append(job.attempt)
        if failure == "raise":
            raise RuntimeError("boom")
        return NACK if failure == "nack" else _forged_retry()

    options = fast_options(delivery_limit=2, visibility_timeout=FAST)
    async with running_worker(client, queue.name, handler, options=options) as worker:
        stats = worker.statistics(queue.name)
        await wait_until(lambda: stats.dead_lettered == 1)
        assert stats.recovered >= 1
        assert stats.nacked == 2
        assert stats.failed == (0 if failure == "nack" else 2)

    assert attempts == [1, 2]
    reason = "nack" if failure == "nack" else "processing-failed"
    letters = await queue.read_dead_letters()
    assert len(letters) == 1
    fields = letters[0][1]
    assert fields["_respire.reason"] == reason.encode()
    assert fields["_respire.attempt"] == b"2"
    assert fields["_respire.source_id"] == enqueued.entry_id.encode()
    events = await all_events(client, queue.keys)
    assert [(e.kind, e.attempt, e.reason) for e in events] == [("dead-letter", 2, reason)]
    assert await pending_count(client, queue.keys) == 0


async def test_a_retry_can_succeed(client: RedisClient, queue: JobQueue[str]) -> None:
    enqueued = await queue.enqueue("flaky", "x")

    async def handler(job: Job[str]) -> Outcome:
        if job.attempt == 1:
            raise RuntimeError("transient")
        return ACK

    options = fast_options(delivery_limit=3, visibility_timeout=FAST)
    async with running_worker(client, queue.name, handler, options=options) as worker:
        await wait_until(lambda: worker.statistics(queue.name).acked == 1)

    events = await all_events(client, queue.keys)
    assert [(e.kind, e.entry_id, e.attempt) for e in events] == [
        ("completed", enqueued.entry_id, 2)
    ]
    assert await client.execute("XLEN", queue.keys.dead) == 0


async def test_without_a_delivery_limit_failures_retry_until_success(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    await queue.enqueue("stubborn", "x")
    attempts: list[int] = []

    async def handler(job: Job[str]) -> Outcome:
        attempts.append(job.attempt)
        return ACK if job.attempt == 3 else NACK

    options = fast_options(delivery_limit=None, visibility_timeout=FAST)
    async with running_worker(client, queue.name, handler, options=options) as worker:
        await wait_until(lambda: worker.statistics(queue.name).acked == 1)
    assert attempts == [1, 2, 3]
    assert await client.execute("EXISTS", queue.keys.dead) == 0


async def test_nack_with_a_limit_of_one_dead_letters_at_once(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    await queue.enqueue("j", "x")
    calls = 0

    async def handler(job: Job[str]) -> Outcome:
        nonlocal calls
        calls += 1
        return NACK

    # A long visibility timeout: only the immediate dead letter can finish this test in time.
    options = fast_options(delivery_limit=1, visibility_timeout=timedelta(seconds=60))
    async with running_worker(client, queue.name, handler, options=options) as worker:
        await wait_until(lambda: worker.statistics(queue.name).dead_lettered == 1)
    assert calls == 1
    assert [e.reason for e in await all_events(client, queue.keys)] == ["nack"]


async def test_undecodable_payload_is_dead_lettered_at_once_when_asked(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    # Before item 16 this was the default; now it needs dead_letter_undecodable=True.
    # The producer uses a str codec; the worker expects JSON integers.
    bad = await queue.enqueue("bad", "not json")
    await queue.enqueue("good", "42")
    handled: list[int] = []

    async def handler(job: Job[int]) -> Outcome:
        handled.append(job.payload)
        return ACK

    options = fast_options(dead_letter_undecodable=True, visibility_timeout=60)
    async with running_worker(
        client, queue.name, handler, codec=JsonCodec(int), options=options
    ) as worker:
        stats = worker.statistics(queue.name)
        await wait_until(lambda: stats.dead_lettered == 1 and stats.acked == 1)
        assert stats.decode_failures == 1
        assert stats.nacked == 0

    assert handled == [42]
    letters = await queue.read_dead_letters()
    assert len(letters) == 1
    fields = letters[0][1]
    assert fields["_respire.job.id"] == b"bad"
    assert fields["_respire.job.payload"] == b"not json"
    assert fields["_respire.reason"] == b"processing-failed"
    assert fields["_respire.detail"].startswith(b"DecodeError: ")
    assert fields["_respire.source_id"] == bad.entry_id.encode()
    kinds = {(e.job_id, e.kind) for e in await all_events(client, queue.keys)}
    assert kinds == {("bad", "dead-letter"), ("good", "completed")}


async def test_jobs_enqueued_before_the_worker_exists_are_processed(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    # No consumer group exists yet: the worker must create it at the start of the stream.
    for i in range(3):
        await queue.enqueue(f"early-{i}", str(i))
    assert await client.execute("EXISTS", queue.keys.ready) == 1
    payloads: list[str] = []

    async def handler(job: Job[str]) -> Outcome:
        payloads.append(job.payload)
        return ACK

    async with running_worker(client, queue.name, handler) as worker:
        await wait_until(lambda: worker.statistics(queue.name).acked == 3)
        await queue.enqueue("late", "3")
        await wait_until(lambda: worker.statistics(queue.name).acked == 4)

    assert sorted(payloads) == ["0", "1", "2", "3"]


async def test_consumer_count_bounds_running_handlers_and_reads(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    await queue.enqueue_many([(f"j{i}", str(i)) for i in range(7)])
    release = anyio.Event()
    running = 0
    most = 0

    async def handler(job: Job[str]) -> Outcome:
        nonlocal running, most
        running += 1
        most = max(most, running)
        try:
            await release.wait()
        finally:
            running -= 1
        return ACK

    options = fast_options(consumer_count=3)
    async with running_worker(client, queue.name, handler, options=options) as worker:
        stats = worker.statistics(queue.name)
        await wait_until(lambda: stats.started == 3)
        # Permits are taken before reading: Redis delivered only what can run.
        assert await pending_count(client, queue.keys) == 3
        assert stats.admitted == 3
        release.set()
        await wait_until(lambda: stats.acked == 7)
    assert most == 3


async def test_stable_and_default_consumer_names(client: RedisClient, unique_name: str) -> None:
    async def handler(job: Job[str]) -> Outcome:
        return ACK

    options = fast_options(consumer_name="host-a")
    async with running_worker(client, unique_name, handler, options=options) as worker:
        assert worker.consumer_name(unique_name) == "host-a"
    async with (
        running_worker(client, unique_name, handler) as one,
        running_worker(client, unique_name, handler) as two,
    ):
        assert one.consumer_name(unique_name) != two.consumer_name(unique_name)


@pytest.mark.parametrize(
    "changes",
    [
        {"consumer_count": 0},
        {"consumer_count": -1},
        {"consumer_count": True},
        {"consumer_count": 1.5},
        {"delivery_limit": 0},
        {"delivery_limit": -3},
        {"delivery_limit": False},
        {"dead_letter_stream": "a{b"},
        {"dead_letter_stream": "x}"},
        {"dead_letter_stream": ""},
        {"dead_letter_stream": "events"},
        {"dead_letter_stream": "ready"},
        {"dead_letter_stream": "control"},
        # found by review: these are the queue's own keys too; every completion was refused
        {"dead_letter_stream": "recurring"},
        {"dead_letter_stream": "recurring-due"},
        {"dead_letter_stream": "coordinated"},
        {"dead_letter_stream": "partitions"},
        {"dead_letter_stream": "ready:metrics"},
        {"dead_letter_stream": "ready:group-jobs"},
        {"dead_letter_stream": "dedup:x"},
        {"dead_letter_stream": "result:x"},
        {"dead_letter_stream": "logs:x"},
        {"dead_letter_stream": "flow:x"},
        {"dead_letter_stream": "batch:x"},
        {"visibility_timeout": timedelta(0)},
        {"visibility_timeout": -1},
        {"recovery_interval": timedelta(milliseconds=2**31)},
        {"poll_interval": 0},
        {"shutdown_grace": -1},
        {"recovery_page_size": 0},
        {"recovery_page_size": True},
        {"read_batch": 1001},
        {"read_batch": True},
        {"consumer_name": "a{b}"},
        {"consumer_name": " "},
        {"telemetry_name": "{x}"},
        {"renew_leases": 1},
        {"renew_leases": None},
        {"timeout": 0},
        {"timeout": -0.5},
        {"timeout": float("inf")},
        {"timeout": "30"},
        {"timeout": timedelta(milliseconds=2**31)},
        # without renewal the lease (the visibility timeout) would end before the budget
        {"renew_leases": False, "timeout": 121},
        {"renew_leases": False, "visibility_timeout": 1, "timeout": timedelta(seconds=2)},
    ],
)
def test_invalid_worker_options(changes: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        WorkerOptions(**changes)


@pytest.mark.parametrize(
    "changes",
    [
        {"max_lines": 0},
        {"max_lines": 1001},
        {"max_lines": True},
        {"max_line_bytes": 0},
        {"max_line_bytes": 16385},
        {"retention": timedelta(0)},
        {"retention": timedelta(milliseconds=2**31)},
    ],
)
def test_invalid_log_policy(changes: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        LogPolicy(**changes)


def test_option_boundaries_are_accepted() -> None:
    WorkerOptions(
        consumer_count=1,
        delivery_limit=1,
        dead_letter_stream="dlq",
        shutdown_grace=timedelta(0),
        visibility_timeout=timedelta(milliseconds=10),
    )
    WorkerOptions(delivery_limit=None)
    # with renewal a budget may exceed the visibility timeout; without, it may equal it
    assert WorkerOptions(visibility_timeout=1, timeout=3600).timeout_ms == 3_600_000
    assert WorkerOptions(renew_leases=False, visibility_timeout=1, timeout=1).timeout_ms == 1000
    assert WorkerOptions().timeout_ms == 0 and WorkerOptions().renew_leases
    LogPolicy(max_lines=1000, max_line_bytes=16384, retention=timedelta(milliseconds=2**31 - 1))


def test_registration_rules() -> None:
    async def handler(job: Job[str]) -> Outcome:
        return ACK

    worker = Worker()
    worker.register("email", handler, StrCodec())
    with pytest.raises(ValidationError):
        worker.register("email", handler, StrCodec())
    with pytest.raises(ValidationError):
        worker.register("sms", handler, StrCodec(), WorkerOptions(telemetry_name="email"))
    with pytest.raises(ValidationError):
        worker.register("a{b}", handler, StrCodec())
    with pytest.raises(ValidationError):
        worker.register(" ", handler, StrCodec())
    assert [r.queue for r in worker.registrations] == ["email"]


async def test_a_worker_without_handlers_does_not_start(client: RedisClient) -> None:
    with pytest.raises(ValidationError):
        await Worker().run(client)


async def test_events_carry_no_payload(client: RedisClient, queue: JobQueue[str]) -> None:
    await queue.enqueue("secret", "credit-card-number")

    async def handler(job: Job[str]) -> Outcome:
        assert await job.report_progress(10)
        return DeadLetter(detail="nope")

    async with running_worker(client, queue.name, handler) as worker:
        await wait_until(lambda: worker.statistics(queue.name).dead_lettered == 1)
    rows = await client.execute("XRANGE", queue.keys.events, "-", "+")
    assert len(rows) == 2
    for _, flat in rows:
        assert all(b"credit-card" not in v for v in flat)
        assert {text(k) for k in flat[0::2]} <= {
            "kind",
            "job_id",
            "entry_id",
            "attempt",
            "percent",
            "reason",
        }
