"""Application job groups with a running worker: handlers see ``job.group``, a group's
concurrency limit holds across runners, failures release the permit, paused groups wait and
resume, and grouped work is fair next to a large backlog."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import anyio
import pytest
from jobs_helpers import fast_options, wait_until_async

from respire_actors.codecs import StrCodec
from respire_actors.jobs import NACK, JobEnqueueOptions, JobQueue, QueueOptions, Worker
from respire_actors.redis.client import RedisClient

pytestmark = pytest.mark.anyio

QO = QueueOptions(scheduling_poll_interval=timedelta(milliseconds=100))


async def run(client: RedisClient, queue: JobQueue[str], handler: Any, **options: Any) -> Worker:
    worker = Worker()
    worker.register(queue.name, handler, StrCodec(), fast_options(**options), queue_options=QO)
    return worker


async def test_handlers_see_the_group_and_max_concurrency_holds(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    await queue.set_group_options("t1", max_concurrency=2)
    running: dict[str, int] = {"t1": 0, "t2": 0}
    peak: dict[str, int] = {"t1": 0, "t2": 0}
    seen: list[tuple[str, str | None]] = []

    async def handler(job: Any) -> None:
        group = job.group
        seen.append((job.id, group))
        running[group] += 1
        peak[group] = max(peak[group], running[group])
        await anyio.sleep(0.03)
        running[group] -= 1

    for g in ("t1", "t2"):
        await queue.enqueue_scheduled_many(
            [(f"{g}-{i}", "x") for i in range(12)], JobEnqueueOptions(group=g)
        )
    await queue.enqueue("plain", "x")
    worker = await run(client, queue, handler, consumer_count=6)
    async with anyio.create_task_group() as tg:
        await tg.start(worker.run, client)

        async def done() -> bool:
            return len(seen) == 25

        await wait_until_async(done, timeout=20)
        await worker.stop()
    assert peak["t1"] == 2  # limited (and reached)
    assert peak["t2"] > 2  # unlimited: uses the runners
    assert ("plain", None) in seen
    assert {g for _, g in seen} == {"t1", "t2", None}
    info = await queue.get_group("t1")
    assert info.running == 0 and info.staged == 0


async def test_a_failed_grouped_handler_releases_its_permit(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    """Unsuccessful processing (a nack left for visibility recovery) releases the lease, so the
    group's next job runs although the failed one is still pending."""
    await queue.set_group_options("g", max_concurrency=1)
    await queue.enqueue_scheduled("bad", "x", JobEnqueueOptions(group="g"))
    await queue.enqueue_scheduled("good", "x", JobEnqueueOptions(group="g", delay=0.05))
    done: list[str] = []

    async def handler(job: Any) -> Any:
        if job.id == "bad":
            return NACK
        done.append(job.id)
        return None

    worker = await run(client, queue, handler)
    async with anyio.create_task_group() as tg:
        await tg.start(worker.run, client)

        async def good_done() -> bool:
            return done == ["good"]

        await wait_until_async(good_done, timeout=10)
        releases = worker.statistics(queue.name).group_releases
        await worker.stop()
    assert releases >= 1


