"""The operator API (respire_actors.admin) against real state: the queue registry, summaries,
paged pending / scheduled / dead-letter reads, job detail, dead-letter retry and removal."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import anyio
import pytest
from jobs_helpers import (
    create_group,
    deliver,
    fast_options,
    fields_of,
    restricted_client,
    running_worker,
    wait_until_async,
)

from respire_actors.admin import QueueAdmin, list_queues, register_queue, unregister_queue
from respire_actors.codecs import StrCodec
from respire_actors.errors import PermissionDenied, ValidationError
from respire_actors.jobs import (
    Callback,
    DeadLetter,
    Job,
    JobEnqueueOptions,
    JobQueue,
    RateLimit,
    Worker,
)
from respire_actors.keys import queue_registry
from respire_actors.redis.client import RedisClient

pytestmark = pytest.mark.anyio


async def dead_letter_all(client: RedisClient, queue: JobQueue[str], jobs: list[str]) -> None:
    """Enqueue ``jobs`` (payload = 'p-' + id) and let a real worker dead-letter each one with
    reason 'explicit' (ids starting with 'n') or 'nack'-style detail."""

    async def handler(job: Job[str]) -> Any:
        return DeadLetter("explicit" if job.id.startswith("x") else "nack", detail=job.id)

    await queue.enqueue_many([(j, f"p-{j}") for j in jobs])
    admin = QueueAdmin(client, queue.name)
    async with running_worker(client, queue.name, handler):
        await wait_until_async(lambda: _dead_count(admin, len(jobs)), timeout=20)


async def _dead_count(admin: QueueAdmin, n: int) -> bool:
    return (await admin.summary()).dead_letters >= n


async def test_workers_register_their_queues(client: RedisClient, unique_name: str) -> None:
    name = f"{unique_name}-reg"
    assert name not in await list_queues(client)
    queue = JobQueue(client, name, StrCodec())

    async def handler(job: Job[str]) -> None:
        return None

    async with running_worker(client, queue.name, handler):
        assert name in await list_queues(client)
    assert await register_queue(client, name) is False  # already there, idempotent
    assert await unregister_queue(client, name) is True
    assert name not in await list_queues(client)
    await client.execute("SREM", queue_registry(client.key_prefix), name)


async def test_list_queues_is_sorted(client: RedisClient, unique_name: str) -> None:
    names = [f"{unique_name}-b", f"{unique_name}-a", f"{unique_name}-c"]
    try:
        for n in names:
            assert await register_queue(client, n) is True
        listed = [n for n in await list_queues(client) if n.startswith(unique_name)]
        assert listed == sorted(names)
    finally:
        for n in names:
            await unregister_queue(client, n)


async def test_summary_counts_real_state(client: RedisClient, queue: JobQueue[str]) -> None:
    admin = QueueAdmin(client, queue.name)
    empty = await admin.summary()
    assert (empty.ready, empty.pending, empty.lag, empty.dead_letters) == (0, 0, None, 0)
    assert empty.oldest_pending_age_ms is None and not empty.paused
    await create_group(client, queue.keys)
    await queue.enqueue_many([(f"j{i}", "x") for i in range(5)])
    await queue.enqueue_scheduled("later", "x", JobEnqueueOptions(delay=timedelta(hours=1)))
    await deliver(client, queue.keys, "c1", 2)
    await queue.pause()
    await queue.set_rate_limit(RateLimit(10, timedelta(seconds=1)))
    await anyio.sleep(0.02)
    s = await admin.summary()
    assert s.name == queue.name
    assert s.ready == 5
    assert s.pending == 2
    assert s.lag == 3
    assert s.consumers == 1
    assert s.scheduled == 1
    assert s.paused is True
    assert s.rate_limit == RateLimit(10, timedelta(seconds=1))
    assert s.oldest_pending_age_ms is not None and s.oldest_pending_age_ms >= 20
    assert s.groups_in_use is False and s.metrics_enabled is False


async def test_pending_pages_with_job_ids(client: RedisClient, queue: JobQueue[str]) -> None:
    admin = QueueAdmin(client, queue.name)
    await create_group(client, queue.keys)
    await queue.enqueue_many([(f"j{i}", "x") for i in range(7)])
    await deliver(client, queue.keys, "c1", 4)
    await deliver(client, queue.keys, "c2", 3)
    first = await admin.pending(count=5)
    assert [r.job_id for r in first.rows] == [f"j{i}" for i in range(5)]
    assert first.rows[0].consumer == "c1" and first.rows[4].consumer == "c2"
    assert all(r.deliveries == 1 for r in first.rows)
    assert first.next_start is not None
    second = await admin.pending(first.next_start, count=5)
    assert [r.job_id for r in second.rows] == ["j5", "j6"]
    assert second.next_start is None
    only_c2 = await admin.pending(count=50, consumer="c2")
    assert [r.job_id for r in only_c2.rows] == ["j4", "j5", "j6"]


async def test_scheduled_pages_earliest_first(client: RedisClient, queue: JobQueue[str]) -> None:
    admin = QueueAdmin(client, queue.name)
    for i in range(5):
        await queue.enqueue_scheduled(
            f"s{i}", "x", JobEnqueueOptions(delay=timedelta(minutes=10 - i))
        )
    page = await admin.scheduled(count=3)
    assert [r.job_id for r in page.rows] == ["s4", "s3", "s2"]
    assert page.rows[0].due_at < page.rows[1].due_at
    assert all(r.attempts == 0 for r in page.rows)
    rest = await admin.scheduled(page.next_cursor, count=3)
    assert [r.job_id for r in rest.rows] == ["s1", "s0"]
    assert rest.next_cursor is None


async def test_dead_letters_pages_and_reasons(client: RedisClient, queue: JobQueue[str]) -> None:
    admin = QueueAdmin(client, queue.name)
    await dead_letter_all(client, queue, ["x1", "n2", "x3", "n4", "x5"])
    page = await admin.dead_letters(count=3)
    assert len(page.rows) == 3 and page.next_before is not None
    older = await admin.dead_letters(page.next_before, count=3)
    assert older.next_before is None
    everything = page.rows + older.rows
    assert sorted(r.job_id for r in everything) == ["n2", "n4", "x1", "x3", "x5"]
    assert [r.dead_id for r in everything] == sorted(
        (r.dead_id for r in everything), key=lambda i: tuple(map(int, i.split("-"))), reverse=True
    )
    row = next(r for r in everything if r.job_id == "x3")
    assert (row.reason, row.detail, row.attempt, row.payload) == ("explicit", "x3", 1, b"p-x3")
    assert row.source_id and row.consumer
    nacks = await admin.dead_letters(count=100, reason="nack")
    assert sorted(r.job_id for r in nacks.rows) == ["n2", "n4"]
    assert await admin.dead_letter_reasons() == {"explicit": 3, "nack": 2}


async def test_job_detail(client: RedisClient, queue: JobQueue[str]) -> None:
    admin = QueueAdmin(client, queue.name)
    await create_group(client, queue.keys)
    entry = (await queue.enqueue("job-1", "hello")).entry_id
    await client.execute(
        "XADD", queue.keys.events, "*", "kind", "progress", "job_id", "job-1",
        "entry_id", entry, "attempt", "1", "percent", "40",
    )  # fmt: skip
    await client.execute("RPUSH", queue.keys.logs("job-1"), "line one")
    await deliver(client, queue.keys, "c1")
    detail = await admin.job(entry)
    assert detail is not None
    assert (detail.job_id, detail.payload) == ("job-1", b"hello")
    assert "_respire.job.payload" not in detail.fields
    assert detail.fields["_respire.job.id"] == "job-1"
    assert detail.pending is not None and detail.pending.consumer == "c1"
    assert [e.percent for e in detail.events] == [40]
    assert detail.logs == ["line one"]
    assert await admin.job("1-1") is None


async def test_retry_dead_letters_keeps_id_and_payload(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    admin = QueueAdmin(client, queue.name)
    await dead_letter_all(client, queue, ["x1", "x2"])
    page = await admin.dead_letters(count=10)
    target = next(r for r in page.rows if r.job_id == "x1")
    seen: list[tuple[str, str, str | None]] = []

    async def handler(job: Job[str]) -> None:
        seen.append((job.id, job.payload, job.replayed_from))

    assert await admin.retry_dead_letters([target.dead_id]) == 1
    assert await admin.retry_dead_letters([target.dead_id]) == 0  # gone: harmless repeat
    remaining = await admin.dead_letters(count=10)
    assert [r.job_id for r in remaining.rows] == ["x2"]
    async with running_worker(client, queue.name, handler):
        await wait_until_async(lambda: _seen(seen))
    assert seen == [("x1", "p-x1", target.dead_id)]


async def _seen(seen: list[Any]) -> bool:
    return bool(seen)


async def test_retry_copies_only_job_id_payload_and_trace(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    """A dead batch/flow member comes back as a plain job: batch, flow, attempt counts and
    dead-letter metadata are not copied, so a retry never reopens a batch or flow."""
    admin = QueueAdmin(client, queue.name)
    dead_id = await client.execute(
        "XADD", admin.dead_key, "*",
        "_respire.job.id", "m1", "_respire.job.payload", "body",
        "_respire.batch", "b1", "_respire.flow", "f1", "_respire.flow.node", "n1",
        "_respire.job.attempts", "3", "_respire.job.group", "g", "_respire.job.priority", "5",
        "_respire.trace.parent", "00-" + "a" * 32 + "-" + "b" * 16 + "-01",
        "_respire.source_id", "1-1", "_respire.attempt", "2", "_respire.reason", "nack",
        "_respire.consumer", "c", "_respire.detail", "d",
    )  # fmt: skip
    assert await admin.retry_dead_letters([dead_id.decode()]) == 1
    rows = await client.execute("XRANGE", queue.keys.ready, "-", "+")
    assert len(rows) == 1
    fields = {k: v.decode() for k, v in fields_of(rows[0][1]).items()}
    assert fields == {
        "_respire.job.id": "m1",
        "_respire.job.payload": "body",
        "_respire.trace.parent": "00-" + "a" * 32 + "-" + "b" * 16 + "-01",
        # the replay names the dead letter it came from (seed 004)
        "_respire.replayed_from": dead_id.decode(),
    }
    detail = await admin.job(rows[0][0].decode())
    assert detail is not None and detail.trace_id == "a" * 32


async def test_retrying_a_dead_batch_member_does_not_reopen_its_batch(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    admin = QueueAdmin(client, queue.name)
    runs: list[tuple[str, str | None]] = []

    async def handler(job: Job[str]) -> Any:
        runs.append((job.id, job.batch_id))
        return DeadLetter() if job.batch_id is not None else None

    batch = await queue.create_batch(on_failure=Callback("cb", "failed"), batch_id="b1")
    await queue.add_to_batch(batch, "m1", "x")
    await queue.seal_batch(batch)
    async with running_worker(client, queue.name, handler):
        await wait_until_async(lambda: _ran(runs, "cb"))
        before = await queue.batch_status(batch)
        (letter,) = (await admin.dead_letters()).rows
        assert await admin.retry_dead_letters([letter.dead_id]) == 1
        await wait_until_async(lambda: _ran(runs, "m1", 2))
        after = await queue.batch_status(batch)
    assert runs == [("m1", "b1"), ("cb", None), ("m1", None)]
    assert before == after and after.completed and after.failed == 1


async def _ran(runs: list[tuple[str, str | None]], job_id: str, times: int = 1) -> bool:
    return sum(1 for j, _ in runs if j == job_id) >= times


async def test_malformed_and_missing_dead_letters_are_skipped(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    admin = QueueAdmin(client, queue.name)
    bad = (await client.execute("XADD", admin.dead_key, "*", "other", "x")).decode()
    assert await admin.retry_dead_letters([bad, "1-1"]) == 0
    assert await client.execute("XLEN", admin.dead_key) == 1  # left in place
    assert await client.execute("XLEN", queue.keys.ready) == 0
    assert await admin.delete_dead_letters([bad, "1-1"]) == 1
    assert await client.execute("XLEN", admin.dead_key) == 0


@pytest.mark.parametrize("denied", ["-xdel", "-xadd"])
async def test_retry_checks_permissions_before_writing(
    server_url: str, client: RedisClient, queue: JobQueue[str], unique_name: str, denied: str
) -> None:
    admin = QueueAdmin(client, queue.name)
    dead_id = await client.execute(
        "XADD", admin.dead_key, "*", "_respire.job.id", "a", "_respire.job.payload", "p"
    )
    async with restricted_client(server_url, client, unique_name, denied) as restricted:
        with pytest.raises(PermissionDenied):
            await QueueAdmin(restricted, queue.name).retry_dead_letters([dead_id.decode()])
    assert await client.execute("XLEN", admin.dead_key) == 1
    assert await client.execute("XLEN", queue.keys.ready) == 0


async def test_retry_all_by_reason_in_pages(client: RedisClient, queue: JobQueue[str]) -> None:
    admin = QueueAdmin(client, queue.name)
    for i in range(25):
        await client.execute(
            "XADD", admin.dead_key, "*", "_respire.job.id", f"j{i}", "_respire.job.payload",
            "p", "_respire.reason", "nack" if i % 5 else "explicit",
        )  # fmt: skip
    progress = [p async for p in admin.retry_all(reason="nack", batch=7)]
    assert [p.scanned for p in progress] == [7, 14, 21, 25]
    assert progress[-1].retried == 20 and progress[-1].skipped == 5
    assert await client.execute("XLEN", queue.keys.ready) == 20
    left = await admin.dead_letters(count=100)
    assert sorted(r.job_id for r in left.rows) == sorted(f"j{i}" for i in range(0, 25, 5))


async def test_dead_stream_override(client: RedisClient, unique_name: str) -> None:
    queue = JobQueue(client, unique_name, StrCodec())

    async def handler(job: Job[str]) -> Any:
        return DeadLetter()

    worker = Worker()
    worker.register(queue.name, handler, StrCodec(), fast_options(dead_letter_stream="graveyard"))
    await queue.enqueue("a", "x")
    admin = QueueAdmin(client, queue.name, dead_stream="graveyard")
    async with anyio.create_task_group() as tg:
        await tg.start(worker.run, client)
        await wait_until_async(lambda: _dead_count(admin, 1))
        await worker.stop()
    assert (await admin.dead_letters()).rows[0].job_id == "a"
    assert (await QueueAdmin(client, queue.name).summary()).dead_letters == 0


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda a: a.pending(count=0), "count"),
        (lambda a: a.pending("nope"), "start"),
        (lambda a: a.scheduled("bad"), "cursor"),
        (lambda a: a.dead_letters(count=1001), "count"),
        (lambda a: a.job("x"), "entry id"),
        (lambda a: a.retry_dead_letters("1-1"), "list"),
        (lambda a: a.retry_dead_letters(["x"]), "dead-letter id"),
        (lambda a: a.delete_dead_letters([1]), "dead-letter id"),
        (lambda a: a.trim_plan("scheduled", max_age=10), "stream"),
        (lambda a: a.trim_plan("ready"), "max age"),
        (lambda a: a.trim_plan("ready", max_age=-1), "max_age"),
        (lambda a: a.trim_plan("ready", max_length=10, limit=0), "limit"),
    ],
)
async def test_bad_arguments_raise_before_sending(
    client: RedisClient, unique_name: str, call: Any, message: str
) -> None:
    admin = QueueAdmin(client, unique_name)
    before = client.round_trips
    with pytest.raises(ValidationError, match=message):
        await call(admin)
    assert client.round_trips == before


async def test_a_retried_dead_letter_no_longer_answers_status_and_result(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    """With keep_results, a dead-lettered job's record used to survive the operator's retry:
    while the retry ran, status() said dead-lettered and result() raised JobDeadLettered for
    the earlier run at once instead of waiting for the new one."""
    from respire_actors.errors import JobDeadLettered

    admin = QueueAdmin(client, queue.name)
    release = anyio.Event()
    started: list[int] = []

    async def handler(job: Job[str]) -> Any:
        started.append(1)
        if len(started) == 1:
            return DeadLetter("explicit", detail="first run failed")
        await release.wait()
        return "second run ok"

    await queue.enqueue("j", "p")
    options = fast_options(keep_results=timedelta(minutes=5))
    async with running_worker(client, queue.name, handler, options=options):
        with pytest.raises(JobDeadLettered):
            await queue.result("j", timeout=10)
        (letter,) = (await admin.dead_letters()).rows
        assert await admin.retry_dead_letters([letter.dead_id, letter.dead_id]) == 1
        await wait_until_async(lambda: _started_twice(started))
        assert (await queue.status("j")).state == "unknown"
        async with anyio.create_task_group() as tg:
            got: list[Any] = []

            async def wait_result() -> None:
                got.append(await queue.result("j", timeout=10))

            tg.start_soon(wait_result)
            await anyio.sleep(0.2)
            assert got == []  # waiting for the new run, not answered by the old record
            release.set()
        assert got == ["second run ok"]
        assert (await queue.status("j")).state == "completed"


async def _started_twice(started: list[int]) -> bool:
    return len(started) >= 2


async def test_retrying_many_dead_letters_logs_a_line_per_page_not_per_letter(
    client: RedisClient, queue: JobQueue[str], caplog: pytest.LogCaptureFixture
) -> None:
    """Found by review: `retry --all` of 3,000 letters wrote 3,000 INFO lines to stderr."""
    import logging

    admin = QueueAdmin(client, queue.name)
    ids = [
        (
            await client.execute(
                "XADD", admin.dead_key, "*", "_respire.job.id", f"j{i}", "_respire.job.payload", "p"
            )
        ).decode()
        for i in range(30)
    ]
    with caplog.at_level(logging.INFO, logger="respire_actors.admin"):
        assert await admin.retry_dead_letters(ids) == 30
    lines = [r for r in caplog.records if r.levelno >= logging.INFO]
    assert [r.getMessage() for r in lines] == [f"{queue.name}: retried 30 of 30 dead letters"]
    # retry_all: one line for the whole run, not one per page (review: 20 lines for 10,000
    # letters around the CLI's progress bar)
    for i in range(30):
        await client.execute(
            "XADD", admin.dead_key, "*", "_respire.job.id", f"k{i}", "_respire.job.payload", "p"
        )
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="respire_actors.admin"):
        pages = [p async for p in admin.retry_all(batch=10)]
    assert len(pages) == 3 and pages[-1].retried == 30
    lines = [r for r in caplog.records if r.levelno >= logging.INFO]
    assert [r.getMessage() for r in lines] == [
        f"{queue.name}: retried 30 of 30 dead letters scanned (0 skipped)"
    ]


async def test_a_misspelt_dead_letter_reason_is_refused(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    """Found by review: `--reason processing_failed` retried 0 letters and succeeded; a
    filter that can match nothing is now a ValidationError naming the reasons."""
    admin = QueueAdmin(client, queue.name)
    with pytest.raises(ValidationError, match="processing-failed"):
        await admin.dead_letters(reason="processing_failed")
    with pytest.raises(ValidationError, match="unknown dead-letter reason"):
        async for _ in admin.retry_all(reason="Explicit"):
            pass
    assert (await admin.dead_letters(reason="nack")).rows == []
