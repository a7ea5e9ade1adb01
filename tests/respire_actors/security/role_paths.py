"""The whole path of each ACL role, as one coroutine per role (docs/security.md).

Each path takes an entered client (logged in as the role's user in the tests, as an
unrestricted user for set-up) and a queue name, and drives every call that role makes. The
paths are written so they can run in order on one queue: producer, scheduler, worker, then
observer and operator read what the worker left.
"""

from __future__ import annotations

from datetime import timedelta

import anyio

from respire_actors.codecs import StrCodec
from respire_actors.jobs import (
    ACK,
    Callback,
    FlowNode,
    JobEnqueueOptions,
    JobQueue,
    Outcome,
    QueueOptions,
    RateLimit,
    RecurringOptions,
    Worker,
    WorkerOptions,
)
from respire_actors.jobs.job import Job
from respire_actors.redis.client import RedisClient

JOBS = ("plain", "many-1", "many-2", "tx", "later", "grouped", "flaky")
"""Job ids the producer path enqueues (``later`` delayed, ``grouped`` in group ``g``,
``flaky`` fails once and is retried with backoff)."""

FLOW_JOBS = ("flow-root", "flow-leaf-1", "flow-leaf-2")
"""The producer's flow ``flow``: a root whose two leaves run first."""

BATCH_JOBS = ("batch-1", "batch-2", "batch-3", "batch-done")
"""The producer's sealed batch ``batch`` and its ``on_complete`` callback (it also leaves an
empty batch ``open`` unsealed)."""


def queue_of(client: RedisClient, name: str) -> JobQueue[str]:
    return JobQueue(client, name, StrCodec())


async def producer_path(client: RedisClient, name: str) -> None:
    """Immediate, batched, transactional, delayed, grouped and batched-delayed enqueues."""
    queue = queue_of(client, name)
    await queue.enqueue("plain", "p")
    await queue.enqueue_many([("many-1", "m1"), ("many-2", "m2")])
    async with client.transaction() as tx:
        pending = queue.enqueue_in(tx, "tx", "t")
        staged = queue.enqueue_scheduled_in(tx, "tx-later", "tl", JobEnqueueOptions(delay=0.05))
        await tx.commit()
    assert pending.result().enqueued and staged.result().enqueued
    await queue.enqueue_scheduled("later", "l", JobEnqueueOptions(delay=0.05, priority=3))
    await queue.enqueue_scheduled("grouped", "g", JobEnqueueOptions(group="g"))
    await queue.enqueue_scheduled_many([("flaky", "f")], JobEnqueueOptions(ttl=60))
    again = await queue.enqueue("plain", "p")  # a duplicate: the dedup record is read back
    assert not again.enqueued
    await flow_and_batch_path(client, name)


async def flow_and_batch_path(client: RedisClient, name: str) -> None:
    """A flow and a sealed batch with a callback (the producer's coordinated enqueues)."""
    queue = queue_of(client, name)
    tree = FlowNode("flow-root", "r", [FlowNode("flow-leaf-1", "1"), FlowNode("flow-leaf-2", "2")])
    assert await queue.enqueue_flow("flow", tree)
    assert not await queue.enqueue_flow("flow", tree)  # flow ids deduplicate
    batch = await queue.create_batch(on_complete=Callback("batch-done", "c"), batch_id="batch")
    assert await queue.add_to_batch(batch, "batch-1", "1")
    assert await queue.add_many_to_batch(batch, [("batch-2", "2"), ("batch-3", "3")]) == [
        True,
        True,
    ]
    assert await queue.seal_batch(batch)
    assert await queue.create_batch(batch_id="open") == "open"  # left open, empty


async def scheduler_path(client: RedisClient, name: str) -> None:
    """Recurring schedules admin: create, read, list, replace, remove."""
    scheduler = queue_of(client, name).scheduler()
    await scheduler.upsert("tick", "r", interval=timedelta(milliseconds=50))
    await scheduler.upsert("gone", "x", cron="0 0 * * *")
    assert await scheduler.get("tick") is not None
    page = await scheduler.list()
    assert {s.schedule_id for s in page.schedules} == {"tick", "gone"}
    assert await scheduler.remove("gone")


