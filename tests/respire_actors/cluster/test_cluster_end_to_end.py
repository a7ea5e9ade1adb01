"""Every public job-queue feature end to end on the 3-master cluster fixture, with the queues
of one test spread over different masters (asserted), on both backends.

Features that already have a single-queue cluster test elsewhere (grouped scheduling scripts,
lease renewal, OpenTelemetry metrics, flows, batches, recurring schedules, results, the
operator API, reliable queues/topics, stream workers, slot migration) are exercised here only
where spreading them over several masters in one worker adds something: one worker whose
registrations live on different nodes, each with its own flows, batches or schedules.
"""

from __future__ import annotations

from datetime import timedelta

import anyio
import pytest
from cluster_helpers import fast_options, names_on_distinct_masters, queue_options, running
from helpers.servers import Cluster
from helpers.waiting import wait_until, wait_until_async

from respire_actors.admin import QueueAdmin, list_queues, unregister_queue
from respire_actors.codecs import StrCodec
from respire_actors.errors import ValidationError
from respire_actors.jobs import (
    ACK,
    CONTINUE,
    Callback,
    DeadLetter,
    FlowNode,
    Job,
    JobEnqueueOptions,
    JobQueue,
    Outcome,
    RateLimit,
)
from respire_actors.jobs.options import CONSUMER_GROUP
from respire_actors.redis.client import RedisClient

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


@pytest.fixture
def names(cluster_nodes: Cluster, unique_name: str) -> list[str]:
    """Three queue names, each on its own master."""
    return names_on_distinct_masters(cluster_nodes, unique_name)


def queues_of(client: RedisClient, names: list[str]) -> list[JobQueue[str]]:
    return [JobQueue(client, n, StrCodec()) for n in names]


async def test_enqueue_deduplicates_on_every_master(
    cluster_client: RedisClient, names: list[str]
) -> None:
    queues = queues_of(cluster_client, names)
    many = [(f"m{i}", str(i)) for i in range(1200)]  # two pipelined chunks of 1000
    for q in queues:
        first = await q.enqueue("one", "x")
        again = await q.enqueue("one", "y")
        assert first.enqueued and not again.enqueued
        assert again.entry_id == first.entry_id
    # enqueue_many on the three masters at once, each pipelining its own node
    results: dict[str, list[bool]] = {}

    async def fill(q: JobQueue[str]) -> None:
        results[q.name] = [r.enqueued for r in await q.enqueue_many([*many, ("one", "z")])]

    async with anyio.create_task_group() as tg:
        for q in queues:
            tg.start_soon(fill, q)
    for q in queues:
        assert results[q.name] == [True] * 1200 + [False]
        assert await cluster_client.execute("XLEN", q.keys.ready) == 1201
    # a repeat of the whole call changes nothing (deduplicated per queue, per node)
    again_many = await queues[1].enqueue_many(many[:10])
    assert not any(r.enqueued for r in again_many)
    # staged enqueues (delay, priority, TTL, group) on each master
    for q in queues:
        staged = await q.enqueue_scheduled_many(
            [("later", "l"), ("grouped", "g")], JobEnqueueOptions(delay=60, priority=2, ttl=600)
        )
        assert [s.enqueued for s in staged] == [True, True]
        assert await cluster_client.execute("XLEN", q.keys.scheduled) == 2


async def test_transactional_enqueue_on_one_queue_and_refused_across_slots(
    cluster_client: RedisClient, names: list[str]
) -> None:
    a, b, _ = queues_of(cluster_client, names)
    async with cluster_client.transaction() as tx:
        now = a.enqueue_in(tx, "tx", "t")
        later = a.enqueue_scheduled_in(tx, "tx-later", "l", JobEnqueueOptions(delay=60))
        await tx.commit()
    assert now.result().enqueued and later.result().enqueued
    assert await cluster_client.execute("XLEN", a.keys.ready) == 1
    # two queues on two masters cannot share a transaction: refused before anything is sent
    async with cluster_client.transaction() as tx:
        a.enqueue_in(tx, "cross-a", "x")
        with pytest.raises(ValidationError, match="one hash slot"):
            b.enqueue_in(tx, "cross-b", "x")
    async with cluster_client.transaction(a.keys.ready) as tx:  # a watched key decides too
        with pytest.raises(ValidationError, match="one hash slot"):
            b.enqueue_in(tx, "cross-b", "x")
    assert await cluster_client.execute("XLEN", a.keys.ready) == 1
    assert await cluster_client.execute("EXISTS", b.keys.ready) == 0


