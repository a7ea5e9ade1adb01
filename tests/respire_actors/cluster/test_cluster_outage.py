"""One queue's outage never stops the other queues of a worker (docs/architecture.md,
"Restart policy"): a worker serves queue A on one master and queue B on another of a private
3-master cluster; A's master is frozen (SIGSTOP) for longer than the tree's (small, test-sized)
restart limits would tolerate, B keeps processing, and A resumes once its master is back, with
every job run exactly once."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import anyio
import anyio.to_thread
import pytest
from cluster_helpers import fast_options, names_on_distinct_masters
from helpers.servers import Cluster, ValkeyProcess, key_slot, start_cluster
from helpers.waiting import wait_until, wait_until_async

from respire_actors import RestartLimits
from respire_actors.chaos.cluster import replication_lag
from respire_actors.codecs import StrCodec
from respire_actors.jobs import (
    ACK,
    Job,
    JobQueue,
    Outcome,
    PartitionedJobQueue,
    QueueOptions,
    Worker,
)
from respire_actors.jobs.options import CONSUMER_GROUP
from respire_actors.keys import JobQueueKeys
from respire_actors.redis.client import RedisClient, connect
from supervisors import Backoff

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

LIMITS = RestartLimits(
    actor_max_restarts=2,
    actor_period=2.0,
    actor_backoff=Backoff(initial=0.05, maximum=0.2),
    outage_backoff=Backoff(initial=0.2, maximum=0.5),
    root_max_restarts=0,
    root_period=60.0,
)
"""Small limits: a few seconds of failing actors exceed them many times over, and a single
escalation to the root would stop the worker."""

OUTAGE = 6.0


@pytest.fixture
def three_masters(tmp_path: Path) -> Iterator[Cluster]:
    cluster = start_cluster(tmp_path / "cluster", masters=3)
    try:
        # the two live masters are a majority and, once the frozen one is marked failed, keep
        # serving their own slots
        for node in cluster.nodes:
            node.execute("CONFIG", "SET", "cluster-require-full-coverage", "no")
        yield cluster
    finally:
        for node in cluster.nodes:
            with contextlib.suppress(ProcessLookupError):  # a node a test killed and reaped
                os.kill(node.pid, signal.SIGCONT)
        cluster.stop()


async def pending(client: RedisClient, queue: JobQueue[str]) -> int:
    return int((await client.execute("XPENDING", queue.keys.ready, CONSUMER_GROUP))[0])


async def keep_b_busy(b: JobQueue[str], runs: Counter[str], seconds: float, tag: str) -> int:
    """Enqueue on B and wait for each job to run, for ``seconds``; returns how many ran."""
    deadline = anyio.current_time() + seconds
    i = 0
    while anyio.current_time() < deadline:
        await b.enqueue(f"{tag}{i}", "x")
        await wait_until(lambda n=i: runs[f"{b.name}:{tag}{n}"] == 1, timeout=5)
        i += 1
        await anyio.sleep(0.1)
    return i


def fill_node(node: ValkeyProcess, tag: str, count: int) -> None:
    """``count`` keys of one hash tag (one slot of ``node``), for a long reload."""
    with node.sync_client(timeout=30) as conn:
        for start in range(0, count, 1000):
            batch = range(start, min(count, start + 1000))
            for n in batch:
                conn.send("SET", f"{{{tag}}}:filler:{n}", "x")
            for _ in batch:
                conn.read_reply()


def reload_slowly(node: ValkeyProcess) -> float:
    """DEBUG RELOAD: the node answers LOADING to everyone else until it has reloaded; returns
    how long that took."""
    started = time.monotonic()
    with node.sync_client(timeout=60) as conn:
        conn.execute("DEBUG", "RELOAD")
    return time.monotonic() - started


async def _reload(node: ValkeyProcess, took: list[float]) -> None:
    took.append(await anyio.to_thread.run_sync(reload_slowly, node))


async def test_an_outage_of_one_master_stops_only_its_own_queue(
    three_masters: Cluster, unique_name: str
) -> None:
    """Phase 1: A's master frozen (SIGSTOP) for longer than the restart limits; its commands
    time out. Phase 2: A's master reloads its data set and answers LOADING for seconds, with
    A's completions in flight. B is served all along; A's actors wait both out (nothing is
    restarted, nothing escalates: ``root_max_restarts=0`` would stop the worker at once)."""
    a_name, b_name, _ = names_on_distinct_masters(three_masters, unique_name, 3)
    node = three_masters.owner_of(key_slot(JobQueueKeys(a_name).ready))
    runs: Counter[str] = Counter()

    async def handler(job: Job[str]) -> Outcome:
        runs[f"{job.queue}:{job.id}"] += 1
        if job.queue == a_name:
            await anyio.sleep(0.3)  # in flight when the master freezes
        return ACK

    async with connect(three_masters.url, command_timeout=0.5, connect_timeout=0.5) as client:
        a, b = JobQueue(client, a_name, StrCodec()), JobQueue(client, b_name, StrCodec())
        worker = Worker(restart_limits=LIMITS)
        for name in (a_name, b_name):
            worker.register(name, handler, StrCodec(), fast_options(delivery_limit=10))
        async with anyio.create_task_group() as tg:
            await tg.start(worker.run, client)
            # phase 1: frozen
            await a.enqueue_many([(f"a{i}", "x") for i in range(4)])
            await wait_until(lambda: runs[f"{a_name}:a0"] == 1)
            os.kill(node.pid, signal.SIGSTOP)
            try:
                served = await keep_b_busy(b, runs, OUTAGE, "frozen")
            finally:
                os.kill(node.pid, signal.SIGCONT)
            assert served >= 20  # B kept processing all along
            await a.enqueue_many([(f"a{i}", "x") for i in range(4, 8)])
            await wait_until(lambda: all(runs[f"{a_name}:a{j}"] for j in range(8)), timeout=30)
            # phase 2: loading, with A's completions in flight
            fill_node(node, JobQueueKeys(a_name).ready.split("}")[0][1:], 20_000)  # A's slot
            node.execute("CONFIG", "SET", "key-load-delay", "300")
            node.execute("CONFIG", "SET", "loading-process-events-interval-bytes", "1024")
            await a.enqueue_many([(f"a{i}", "x") for i in range(8, 12)])
            await wait_until(lambda: runs[f"{a_name}:a8"] == 1)
            reloaded: list[float] = []
            async with anyio.create_task_group() as reload:
                reload.start_soon(_reload, node, reloaded)
                served = await keep_b_busy(b, runs, 3.0, "loading")
            assert reloaded[0] >= 3.0 and served >= 10  # B ran while A's master was loading
            node.execute("CONFIG", "SET", "key-load-delay", "0")
            await a.enqueue_many([(f"a{i}", "x") for i in range(12, 16)])
            await wait_until(lambda: all(runs[f"{a_name}:a{j}"] for j in range(16)), timeout=30)
            await wait_until_async(lambda: _drained(client, a), timeout=30)
            snapshot = worker.snapshot()
            await worker.stop()
        assert snapshot is not None
        assert snapshot.restarts_in_period == 0  # nothing escalated to the root
        (queue_a,) = [c for c in snapshot.children if c.name == f"queue:{a_name}"]
        assert queue_a.supervisor is not None
        assert [c.restart_count for c in queue_a.supervisor.children] == [0] * len(
            queue_a.supervisor.children
        )  # a frozen or loading server is an outage to wait out, not a crash
        assert {k: v for k, v in runs.items() if v != 1} == {}  # each job ran once
        assert await pending(client, b) == 0


async def _drained(client: RedisClient, queue: JobQueue[str]) -> bool:
    return await pending(client, queue) == 0


async def test_a_client_connects_while_the_owner_of_slot_zero_is_down(
    three_masters: Cluster, unique_name: str
) -> None:
    """Keyless commands (the COMMAND INFO of connect(), the sampler's TIME) always went to the
    first primary of the slot map, the owner of slot 0: while it was down no worker, producer
    or operator command could even connect, though the other masters served their slots."""
    first = three_masters.owner_of(0)
    live = [n for n in three_masters.nodes if n is not first]
    names = [
        n
        for n in names_on_distinct_masters(three_masters, unique_name)
        if three_masters.owner_of(key_slot(JobQueueKeys(n).ready)) is not first
    ]
    os.kill(first.pid, signal.SIGKILL)
    url = "redis+cluster://" + ",".join(f"127.0.0.1:{n.port}" for n in live)
    with anyio.fail_after(20):
        async with connect(url) as client:
            assert await client.time_ms() > 0
            queue = JobQueue(client, names[0], StrCodec())
            assert (await queue.enqueue("a", "x")).enqueued


@pytest.mark.parametrize("command_timeout", [0.5, 5.0])
async def test_a_partitioned_queue_serves_its_other_partitions_while_one_master_is_frozen(
    three_masters: Cluster, unique_name: str, command_timeout: float
) -> None:
    """One partitioned queue over three masters, one master frozen (SIGSTOP): the partitions
    on the others keep being read, run and committed (a read, a wait, a recovery pass, a
    batch of completions or a promotion touching the frozen partitions used to fail as a
    whole, so the worker served nothing at all); once the master is back its partitions'
    jobs run too, each exactly once. With the default 5 s command timeout as well: a dead
    node's timeouts must not sit on the reader's path (they held every read and wait up for
    seconds, so the healthy partitions got a job through every few seconds)."""
    runs: Counter[str] = Counter()

    async def handler(job: Job[str]) -> Outcome:
        runs[job.id] += 1
        return ACK

    timeouts = {"command_timeout": command_timeout, "connect_timeout": command_timeout}
    async with connect(three_masters.url, **timeouts) as client:
        queue = PartitionedJobQueue(client, unique_name, StrCodec(), partitions=12)
        frozen_node = three_masters.owner_of(key_slot(queue.partition(0).keys.ready))
        frozen = {
            i
            for i in range(12)
            if three_masters.owner_of(key_slot(queue.partition(i).keys.ready)) is frozen_node
        }
        assert 0 < len(frozen) < 12
        keys = {i: next(f"k{n}" for n in range(10_000) if queue.partition_of(f"k{n}") == i)
                for i in range(12)}  # fmt: skip
        worker = Worker(restart_limits=LIMITS)
        worker.register(
            unique_name,
            handler,
            StrCodec(),
            fast_options(delivery_limit=10),
            queue_options=QueueOptions(),
            partitions=12,
        )
        async with anyio.create_task_group() as tg:
            await tg.start(worker.run, client)
            await queue.enqueue_many([(f"before-{i}", "x", keys[i]) for i in range(12)])
            await wait_until(lambda: len(runs) == 12, timeout=15)
            os.kill(frozen_node.pid, signal.SIGSTOP)
            try:
                # jobs for every partition: the healthy ones must run during the outage
                healthy = [i for i in range(12) if i not in frozen]
                for round_ in range(6):
                    for i in healthy:
                        await queue.enqueue(f"during-{round_}-{i}", "x", ordering_key=keys[i])
                    # noticing the node is down costs one command timeout, once; after that
                    # the healthy partitions must flow at their normal pace
                    await wait_until(
                        lambda r=round_: all(runs[f"during-{r}-{i}"] for i in healthy),  # type: ignore[misc]
                        timeout=3 + (command_timeout if round_ == 0 else 0),
                    )
                    await anyio.sleep(0.5)
            finally:
                os.kill(frozen_node.pid, signal.SIGCONT)
            await queue.enqueue_many([(f"after-{i}", "x", keys[i]) for i in range(12)])
            await wait_until(lambda: all(runs[f"after-{i}"] for i in range(12)), timeout=30)
            await worker.stop()
    assert {k: v for k, v in runs.items() if v != 1} == {}


async def test_long_jobs_of_healthy_partitions_keep_their_leases_while_a_master_is_frozen(
    three_masters: Cluster, unique_name: str
) -> None:
    """A renewal call spans every partition with running jobs: it used to wait for the frozen
    node within one bound, so the healthy partitions' renewals were thrown away too, their
    leases expired and their running jobs were cancelled and run again."""
    runs: Counter[str] = Counter()
    started = anyio.Event()

    async def handler(job: Job[str]) -> Outcome:
        runs[job.id] += 1
        if job.id.startswith("long"):
            started.set()
            await anyio.sleep(6)  # twice the visibility timeout, across the freeze
        return ACK

    async with connect(three_masters.url) as client:  # the default 5 s command timeout
        queue = PartitionedJobQueue(client, unique_name, StrCodec(), partitions=12)
        frozen_node = three_masters.owner_of(key_slot(queue.partition(0).keys.ready))
        healthy = [
            i
            for i in range(12)
            if three_masters.owner_of(key_slot(queue.partition(i).keys.ready)) is not frozen_node
        ]
        keys = {i: next(f"k{n}" for n in range(10_000) if queue.partition_of(f"k{n}") == i)
                for i in range(12)}  # fmt: skip
        worker = Worker(restart_limits=LIMITS)
        options = fast_options(visibility_timeout=timedelta(seconds=3), consumer_count=8)
        worker.register(unique_name, handler, StrCodec(), options, partitions=12)
        async with anyio.create_task_group() as tg:
            await tg.start(worker.run, client)
            await queue.enqueue_many(
                [(f"long-{i}", "x", keys[i]) for i in healthy[:3]] + [("long-frozen", "x", keys[0])]
            )
            with anyio.fail_after(10):
                await started.wait()
            await anyio.sleep(0.5)
            os.kill(frozen_node.pid, signal.SIGSTOP)
            try:
                await wait_until(lambda: all(runs[f"long-{i}"] for i in healthy[:3]), timeout=10)
                await anyio.sleep(6.5)  # the healthy long jobs finish and commit
            finally:
                os.kill(frozen_node.pid, signal.SIGCONT)
            await worker.stop()
    assert [runs[f"long-{i}"] for i in healthy[:3]] == [1, 1, 1]


async def test_enqueue_many_reports_each_job_when_one_master_is_down(
    three_masters: Cluster, unique_name: str
) -> None:
    """Found by review: with one master dead, a partitioned enqueue_many raised
    RedisUnavailable with that same error as every job's partial result, although the jobs
    routed to the live masters were enqueued (a repeat found them as duplicates). Each job now
    gets its own outcome: a result on a live node, the error on the dead one."""
    from respire_actors.errors import RedisUnavailable
    from respire_actors.jobs.model import EnqueueResult

    async with connect(three_masters.url, command_timeout=2, connect_timeout=2) as client:
        queue = PartitionedJobQueue(client, unique_name, StrCodec(), partitions=12)
        await queue.check()
        dead_node = three_masters.owner_of(key_slot(queue.partition(0).keys.ready))
        keys = {i: next(f"k{n}" for n in range(10_000) if queue.partition_of(f"k{n}") == i)
                for i in range(12)}  # fmt: skip
        dead = {
            i
            for i in range(12)
            if three_masters.owner_of(key_slot(queue.partition(i).keys.ready)) is dead_node
        }
        assert 0 < len(dead) < 12
        os.kill(dead_node.pid, signal.SIGKILL)  # reaped by the fixture's stop
        with pytest.raises(RedisUnavailable) as caught:
            await queue.enqueue_many([(f"j{i}", "x", keys[i]) for i in range(12)])
        outcomes = caught.value.partial_results
        assert outcomes is not None and len(outcomes) == 12
        for i, outcome in enumerate(outcomes):
            if i in dead:
                assert isinstance(outcome, RedisUnavailable), (i, outcome)
            else:
                assert isinstance(outcome, EnqueueResult) and outcome.enqueued, (i, outcome)
        # the live partitions really hold their jobs: a repeat is deduplicated there
        for i in sorted(set(range(12)) - dead):
            again = await queue.enqueue(f"j{i}", "x", ordering_key=keys[i])
            assert not again.enqueued


async def test_the_partition_count_key_is_no_single_point_of_failure(
    three_masters: Cluster, unique_name: str
) -> None:
    """Found by review: a producer or observer started while the master holding the queue's
    partition-count record was down could not enqueue or inspect anything, not even on the
    partitions of live masters (the count check read only that record). The count is now
    copied into each partition's slot and a copy answers instead. The controls and
    inspections over every partition raise the dead node's RedisUnavailable with each
    partition's outcome in partial_results (they raised a bare ExceptionGroup)."""
    from respire_actors.errors import RedisUnavailable
    from respire_actors.keys import partitions_key

    async with connect(three_masters.url, command_timeout=2, connect_timeout=2) as client:
        for n in range(100):  # a name whose record's master also holds some partitions
            name = f"{unique_name}-{n}"
            queue = PartitionedJobQueue(client, name, StrCodec(), partitions=12)
            record_node = three_masters.owner_of(key_slot(partitions_key(name)))
            dead = {
                i
                for i in range(12)
                if three_masters.owner_of(key_slot(queue.partition(i).keys.ready)) is record_node
            }
            if dead:
                break
        await queue.check()  # the first producer: records the count and copies it
        keys = {i: next(f"k{n}" for n in range(10_000) if queue.partition_of(f"k{n}") == i)
                for i in range(12)}  # fmt: skip
        live = sorted(set(range(12)) - dead)
        assert live
        await queue.enqueue("before", "x", ordering_key=keys[live[0]])
        os.kill(record_node.pid, signal.SIGKILL)  # reaped by the fixture's stop

        fresh = PartitionedJobQueue(client, name, StrCodec(), partitions=12)
        for i in live:
            result = await fresh.enqueue(f"j{i}", "x", ordering_key=keys[i])
            assert result.enqueued, i
        for i in sorted(dead):
            with pytest.raises(RedisUnavailable):
                await fresh.enqueue(f"j{i}", "x", ordering_key=keys[i])
        observer = PartitionedJobQueue(client, name, StrCodec(), partitions=12)
        status = await observer.status("before", ordering_key=keys[live[0]])
        assert status.state == "unknown", status  # answered, not refused
        # a wrong count is still refused, by a copy
        wrong = PartitionedJobQueue(client, name, StrCodec(), partitions=13)
        from respire_actors.errors import PartitionCountMismatch

        with pytest.raises(PartitionCountMismatch):
            await wrong.enqueue("w", "x")

        with pytest.raises(RedisUnavailable) as caught:
            await observer.backlog()
        outcomes = caught.value.partial_results
        assert outcomes is not None and len(outcomes) == 12
        for i, outcome in enumerate(outcomes):
            if i in dead:
                assert isinstance(outcome, RedisUnavailable), (i, outcome)
            else:
                assert not isinstance(outcome, BaseException), (i, outcome)
        with pytest.raises(RedisUnavailable) as paused:
            await observer.pause()
        changed = paused.value.partial_results
        assert changed is not None
        assert [changed[i] for i in live] == [True] * len(live)


async def test_a_partition_whose_master_failed_over_is_reported_served_again(
    three_masters: Cluster, unique_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Found by review: after a failover the partition's node address changes, so the worker
    logged that the node could not be reached and never that it was served again. Its jobs
    run on the promoted replica, and the recovery is logged."""
    runs: Counter[str] = Counter()

    async def handler(job: Job[str]) -> Outcome:
        runs[job.id] += 1
        return ACK

    async with connect(three_masters.url, command_timeout=1, connect_timeout=1) as client:
        queue = PartitionedJobQueue(client, unique_name, StrCodec(), partitions=12)
        master = three_masters.owner_of(key_slot(queue.partition(0).keys.ready))
        replica = three_masters.add_replica(master)
        moved = [
            i
            for i in range(12)
            if three_masters.owner_of(key_slot(queue.partition(i).keys.ready)) is master
        ]
        keys = {i: next(f"k{n}" for n in range(10_000) if queue.partition_of(f"k{n}") == i)
                for i in range(12)}  # fmt: skip
        worker = Worker(restart_limits=LIMITS)
        worker.register(
            unique_name, handler, StrCodec(), fast_options(delivery_limit=10), partitions=12
        )
        with caplog.at_level("WARNING", logger="respire_actors.worker"):
            async with anyio.create_task_group() as tg:
                await tg.start(worker.run, client)
                await queue.enqueue_many([(f"before-{i}", "x", keys[i]) for i in range(12)])
                await wait_until(lambda: len(runs) == 12, timeout=15)
                await wait_until(lambda: replication_lag(master, replica) == 0, timeout=10)
                master.process.kill()
                master.process.wait()
                await anyio.sleep(1.5)  # the worker notices
                replica.execute("CLUSTER", "FAILOVER", "TAKEOVER")
                for i in moved:
                    await wait_until_async(
                        lambda i=i: _enqueued(queue, f"after-{i}", keys[i]), timeout=15
                    )
                await wait_until(lambda: all(runs[f"after-{i}"] for i in moved), timeout=20)
                await wait_until(
                    lambda: any(
                        "is served again, now by" in r.getMessage() for r in caplog.records
                    ),
                    timeout=10,
                )
                await worker.stop()
    assert {k: v for k, v in runs.items() if v != 1} == {}


async def _enqueued(queue: PartitionedJobQueue[str], job_id: str, key: str) -> bool:
    from respire_actors.errors import RedisUnavailable

    try:
        await queue.enqueue(job_id, "x", ordering_key=key)
    except RedisUnavailable:
        return False
    return True