def worker_options() -> WorkerOptions:
    return WorkerOptions(
        consumer_count=4,
        visibility_timeout=timedelta(milliseconds=300),  # the renewer must renew
        recovery_interval=timedelta(milliseconds=50),
        poll_interval=timedelta(milliseconds=100),
        shutdown_grace=timedelta(seconds=5),
        delivery_limit=5,
        keep_results=timedelta(minutes=5),
    )


def queue_options() -> QueueOptions:
    return QueueOptions(
        scheduling_poll_interval=timedelta(milliseconds=50),
        retry_backoff=timedelta(milliseconds=20),
        rate_limit=RateLimit(1000, timedelta(seconds=1)),
        metrics_retention_minutes=5,
        delete_acknowledged_entries=True,
    )


async def worker_path(client: RedisClient, name: str, *, expect: set[str] | None = None) -> None:
    """A worker with scheduling, retries, groups, the recurring ticker and the renewer: runs
    until every produced job (and one recurring tick) has been acknowledged."""
    done: set[str] = set()
    failed_once: set[str] = set()
    ticks = 0
    wanted = set(JOBS) | set(FLOW_JOBS) | set(BATCH_JOBS) | {"tx-later"}
    if expect is not None:
        wanted = expect
    finished = anyio.Event()

    def check() -> None:
        if wanted <= done and ticks >= 1:
            finished.set()

    async def handler(job: Job[str]) -> Outcome:
        nonlocal ticks
        if job.schedule_id is not None:
            ticks += 1
            check()
            return ACK
        await job.report_progress(50)
        await job.log(f"running {job.id}")
        if job.id == "grouped":
            await anyio.sleep(0.5)  # longer than the visibility timeout: renewed meanwhile
        if job.id == "flaky" and job.id not in failed_once:
            failed_once.add(job.id)
            raise RuntimeError("fails once")
        done.add(job.id)
        check()
        return ACK

    worker = Worker()
    worker.register(
        name,
        handler,
        StrCodec(),
        worker_options(),
        queue_options=queue_options(),
        recurring=RecurringOptions(poll_interval=timedelta(milliseconds=50)),
    )
    async with anyio.create_task_group() as tg:
        await tg.start(worker.run, client)
        try:
            with anyio.fail_after(20):
                await finished.wait()
        finally:
            with anyio.fail_after(15, shield=True):
                await worker.stop()


async def observer_path(client: RedisClient, name: str) -> None:
    """Events, state, logs, status and result, metrics."""
    queue = queue_of(client, name)
    async with queue.read_events("$", block=timedelta(milliseconds=10)) as events:
        with anyio.move_on_after(0.05):
            await events.__anext__()
    async with queue.read_events(block=timedelta(milliseconds=10)) as events:
        first = await events.__anext__()
        assert first.kind
    await queue.get_state()
    assert await queue.get_logs("plain") == ["running plain"]
    status = await queue.status("plain")
    assert status.state == "completed"
    assert await queue.result("plain", timeout=1) is None
    metrics = await queue.read_metrics(5)
    assert sum(m.completed for m in metrics) >= len(JOBS)
    flow = await queue.flow_results("flow")
    assert [(n.id, n.status) for n in flow] == [(j, "completed") for j in FLOW_JOBS]
    batch = await queue.batch_status("batch")
    assert batch is not None and batch.completed and batch.succeeded == 3


async def operator_path(client: RedisClient, name: str) -> None:
    """Pause and resume, the rate policy, group administration, dead letters."""
    queue = queue_of(client, name)
    assert await queue.pause()
    assert await queue.resume()
    await queue.set_rate_limit(RateLimit(1000, timedelta(seconds=1)))
    await queue.set_group_options("g", max_concurrency=2)
    assert await queue.pause_group("g")
    assert await queue.resume_group("g")
    await queue.get_group("g")
    await queue.list_groups()
    await queue.read_dead_letters(10)
    await queue.get_state()
    # coordinated work: inspect a flow, cancel a batch (its queued members are skipped)
    assert [n.id for n in await queue.flow_results("flow")] == list(FLOW_JOBS)
    status = await queue.batch_status("batch")
    assert status is not None
    # True while members are pending (the producer's batch before any worker ran)
    assert await queue.cancel_batch("batch") is not status.completed
