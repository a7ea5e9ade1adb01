"""Enqueue: deduplication and job identity (spec: "Deduplication and job identity")."""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Any

import anyio
import pytest
from jobs_helpers import (
    events_of_kind,
    fields_of,
    forbid_commands,
    running_worker,
    text,
    wait_until,
    wait_until_async,
)

from respire_actors.codecs import StrCodec
from respire_actors.errors import ValidationError
from respire_actors.jobs import ACK, DeadLetter, Job, JobQueue
from respire_actors.jobs.options import MAX_MS, duration_ms
from respire_actors.redis.client import RedisClient

pytestmark = pytest.mark.anyio

DAY_MS = 24 * 60 * 60 * 1000


def entry_ms(entry_id: str) -> int:
    return int(entry_id.split("-")[0])


async def stream_entries(client: RedisClient, key: str) -> list[tuple[str, dict[str, bytes]]]:
    rows = await client.execute("XRANGE", key, "-", "+")
    return [(text(i), fields_of(f)) for i, f in rows or []]


def unentered(queue: JobQueue[Any]) -> JobQueue[Any]:
    """The same queue on a client that was never entered: any command raises RuntimeError, so a
    ValidationError proves the check ran before anything was sent."""
    return JobQueue(RedisClient(queue.client.settings), queue.name, queue.codec)


