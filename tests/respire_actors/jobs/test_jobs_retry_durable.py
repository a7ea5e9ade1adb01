"""Durable retries with backoff and retry_after (spec: "Processing, retry and dead letters")."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import anyio
import pytest
from jobs_helpers import (
    create_group,
    deliver,
    events_of_kind,
    fast_options,
    new_runtime,
    pending_count,
    pending_rows,
    running_worker,
    text,
    wait_until,
    wait_until_async,
)
from sched_helpers import id_ms, sched_options, scheduling_worker, staged, xlen

from respire_actors.actors.messages import Completion
from respire_actors.actors.runner import retry_decision
from respire_actors.errors import ValidationError
from respire_actors.jobs import NACK, Delivery, Job, JobQueue, QueueOptions, RetryAfter
from respire_actors.redis.client import RedisClient

pytestmark = pytest.mark.anyio


# -- the pure decision -----------------------------------------------------------------------


def test_backoff_doubles_per_total_attempt_up_to_the_cap() -> None:
    qo = QueueOptions(
        retry_backoff=timedelta(seconds=2), max_retry_backoff=timedelta(minutes=1), retry_jitter=0
    )
    assert [qo.retry_delay_ms(n) for n in (1, 2, 3, 4, 5, 6, 100)] == [
        2000,
        4000,
        8000,
        16000,
        32000,
        60000,
        60000,
    ]
    assert QueueOptions().retry_delay_ms(1) is None
    assert QueueOptions(retry_backoff=1, retry_jitter=0).retry_delay_ms(40) == 2**31 - 1


def test_jitter_shortens_each_backoff_within_its_bound() -> None:
    """Found by review: the seed asks for bounded exponential backoff *and jitter*; jobs that
    failed together in an outage retried at exactly the same moments."""
    qo = QueueOptions(retry_backoff=timedelta(milliseconds=300), retry_jitter=0.5)
    assert qo.retry_delay_ms(3, lambda: 0.0) == 1200
    assert qo.retry_delay_ms(3, lambda: 0.999999) == 601
    assert qo.retry_delay_ms(3, lambda: 0.5) == 900
    draws = {qo.retry_delay_ms(2) for _ in range(200)}
    assert len(draws) > 50 and all(300 <= d <= 600 for d in draws if d is not None)
    default = QueueOptions(retry_backoff=timedelta(seconds=1))
    assert all(800 <= (default.retry_delay_ms(1) or 0) <= 1000 for _ in range(100))


@pytest.mark.parametrize(
    ("changes", "complaint"),
    [
        ({"scheduling_batch_size": 257}, "scheduling_batch_size"),
        ({"scheduling_batch_size": 0}, "scheduling_batch_size"),
        ({"scheduling_poll_interval": 0}, "scheduling_poll_interval"),
        ({"max_retry_backoff": 5}, "needs retry_backoff"),
        ({"retry_backoff": 5, "max_retry_backoff": 1}, "at least"),
        ({"retry_backoff": -1}, "retry_backoff"),
        ({"retry_jitter": -0.1}, "retry_jitter"),
        ({"retry_jitter": 1.5}, "retry_jitter"),
        ({"retry_jitter": True}, "retry_jitter"),
        ({"retry_jitter": "0.2"}, "retry_jitter"),
    ],
)
def test_queue_options_are_validated(changes: dict[str, Any], complaint: str) -> None:
    with pytest.raises(ValidationError, match=complaint):
        QueueOptions(**changes)


def _delivery(attempt: int, prior: int = 0) -> Delivery:
    fields = {b"_respire.job.id": b"j"}
    if prior:
        fields[b"_respire.job.attempts"] = str(prior).encode()
    return Delivery("1-0", fields, attempt)


async def test_retry_decision(client_free_runtime: Any) -> None:
    rt = client_free_runtime(queue_options=None)
    assert retry_decision(rt, _delivery(1), None) == ("pending", 0)
    assert retry_decision(rt, _delivery(1), 500) == ("pending", 0)  # no queue options
    assert retry_decision(rt, _delivery(5), None) == ("dead", 0)
    exact = QueueOptions(retry_backoff=1, max_retry_backoff=3, retry_jitter=0)
    rt = client_free_runtime(queue_options=exact)
    assert retry_decision(rt, _delivery(1, prior=1), None) == ("retry", 2000)
    assert retry_decision(rt, _delivery(1, prior=2), None) == ("retry", 3000)
    assert retry_decision(rt, _delivery(1, prior=2), 60_000) == ("retry", 60_000)
    assert retry_decision(rt, _delivery(2, prior=3), 0) == ("dead", 0)  # limit 5 wins
    rt = client_free_runtime(queue_options=QueueOptions())
    assert retry_decision(rt, _delivery(1), None) == ("pending", 0)
    assert retry_decision(rt, _delivery(1), 0) == ("retry", 0)


@pytest.fixture
def client_free_runtime(client: RedisClient, unique_name: str) -> Any:
    made: list[Any] = []

    def make(queue_options: QueueOptions | None) -> Any:
        rt = new_runtime(client, unique_name)
        rt.queue_options = queue_options
        made.append(rt)
        return rt

    yield make
    for rt in made:
        rt.deliveries.close()
        rt.completions.close()


def test_retry_after_validates_its_delay() -> None:
    from respire_actors.jobs.job import Job as RuntimeJob

    job = RuntimeJob.__new__(RuntimeJob)
    assert job.retry_after(0) == RetryAfter(0)
    assert job.retry_after(timedelta(microseconds=1)) == RetryAfter(1)
    with pytest.raises(ValidationError):
        job.retry_after(-1)
    with pytest.raises(ValidationError):
        job.retry_after(2**31)


# -- with real servers -----------------------------------------------------------------------


async def _force_due(client: RedisClient, queue: JobQueue[str]) -> None:
    """Drive time: make every staged job due now (instead of sleeping through backoff)."""
    for member, _ in await staged(client, queue.keys):
        await client.execute("ZADD", queue.keys.due, "XX", 0, member)


async def test_backoff_delays_are_measured_on_redis_time_and_capped(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    attempts: list[int] = []

    async def handler(job: Job[str]) -> Any:
        attempts.append(job.total_attempts)
        raise RuntimeError("boom")

    qo = sched_options(retry_backoff=timedelta(seconds=10), max_retry_backoff=15, retry_jitter=0)
    await queue.enqueue("a", "x")
    async with scheduling_worker(client, queue.name, handler, queue_options=qo) as worker:
        await wait_until(lambda: worker.statistics(queue.name).retried == 1)
        ((member, due),) = await staged(client, queue.keys)
        assert abs(due - id_ms(member) - 10_000) <= 1  # base * 2**0
        await _force_due(client, queue)
        await wait_until(lambda: worker.statistics(queue.name).retried == 2)
        ((member, due),) = await staged(client, queue.keys)
        assert abs(due - id_ms(member) - 15_000) <= 1  # min(15 s, 20 s)
    assert attempts == [1, 2]
    assert await pending_count(client, queue.keys) == 0
    (row,) = await client.execute("XRANGE", queue.keys.scheduled, "-", "+")
    items = (
        row[1].items() if isinstance(row[1], dict) else zip(row[1][0::2], row[1][1::2], strict=True)
    )
    fields = {text(k): text(v) for k, v in items}
    assert fields["_respire.job.id"] == "a" and fields["_respire.job.payload"] == "x"
    assert fields["_respire.job.attempts"] == "2"


async def test_retry_after_overrides_backoff_and_cap_and_zero_retries_at_once(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    seen: list[tuple[str, int]] = []

    async def handler(job: Job[str]) -> Any:
        seen.append((job.id, job.total_attempts))
        if job.id == "slow":
            return job.retry_after(timedelta(minutes=5))
        if job.total_attempts == 1:
            return job.retry_after(0)
        return None

    qo = sched_options(retry_backoff=1, max_retry_backoff=2)
    await queue.enqueue("slow", "x")
    await queue.enqueue("now", "x")
    async with scheduling_worker(client, queue.name, handler, queue_options=qo) as worker:
        await wait_until(lambda: ("now", 2) in seen)
        await wait_until(lambda: worker.statistics(queue.name).retried == 2)
    ((member, due),) = await staged(client, queue.keys)
    assert abs(due - id_ms(member) - 300_000) <= 1
    assert sorted(seen) == [("now", 1), ("now", 2), ("slow", 1)]


async def test_nack_without_backoff_keeps_visibility_recovery(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    seen: list[int] = []

    async def handler(job: Job[str]) -> Any:
        seen.append(job.attempt)
        return NACK if job.attempt == 1 else None

    await queue.enqueue("a", "x")
    options = fast_options(visibility_timeout=0.2)
    async with scheduling_worker(client, queue.name, handler, options=options):
        await wait_until(lambda: seen == [1, 2])  # same entry, delivered again by recovery
    assert await xlen(client, queue.keys.scheduled) == 0


async def test_delivery_limit_counts_attempts_across_durable_retries(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    totals: list[tuple[int, int]] = []
    provenance: list[tuple[str, str | None, str | None]] = []

    async def handler(job: Job[str]) -> Any:
        totals.append((job.attempt, job.total_attempts))
        provenance.append((job.entry_id, job.previous_entry_id, job.retry_reason))
        raise RuntimeError("always")

    qo = sched_options(retry_backoff=timedelta(milliseconds=1))
    await queue.enqueue("a", "x")
    options = fast_options(delivery_limit=3)
    async with scheduling_worker(
        client, queue.name, handler, queue_options=qo, options=options
    ) as worker:
        await wait_until(lambda: worker.statistics(queue.name).dead_lettered == 1)
    assert totals == [(1, 1), (1, 2), (1, 3)]
    # every rescheduled attempt names the attempt before it and why it failed (seed 004)
    (first, _, _), (second, prior2, why2), (_, prior3, why3) = provenance
    assert provenance[0][1:] == (None, None)
    assert (prior2, why2, prior3, why3) == (first, "processing-failed", second, "processing-failed")
    (letter,) = await queue.read_dead_letters()
    fields = letter[1]
    assert fields["_respire.attempt"] == b"1"
    assert fields["_respire.job.attempts"] == b"2"
    assert fields["_respire.total_attempts"] == b"3"
    assert fields["_respire.reason"] == b"processing-failed"
    assert await xlen(client, queue.keys.scheduled) == 0
    (event,) = await events_of_kind(client, queue.keys, "dead-letter")
    assert event.job_id == "a"


async def test_a_crash_before_the_retry_transition_leaves_the_entry_for_recovery(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    """The handler of the first delivery "returned" (failed) but its process died before the
    retry committed: the entry stays pending, is recovered with attempt 2, and the retry then
    counts both deliveries; exactly one staged entry and one completion result."""
    await queue.enqueue("a", "x")
    await create_group(client, queue.keys)
    (crashed,) = await deliver(client, queue.keys, "crashed")
    # the crashed consumer's delivery has been idle for 10 minutes (set, not slept): the live
    # worker recovers it at once, while its own leases (5 s) cannot expire however slow the
    # machine is (a 100 ms lease was lost under load, and the job ran a third time)
    await client.execute(
        "XCLAIM", queue.keys.ready, "respire", "crashed", 0, crashed.entry_id,
        "IDLE", 600_000, "JUSTID",
    )  # fmt: skip
    assert await xlen(client, queue.keys.scheduled) == 0
    seen: list[tuple[int, int]] = []

    async def handler(job: Job[str]) -> Any:
        seen.append((job.attempt, job.total_attempts))
        if job.total_attempts == 2:
            raise RuntimeError("fails once more")
        return None

    qo = sched_options(retry_backoff=timedelta(milliseconds=1))
    options = fast_options(visibility_timeout=5)
    async with scheduling_worker(
        client, queue.name, handler, queue_options=qo, options=options
    ) as worker:
        await wait_until(lambda: worker.statistics(queue.name).acked == 1)
    assert seen == [(2, 2), (1, 3)]
    assert len(await events_of_kind(client, queue.keys, "completed")) == 1
    assert await pending_rows(client, queue.keys) == []
    assert await xlen(client, queue.keys.scheduled) == 0
    # the crashed consumer's late retry is fenced out
    rt = new_runtime(client, queue.name, consumer="crashed")
    try:
        statuses = await rt.source.complete("crashed", [Completion(crashed, "retry", "nack", 0)])
    finally:
        rt.deliveries.close()
        rt.completions.close()
    assert statuses == [0]
    assert await xlen(client, queue.keys.scheduled) == 0


async def test_retry_transition_is_atomic_and_safe_to_repeat(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    await queue.enqueue("a", "x")
    await create_group(client, queue.keys)
    (delivery,) = await deliver(client, queue.keys, "c1")
    rt = new_runtime(client, queue.name, consumer="c1")
    try:
        retry = Completion(delivery, "retry", "nack", 60_000)
        assert await rt.source.complete("c1", [retry]) == [1]
        assert await rt.source.complete("c1", [retry]) == [0]  # a lost reply's retry
    finally:
        rt.deliveries.close()
        rt.completions.close()
    assert len(await staged(client, queue.keys)) == 1
    assert await pending_count(client, queue.keys) == 0


async def test_a_retry_due_after_the_ttl_is_acknowledged_as_expired(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    from respire_actors.jobs import JobEnqueueOptions

    async def handler(job: Job[str]) -> Any:
        return job.retry_after(timedelta(hours=2))

    await queue.enqueue_scheduled("a", "x", JobEnqueueOptions(ttl=timedelta(hours=1)))
    async with scheduling_worker(client, queue.name, handler) as worker:
        await wait_until(lambda: worker.statistics(queue.name).expired == 1)
        assert worker.statistics(queue.name).retried == 0
    assert await staged(client, queue.keys) == []
    assert await pending_count(client, queue.keys) == 0
    assert await xlen(client, queue.keys.dead) == 0


async def test_retry_after_without_queue_options_behaves_as_nack(
    client: RedisClient, queue: JobQueue[str], caplog: pytest.LogCaptureFixture
) -> None:
    """It cannot stage a durable retry; the job comes back after the visibility timeout, and
    the worker says so once (found by review: it waited silently, 2 minutes by default)."""
    seen: list[int] = []

    async def handler(job: Job[str]) -> Any:
        seen.append(job.attempt)
        return job.retry_after(0) if job.attempt < 3 else None

    await queue.enqueue("a", "x")
    with caplog.at_level("WARNING", logger="respire_actors.worker"):
        async with running_worker(
            client, queue.name, handler, options=fast_options(visibility_timeout=0.2)
        ):
            await wait_until(lambda: seen == [1, 2, 3])
    await wait_until_async(lambda: _empty(client, queue))
    warnings = [r for r in caplog.records if "no QueueOptions" in r.getMessage()]
    assert len(warnings) == 1


async def _empty(client: RedisClient, queue: JobQueue[str]) -> bool:
    return (
        await pending_count(client, queue.keys) == 0
        and await xlen(client, queue.keys.scheduled) == 0
    )


async def test_a_retry_due_before_the_next_poll_is_promoted_when_due(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    """Found by review: the promoter slept out its poll interval whatever this worker staged,
    so retry_after(0) and a 100 ms backoff both waited up to a whole poll (here 30 s). The
    worker's own retries now wake it for their due time."""
    seen: list[tuple[str, int]] = []

    async def handler(job: Job[str]) -> Any:
        seen.append((job.id, job.total_attempts))
        if job.total_attempts == 1:
            if job.id == "now":
                return job.retry_after(0)
            raise RuntimeError("backoff")
        return None

    qo = QueueOptions(scheduling_poll_interval=30, retry_backoff=0.1, retry_jitter=0)
    async with scheduling_worker(client, queue.name, handler, queue_options=qo) as worker:
        await queue.enqueue("now", "x")
        await queue.enqueue("backoff", "x")
        await wait_until(lambda: len(seen) == 4, timeout=10)
        assert worker.statistics(queue.name).retried == 2
    assert sorted(seen) == [("backoff", 1), ("backoff", 2), ("now", 1), ("now", 2)]