async def test_paused_group_waits_while_others_run_then_resumes(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    await queue.pause_group("slow")
    for g in ("slow", "fast"):
        await queue.enqueue_scheduled_many(
            [(f"{g}-{i}", "x") for i in range(3)], JobEnqueueOptions(group=g)
        )
    done: list[str] = []

    async def handler(job: Any) -> None:
        done.append(job.group)

    worker = await run(client, queue, handler)
    async with anyio.create_task_group() as tg:
        await tg.start(worker.run, client)

        async def fast_done() -> bool:
            return done.count("fast") == 3

        await wait_until_async(fast_done, timeout=10)
        await anyio.sleep(0.3)
        assert "slow" not in done
        assert (await queue.get_group("slow")).parked == "paused"
        assert await queue.resume_group("slow")

        async def slow_done() -> bool:
            return done.count("slow") == 3

        await wait_until_async(slow_done, timeout=10)
        await worker.stop()


async def test_a_newly_staged_grouped_job_wakes_a_blocked_reader(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    """The idle reader blocks on the ready stream and the staging stream: a grouped job staged
    while it waits is selected at once, not after the (long) poll interval."""
    done = anyio.Event()

    async def handler(job: Any) -> None:
        done.set()

    worker = Worker()
    worker.register(
        queue.name,
        handler,
        StrCodec(),
        fast_options(poll_interval=timedelta(seconds=20)),
        queue_options=QueueOptions(scheduling_poll_interval=timedelta(seconds=20)),
    )
    async with anyio.create_task_group() as tg:
        await tg.start(worker.run, client)

        async def blocked() -> bool:
            return worker.statistics(queue.name).read_calls >= 1

        await wait_until_async(blocked, timeout=10)
        await anyio.sleep(0.2)
        await queue.enqueue_scheduled("late", "x", JobEnqueueOptions(group="g"))
        with anyio.fail_after(5):
            await done.wait()
        await worker.stop()


async def test_a_group_lease_shorter_than_the_renewal_pace_is_kept_while_its_handler_runs(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    """A 300 ms group lease under a 3 s visibility timeout (whose own renewal pace is 1 s): the
    renewer paces itself by the group lease, so a healthy handler running 1.2 s keeps it, is
    not cancelled, and the group's second job waits for it (the lease used to lapse: both ran
    at once and the first was cancelled and run again)."""
    await queue.set_group_options(
        "g", max_concurrency=1, lease_duration=timedelta(milliseconds=300)
    )
    await queue.enqueue_scheduled_many([("g1", "x"), ("g2", "x")], JobEnqueueOptions(group="g"))
    log: list[tuple[str, str, int]] = []
    running = peak = 0

    async def handler(job: Any) -> None:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        log.append(("start", job.id, job.attempt))
        try:
            await anyio.sleep(1.2)
        except BaseException:
            log.append(("cancelled", job.id, job.attempt))
            raise
        finally:
            running -= 1
        log.append(("end", job.id, job.attempt))

    worker = await run(client, queue, handler, visibility_timeout=timedelta(seconds=3))
    async with anyio.create_task_group() as tg:
        await tg.start(worker.run, client)

        async def both_done() -> bool:
            return sum(1 for e in log if e[0] == "end") == 2

        await wait_until_async(both_done, timeout=20)
        stats = worker.statistics(queue.name)
        await worker.stop()
    assert peak == 1, log
    assert log == [
        ("start", "g1", 1),
        ("end", "g1", 1),
        ("start", "g2", 1),
        ("end", "g2", 1),
    ]
    assert stats.leases_lost == 0
    # about ten renewals per second of handler time (a third of 300 ms), not one per second
    assert stats.renewal_passes >= 12


async def test_grouped_jobs_starting_often_do_not_hold_back_the_renewal_pass(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    """Each grouped job that starts wakes the renewer to plan again; the regular pass stays due
    an interval after the previous one (replanning from "now" pushed it back for as long as
    grouped jobs kept starting, until every lease expired: a healthy long handler was
    cancelled at its visibility timeout and run again)."""
    done: list[str] = []
    cancelled: list[str] = []

    async def handler(job: Any) -> None:
        if job.id == "warm":
            await anyio.sleep(0.5)  # renewed once: the group's lease duration is learned
        if job.id == "long":
            try:
                await anyio.sleep(2.5)
            except BaseException:
                cancelled.append(job.id)
                raise
        done.append(job.id)

    worker = await run(client, queue, handler, visibility_timeout=timedelta(seconds=1.5))
    async with anyio.create_task_group() as tg:
        await tg.start(worker.run, client)
        await queue.enqueue_scheduled("warm", "x", JobEnqueueOptions(group="g"))
        await anyio.sleep(1.0)
        await queue.enqueue("long", "x")
        for i in range(15):  # a grouped job starting every 0.2 s while "long" runs
            await queue.enqueue_scheduled(f"s{i}", "x", JobEnqueueOptions(group="g"))
            await anyio.sleep(0.2)

        async def long_done() -> bool:
            return "long" in done

        await wait_until_async(long_done, timeout=15)
        stats = worker.statistics(queue.name)
        await worker.stop()
    assert cancelled == [] and done.count("long") == 1
    assert stats.leases_expired == 0 and stats.leases_lost == 0


async def test_a_graceful_stop_hands_back_the_permits_of_what_it_did_not_finish(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    """Found by review: handlers cancelled by the worker's stop (past its shutdown grace) kept
    their group permits until the group lease expired (60 s by default), so the group stalled
    with nothing running. The stop now hands them back (fenced); the entries stay pending for
    recovery."""
    await queue.set_group_options("g", max_concurrency=3)
    await queue.enqueue_scheduled_many(
        [(f"j{i}", "x") for i in range(3)], JobEnqueueOptions(group="g")
    )
    started: list[str] = []

    async def handler(job: Any) -> None:
        started.append(job.id)
        await anyio.sleep_forever()

    worker = await run(
        client, queue, handler, consumer_count=3, shutdown_grace=timedelta(milliseconds=200)
    )
    async with anyio.create_task_group() as tg:
        await tg.start(worker.run, client)

        async def all_running() -> bool:
            return len(started) == 3 and (await queue.get_group("g")).running == 3

        await wait_until_async(all_running, timeout=10)
        await worker.stop()
    info = await queue.get_group("g")
    assert info.running == 0, info
    assert worker.statistics(queue.name).group_releases == 3
    # the entries themselves stay pending for recovery
    pending = await client.execute("XPENDING", queue.keys.ready, "respire")
    assert int(pending[0]) == 3


async def test_a_stale_delivery_of_a_paused_group_does_not_stop_a_rate_limited_queue(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    """Found by review: under a queue rate limit every read was sent to recover the oldest
    entry idle past the visibility timeout; when its group was paused the recovery claimed
    nothing and the next read was sent there again, so no other job of the queue ran while
    the group stayed paused. Reads now go on while that entry cannot be claimed."""
    from respire_actors import RateLimit

    await queue.set_rate_limit(RateLimit(100, timedelta(seconds=1)))
    await queue.enqueue_scheduled("stuck", "x", JobEnqueueOptions(group="g1"))
    started: list[str] = []

    async def hang(job: Any) -> None:
        started.append(job.id)
        await anyio.sleep_forever()

    first = await run(client, queue, hang, shutdown_grace=timedelta(milliseconds=100))
    async with anyio.create_task_group() as tg:
        await tg.start(first.run, client)

        async def running() -> bool:
            return started == ["stuck"]

        await wait_until_async(running, timeout=10)
        await queue.pause_group("g1")
        await first.stop()  # "stuck" stays pending
    await anyio.sleep(1.5)  # and is idle past the next worker's visibility timeout
    await queue.enqueue_many([(f"plain{i}", "x") for i in range(10)])
    await queue.enqueue_scheduled_many(
        [(f"g2-{i}", "x") for i in range(3)], JobEnqueueOptions(group="g2")
    )
    done: list[str] = []

    async def handler(job: Any) -> None:
        done.append(job.id)

    second = await run(client, queue, handler, visibility_timeout=timedelta(seconds=1))
    async with anyio.create_task_group() as tg:
        await tg.start(second.run, client)

        async def others_done() -> bool:
            return len(done) == 13

        await wait_until_async(others_done, timeout=20)
        await second.stop()
    assert "stuck" not in done  # its group is still paused