async def test_enqueue_appends_and_records_the_entry(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    result = await queue.enqueue("welcome:42", "hello")

    assert result.enqueued is True
    entries = await stream_entries(client, queue.keys.ready)
    assert [entry_id for entry_id, _ in entries] == [result.entry_id]
    fields = entries[0][1]
    assert fields["_respire.job.id"] == b"welcome:42"
    assert fields["_respire.job.payload"] == b"hello"
    assert await client.execute("GET", queue.keys.dedup("welcome:42")) == result.entry_id.encode()


async def test_duplicate_returns_the_original_entry_and_first_payload_wins(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    first = await queue.enqueue("job-1", "first")
    again = await queue.enqueue("job-1", "second")

    assert again.enqueued is False
    assert again.entry_id == first.entry_id
    entries = await stream_entries(client, queue.keys.ready)
    assert len(entries) == 1
    assert entries[0][1]["_respire.job.payload"] == b"first"


async def test_distinct_ids_are_distinct_jobs(client: RedisClient, queue: JobQueue[str]) -> None:
    a = await queue.enqueue("a", "x")
    b = await queue.enqueue("b", "x")
    assert a.enqueued and b.enqueued
    assert a.entry_id != b.entry_id
    assert await client.execute("XLEN", queue.keys.ready) == 2


async def test_concurrent_duplicates_yield_one_job(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    results = []

    async def submit(i: int) -> None:
        results.append(await queue.enqueue("race", f"payload-{i}"))

    async with anyio.create_task_group() as tg:
        for i in range(50):
            tg.start_soon(submit, i)

    assert len(results) == 50
    assert sum(r.enqueued for r in results) == 1
    assert len({r.entry_id for r in results}) == 1
    assert await client.execute("XLEN", queue.keys.ready) == 1


@pytest.mark.parametrize(
    ("window", "expected_ms"),
    [
        (timedelta(microseconds=1), 1),  # truncation would give 0, which is invalid
        (1e-10, 1),  # any positive value is at least 1 ms (it was refused as not positive)
        (0.0015, 2),
        (timedelta(milliseconds=1500, microseconds=1), 1501),
        (3.0000001, 3001),
        (12, 12_000),
        (timedelta(days=1), DAY_MS),
        (timedelta(milliseconds=MAX_MS), MAX_MS),
        (MAX_MS / 1000, MAX_MS),
    ],
)
def test_window_converts_to_whole_milliseconds_rounding_up(window: Any, expected_ms: int) -> None:
    assert duration_ms(window, what="window") == expected_ms


@pytest.mark.parametrize(
    ("window", "expected_ms"),
    [
        (None, DAY_MS),
        (timedelta(milliseconds=1500, microseconds=100), 1501),
        (12, 12_000),
        (timedelta(milliseconds=MAX_MS), MAX_MS),
    ],
)
async def test_window_sets_the_record_expiry(
    client: RedisClient, queue: JobQueue[str], window: Any, expected_ms: int
) -> None:
    result = await queue.enqueue("w", "x", dedup_window=window)
    # The entry id and the expiry both come from the server clock inside one script (they may
    # straddle a millisecond tick).
    expires_at = await client.execute("PEXPIRETIME", queue.keys.dedup("w"))
    assert 0 <= expires_at - entry_ms(result.entry_id) - expected_ms <= 1


async def test_a_sub_millisecond_window_is_one_millisecond(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    result = await queue.enqueue("w", "x", dedup_window=timedelta(microseconds=1))
    assert result.enqueued
    expires_at = await client.execute("PEXPIRETIME", queue.keys.dedup("w"))
    # gone already (-2), or due within 2 ms of the append; never persistent (-1)
    assert expires_at == -2 or 0 < expires_at - entry_ms(result.entry_id) <= 2


@pytest.mark.parametrize(
    "window",
    [
        0,
        0.0,
        timedelta(0),
        -1,
        timedelta(milliseconds=-5),
        -0.0000001,
        timedelta(milliseconds=MAX_MS + 1),
        MAX_MS / 1000 + 0.001,
        math.nan,
        math.inf,
        "10",
        True,
    ],
)
async def test_invalid_window_is_rejected_before_sending(queue: JobQueue[str], window: Any) -> None:
    with pytest.raises(ValidationError):
        await unentered(queue).enqueue("w", "x", dedup_window=window)


@pytest.mark.parametrize(
    "job_id", ["", "   ", "\t\n", 5, None, b"bytes-id", "x" * 1025, "é" * 513, "bad\ud800"]
)
async def test_invalid_job_id_is_rejected_before_sending(queue: JobQueue[str], job_id: Any) -> None:
    with pytest.raises(ValidationError):
        await unentered(queue).enqueue(job_id, "x")


async def test_job_id_of_exactly_1024_bytes_is_accepted(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    job_id = "é" * 512
    assert len(job_id.encode()) == 1024
    assert (await queue.enqueue(job_id, "x")).enqueued


async def test_unencodable_payload_is_rejected_before_sending(queue: JobQueue[str]) -> None:
    with pytest.raises(ValidationError):
        await unentered(queue).enqueue("j", 42)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["", "  ", "a{b", "a}b", "{x}", 7, None])
async def test_invalid_queue_name_is_rejected(client: RedisClient, name: Any) -> None:
    unopened = RedisClient(client.settings)
    with pytest.raises(ValidationError):
        JobQueue(unopened, name, StrCodec())


async def test_duplicates_do_not_extend_the_window(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    first = await queue.enqueue("j", "x", dedup_window=timedelta(seconds=60))
    key = queue.keys.dedup("j")
    # Shorten the record by hand; a duplicate that re-armed the window would push it back to 60 s.
    assert await client.execute("PEXPIRE", key, 5000) == 1
    for _ in range(3):
        again = await queue.enqueue("j", "y", dedup_window=timedelta(seconds=60))
        assert again.entry_id == first.entry_id and not again.enqueued
    assert 0 < await client.execute("PTTL", key) <= 5000


async def test_expired_record_allows_a_new_entry_even_if_the_old_is_pending(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    first = await queue.enqueue("j", "one", dedup_window=timedelta(milliseconds=1))

    async def expired() -> bool:
        return not await client.execute("EXISTS", queue.keys.dedup("j"))

    await wait_until_async(expired, timeout=5)
    second = await queue.enqueue("j", "two")
    assert second.enqueued
    assert second.entry_id != first.entry_id
    assert await client.execute("XLEN", queue.keys.ready) == 2


async def test_duplicate_returns_the_original_id_after_the_entry_was_deleted(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    first = await queue.enqueue("j", "x")
    assert await client.execute("XDEL", queue.keys.ready, first.entry_id) == 1
    again = await queue.enqueue("j", "x")
    assert again == type(again)(first.entry_id, False)
    assert await client.execute("XLEN", queue.keys.ready) == 0


@pytest.mark.parametrize("outcome", [ACK, DeadLetter(detail="poison")], ids=["ack", "dead-letter"])
async def test_completion_keeps_the_deduplication_record(
    client: RedisClient, queue: JobQueue[str], outcome: Any
) -> None:
    first = await queue.enqueue("j", "x")

    async def handler(job: Job[str]) -> Any:
        return outcome

    async with running_worker(client, queue.name, handler) as worker:
        stats = worker.statistics(queue.name)
        await wait_until(lambda: stats.acked + stats.dead_lettered == 1)

    assert len(await events_of_kind(client, queue.keys, "completed")) == (outcome is ACK)
    assert await client.execute("GET", queue.keys.dedup("j")) == first.entry_id.encode()
    again = await queue.enqueue("j", "x")
    assert again.entry_id == first.entry_id and not again.enqueued
    assert await client.execute("XLEN", queue.keys.ready) == 1


async def test_enqueue_many_deduplicates_inside_and_across_calls(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    earlier = await queue.enqueue("c", "earlier")
    results = await queue.enqueue_many([("a", "1"), ("b", "2"), ("a", "3"), ("c", "4")])

    assert [r.enqueued for r in results] == [True, True, False, False]
    assert results[2].entry_id == results[0].entry_id
    assert results[3].entry_id == earlier.entry_id
    entries = await stream_entries(client, queue.keys.ready)
    assert [f["_respire.job.payload"] for _, f in entries] == [b"earlier", b"1", b"2"]


async def test_enqueue_many_spans_several_pipelines(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    jobs = [(f"j{i}", str(i)) for i in range(1234)]
    results = await queue.enqueue_many(jobs)
    assert len(results) == 1234 and all(r.enqueued for r in results)
    assert len({r.entry_id for r in results}) == 1234
    assert await client.execute("XLEN", queue.keys.ready) == 1234
    again = await queue.enqueue_many(jobs[1000:1010])
    assert [r.entry_id for r in again] == [r.entry_id for r in results[1000:1010]]
    assert not any(r.enqueued for r in again)


async def test_enqueue_many_validates_every_job_before_sending(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    with forbid_commands(client):
        with pytest.raises(ValidationError):
            await queue.enqueue_many([("fine", "x"), ("", "y")])
        with pytest.raises(ValidationError):
            await queue.enqueue_many([("fine", "x")], dedup_window=0)
        with pytest.raises(ValidationError):
            await queue.enqueue_many([("fine", "x"), ("other", 3)])  # type: ignore[list-item]
    assert await client.execute("EXISTS", queue.keys.ready, queue.keys.dedup("fine")) == 0
