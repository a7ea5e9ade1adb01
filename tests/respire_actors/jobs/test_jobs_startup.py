"""Start-up checks that belong to the built tree, and consumer groups that vanish (issue 8,
items 3 and 7; spec: "Storage and delivery guarantees": never replay acknowledged history)."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta
from typing import Any

import anyio
import anyio.abc
import pytest
from helpers.running import run_catching
from jobs_helpers import fast_options, pending_count, text, wait_until, wait_until_async
from sched_helpers import sched_options, xlen

from respire_actors.codecs import StrCodec
from respire_actors.errors import ConfigurationError, ConsumerGroupMissing, ValidationError
from respire_actors.jobs import Job, JobQueue, RateLimit, Worker, WorkerOptions
from respire_actors.jobs.options import CONSUMER_GROUP
from respire_actors.redis.client import RedisClient
from supervisors import ChildSpec, Restart, StartError, Supervisor

pytestmark = pytest.mark.anyio


def recording_worker(queue: str, options: WorkerOptions | None = None, **kw: Any) -> Any:
    seen: Counter[str] = Counter()

    async def handler(job: Job[str]) -> Any:
        seen[job.id] += 1
        return None

    worker = Worker()
    worker.register(queue, handler, StrCodec(), options or fast_options(), **kw)
    return worker, seen


def test_recreate_missing_group_is_validated() -> None:
    for bad in ["", "0-x", "later", 5, None, "$ "]:
        with pytest.raises(ValidationError, match="recreate_missing_group"):
            WorkerOptions(recreate_missing_group=bad)  # type: ignore[arg-type]
    for good in ["fail", "$", "0", "1700000000000-3"]:
        assert WorkerOptions(recreate_missing_group=good).recreate_missing_group == good


# -- item 3: a consumer group that vanishes ----------------------------------------------------


async def test_a_group_deleted_under_a_running_worker_stops_it_without_replaying(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    for i in range(3):
        await queue.enqueue(f"old{i}", "x")
    worker, seen = recording_worker(queue.name)
    errors: list[BaseException] = []

    run = run_catching(worker, client, ConsumerGroupMissing, errors)

    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            await tg.start(run)
            stats = worker.statistics(queue.name)
            await wait_until(lambda: stats.acked == 3)
            await client.execute("XGROUP", "DESTROY", queue.keys.ready, CONSUMER_GROUP)
            await queue.enqueue("new", "x")  # wakes the blocked reader: its read gets NOGROUP
            await wait_until(lambda: bool(errors))  # run() itself raised and returned
    (error,) = errors
    assert isinstance(error, ConsumerGroupMissing) and "recreate_missing_group" in str(error)
    assert error.stream == queue.keys.ready
    assert seen == Counter({"old0": 1, "old1": 1, "old2": 1})  # nothing acknowledged ran again
    # the group stays missing: a restarted worker refuses to start rather than replay at 0
    restarted, seen2 = recording_worker(queue.name)
    with anyio.fail_after(10), pytest.raises(ConsumerGroupMissing):
        await restarted.run(client)
    assert not seen2


async def test_recreate_missing_group_dollar_continues_with_new_jobs_only(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    for i in range(3):
        await queue.enqueue(f"old{i}", "x")
    worker, seen = recording_worker(queue.name, fast_options(recreate_missing_group="$"))
    async with anyio.create_task_group() as tg:
        await tg.start(worker.run, client)
        stats = worker.statistics(queue.name)
        await wait_until(lambda: stats.acked == 3)
        await client.execute("XGROUP", "DESTROY", queue.keys.ready, CONSUMER_GROUP)
        await queue.enqueue("new", "x")  # the reader gets NOGROUP and recreates at "$"

        async def recreated() -> bool:
            groups = await client.execute("XINFO", "GROUPS", queue.keys.ready)
            return len(groups) == 1

        await wait_until_async(recreated)
        await queue.enqueue("late", "x")
        await wait_until(lambda: seen["late"] == 1)
        await worker.stop()
    assert seen["old0"] == seen["old1"] == seen["old2"] == 1  # never replayed
    assert seen["late"] == 1
    # "new" raced the recreation at "$": it ran once or (if appended first) not at all
    assert seen["new"] <= 1


async def test_a_new_queue_gets_its_group_at_zero_and_a_vanished_one_is_refused(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    await queue.enqueue("before-any-worker", "x")  # a brand-new queue: this job must run
    worker, seen = recording_worker(queue.name)
    async with anyio.create_task_group() as tg:
        await tg.start(worker.run, client)
        await wait_until(lambda: seen["before-any-worker"] == 1)
        await worker.stop()
    await client.execute("XGROUP", "DESTROY", queue.keys.ready, CONSUMER_GROUP)
    again, seen2 = recording_worker(queue.name)
    with anyio.fail_after(10), pytest.raises(ConsumerGroupMissing):
        await again.run(client)
    assert not seen2
    # an explicit id recreates it there: everything after that id runs, nothing before it
    second = await queue.enqueue("after", "x")
    ((first_id, _),) = await client.execute("XRANGE", queue.keys.ready, "-", "+", "COUNT", 1)
    explicit, seen3 = recording_worker(
        queue.name, fast_options(recreate_missing_group=text(first_id))
    )
    async with anyio.create_task_group() as tg:
        await tg.start(explicit.run, client)
        await wait_until(lambda: seen3["after"] == 1)
        await explicit.stop()
    assert seen3 == Counter({"after": 1}) and second.enqueued


# -- item 7: build() runs its own start-up checks ----------------------------------------------


def close_mailboxes(worker: Worker) -> None:
    """A composed tree's mailboxes are the composer's to close (``run`` closes its own)."""
    for rt in worker._runtimes.values():
        rt.deliveries.close()
        rt.completions.close()


async def custom_tree_start(worker: Worker, client: RedisClient) -> Supervisor:
    return Supervisor(
        "custom",
        [worker.build(client).child_spec(restart=Restart.TEMPORARY)],
        max_restarts=0,
        period=1.0,
    )


async def test_a_composed_tree_refuses_a_mismatched_rate_policy(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    await queue.set_rate_limit(RateLimit(5, 1))
    await queue.enqueue("a", "x")
    worker, seen = recording_worker(
        queue.name, queue_options=sched_options(rate_limit=RateLimit(6, 1))
    )
    custom = await custom_tree_start(worker, client)
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            with pytest.raises(StartError) as caught:
                await tg.start(custom.run)
    close_mailboxes(worker)
    cause: BaseException | None = caught.value
    while cause is not None and not isinstance(cause, ConfigurationError):
        cause = cause.__cause__
    assert isinstance(cause, ConfigurationError) and "differs from the one stored" in str(cause)
    assert not seen
    assert (await queue.get_state()).rate_limit == RateLimit(5, timedelta(seconds=1))


async def test_a_composed_tree_deletes_acknowledged_entries(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    for i in range(3):
        await queue.enqueue(f"j{i}", "x")
    worker, seen = recording_worker(
        queue.name, queue_options=sched_options(delete_acknowledged_entries=True)
    )
    custom = Supervisor("custom", [ChildSpec("jobs", worker.build(client).run)])
    async with anyio.create_task_group() as tg:
        await tg.start(custom.run)
        await wait_until(lambda: worker.statistics(queue.name).acked == 3)
        await custom.stop()
    close_mailboxes(worker)
    assert sum(seen.values()) == 3
    assert await xlen(client, queue.keys.ready) == 0
    assert await pending_count(client, queue.keys) == 0


async def test_a_completion_that_meets_a_vanished_group_stops_the_worker(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    release = anyio.Event()
    started = anyio.Event()

    async def handler(job: Job[str]) -> Any:
        started.set()
        await release.wait()
        return None

    await queue.enqueue("a", "x")
    worker = Worker()
    worker.register(queue.name, handler, StrCodec(), fast_options())
    errors: list[BaseException] = []

    run = run_catching(worker, client, ConsumerGroupMissing, errors)

    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            await tg.start(run)
            await started.wait()
            await client.execute("XGROUP", "DESTROY", queue.keys.ready, CONSUMER_GROUP)
            release.set()  # its completion finds no group: stale, and the worker stops
            await wait_until(lambda: bool(errors))
    assert worker.statistics(queue.name).stale_completions == 1
    assert not await client.execute("XINFO", "GROUPS", queue.keys.ready)  # not recreated
