"""Transactional enqueue: a job queued with the caller's writes in one MULTI/EXEC."""

from __future__ import annotations

import pytest
from jobs_helpers import text

from respire_actors.errors import TransactionAborted, ValidationError
from respire_actors.jobs import JobQueue
from respire_actors.redis.client import RedisClient, connect

pytestmark = pytest.mark.anyio


def business_key(queue: JobQueue[str]) -> str:
    # Same hash tag as the queue, as a cluster requires.
    return queue.keys.custom("order:42")


async def test_commit_makes_the_job_and_the_business_write_visible_together(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    order = business_key(queue)
    async with client.transaction() as tx:
        saved = tx.queue("SET", order, "paid")
        job = queue.enqueue_in(tx, "receipt:42", "customer@example.com")
        other = queue.enqueue_in(tx, "receipt:43", "other@example.com")
        # Nothing is written before EXEC.
        assert await client.execute("EXISTS", order, queue.keys.ready) == 0
        assert await client.execute("EXISTS", queue.keys.dedup("receipt:42")) == 0
        assert await tx.commit() is True

    assert text(saved.result()) == "OK"
    result = job.result()
    assert result.enqueued and other.result().enqueued
    assert await client.execute("GET", order) == b"paid"
    rows = await client.execute("XRANGE", queue.keys.ready, "-", "+")
    assert [text(r[0]) for r in rows] == [result.entry_id, other.result().entry_id]
    assert await client.execute("GET", queue.keys.dedup("receipt:42")) == result.entry_id.encode()


async def test_duplicate_inside_a_transaction_returns_the_original(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    earlier = await queue.enqueue("receipt:42", "first")
    async with client.transaction() as tx:
        job = queue.enqueue_in(tx, "receipt:42", "second")
        assert await tx.commit()
    assert job.result() == type(earlier)(earlier.entry_id, False)
    assert await client.execute("XLEN", queue.keys.ready) == 1


async def test_leaving_without_commit_writes_nothing(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    order = business_key(queue)
    async with client.transaction() as tx:
        saved = tx.queue("SET", order, "paid")
        job = queue.enqueue_in(tx, "receipt:42", "x")

    for pending in (saved, job):
        with pytest.raises(TransactionAborted):
            pending.result()
    assert await client.execute("EXISTS", order, queue.keys.ready) == 0
    assert await client.execute("EXISTS", queue.keys.dedup("receipt:42")) == 0


async def test_result_before_commit_is_an_error(client: RedisClient, queue: JobQueue[str]) -> None:
    async with client.transaction() as tx:
        job = queue.enqueue_in(tx, "receipt:42", "x")
        with pytest.raises(RuntimeError):
            job.result()
        await tx.discard()
    with pytest.raises(TransactionAborted):
        job.result()


async def test_watch_abort_writes_nothing(
    server_url: str, client: RedisClient, queue: JobQueue[str]
) -> None:
    order = business_key(queue)
    await client.execute("SET", order, "new")
    async with connect(server_url) as other, client.transaction(order) as tx:
        assert await tx.read("GET", order) == b"new"
        saved = tx.queue("SET", order, "paid")
        job = queue.enqueue_in(tx, "receipt:42", "x")
        await other.execute("SET", order, "cancelled")  # another client changes it
        assert await tx.commit() is False

    for pending in (saved, job):
        with pytest.raises(TransactionAborted):
            pending.result()
    assert await client.execute("GET", order) == b"cancelled"
    assert await client.execute("EXISTS", queue.keys.ready) == 0
    assert await client.execute("EXISTS", queue.keys.dedup("receipt:42")) == 0


async def test_watch_without_a_change_commits(client: RedisClient, queue: JobQueue[str]) -> None:
    order = business_key(queue)
    async with client.transaction(order) as tx:
        assert await tx.read("GET", order) is None
        tx.queue("SET", order, "paid")
        job = queue.enqueue_in(tx, "receipt:42", "x")
        assert await tx.commit() is True
    assert job.result().enqueued
    assert await client.execute("XLEN", queue.keys.ready) == 1


async def test_transaction_of_another_client_is_rejected(
    server_url: str, client: RedisClient, queue: JobQueue[str]
) -> None:
    async with connect(server_url) as other, other.transaction() as tx:
        with pytest.raises(ValidationError):
            queue.enqueue_in(tx, "receipt:42", "x")
        tx.queue("SET", business_key(queue), "paid")
        assert await tx.commit()
    assert await client.execute("EXISTS", queue.keys.ready) == 0


async def test_invalid_arguments_are_rejected_while_queueing(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    async with client.transaction() as tx:
        with pytest.raises(ValidationError):
            queue.enqueue_in(tx, "", "x")
        with pytest.raises(ValidationError):
            queue.enqueue_in(tx, "j", "x", dedup_window=0)
        with pytest.raises(ValidationError):
            queue.enqueue_in(tx, "j", 5)  # type: ignore[arg-type]
        saved = tx.queue("SET", business_key(queue), "paid")
        assert await tx.commit()
    assert text(saved.result()) == "OK"
    assert await client.execute("EXISTS", queue.keys.ready) == 0
