"""Batches with workers: member outcomes commit counts, callbacks, events and acknowledgement
together (lib/coordination.lua + lib/batch.lua), on both servers and backends.

Success, failure (explicit dead letter and the delivery limit), durable retries counted once,
repeated and concurrent completion requests publishing each callback once, cancellation
mid-batch (unstarted members skipped, a running handler finishing and counted cancelled),
dead-letter replays that never reopen a batch, an unknown schema version refusing a completion,
and a batch on a 3-master cluster. Two worker processes are in test_batches_processes.py."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta
from typing import Any

import anyio
import pytest
from jobs_helpers import (
    all_events,
    create_group,
    deliver,
    events_of_kind,
    fast_options,
    fields_of,
    pending_count,
    running_worker,
    text,
    wait_until,
    wait_until_async,
)
from sched_helpers import scheduling_worker

from respire_actors.actors.messages import Completion
from respire_actors.codecs import StrCodec
from respire_actors.errors import UnsupportedSchema
from respire_actors.jobs import (
    ACK,
    BatchStatus,
    Callback,
    DeadLetter,
    Job,
    JobQueue,
    Outcome,
)
from respire_actors.jobs.options import CONSUMER_GROUP
from respire_actors.jobs.source import JobSource
from respire_actors.redis.client import RedisClient, connect

pytestmark = pytest.mark.anyio

CALLBACKS = dict(
    on_success=Callback("cb-ok", "success"),
    on_failure=Callback("cb-fail", "failure"),
    on_complete=Callback("cb-done", "complete"),
)
CALLBACK_IDS = {"cb-ok", "cb-fail", "cb-done"}


async def status_of(queue: JobQueue[Any], batch: str) -> BatchStatus:
    status = await queue.batch_status(batch)
    assert status is not None
    return status


async def wait_completed(queue: JobQueue[Any], batch: str, timeout: float = 15) -> BatchStatus:
    async def done() -> bool:
        return (await status_of(queue, batch)).completed

    await wait_until_async(done, timeout=timeout)
    return await status_of(queue, batch)


async def published_callbacks(queue: JobQueue[Any]) -> list[str]:
    """Job ids of ready entries that are callbacks (no batch field), in stream order."""
    rows = await queue.client.execute("XRANGE", queue.keys.ready, "-", "+")
    ids = []
    for _, flat in rows or []:
        fields = fields_of(flat)
        if "_respire.batch" not in fields:
            ids.append(text(fields["_respire.job.id"]))
    return ids


async def test_callbacks_on_success(client: RedisClient, queue: JobQueue[str]) -> None:
    runs: list[tuple[str, str, str | None]] = []

    async def handler(job: Job[str]) -> Outcome:
        runs.append((job.id, job.payload, job.batch_id))
        return ACK

    batch = await queue.create_batch(**CALLBACKS, batch_id="report-42")
    await queue.add_many_to_batch(batch, [(f"part-{i}", f"p{i}") for i in range(5)])
    async with running_worker(client, queue.name, handler):
        await wait_until(lambda: len(runs) >= 5)
        # members finished while the batch was open: counted, nothing published
        await wait_until_async(
            lambda: _succeeded(queue, batch, 5),
        )
        assert (await status_of(queue, batch)).completed is False
        assert await published_callbacks(queue) == []
        assert await queue.seal_batch(batch) is True  # nothing pending: completes here
        await wait_until(lambda: len(runs) >= 7)
    status = await status_of(queue, batch)
    assert (status.succeeded, status.failed, status.cancelled, status.pending) == (5, 0, 0, 0)
    assert status.completed
    assert await published_callbacks(queue) == ["cb-ok", "cb-done"]
    # callbacks run as ordinary jobs of the same queue and handler
    assert sorted(r for r in runs if r[0] in CALLBACK_IDS) == [
        ("cb-done", "complete", None),
        ("cb-ok", "success", None),
    ]
    events = await all_events(client, queue.keys)
    member_events = [e for e in events if e.job_id.startswith("part-")]
    assert {(e.kind, e.batch_id) for e in member_events} == {("completed", "report-42")}
    assert [
        (e.batch_id, e.extra.get("outcome")) for e in events if e.kind == "batch-completed"
    ] == [("report-42", "succeeded")]


async def _succeeded(queue: JobQueue[Any], batch: str, n: int) -> bool:
    return (await status_of(queue, batch)).succeeded == n


async def test_the_last_member_publishes_the_callbacks(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    runs: list[str] = []

    async def handler(job: Job[str]) -> Outcome:
        runs.append(job.id)
        return ACK

    batch = await queue.create_batch(**CALLBACKS)
    await queue.add_many_to_batch(batch, [("a", "1"), ("b", "2")])
    await queue.seal_batch(batch)
    async with running_worker(client, queue.name, handler):
        await wait_until(lambda: len(runs) >= 4)
    status = await wait_completed(queue, batch)
    assert (status.succeeded, status.pending) == (2, 0)
    assert sorted(runs) == ["a", "b", "cb-done", "cb-ok"]
    assert await published_callbacks(queue) == ["cb-ok", "cb-done"]


async def test_callbacks_on_failure_when_a_member_is_dead_lettered(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    runs: list[str] = []

    async def handler(job: Job[str]) -> Outcome:
        runs.append(job.id)
        if job.id == "bad":
            return DeadLetter(detail="bad input")
        return ACK

    batch = await queue.create_batch(**CALLBACKS)
    await queue.add_many_to_batch(batch, [("good", "1"), ("bad", "2")])
    await queue.seal_batch(batch)
    async with running_worker(client, queue.name, handler):
        await wait_until(lambda: {"cb-fail", "cb-done"} <= set(runs))
    status = await status_of(queue, batch)
    assert (status.succeeded, status.failed, status.cancelled, status.completed) == (1, 1, 0, True)
    assert await published_callbacks(queue) == ["cb-fail", "cb-done"]
    assert "cb-ok" not in runs
    (dead_event,) = await events_of_kind(client, queue.keys, "dead-letter")
    assert (dead_event.job_id, dead_event.batch_id) == ("bad", batch)
    (done,) = await events_of_kind(client, queue.keys, "batch-completed")
    assert done.extra.get("outcome") == "failed"


async def test_a_member_failing_to_the_delivery_limit_fails_the_batch(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    runs: Counter[str] = Counter()

    async def handler(job: Job[str]) -> Outcome:
        runs[job.id] += 1
        if job.id == "flaky":
            raise RuntimeError("always")
        return ACK

    batch = await queue.create_batch(**CALLBACKS)
    await queue.add_many_to_batch(batch, [("ok", "1"), ("flaky", "2")])
    await queue.seal_batch(batch)
    options = fast_options(delivery_limit=2, visibility_timeout=timedelta(milliseconds=200))
    async with running_worker(client, queue.name, handler, options=options):
        await wait_until(lambda: runs["cb-done"] >= 1 and runs["cb-fail"] >= 1, timeout=20)
    status = await status_of(queue, batch)
    assert (status.succeeded, status.failed, status.pending) == (1, 1, 0)
    assert runs["flaky"] == 2
    (dead_event,) = await events_of_kind(client, queue.keys, "dead-letter")
    assert (dead_event.job_id, dead_event.reason, dead_event.batch_id) == (
        "flaky",
        "processing-failed",
        batch,
    )
    assert await published_callbacks(queue) == ["cb-fail", "cb-done"]


async def test_recovery_dead_lettering_at_the_limit_fails_the_member(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    """A member whose worker died on its last allowed delivery is failed by recovery."""
    batch = await queue.create_batch(**CALLBACKS)
    await queue.add_many_to_batch(batch, [("crashed", "1")])
    await queue.seal_batch(batch)
    await create_group(client, queue.keys)
    await deliver(client, queue.keys, "dead-consumer")  # delivery 1 of 1, never completed
    source = JobSource(client, queue.keys, queue.keys.dead, CONSUMER_GROUP)
    page = await source.claim("c2", "recover", "0-0", 10, 0, 1)
    assert (page.dead_lettered, list(page.deliveries), list(page.refused)) == (1, [], [])
    status = await status_of(queue, batch)
    assert (status.failed, status.pending, status.completed) == (1, 0, True)
    assert await published_callbacks(queue) == ["cb-fail", "cb-done"]
    (dead_event,) = await events_of_kind(client, queue.keys, "dead-letter")
    assert (dead_event.reason, dead_event.batch_id) == ("delivery-limit", batch)


async def test_a_member_retried_durably_then_succeeding_counts_once(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    runs: Counter[str] = Counter()
    seen_pending: list[int] = []

    async def handler(job: Job[str]) -> Outcome:
        runs[job.id] += 1
        if job.id == "retry-me" and runs[job.id] < 3:
            seen_pending.append((await status_of(queue, job.batch_id or "")).pending)
            return job.retry_after(0)
        return ACK

    batch = await queue.create_batch(**CALLBACKS)
    await queue.add_many_to_batch(batch, [("retry-me", "1"), ("plain", "2")])
    await queue.seal_batch(batch)
    async with scheduling_worker(client, queue.name, handler):
        await wait_until(lambda: runs["cb-done"] >= 1, timeout=20)
    status = await status_of(queue, batch)
    assert runs["retry-me"] == 3  # two durable retries (new entries), then success
    assert (status.succeeded, status.failed, status.pending, status.members) == (2, 0, 0, 2)
    assert seen_pending and all(p >= 1 for p in seen_pending)  # retries stay pending
    assert await published_callbacks(queue) == ["cb-ok", "cb-done"]
    completed = [e for e in await events_of_kind(client, queue.keys, "completed")]
    assert [e.batch_id for e in completed if e.job_id == "retry-me"] == [batch]


async def test_repeated_completion_requests_publish_once(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    batch = await queue.create_batch(**CALLBACKS)
    await queue.add_many_to_batch(batch, [("a", "1"), ("b", "2")])
    await queue.seal_batch(batch)
    await create_group(client, queue.keys)
    source = JobSource(client, queue.keys, queue.keys.dead, CONSUMER_GROUP)
    a, b = await deliver(client, queue.keys, "c1", 2)
    assert await source.complete("c1", [Completion(a, "ack")]) == [1]
    last = Completion(b, "ack")
    # the same completion twice in one call, then again in another: the fence lets one through
    assert await source.complete("c1", [last, last]) == [1, 0]
    assert await source.complete("c1", [last]) == [0]
    status = await status_of(queue, batch)
    assert (status.succeeded, status.pending, status.completed) == (2, 0, True)
    assert await published_callbacks(queue) == ["cb-ok", "cb-done"]
    assert len(await events_of_kind(client, queue.keys, "batch-completed")) == 1


async def test_concurrent_final_completions_publish_once(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    batch = await queue.create_batch(**CALLBACKS)
    members = [(f"m{i}", str(i)) for i in range(8)]
    await queue.add_many_to_batch(batch, members)
    await queue.seal_batch(batch)
    await create_group(client, queue.keys)
    deliveries = [(f"c{i}", (await deliver(client, queue.keys, f"c{i}"))[0]) for i in range(8)]

    async def complete(consumer: str, completion: Completion) -> None:
        source = JobSource(client, queue.keys, queue.keys.dead, CONSUMER_GROUP)
        assert await source.complete(consumer, [completion]) == [1]

    async with anyio.create_task_group() as tg:
        for consumer, delivery in deliveries:
            kind = "dead" if delivery.job_id == "m3" else "ack"
            tg.start_soon(complete, consumer, Completion(delivery, kind, reason="explicit"))
    status = await status_of(queue, batch)
    assert (status.succeeded, status.failed, status.completed) == (7, 1, True)
    assert await published_callbacks(queue) == ["cb-fail", "cb-done"]
    assert len(await events_of_kind(client, queue.keys, "batch-completed")) == 1
    assert await pending_count(client, queue.keys) == 0


async def test_cancel_mid_batch(client: RedisClient, queue: JobQueue[str]) -> None:
    started = anyio.Event()
    release = anyio.Event()
    runs: list[str] = []
    finished: list[str] = []

    async def handler(job: Job[str]) -> Outcome:
        runs.append(job.id)
        if job.id == "slow":
            started.set()
            await release.wait()  # not interrupted by the cancellation request
            finished.append(job.id)
        return ACK

    batch = await queue.create_batch(**CALLBACKS)
    await queue.add_to_batch(batch, "slow", "s")
    await queue.add_many_to_batch(batch, [(f"later-{i}", str(i)) for i in range(4)])
    # one consumer: the later members wait behind the running one
    options = fast_options(consumer_count=1)
    async with running_worker(client, queue.name, handler, options=options):
        with anyio.fail_after(10):
            await started.wait()
        assert await queue.cancel_batch(batch) is True
        status = await status_of(queue, batch)
        assert (status.cancellation_requested, status.sealed, status.pending) == (True, True, 5)
        release.set()
        await wait_until(lambda: {"cb-fail", "cb-done"} <= set(runs), timeout=15)
    assert finished == ["slow"]
    assert [r for r in runs if r not in CALLBACK_IDS] == ["slow"]  # the others never started
    status = await status_of(queue, batch)
    assert (status.succeeded, status.failed, status.cancelled, status.pending) == (0, 0, 5, 0)
    assert status.completed
    assert await published_callbacks(queue) == ["cb-fail", "cb-done"]
    events = await all_events(client, queue.keys)
    # the running member completed after the request: it counts as cancelled, event included
    assert sorted(e.job_id for e in events if e.kind == "cancelled") == [
        *(f"later-{i}" for i in range(4)),
        "slow",
    ]
    assert {e.batch_id for e in events if e.kind == "cancelled"} == {batch}
    assert [e.job_id for e in events if e.kind == "completed" and e.batch_id == batch] == []
    assert await queue.cancel_batch(batch) is False  # a completed batch is left unchanged
    assert (await status_of(queue, batch)).cancelled == 5


async def test_earlier_outcomes_keep_their_counts_after_cancellation(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    batch = await queue.create_batch(**CALLBACKS)
    await queue.add_many_to_batch(batch, [("done", "1"), ("failed", "2"), ("open", "3")])
    await create_group(client, queue.keys)
    source = JobSource(client, queue.keys, queue.keys.dead, CONSUMER_GROUP)
    d, f, o = await deliver(client, queue.keys, "c1", 3)
    assert await source.complete("c1", [Completion(d, "ack"), Completion(f, "dead")]) == [1, 1]
    assert await queue.cancel_batch(batch) is True
    assert await published_callbacks(queue) == []  # "open" is still pending
    # committed as cancelled (status 3): the request came before it finished
    assert await source.complete("c1", [Completion(o, "ack")]) == [3]
    status = await status_of(queue, batch)
    assert (status.succeeded, status.failed, status.cancelled, status.completed) == (1, 1, 1, True)
    assert await published_callbacks(queue) == ["cb-fail", "cb-done"]


async def test_a_dead_letter_replay_does_not_reopen_the_batch(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    runs: Counter[str] = Counter()

    async def handler(job: Job[str]) -> Outcome:
        runs[job.id] += 1
        if job.id == "bad" and runs[job.id] == 1:
            return DeadLetter(detail="first time")
        return ACK

    batch = await queue.create_batch(**CALLBACKS, batch_id="replayed")
    await queue.add_many_to_batch(batch, [("good", "1"), ("bad", "2")])
    await queue.seal_batch(batch)
    async with running_worker(client, queue.name, handler):
        await wait_until(lambda: runs["cb-done"] >= 1)
        before = await queue.client.execute("GET", queue.keys.batch(batch))
        # an operator replays the dead letter with its envelope (batch field included)
        (row,) = await client.execute("XRANGE", queue.keys.dead, "-", "+")
        fields = fields_of(row[1])
        bookkeeping = ("_respire.source_id", "_respire.attempt", "_respire.reason")
        envelope = [
            x
            for k, v in fields.items()
            if k not in (*bookkeeping, "_respire.consumer")
            for x in (k, v)
        ]
        assert fields["_respire.batch"] == batch.encode()
        await client.execute("XADD", queue.keys.ready, "*", *envelope)
        await wait_until(lambda: runs["bad"] >= 2)
        await wait_until_async(lambda: _no_pending(client, queue))
    assert await queue.client.execute("GET", queue.keys.batch(batch)) == before
    status = await status_of(queue, batch)
    assert (status.succeeded, status.failed, status.completed) == (1, 1, True)
    assert await published_callbacks(queue) == ["cb-fail", "cb-done"]
    assert runs["cb-fail"] == 1 and runs["cb-done"] == 1
    replayed = [
        e for e in await events_of_kind(client, queue.keys, "completed") if e.job_id == "bad"
    ]
    assert len(replayed) == 1  # the replay's own completion; the batch did not change


async def _no_pending(client: RedisClient, queue: JobQueue[Any]) -> bool:
    return await pending_count(client, queue.keys) == 0


async def test_a_replay_of_a_cancelled_batch_member_runs(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    """The gate cancels only pending members: a finished member's replay runs."""
    runs: list[str] = []

    async def handler(job: Job[str]) -> Outcome:
        runs.append(job.id)
        return ACK

    batch = await queue.create_batch(**CALLBACKS)
    await queue.add_to_batch(batch, "m", "1")
    await queue.cancel_batch(batch)
    async with running_worker(client, queue.name, handler):
        await wait_until_async(lambda: _completed(queue, batch))
        await wait_until(lambda: "cb-done" in runs)
        assert "m" not in runs  # skipped as cancelled
        await client.execute(
            "XADD",
            queue.keys.ready,
            "*",
            "_respire.job.id",
            "m",
            "_respire.job.payload",
            "1",
            "_respire.batch",
            batch,
        )
        await wait_until(lambda: "m" in runs)
    assert (await status_of(queue, batch)).cancelled == 1


