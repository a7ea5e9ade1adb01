"""Producer backpressure: a queue's backlog bound (docs/job-queue.md#backpressure).

Against real servers on both backends: the bound is checked atomically by every enqueue script
before its first write, a refused call writes nothing, deduplicated repeats still succeed, and
the backlog counts what is accepted and not finished (ready, pending, staged), also where the
server cannot tell the consumer group's lag.
"""

from __future__ import annotations

from datetime import timedelta

import anyio
import pytest
from helpers.proxy import open_fault_proxy
from jobs_helpers import create_group, deliver, running_worker

from respire_actors.acl import acl_rules
from respire_actors.actors.options import CONSUMER_GROUP
from respire_actors.codecs import StrCodec
from respire_actors.errors import QueueFull, RedisUnavailable, ValidationError, WrongKeyType
from respire_actors.jobs import (
    ACK,
    Backlog,
    EnqueueResult,
    FlowNode,
    Job,
    JobEnqueueOptions,
    JobQueue,
    PartitionedJobQueue,
)
from respire_actors.redis.client import ConnectionSettings, RedisClient, connect
from respire_actors.redis.scripts import load

pytestmark = pytest.mark.anyio


async def stored(client: RedisClient, queue: JobQueue[str]) -> tuple[int, int]:
    k = queue.keys
    return await client.execute("XLEN", k.ready), await client.execute("XLEN", k.scheduled)