async def test_one_worker_serves_queues_on_three_masters(
    cluster_client: RedisClient, names: list[str]
) -> None:
    """Processing, progress and logs, events with a cursor, scheduling and promotion,
    durable retries, dead letters, results, per-minute metrics and the queue registry: one
    worker, three registrations, three masters."""
    queues = queues_of(cluster_client, names)
    done: dict[str, set[str]] = {n: set() for n in names}
    failed_once: set[tuple[str, str]] = set()

    async def handler(job: Job[str]) -> Outcome:
        await job.report_progress(50)
        await job.log(f"{job.queue}:{job.id}")
        if job.id == "bad":
            return DeadLetter(detail="refused")
        if job.id == "flaky" and (job.queue, job.id) not in failed_once:
            failed_once.add((job.queue, job.id))
            raise RuntimeError("fails once")
        done[job.queue].add(job.id)
        return f"{job.queue}/{job.id}"  # kept as the job's result

    for q in queues:
        await q.enqueue("now", "n")
        await q.enqueue("flaky", "f")
        await q.enqueue("bad", "b")
        await q.enqueue_scheduled("later", "l", JobEnqueueOptions(delay=0.2, priority=5))
    wanted = {"now", "flaky", "later"}
    options = fast_options(delivery_limit=5, keep_results=timedelta(minutes=5))
    async with running(cluster_client, names, handler, options=options) as worker:
        await wait_until(lambda: all(done[n] >= wanted for n in names), timeout=30)
        for n in names:
            stats = worker.statistics(n)
            await wait_until(lambda s=stats: s.dead_lettered == 1)  # type: ignore[misc]
            assert stats.retried >= 1
        # the registry (written by each registration's keeper) lists all three queues
        await wait_until_async(lambda: _listed(cluster_client, names))
    for q in queues:
        assert await q.get_logs("now") == [f"{q.name}:now"]
        assert await q.result("later", timeout=1) == f"{q.name}/later"
        assert (await q.status("bad")).state == "dead-lettered"
        ((_, fields),) = await q.read_dead_letters(10)
        assert fields["_respire.job.id"] == b"bad"
        metrics = await q.read_metrics(5)
        assert sum(m.completed for m in metrics) == 3
        assert sum(m.failed for m in metrics) >= 1
        # events: everything from the start, then only what follows a saved cursor
        seen = []
        async with q.read_events(block=timedelta(milliseconds=50)) as events:
            with anyio.move_on_after(1):
                async for event in events:
                    seen.append(event)
            cursor = events.cursor
        kinds = {(e.kind, e.job_id) for e in seen}
        assert {("completed", "now"), ("dead-letter", "bad"), ("progress", "later")} <= kinds
        assert await q.pause()
        async with q.read_events(cursor, block=timedelta(milliseconds=50)) as events:
            with anyio.fail_after(5):
                after = await events.__anext__()
        assert after.kind == "paused"
        # the operator API: one dead letter back to the ready stream on this node
        admin = QueueAdmin(cluster_client, q.name)
        page = await admin.dead_letters()
        assert await admin.retry_dead_letters([page.rows[0].dead_id]) == 1
        await unregister_queue(cluster_client, q.name)


async def _listed(client: RedisClient, names: list[str]) -> bool:
    return set(names) <= set(await list_queues(client))


async def test_fencing_on_each_master(cluster_client: RedisClient, names: list[str]) -> None:
    """A handler whose delivery was taken over cannot complete it, on any node."""
    queues = queues_of(cluster_client, names)
    entries = {q.name: (await q.enqueue("j", "x")).entry_id for q in queues}
    started: set[str] = set()
    release = anyio.Event()

    async def handler(job: Job[str]) -> Outcome:
        started.add(job.queue)
        with anyio.CancelScope(shield=True):  # keep running after the lease is lost
            await release.wait()
        return ACK

    options = fast_options(visibility_timeout=timedelta(seconds=60), renew_leases=False)
    async with running(
        cluster_client, names, handler, options=options, with_queue_options=False
    ) as worker:
        await wait_until(lambda: started == set(names))
        for q in queues:
            claimed = await cluster_client.execute(
                "XCLAIM", q.keys.ready, CONSUMER_GROUP, "thief", 0, entries[q.name]
            )
            assert len(claimed) == 1
        release.set()
        for n in names:
            stats = worker.statistics(n)
            await wait_until(lambda s=stats: s.stale_completions == 1)  # type: ignore[misc]
            assert stats.acked == 0
    for q in queues:
        rows = await cluster_client.execute("XPENDING", q.keys.ready, CONSUMER_GROUP, "-", "+", 10)
        assert [(r[0].decode(), r[1].decode()) for r in rows] == [(entries[q.name], "thief")]