async def _completed(queue: JobQueue[Any], batch: str) -> bool:
    return (await status_of(queue, batch)).completed


async def test_an_unknown_schema_version_refuses_the_completion(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    batch = await queue.create_batch(**CALLBACKS)
    await queue.add_to_batch(batch, "m", "1")
    await queue.seal_batch(batch)
    await create_group(client, queue.keys)
    (d,) = await deliver(client, queue.keys, "c1")
    key = queue.keys.batch(batch)
    await client.execute(
        "EVAL",
        "local s = cmsgpack.unpack(redis.call('GET', KEYS[1])) s.v = 2 "
        "redis.call('SET', KEYS[1], cmsgpack.pack(s))",
        1,
        key,
    )
    stored = await client.execute("GET", key)
    source = JobSource(client, queue.keys, queue.keys.dead, CONSUMER_GROUP)
    with pytest.raises(UnsupportedSchema):
        await source.complete("c1", [Completion(d, "ack")])
    assert await client.execute("GET", key) == stored
    assert await pending_count(client, queue.keys) == 1  # left pending, recoverable
    # recovery at the delivery limit cannot fail the member either: left as it is, reported
    page = await source.claim("c2", "recover", "0-0", 10, 0, 1)
    assert [entry for entry, _ in page.refused] == [d.entry_id]
    assert "RESPIRE_SCHEMA" in page.refused[0][1]
    assert (page.dead_lettered, list(page.deliveries)) == (0, [])
    assert await client.execute("GET", key) == stored
    assert await pending_count(client, queue.keys) == 1
    assert await published_callbacks(queue) == []
    assert await all_events(client, queue.keys) == []


async def test_a_batch_on_a_cluster(cluster_client: RedisClient, unique_name: str) -> None:
    queue = JobQueue(cluster_client, unique_name, StrCodec())
    runs: list[str] = []

    async def handler(job: Job[str]) -> Outcome:
        runs.append(job.id)
        return DeadLetter(detail="no") if job.id == "m2" else ACK

    batch = await queue.create_batch(**CALLBACKS)
    await queue.add_many_to_batch(batch, [(f"m{i}", str(i)) for i in range(4)])
    await queue.seal_batch(batch)
    async with running_worker(cluster_client, queue.name, handler):
        await wait_until(lambda: {"cb-fail", "cb-done"} <= set(runs), timeout=20)
    status = await status_of(queue, batch)
    assert (status.succeeded, status.failed, status.completed) == (3, 1, True)


async def test_a_key_prefix_is_respected(
    client: RedisClient, server_url: str, unique_name: str
) -> None:
    """The completion scripts derive the batch key from the (prefixed) ready key."""
    runs: list[str] = []

    async def handler(job: Job[str]) -> Outcome:
        runs.append(job.id)
        return ACK

    async with connect(server_url, key_prefix=f"{unique_name}:") as prefixed:
        queue = JobQueue(prefixed, f"{unique_name}-q", StrCodec())
        assert queue.keys.batch("b").startswith(f"{unique_name}:{{respire-job:{unique_name}-q}}")
        batch = await queue.create_batch(**CALLBACKS, batch_id="b")
        await queue.add_many_to_batch(batch, [("m1", "1"), ("m2", "2")])
        await queue.seal_batch(batch)
        async with running_worker(prefixed, queue.name, handler):
            await wait_until(lambda: "cb-done" in runs)
        status = await status_of(queue, batch)
        assert (status.succeeded, status.completed) == (2, True)
    # nothing was written outside the prefix
    keys = [text(k) for k in await client.execute("KEYS", f"*{unique_name}-q*")]
    assert keys and all(k.startswith(f"{unique_name}:") for k in keys)


@pytest.mark.parametrize("returned", ["ack", "dead", "ack-kept"])
async def test_a_member_running_when_its_batch_is_cancelled_is_cancelled_everywhere(
    client: RedisClient, unique_name: str, returned: str
) -> None:
    """The member's handler is running when cancel_batch is called, then returns ACK or a
    DeadLetter: the batch counts it cancelled, and so do its event (kind 'cancelled', no
    dead letter) and the per-minute metrics (not counted). Its completed or dead-letter event
    and a metrics count used to contradict the batch. With keep_results its record says
    cancelled and result() raises JobResultUnavailable."""
    from respire_actors.errors import JobResultUnavailable
    from respire_actors.jobs import QueueOptions

    queue = JobQueue(client, unique_name, StrCodec())
    batch = await queue.create_batch(batch_id="B")
    started, release = anyio.Event(), anyio.Event()

    async def handler(job: Job[str]) -> Any:
        started.set()
        await release.wait()
        return DeadLetter("explicit", "x") if returned == "dead" else ACK

    await queue.add_to_batch(batch, "m", "x")
    keep = timedelta(minutes=1) if returned == "ack-kept" else None
    async with running_worker(
        client,
        queue.name,
        handler,
        options=fast_options(keep_results=keep),
        queue_options=QueueOptions(metrics_retention_minutes=5),
    ) as worker:
        with anyio.fail_after(10):
            await started.wait()
        assert await queue.cancel_batch(batch)
        release.set()

        async def done() -> bool:
            return (await queue.batch_status(batch)).completed

        await wait_until_async(done, timeout=10)
        stats = worker.statistics(queue.name)
    # the worker's own counters agree (it counted it acknowledged or dead-lettered)
    assert (stats.cancelled, stats.acked, stats.dead_lettered) == (1, 0, 0)
    status = await queue.batch_status(batch)
    assert (status.cancelled, status.succeeded, status.failed) == (1, 0, 0)
    kinds = [e.kind for e in await all_events(client, queue.keys) if e.job_id == "m"]
    assert kinds == ["cancelled"], kinds
    assert await client.execute("XLEN", queue.keys.dead) == 0
    minutes = await queue.read_metrics(5)
    assert (sum(m.completed for m in minutes), sum(m.failed for m in minutes)) == (0, 0)
    if keep:
        with pytest.raises(JobResultUnavailable) as raised:
            await queue.result("m", timeout=1)
        assert raised.value.problem == "cancelled"


async def test_a_member_skipped_after_cancellation_keeps_a_cancelled_record(
    client: RedisClient, unique_name: str
) -> None:
    """A member whose batch was cancelled before it started is skipped; with keep_results it
    kept no record, so a result() called after the skip waited for its whole timeout."""
    from respire_actors.errors import JobResultUnavailable

    queue = JobQueue(client, unique_name, StrCodec())
    batch = await queue.create_batch(batch_id="B")
    await queue.add_many_to_batch(batch, [(f"m{i}", "x") for i in range(3)])
    assert await queue.cancel_batch(batch)
    runs: list[str] = []

    async def handler(job: Job[str]) -> Any:
        runs.append(job.id)
        return ACK

    options = fast_options(keep_results=timedelta(minutes=1))
    async with running_worker(client, queue.name, handler, options=options) as worker:

        async def done() -> bool:
            return (await queue.batch_status(batch)).completed

        await wait_until_async(done, timeout=10)
        stats = worker.statistics(queue.name)
    assert runs == [] and stats.cancelled == 3
    for i in range(3):
        with anyio.fail_after(2), pytest.raises(JobResultUnavailable) as raised:
            await queue.result(f"m{i}", timeout=30)
        assert raised.value.problem == "cancelled"
    kinds = [e.kind for e in await all_events(client, queue.keys) if e.job_id.startswith("m")]
    assert kinds == ["cancelled"] * 3