async def test_a_full_queue_refuses_new_jobs_and_writes_nothing(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    assert await queue.set_max_backlog(3)
    assert not await queue.set_max_backlog(3)  # unchanged
    assert (await queue.get_state()).max_backlog == 3
    for i in range(3):
        assert (await queue.enqueue(f"j{i}", "x")).enqueued
    assert await queue.backlog() == Backlog(3, 3)
    before = await stored(client, queue)
    with pytest.raises(QueueFull) as caught:
        await queue.enqueue("j3", "x")
    assert (caught.value.backlog, caught.value.limit, caught.value.adding) == (3, 3, 1)
    assert caught.value.ran is False
    assert await stored(client, queue) == before
    assert await client.execute("EXISTS", queue.keys.dedup("j3")) == 0  # nothing recorded
    # a repeat of an accepted id adds nothing: it succeeds while the queue is full
    again = await queue.enqueue("j1", "x")
    assert not again.enqueued
    # removing the bound admits again
    assert await queue.set_max_backlog(None)
    assert (await queue.get_state()).max_backlog is None
    assert (await queue.enqueue("j3", "x")).enqueued


async def test_finished_jobs_free_room_and_pending_ones_do_not(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    """Acknowledged entries stay in the stream (retention) but no longer count; delivered,
    unacknowledged ones (a crashed worker's expired leases) still do."""
    await create_group(client, queue.keys)
    await queue.set_max_backlog(2)
    await queue.enqueue("a", "x")
    await queue.enqueue("b", "x")
    delivered = await deliver(client, queue.keys, "c1", count=2)
    with pytest.raises(QueueFull):  # two pending: still the backlog
        await queue.enqueue("c", "x")
    await client.execute("XACK", queue.keys.ready, CONSUMER_GROUP, delivered[0].entry_id)
    assert await client.execute("XLEN", queue.keys.ready) == 2  # acked, kept
    assert await queue.backlog() == Backlog(1, 2)
    assert (await queue.enqueue("c", "x")).enqueued
    with pytest.raises(QueueFull):
        await queue.enqueue("d", "x")


async def test_the_lag_the_server_cannot_tell_is_counted(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    """An older entry still pending and the group's last delivered entry acknowledged and
    deleted (deletion of acknowledged entries): the server reports no lag, so the scripts count
    the undelivered entries themselves."""
    await create_group(client, queue.keys)
    await queue.set_max_backlog(4)
    await queue.enqueue("a", "x")
    await queue.enqueue("b", "x")
    _, second = await deliver(client, queue.keys, "c1", count=2)  # a stays pending
    await client.execute("XACK", queue.keys.ready, CONSUMER_GROUP, second.entry_id)
    await client.execute("XDEL", queue.keys.ready, second.entry_id)
    for job in ("c", "d"):
        await queue.enqueue(job, "x")
    [group] = await client.execute("XINFO", "GROUPS", queue.keys.ready)
    assert dict(group)[b"lag"] is None  # the fallback below is what this test exercises
    assert await queue.backlog() == Backlog(3, 4)  # a pending; c, d undelivered
    assert (await queue.enqueue("e", "x")).enqueued
    with pytest.raises(QueueFull) as caught:
        await queue.enqueue("f", "x")
    assert caught.value.backlog == 4


async def test_staged_jobs_count_and_scheduled_enqueues_are_bounded(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    await queue.set_max_backlog(2)
    await queue.enqueue_scheduled("later", "x", JobEnqueueOptions(delay=60))
    await queue.enqueue("now", "x")
    with pytest.raises(QueueFull):
        await queue.enqueue_scheduled("later-2", "x", JobEnqueueOptions(delay=60))
    with pytest.raises(QueueFull):
        await queue.enqueue_scheduled("grouped", "x", JobEnqueueOptions(group="g"))
    with pytest.raises(QueueFull):
        await queue.enqueue("now-2", "x")
    assert await stored(client, queue) == (1, 1)
    assert await client.execute("EXISTS", queue.keys.group_jobs) == 0
    again = await queue.enqueue_scheduled("later", "x", JobEnqueueOptions(delay=60))
    assert not again.enqueued


async def test_enqueue_many_takes_what_fits_then_raises(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    await queue.set_max_backlog(3)
    with pytest.raises(QueueFull) as refused:
        await queue.enqueue_many([(f"m{i}", "x") for i in range(5)])
    assert await stored(client, queue) == (3, 0)
    for i in range(3):
        assert await client.execute("EXISTS", queue.keys.dedup(f"m{i}")) == 1
    # the error says which jobs went in: in input order, a result or the job's own error
    outcomes = refused.value.partial_results
    assert outcomes is not None and len(outcomes) == 5
    assert [type(o).__name__ for o in outcomes] == ["EnqueueResult"] * 3 + ["QueueFull"] * 2
    assert all(o.enqueued for o in outcomes[:3] if isinstance(o, EnqueueResult))
    assert outcomes[3] is refused.value
    # repeating the whole call: the accepted ones deduplicate, the others are still refused
    with pytest.raises(QueueFull) as again:
        await queue.enqueue_many([(f"m{i}", "x") for i in range(5)])
    outcomes = again.value.partial_results
    assert outcomes is not None
    assert [o.enqueued for o in outcomes[:3] if isinstance(o, EnqueueResult)] == [False] * 3
    assert all(isinstance(o, QueueFull) for o in outcomes[3:])
    with pytest.raises(QueueFull) as scheduled:
        await queue.enqueue_scheduled_many([("s", "x")], JobEnqueueOptions(delay=60))
    assert scheduled.value.partial_results == [scheduled.value]


async def test_enqueue_many_past_one_round_trip_reports_every_job(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    """1,500 jobs (two pipelined round trips of 1,000) against a bound of 800, the last ten
    accepted earlier: the second round trip is still sent after refusals in the first (its
    repeats deduplicate), and every job's outcome is reported in input order."""
    jobs = [(f"b{i}", "x") for i in range(1500)]
    await queue.enqueue_many(jobs[1490:])
    await queue.set_max_backlog(800)
    with pytest.raises(QueueFull) as refused:
        await queue.enqueue_many(jobs)
    outcomes = refused.value.partial_results
    assert outcomes is not None and len(outcomes) == 1500
    assert all(isinstance(o, EnqueueResult) and o.enqueued for o in outcomes[:790])
    assert all(isinstance(o, QueueFull) for o in outcomes[790:1490])
    assert all(isinstance(o, EnqueueResult) and not o.enqueued for o in outcomes[1490:])
    assert await stored(client, queue) == (800, 0)


async def test_a_partitioned_enqueue_many_reports_every_job(
    client: RedisClient, unique_name: str
) -> None:
    queue = PartitionedJobQueue(client, unique_name, StrCodec(), partitions=4)
    full = queue.queues[queue.partition_of("p0")]
    await full.set_max_backlog(1)
    jobs = [(f"p{i}", "x") for i in range(40)]
    with pytest.raises(QueueFull) as refused:
        await queue.enqueue_many(jobs)
    outcomes = refused.value.partial_results
    assert outcomes is not None and len(outcomes) == 40
    for (job_id, _), outcome in zip(jobs, outcomes, strict=True):
        if queue.queues[queue.partition_of(job_id)] is not full:
            assert isinstance(outcome, EnqueueResult) and outcome.enqueued, job_id
    refused_ids = [j for (j, _), o in zip(jobs, outcomes, strict=True) if isinstance(o, QueueFull)]
    in_full = [j for j, _ in jobs if queue.queues[queue.partition_of(j)] is full]
    assert refused_ids == in_full[1:]  # the first job of the full partition fitted


async def test_a_transactional_enqueue_refused_raises_from_its_result(
    client: RedisClient, queue: JobQueue[str], unique_name: str
) -> None:
    await queue.set_max_backlog(1)
    await queue.enqueue("first", "x")
    side = f"{unique_name}:business-row"
    async with client.transaction() as tx:
        tx.queue("SET", side, "1")
        pending = queue.enqueue_in(tx, "second", "x")
        await tx.commit()
    with pytest.raises(QueueFull):
        pending.result()
    # Redis transactions do not roll back: the other command committed (documented)
    assert await client.execute("GET", side) == b"1"
    assert await stored(client, queue) == (1, 0)


async def test_flows_are_checked_whole_and_batch_members_one_by_one(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    await queue.set_max_backlog(3)
    await queue.enqueue("a", "x")
    tree = FlowNode("root", "r", [FlowNode("c1", "x"), FlowNode("c2", "x")])
    with pytest.raises(QueueFull) as caught:
        await queue.enqueue_flow("flow", tree)
    assert caught.value.adding == 3
    assert await stored(client, queue) == (1, 0)
    assert await client.execute("EXISTS", queue.keys.flow("flow")) == 0
    small = FlowNode("root", "r", [FlowNode("c1", "x")])
    assert await queue.enqueue_flow("flow", small)  # two nodes fit
    assert not await queue.enqueue_flow("flow", small)  # the repeat changes nothing
    # the waiting parent is not in the backlog until a child activates it: a, c1
    assert await queue.backlog() == Backlog(2, 3)
    await queue.enqueue("b", "x")
    batch = await queue.create_batch()
    with pytest.raises(QueueFull):
        await queue.add_to_batch(batch, "member", "x")
    status = await queue.batch_status(batch)
    assert status is not None and status.members == 0


async def test_wait_retries_until_the_backlog_drains(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    await queue.set_max_backlog(1)
    await queue.enqueue("first", "x")
    started = anyio.current_time()
    with pytest.raises(QueueFull):
        await queue.enqueue("second", "x", wait=0.2)
    assert anyio.current_time() - started >= 0.2
    accepted = anyio.Event()

    async def handler(job: Job[str]) -> object:
        return ACK

    async with anyio.create_task_group() as tg:
        result = None

        async def produce() -> None:
            nonlocal result
            result = await queue.enqueue("second", "x", wait=timedelta(seconds=20))
            accepted.set()

        tg.start_soon(produce)
        await anyio.sleep(0.1)
        assert result is None  # still waiting: the queue is full
        async with running_worker(client, queue.name, handler):
            with anyio.fail_after(20):
                await accepted.wait()
    assert result is not None and result.enqueued


async def test_bad_bounds_and_waits_are_refused_before_sending(queue: JobQueue[str]) -> None:
    for bad in (0, -1, 2**31, 1.5, True, "3"):
        with pytest.raises(ValidationError):
            await queue.set_max_backlog(bad)  # type: ignore[arg-type]
    with pytest.raises(ValidationError):
        await queue.enqueue("a", "x", wait=-1)
    with pytest.raises(ValidationError):
        await queue.enqueue_scheduled("a", "x", wait="soon")  # type: ignore[arg-type]
    assert (await queue.get_state()).max_backlog is None


async def test_a_control_key_of_another_type_is_refused_before_writing(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    await client.execute("SET", queue.keys.control, "squatter")
    with pytest.raises(WrongKeyType):
        await queue.enqueue("a", "x")
    assert await stored(client, queue) == (0, 0)
    with pytest.raises(WrongKeyType):
        await load("job_backlog")(
            client, (queue.keys.control, queue.keys.ready, queue.keys.scheduled), ("set", 5)
        )


async def test_the_bound_on_a_cluster(cluster_client: RedisClient, unique_name: str) -> None:
    queue = JobQueue(cluster_client, unique_name, StrCodec())
    await queue.set_max_backlog(1)
    await queue.enqueue("a", "x")
    with pytest.raises(QueueFull):
        await queue.enqueue_scheduled("b", "x", JobEnqueueOptions(delay=1))
    assert await queue.backlog() == Backlog(1, 1)


async def test_the_producer_role_runs_a_bounded_enqueue(
    client: RedisClient, queue: JobQueue[str], server_url: str, unique_name: str
) -> None:
    """The bound's check needs HGET, XLEN, XINFO GROUPS and XRANGE (probed up front): the
    producer ACL role has them, so a full queue answers QueueFull, not PermissionDenied."""
    await create_group(client, queue.keys)
    await queue.set_max_backlog(1)
    user = f"producer-{unique_name}"
    rules = acl_rules("producer", (unique_name,))
    await client.execute("ACL", "SETUSER", user, "on", ">pw", *rules)
    try:
        async with connect(server_url, username=user, password="pw") as producer:
            bounded = JobQueue(producer, unique_name, StrCodec())
            assert (await bounded.enqueue("a", "x")).enqueued
            with pytest.raises(QueueFull):
                await bounded.enqueue("b", "x")
            with pytest.raises(QueueFull):
                await bounded.enqueue_scheduled("c", "x", JobEnqueueOptions(group="g"))
    finally:
        await client.execute("ACL", "DELUSER", user)


async def test_enqueue_many_cut_off_by_a_lost_connection_reports_what_never_went(
    client: RedisClient, queue: JobQueue[str], server_url: str
) -> None:
    """The reply of the first round trip (1,000 jobs) is lost: those jobs' outcome is unknown
    (the error), the other 500 were never sent (None), and nothing is re-sent."""
    await queue.enqueue("warm-up", "x")  # the script is cached on the server: no NOSCRIPT
    port = ConnectionSettings.from_url(server_url).port
    async with open_fault_proxy(port) as proxy, connect(proxy.url) as proxied:
        cut_queue = JobQueue(proxied, queue.name, StrCodec())
        proxy.cut_on_reply(lambda chunk: chunk.startswith(b"*2"))
        with pytest.raises(RedisUnavailable) as lost:
            await cut_queue.enqueue_many([(f"c{i}", "x") for i in range(1500)])
    outcomes = lost.value.partial_results
    assert outcomes is not None and len(outcomes) == 1500
    assert all(o is lost.value for o in outcomes[:1000])
    assert all(o is None for o in outcomes[1000:])
    # some of the first round trip ran (the cut also drops request bytes still in the proxy):
    # that is the unknown outcome; of the jobs reported as never sent, none exists
    ready, _ = await stored(client, queue)
    assert 1 < ready <= 1001
    never = await client.pipeline(
        [("EXISTS", queue.keys.dedup(f"c{i}")) for i in range(1000, 1500)]
    )
    assert never == [0] * 500