async def test_controls_on_three_masters(cluster_client: RedisClient, names: list[str]) -> None:
    """Pause on one master, a rate limit on another, batch cancellation and flow removal on
    the third, deletion of acknowledged entries on all: each queue's control applies to it
    alone."""
    paused, limited, third = queues_of(cluster_client, names)
    ran: dict[str, list[str]] = {n: [] for n in names}

    async def handler(job: Job[str]) -> Outcome:
        ran[job.queue].append(job.id)
        return ACK

    assert await paused.pause()
    await limited.set_rate_limit(RateLimit(2, timedelta(seconds=1)))
    await paused.enqueue("p", "x")
    await limited.enqueue_many([(f"r{i}", "x") for i in range(5)])
    batch = await third.create_batch(on_complete=Callback("cb", "c"), batch_id="b")
    await third.add_many_to_batch(batch, [("b1", "1"), ("b2", "2")])
    assert await third.cancel_batch(batch)
    await third.seal_batch(batch)
    assert await third.enqueue_flow("f", FlowNode("root", "r", [FlowNode("leaf", "l")]), CONTINUE)
    deleting = queue_options(delete_acknowledged_entries=True)
    async with running(cluster_client, names, handler, queue_opts=deleting) as worker:
        await wait_until(lambda: "cb" in ran[third.name] and "root" in ran[third.name])
        await wait_until(lambda: len(ran[limited.name]) == 5, timeout=15)
        assert worker.statistics(limited.name).rate_limited_reads >= 1
        held = worker.statistics(paused.name)  # the startup replay is refused while paused
        await wait_until(lambda: held.denied_claims + held.paused_reads >= 2)
        assert ran[paused.name] == []
        assert await paused.resume()
        await wait_until(lambda: ran[paused.name] == ["p"])
    # acknowledged entries were deleted on every master
    for q in (paused, limited, third):
        assert await cluster_client.execute("XLEN", q.keys.ready) == 0
    # cancelled members were skipped, not run
    assert set(ran[third.name]) == {"cb", "leaf", "root"}
    status = await third.batch_status(batch)
    assert status is not None and status.completed and status.cancellation_requested
    assert status.cancelled == 2
    assert [n.status for n in await third.flow_results("f")] == ["completed", "completed"]
    assert await third.remove_flow("f")
    assert await third.flow_results("f") == []
    assert await third.remove_batch(batch)


async def test_recurring_schedules_and_groups_on_three_masters(
    cluster_client: RedisClient, names: list[str]
) -> None:
    """One worker ticks the schedules of three queues on three masters and runs their grouped
    jobs under each queue's own group limits."""
    queues = queues_of(cluster_client, names)
    ticks: dict[str, int] = dict.fromkeys(names, 0)
    grouped: dict[str, list[str]] = {n: [] for n in names}

    async def handler(job: Job[str]) -> Outcome:
        if job.schedule_id is not None:
            ticks[job.queue] += 1
        elif job.group is not None:
            grouped[job.queue].append(job.id)
        return ACK

    for q in queues:
        await q.scheduler().upsert("tick", "t", interval=timedelta(milliseconds=100))
        await q.set_group_options("g", max_concurrency=1)
        await q.enqueue_scheduled_many([("g1", "1"), ("g2", "2")], JobEnqueueOptions(group="g"))
    async with running(cluster_client, names, handler, recurring=True):
        await wait_until(lambda: all(t >= 2 for t in ticks.values()), timeout=20)
        await wait_until(lambda: all(len(g) == 2 for g in grouped.values()))
    for q in queues:
        info = await q.get_group("g")
        assert info.options.max_concurrency == 1 and info.staged == 0
