"""A queue's slot migrated while a producer and a worker run on it (issue 15).

The slot is held half-migrated for seconds (as a slot full of deduplication keys is): multi-key
scripts touching a key that does not exist yet get ``TRYAGAIN`` for the whole time. Nothing may
crash: the client retries within ``cluster_retry_timeout`` and then raises
:class:`ClusterReconfiguring` (the command did not run, so the producer repeats it); the worker's
actors wait it out. Every accepted job completes exactly once, the queue on another master is
served throughout, and processing resumes by itself.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from helpers.servers import Cluster, key_slot, start_cluster
from helpers.waiting import wait_until, wait_until_async

from respire_actors import (
    ClusterReconfiguring,
    DeadLetter,
    Job,
    JobEnqueueOptions,
    JobQueue,
    PartitionedJobQueue,
    QueueOptions,
    StrCodec,
    Worker,
    WorkerOptions,
)
from respire_actors.keys import JobQueueKeys
from respire_actors.redis.client import RedisClient, connect
from supervisors import SupervisorSnapshot

pytestmark = pytest.mark.anyio

HOLD = float(os.environ.get("RESPIRE_MIGRATION_HOLD", "6"))  # 30 for the long move


@pytest.fixture
def own_cluster(tmp_path: Path) -> Iterator[Cluster]:
    """A cluster of its own: this test moves slots, which the shared fixture must not see."""
    cluster = start_cluster(tmp_path / "cluster", masters=3)
    try:
        yield cluster
    finally:
        cluster.stop()


def queues_on_two_masters(cluster: Cluster) -> tuple[str, str]:
    moving = "orders"
    slot = key_slot(JobQueueKeys(moving).ready)
    owner = cluster.owner_of(slot).port
    i = 0
    while True:
        other = f"billing-{i}"
        other_slot = key_slot(JobQueueKeys(other).ready)
        if cluster.owner_of(other_slot).port != owner:
            return moving, other
        i += 1


async def completed_counts(client: RedisClient, queue: JobQueue[str]) -> Counter[str]:
    counts: Counter[str] = Counter()
    for _, flat in await client.execute("XRANGE", queue.keys.events, "-", "+"):
        fields = dict(zip(flat[0::2], flat[1::2], strict=True))
        if fields[b"kind"] == b"completed":
            counts[fields[b"job_id"].decode()] += 1
    return counts


@pytest.mark.xdist_group("heavy")  # one heavy test at a time under xdist (tests/conftest.py)
async def test_a_slot_migration_under_load_loses_and_duplicates_nothing(
    own_cluster: Cluster,
) -> None:
    moving_name, other_name = queues_on_two_masters(own_cluster)
    async with connect(own_cluster.url, cluster_retry_timeout=0.5) as client:
        moving = JobQueue(client, moving_name, StrCodec())
        other = JobQueue(client, other_name, StrCodec())
        for i in range(200):  # history: a slot with keys to move
            await moving.enqueue(f"before-{i}", "x")
        handled: Counter[str] = Counter()

        async def handler(job: Job[str]) -> None:
            handled[f"{job.queue}:{job.id}"] += 1

        worker = Worker()
        options = WorkerOptions(
            consumer_count=8, poll_interval=0.05, recovery_interval=0.2, shutdown_grace=5
        )
        worker.register(moving_name, handler, StrCodec(), options)
        worker.register(other_name, handler, StrCodec(), options)
        accepted: list[str] = []
        other_accepted: list[str] = []
        refused = 0
        migrating = anyio.Event()
        done = anyio.Event()

        async def produce() -> None:
            nonlocal refused
            i = 0
            while not done.is_set():
                job_id = f"during-{i}"
                try:
                    await moving.enqueue(job_id, "x")
                except ClusterReconfiguring:
                    refused += 1  # it did not run: repeat the same call, as an app would
                    continue
                accepted.append(job_id)
                await other.enqueue(job_id, "y")
                other_accepted.append(job_id)
                i += 1
                await anyio.sleep(0.005)

        async def migrate() -> None:
            slot = key_slot(moving.keys.ready)
            source = own_cluster.owner_of(slot)
            target = next(n for n in own_cluster.nodes if n.port != source.port)
            # load before and after the move is counted in jobs, not slept for: a loaded machine
            # (parallel test workers) enqueues far fewer jobs in a fixed time
            await wait_until(lambda: len(accepted) >= 30, timeout=30)
            migrating.set()
            keep = [moving.keys.ready, moving.keys.events]  # the streams move last
            await anyio.to_thread.run_sync(
                lambda: own_cluster.migrate_slot(slot, target, hold=HOLD, last=keep)
            )
            moved = len(accepted)
            await wait_until(lambda: len(accepted) >= moved + 30, timeout=30)  # enqueues resume
            done.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(worker.run, client)
            tg.start_soon(produce)
            await migrate()
            # processing resumes by itself: everything accepted completes
            await wait_until(
                lambda: (
                    sum(1 for k in handled if k.startswith(moving_name)) >= 200 + len(accepted)
                    and sum(1 for k in handled if k.startswith(other_name)) >= len(other_accepted)
                ),
                timeout=60,
            )
            snapshot = worker.snapshot()
            await worker.stop()
            tg.cancel_scope.cancel()

        assert migrating.is_set() and len(accepted) > 50
        assert client.statistics().cluster_retries > 0  # the move was really felt
        completed = await completed_counts(client, moving)
        expected = {f"before-{i}" for i in range(200)} | set(accepted)
        assert set(completed) == expected  # nothing lost
        assert all(n == 1 for n in completed.values())  # no second completion
        assert all(n == 1 for n in handled.values())  # no handler ran twice here
        assert snapshot is not None
        restarts = _restarts(snapshot)
        assert restarts == 0, f"actors crashed and were restarted {restarts} times"


def _restarts(snapshot: SupervisorSnapshot) -> int:
    total = 0
    for child in snapshot.children:
        total += child.restart_count
        if child.supervisor is not None:
            total += _restarts(child.supervisor)
    return total


async def test_a_producer_gets_a_typed_error_that_says_nothing_ran(own_cluster: Cluster) -> None:
    async with connect(own_cluster.url, cluster_retry_timeout=0.3) as client:
        queue = JobQueue(client, "orders", StrCodec())
        await queue.enqueue("first", "x")
        slot = key_slot(queue.keys.ready)
        source = own_cluster.owner_of(slot)
        target = next(n for n in own_cluster.nodes if n.port != source.port)
        source_id = source.execute("CLUSTER", "MYID")
        target_id = target.execute("CLUSTER", "MYID")
        target.execute("CLUSTER", "SETSLOT", slot, "IMPORTING", source_id)  # type: ignore[arg-type]
        source.execute("CLUSTER", "SETSLOT", slot, "MIGRATING", target_id)  # type: ignore[arg-type]
        started = anyio.current_time()
        with pytest.raises(ClusterReconfiguring, match="did not run") as raised:
            await queue.enqueue("second", "x")  # the stream is here, its dedup key is not
        assert raised.value.ran is False
        assert anyio.current_time() - started >= 0.3  # retried for the budget first
        assert client.statistics().cluster_retries > 0
        assert source.execute("XLEN", queue.keys.ready) == 1
        for node in (source, target):
            node.execute("CLUSTER", "SETSLOT", slot, "STABLE")
        assert (await queue.enqueue("second", "x")).enqueued  # the same call, repeated
        assert await client.execute("XLEN", queue.keys.ready) == 2


async def test_a_worker_started_while_its_slot_is_half_migrated_waits_and_runs(
    own_cluster: Cluster,
) -> None:
    """Its start-up (the consumer group's creation, a multi-key script) is refused with
    TRYAGAIN for the whole hold: the worker must wait for the move, not crash at start."""
    hold = 3.0
    async with connect(own_cluster.url, cluster_retry_timeout=0.2) as client:
        queue = JobQueue(client, "orders", StrCodec())
        for i in range(20):
            await queue.enqueue(f"j{i}", "x")
        slot = key_slot(queue.keys.ready)
        source = own_cluster.owner_of(slot)
        target = next(n for n in own_cluster.nodes if n.port != source.port)
        handled: Counter[str] = Counter()

        async def handler(job: Job[str]) -> None:
            handled[job.id] += 1

        worker = Worker()
        worker.register("orders", handler, StrCodec(), WorkerOptions(consumer_count=2))
        moved = anyio.Event()

        async def migrate() -> None:
            keep = [queue.keys.ready, queue.keys.events]
            await anyio.to_thread.run_sync(
                lambda: own_cluster.migrate_slot(slot, target, hold=hold, last=keep)
            )
            moved.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(migrate)
            held = {queue.keys.ready.encode(), queue.keys.events.encode()}

            def only_streams_left() -> bool:
                return set(source.execute("CLUSTER", "GETKEYSINSLOT", slot, 100)) <= held  # type: ignore[arg-type]

            await wait_until(only_streams_left)  # the other keys moved: the slot is split
            await tg.start(worker.run, client)  # starts (ready) only once the move ended
            assert moved.is_set() or client.statistics().cluster_retries > 0
            await wait_until(lambda: len(handled) == 20, timeout=20)
            await worker.stop()
    assert all(n == 1 for n in handled.values())


async def test_a_completion_reaching_an_absent_undeclared_key_mid_migration_waits(
    own_cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    """A real reshard leaves the slot MIGRATING before any key has moved. Every key a
    completion declares is still on the source, so the script runs, but the keys it derives
    from them (the coordination marker, here absent) are refused inside it ("attempted to access
    a non local key"): that used to surface as an untyped ServerError, the sweeper crashed and
    restarted and the job's completion was dropped, so it ran again after its visibility
    timeout. It is a ClusterReconfiguring now: waited out, committed once the slot settles, and
    the job is not run again although the hold outlasts its visibility timeout."""
    caplog.set_level("WARNING")
    async with connect(own_cluster.url, cluster_retry_timeout=0.3) as client:
        queue = JobQueue(client, "orders", StrCodec())
        release = anyio.Event()
        started = anyio.Event()
        handled: Counter[str] = Counter()

        async def handler(job: Job[str]) -> object:
            handled[job.id] += 1
            if job.id == "bad":
                return DeadLetter()
            if job.id == "g1":
                started.set()
                await release.wait()
            return None

        worker = Worker()
        options = WorkerOptions(
            consumer_count=4, poll_interval=0.05, recovery_interval=0.2, visibility_timeout=1.5
        )
        worker.register(
            "orders", handler, StrCodec(), options,
            queue_options=QueueOptions(scheduling_poll_interval=0.05),
        )  # fmt: skip
        async with anyio.create_task_group() as tg:
            await tg.start(worker.run, client)
            await queue.enqueue("bad", "x")  # the dead-letter stream exists
            await wait_until(lambda: handled["bad"] == 1, timeout=10)
            await queue.set_group_options("g", max_concurrency=1)
            await queue.enqueue_scheduled("g1", "x", JobEnqueueOptions(group="g"))
            await queue.enqueue_scheduled("g2", "x", JobEnqueueOptions(group="g"))
            with anyio.fail_after(10):
                await started.wait()
            k = queue.keys

            async def parked() -> bool:  # g2 waits for g1's permit
                return bool(await client.execute("EXISTS", k.group_parked))

            await wait_until_async(parked, timeout=10)  # every key job_complete declares exists
            for key in (k.ready, k.events, k.dead, k.group_leases, k.group_owners, k.group_parked):
                assert await client.execute("EXISTS", key) == 1, key
            assert await client.execute("EXISTS", k.coordinated) == 0
            slot = key_slot(k.ready)
            source = own_cluster.owner_of(slot)
            target = next(n for n in own_cluster.nodes if n.port != source.port)
            target.execute(
                "CLUSTER", "SETSLOT", slot, "IMPORTING", source.execute("CLUSTER", "MYID")
            )  # type: ignore[arg-type]
            source.execute(
                "CLUSTER", "SETSLOT", slot, "MIGRATING", target.execute("CLUSTER", "MYID")
            )  # type: ignore[arg-type]
            release.set()
            # held for twice the visibility timeout: the finished handler's lease goes with its
            # outcome to the completer and is renewed until the commit succeeds (the renewal
            # script reaches only keys that exist), so the job is not recovered and run again
            await anyio.sleep(3)
            for node in (source, target):
                node.execute("CLUSTER", "SETSLOT", slot, "STABLE")
            counts: Counter[str] = Counter()

            async def g1_completed() -> bool:
                counts.clear()
                counts.update(await completed_counts(client, queue))
                return counts["g1"] == 1 and counts["g2"] == 1

            await wait_until_async(g1_completed, timeout=20)
            await anyio.sleep(2)  # past another visibility timeout: still no second run
            snapshot = worker.snapshot()
            await worker.stop()
    assert handled["g1"] == 1 and handled["g2"] == 1
    assert _restarts(snapshot) == 0
    messages = [r.getMessage() for r in caplog.records]
    untyped = [m for m in messages if "non local key" in m and "could not serve" not in m]
    assert not untyped, untyped[:3]


async def test_a_partition_whose_slot_migrates_holds_up_only_itself(own_cluster: Cluster) -> None:
    """Found by review: a partition whose slot was migrating (TRYAGAIN) was taken for its
    whole node being down, so every partition on that master was passed over for up to 5 s at
    a time, again and again, for the whole move. Only the migrating partition waits now."""
    partitions = 12
    async with connect(own_cluster.url, cluster_retry_timeout=0.3) as client:
        pq = PartitionedJobQueue(client, "pm", StrCodec(), partitions=partitions)
        slots = [key_slot(q.keys.ready) for q in pq.queues]
        owners = [own_cluster.owner_of(slot).port for slot in slots]
        moving = 0
        siblings = [i for i in range(1, partitions) if owners[i] == owners[moving]]
        assert siblings, owners
        handled: dict[str, float] = {}

        async def handler(job: Job[str]) -> None:
            handled[job.id] = anyio.current_time()

        worker = Worker()
        options = WorkerOptions(consumer_count=8, poll_interval=0.05, recovery_interval=0.2)
        worker.register("pm", handler, StrCodec(), options, partitions=partitions)
        async with anyio.create_task_group() as tg:
            await tg.start(worker.run, client)
            for i, q in enumerate(pq.queues):  # every partition's keys exist
                await q.enqueue(f"warm-{i}", "x")
            await wait_until(lambda: len(handled) == partitions, timeout=20)
            source = own_cluster.owner_of(slots[moving])
            target = next(n for n in own_cluster.nodes if n.port != source.port)
            target.execute(
                "CLUSTER", "SETSLOT", slots[moving], "IMPORTING", source.execute("CLUSTER", "MYID")
            )  # type: ignore[arg-type]
            source.execute(
                "CLUSTER", "SETSLOT", slots[moving], "MIGRATING", target.execute("CLUSTER", "MYID")
            )  # type: ignore[arg-type]
            latencies: list[float] = []
            try:
                for n in range(20):  # about 4 s of the slot half-migrated
                    sibling = pq.queues[siblings[n % len(siblings)]]
                    sent = anyio.current_time()
                    await sibling.enqueue(f"s-{n}", "x")
                    await wait_until(lambda n=n: f"s-{n}" in handled, timeout=20)  # type: ignore[misc]
                    latencies.append(handled[f"s-{n}"] - sent)
                    await anyio.sleep(0.1)
            finally:
                for node in (source, target):
                    node.execute("CLUSTER", "SETSLOT", slots[moving], "STABLE")
            await pq.queues[moving].enqueue("after", "x")
            await wait_until(lambda: "after" in handled, timeout=20)  # served again by itself
            await worker.stop()
    assert max(latencies) < 1.5, latencies