async def test_after_a_full_batch_a_retry_does_not_cut_the_promoters_wait(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    """The other half of the rule above (docs/scheduling.md): after a pass that promoted a
    full batch the whole poll interval stands, so a due backlog reaches the ready stream at
    most one batch per interval even while this worker's own retries are committed (a
    mutation review found no test failing when every staged retry woke the promoter)."""
    from respire_actors.jobs import JobEnqueueOptions

    for job_id in ("a", "b", "c", "d"):
        await queue.enqueue_scheduled(job_id, "x", JobEnqueueOptions(delay=0.05))
    await anyio.sleep(0.2)  # all four due: the first pass promotes a full batch of two
    seen: list[tuple[str, int]] = []

    async def handler(job: Job[str]) -> Any:
        seen.append((job.id, job.total_attempts))
        if job.total_attempts == 1 and job.id == "a":
            return job.retry_after(0)  # staged, due at once: it must not wake the promoter
        return None

    qo = QueueOptions(scheduling_poll_interval=3, scheduling_batch_size=2, retry_jitter=0)
    async with scheduling_worker(client, queue.name, handler, queue_options=qo):
        await wait_until(lambda: len(seen) == 2, timeout=10)
        await anyio.sleep(1.5)  # well inside the 3 s wait after the full batch
        assert sorted(seen) == [("a", 1), ("b", 1)], seen
        await wait_until(lambda: len(seen) == 5, timeout=15)
    assert sorted(seen) == [("a", 1), ("a", 2), ("b", 1), ("c", 1), ("d", 1)]
