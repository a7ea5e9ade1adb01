"""Graceful shutdown, startup replay and recovery passes."""

from __future__ import annotations

from datetime import timedelta

import anyio
import anyio.abc
import anyio.lowlevel
import pytest
from helpers.running import run_catching
from jobs_helpers import (
    FAST,
    all_events,
    create_group,
    deliver,
    events_of_kind,
    fast_options,
    group_info,
    pending_rows,
    running_worker,
    text,
    wait_until,
)

from respire_actors.codecs import StrCodec
from respire_actors.jobs import ACK, Job, JobQueue, Outcome, Worker
from respire_actors.redis.client import RedisClient
from supervisors import RunState

pytestmark = pytest.mark.anyio

LONG = timedelta(seconds=60)


def child_state(worker: Worker, queue: str, child: str) -> RunState:
    root = worker.snapshot()
    assert root is not None
    for node in root.children:
        if node.name == f"queue:{queue}":
            assert node.supervisor is not None
            for leaf in node.supervisor.children:
                if leaf.name == child:
                    return leaf.state
    raise LookupError(child)


async def test_stop_finishes_the_running_handler_and_leaves_the_rest_unread(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    results = await queue.enqueue_many([("a", "1"), ("b", "2"), ("c", "3")])
    started, release = anyio.Event(), anyio.Event()
    handled: list[str] = []

    async def handler(job: Job[str]) -> Outcome:
        handled.append(job.id)
        started.set()
        await release.wait()
        return ACK

    worker = Worker()
    options = fast_options(
        consumer_count=1, visibility_timeout=LONG, shutdown_grace=timedelta(seconds=10)
    )
    worker.register(queue.name, handler, StrCodec(), options)
    with anyio.fail_after(15):
        async with anyio.create_task_group() as tg:
            await tg.start(worker.run, client)
            await started.wait()
            tg.start_soon(worker.stop)
            # Intake stops first; only then does the running handler finish.
            await wait_until(lambda: child_state(worker, queue.name, "reader") is RunState.STOPPED)
            runners = child_state(worker, queue.name, "runners")
            assert runners in (RunState.RUNNING, RunState.STOPPING)  # not stopped before
            # the supervisor asks the runners to stop in its next step (under load that is not
            # always done by the time the reader's state is seen)
            await wait_until(
                lambda: child_state(worker, queue.name, "runners") is RunState.STOPPING
            )
            release.set()

    stats = worker.statistics(queue.name)
    assert handled == ["a"]
    assert stats.acked == 1 and stats.admitted == 1
    completed = await events_of_kind(client, queue.keys, "completed")
    assert [(e.job_id, e.entry_id) for e in completed] == [("a", results[0].entry_id)]
    assert await pending_rows(client, queue.keys) == []
    # b and c were never delivered: the group has read only up to a.
    info = await group_info(client, queue.keys)
    assert text(info["last-delivered-id"]) == results[0].entry_id


async def test_handler_exceeding_the_grace_is_cancelled_and_left_pending(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    enqueued = await queue.enqueue("stuck", "x")
    started = anyio.Event()
    cancelled = False

    async def handler(job: Job[str]) -> Outcome:
        nonlocal cancelled
        started.set()
        try:
            await anyio.sleep_forever()
        except anyio.get_cancelled_exc_class():
            cancelled = True
            raise
        return ACK  # pragma: no cover

    worker = Worker()
    options = fast_options(visibility_timeout=LONG, shutdown_grace=timedelta(milliseconds=200))
    worker.register(queue.name, handler, StrCodec(), options)
    async with anyio.create_task_group() as tg:
        await tg.start(worker.run, client)
        with anyio.fail_after(10):
            await started.wait()
        with anyio.fail_after(5):  # grace plus the other children's quick exits
            await worker.stop()
        tg.cancel_scope.cancel()

    assert cancelled
    stats = worker.statistics(queue.name)
    assert stats.acked == 0 and stats.started == 1
    assert await all_events(client, queue.keys) == []
    assert await pending_rows(client, queue.keys) == [
        (enqueued.entry_id, worker.consumer_name(queue.name), 1)
    ]


async def test_own_pending_jobs_are_replayed_at_startup(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    mine = await queue.enqueue("mine", "x")
    theirs = await queue.enqueue("theirs", "y")
    await create_group(client, queue.keys)
    # A previous run of "host-a" read one job and stopped without finishing it; another host
    # holds the other one.
    assert [d.entry_id for d in await deliver(client, queue.keys, "host-a")] == [mine.entry_id]
    assert [d.entry_id for d in await deliver(client, queue.keys, "host-b")] == [theirs.entry_id]
    attempts: list[tuple[str, int]] = []

    async def handler(job: Job[str]) -> Outcome:
        attempts.append((job.id, job.attempt))
        return ACK

    # The visibility timeout is far away: only replay can pick the job up within the test.
    options = fast_options(consumer_name="host-a", visibility_timeout=LONG)
    async with running_worker(client, queue.name, handler, options=options) as worker:
        stats = worker.statistics(queue.name)
        await wait_until(lambda: stats.acked == 1, timeout=5)
        assert stats.replayed == 1 and stats.recovered == 0

    assert attempts == [("mine", 2)]
    assert await pending_rows(client, queue.keys) == [(theirs.entry_id, "host-b", 1)]


async def test_startup_replay_precedes_new_reads(client: RedisClient, queue: JobQueue[str]) -> None:
    """Replay must not re-claim what the reader delivered meanwhile to the same consumer name
    (each new job would then run twice, once per delivery)."""
    await queue.enqueue_many([("old-1", "x"), ("old-2", "x")])
    await create_group(client, queue.keys)
    await deliver(client, queue.keys, "host-a", 2)
    await queue.enqueue_many([(f"new-{i}", "x") for i in range(6)])
    release = anyio.Event()
    calls: list[tuple[str, int]] = []

    async def handler(job: Job[str]) -> Outcome:
        calls.append((job.id, job.attempt))
        await release.wait()
        return ACK

    # One entry per replay page: the replay pass spans several round trips.
    options = fast_options(
        consumer_name="host-a", visibility_timeout=LONG, recovery_page_size=1, consumer_count=16
    )
    async with running_worker(client, queue.name, handler, options=options) as worker:
        stats = worker.statistics(queue.name)
        await wait_until(lambda: stats.started >= 8)
        release.set()
        await wait_until(lambda: stats.acked == 8)
        assert stats.replayed == 2 and stats.admitted == 6
        assert stats.stale_completions == 0

    expected = [("old-1", 2), ("old-2", 2)] + [(f"new-{i}", 1) for i in range(6)]
    assert sorted(calls) == sorted(expected)


async def test_a_restarted_sweeper_does_not_replay_running_jobs(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    orphan = await queue.enqueue("orphan", "x")
    await create_group(client, queue.keys)
    await deliver(client, queue.keys, "ghost")  # recovered later, to prove a pass ran
    running = await queue.enqueue("running", "y")
    release = anyio.Event()
    calls: list[tuple[str, int]] = []

    async def handler(job: Job[str]) -> Outcome:
        calls.append((job.id, job.attempt))
        if job.id == "running":
            await release.wait()
        return ACK

    options = fast_options(consumer_name="host-a", visibility_timeout=LONG)
    async with running_worker(client, queue.name, handler, options=options) as worker:
        stats = worker.statistics(queue.name)
        await wait_until(lambda: stats.started == 1)
        # A squatter on the dead-letter key makes the sweeper's next pass fail: it restarts.
        await client.execute("SET", queue.keys.dead, "squatter")
        await wait_until(lambda: child_state(worker, queue.name, "sweeper") is RunState.RESTARTING)
        await client.execute("DEL", queue.keys.dead)
        # Age the orphan past the visibility timeout: the next completed pass recovers it.
        await client.execute(
            "XCLAIM",
            queue.keys.ready,
            "respire",
            "ghost",
            0,
            orphan.entry_id,
            "IDLE",
            3_600_000,
            "JUSTID",
        )
        await wait_until(lambda: stats.acked == 1 and stats.recovered == 1)
        release.set()
        await wait_until(lambda: stats.acked == 2)
        assert stats.replayed == 0 and stats.stale_completions == 0

    assert sorted(calls) == [("orphan", 2), ("running", 1)]
    completed = await events_of_kind(client, queue.keys, "completed")
    assert sorted((e.entry_id, e.attempt) for e in completed) == [
        (orphan.entry_id, 2),
        (running.entry_id, 1),
    ]


async def test_a_failed_startup_replay_does_not_hold_up_the_reader(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    old = await queue.enqueue("old", "x")
    await create_group(client, queue.keys)
    await deliver(client, queue.keys, "host-a")
    await client.execute("SET", queue.keys.dead, "squatter")  # replay's preflight fails
    handled: list[str] = []

    async def handler(job: Job[str]) -> Outcome:
        handled.append(job.id)
        return ACK

    options = fast_options(consumer_name="host-a", visibility_timeout=LONG)
    async with running_worker(client, queue.name, handler, options=options) as worker:
        await wait_until(lambda: child_state(worker, queue.name, "sweeper") is RunState.RESTARTING)
        await client.execute("DEL", queue.keys.dead)
        await queue.enqueue("new", "y")
        await wait_until(lambda: worker.statistics(queue.name).acked == 1)

    assert handled == ["new"]
    # Not replayed by the restarted sweeper: it waits for visibility recovery.
    assert await pending_rows(client, queue.keys) == [(old.entry_id, "host-a", 1)]


@pytest.mark.parametrize("owner", ["other-consumer", "same-consumer"])
async def test_pending_references_to_deleted_entries_are_cleared(
    client: RedisClient, queue: JobQueue[str], owner: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The seed's trim loss: the work is gone. Found by review: it was only counted, with no
    log line or metric; now each recovery that clears such references warns."""
    gone = await queue.enqueue("gone", "x")
    kept = await queue.enqueue("kept", "y")
    await create_group(client, queue.keys)
    consumer = "ghost" if owner == "other-consumer" else "host-a"
    assert len(await deliver(client, queue.keys, consumer, 2)) == 2
    assert await client.execute("XDEL", queue.keys.ready, gone.entry_id) == 1
    handled: list[str] = []

    async def handler(job: Job[str]) -> Outcome:
        handled.append(job.id)
        return ACK

    options = fast_options(consumer_name="host-a", visibility_timeout=FAST)
    async with running_worker(client, queue.name, handler, options=options) as worker:
        stats = worker.statistics(queue.name)
        await wait_until(lambda: stats.acked == 1 and stats.cleared_deleted_refs == 1)

    assert handled == ["kept"]
    assert await pending_rows(client, queue.keys) == []
    lost = [r for r in caplog.records if "whose payload was deleted" in r.getMessage()]
    assert [r.levelname for r in lost] == ["WARNING"]
    assert "1 pending entries" in lost[0].getMessage()
    completed = await events_of_kind(client, queue.keys, "completed")
    assert [(e.entry_id, e.attempt) for e in completed] == [(kept.entry_id, 2)]


async def test_recovery_dead_letters_entries_past_the_delivery_limit(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    enqueued = await queue.enqueue("poison", "x")
    await create_group(client, queue.keys)
    await deliver(client, queue.keys, "ghost")  # the one allowed delivery, never finished

    async def handler(job: Job[str]) -> Outcome:
        raise AssertionError("must not run past the delivery limit")

    options = fast_options(delivery_limit=1, visibility_timeout=FAST)
    async with running_worker(client, queue.name, handler, options=options) as worker:
        stats = worker.statistics(queue.name)
        await wait_until(lambda: stats.dead_lettered_by_recovery == 1)
        assert stats.started == 0

    letters = await queue.read_dead_letters()
    assert len(letters) == 1
    fields = letters[0][1]
    assert fields["_respire.reason"] == b"delivery-limit"
    assert fields["_respire.source_id"] == enqueued.entry_id.encode()
    assert fields["_respire.attempt"] == b"1"
    events = await all_events(client, queue.keys)
    assert [(e.kind, e.reason, e.attempt) for e in events] == [("dead-letter", "delivery-limit", 1)]
    assert await pending_rows(client, queue.keys) == []


async def test_a_stop_requested_before_the_tree_is_built_stops_the_run(
    client: RedisClient, unique_name: str
) -> None:
    """request_stop() right after start_soon(worker.run) (a signal handler firing during
    start-up, say) used to be dropped: the worker ran on."""
    worker = Worker()

    async def handler(job: Job[str]) -> Outcome:
        return ACK

    worker.register(unique_name, handler, StrCodec(), fast_options())
    finished = anyio.Event()

    async def run() -> None:
        await worker.run(client)
        finished.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(run)
        worker.request_stop()
        with anyio.fail_after(10):
            await finished.wait()


async def test_a_stop_requested_before_a_second_run_starts_stops_that_run(
    client: RedisClient, unique_name: str
) -> None:
    """The same Worker run a second time: request_stop() right after start_soon(worker.run)
    used to reach run 1's finished tree and be dropped, so run 2 ran on. And stop() called
    while a run is still starting waits for that run to end."""
    worker = Worker()

    async def handler(job: Job[str]) -> Outcome:
        return ACK

    worker.register(unique_name, handler, StrCodec(), fast_options())
    for _ in range(2):
        finished = anyio.Event()

        async def run(done: anyio.Event = finished) -> None:
            await worker.run(client)
            done.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(run)
            worker.request_stop()
            with anyio.fail_after(10):
                await finished.wait()
    async with anyio.create_task_group() as tg:
        ended = anyio.Event()

        async def third() -> None:
            await worker.run(client)
            ended.set()

        tg.start_soon(third)
        while worker._ended is None:
            await anyio.lowlevel.checkpoint()
        assert worker._live is None  # its tree has not reported started yet
        with anyio.fail_after(10):
            await worker.stop()
        assert ended.is_set()


async def test_a_stop_after_a_run_ended_does_not_stop_the_next_run(
    client: RedisClient, unique_name: str
) -> None:
    """Found by review: stop() with no run in progress left a pending stop behind, so a second
    stop() (or one in cleanup after a run ended) made the next run of the same Worker return
    at once. Only request_stop() carries over to a run about to start."""
    worker = Worker()
    handled = anyio.Event()

    async def handler(job: Job[str]) -> Outcome:
        handled.set()
        return ACK

    worker.register(unique_name, handler, StrCodec(), fast_options())
    async with anyio.create_task_group() as tg:
        await tg.start(worker.run, client)
        await worker.stop()
    await worker.stop()  # nothing runs: a no-op
    async with anyio.create_task_group() as tg:
        await tg.start(worker.run, client)
        await JobQueue(client, unique_name, StrCodec()).enqueue("j", "x")
        with anyio.fail_after(10):
            await handled.wait()  # the run is still serving
        await worker.stop()


async def test_a_worker_refuses_a_second_concurrent_run(
    client: RedisClient, unique_name: str
) -> None:
    """Found by review: a second run of a running Worker was accepted; it overwrote the first
    run's runtimes and tree, so stop() stopped only one of them (the program hung) or the
    shared mailboxes were closed under the other (a crash storm)."""
    worker = Worker()

    async def handler(job: Job[str]) -> Outcome:
        return ACK

    worker.register(unique_name, handler, StrCodec(), fast_options())
    async with anyio.create_task_group() as tg:
        await tg.start(worker.run, client)
        with pytest.raises(RuntimeError, match="already running"):
            await worker.run(client)
        with anyio.fail_after(10):
            await worker.stop()
    # and once stopped it runs again
    async with anyio.create_task_group() as tg:
        await tg.start(worker.run, client)
        await worker.stop()


async def test_statistics_of_an_unknown_registration_is_a_validation_error(
    client: RedisClient, unique_name: str
) -> None:
    from respire_actors.errors import ValidationError

    worker = Worker()

    async def handler(job: Job[str]) -> Outcome:
        return ACK

    worker.register(unique_name, handler, StrCodec(), fast_options())
    with pytest.raises(ValidationError, match="not run"):
        worker.statistics(unique_name)
    async with anyio.create_task_group() as tg:
        await tg.start(worker.run, client)
        with pytest.raises(ValidationError, match=f"known: '{unique_name}'"):
            worker.statistics("typo")
        assert worker.statistics(unique_name).acked == 0
        await worker.stop()


def recording_worker(queue: str) -> tuple[Worker, list[str]]:
    """A worker of ``queue`` whose handler records each job id it sees."""
    worker = Worker()
    seen: list[str] = []

    async def handler(job: Job[str]) -> Outcome:
        seen.append(job.id)
        return ACK

    worker.register(queue, handler, StrCodec(), fast_options())
    return worker, seen


async def test_a_worker_run_again_after_a_fatal_error_does_not_raise_it_again(
    client: RedisClient, unique_name: str
) -> None:
    """Run 1 ends with ConsumerGroupMissing (the group destroyed under it); the operator
    recreates the group and runs the same Worker again: its graceful stop returns normally
    (it used to raise run 1's error again)."""
    from respire_actors.errors import ConsumerGroupMissing
    from respire_actors.jobs.options import CONSUMER_GROUP

    queue = JobQueue(client, unique_name, StrCodec())
    worker, seen = recording_worker(unique_name)
    errors: list[BaseException] = []

    first_run = run_catching(worker, client, ConsumerGroupMissing, errors)

    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            await tg.start(first_run)
            await queue.enqueue("a", "x")
            await wait_until(lambda: seen == ["a"])
            await client.execute("XGROUP", "DESTROY", queue.keys.ready, CONSUMER_GROUP)
            await queue.enqueue("b", "x")
            await wait_until(lambda: bool(errors))
        await client.execute("XGROUP", "CREATE", queue.keys.ready, CONSUMER_GROUP, "$")
        async with anyio.create_task_group() as tg:
            await tg.start(worker.run, client)
            await queue.enqueue("c", "x")
            await wait_until(lambda: "c" in seen)
            await worker.stop()


async def test_a_composed_tree_raises_an_error_no_restart_can_fix(
    client: RedisClient, unique_name: str
) -> None:
    """Found by review: a tree from ``worker.build`` run by the application (or composed into
    its supervisor) stopped gracefully and returned normally when its consumer group vanished,
    so the worker was gone with no error anywhere (a parent supervisor even counted it as a
    clean exit). Its ``run`` raises the error, as ``worker.run`` does."""
    from respire_actors.errors import ConsumerGroupMissing
    from respire_actors.jobs.options import CONSUMER_GROUP

    queue = JobQueue(client, unique_name, StrCodec())
    worker, seen = recording_worker(unique_name)
    tree = worker.build(client)
    errors: list[BaseException] = []

    async def run_tree(*, task_status: anyio.abc.TaskStatus[None]) -> None:
        try:
            await tree.run(task_status=task_status)
        except ConsumerGroupMissing as exc:
            errors.append(exc)

    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            await tg.start(run_tree)
            await queue.enqueue("a", "x")
            await wait_until(lambda: seen == ["a"])
            await client.execute("XGROUP", "DESTROY", queue.keys.ready, CONSUMER_GROUP)
            await queue.enqueue("b", "x")
    assert len(errors) == 1
