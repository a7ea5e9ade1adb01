"""Lease renewal, execution budgets and when a handler is cancelled (issue 10; spec 000
"Processing, retry and dead letters", 004 "claim idle time must exceed the enforced execution
budget"): a renewed long job completes once with no recovery; a killed or stopped worker's job is
recovered about one visibility timeout after its last renewal; a budget cancels a handler and
the nack path follows; a handler whose renewal finds another owner is cancelled; renewal off
keeps the fixed lease."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from datetime import timedelta
from typing import Any

import anyio
import pytest
from helpers.proxy import open_fault_proxy
from jobs_helpers import (
    all_events,
    events_of_kind,
    fast_options,
    pending_rows,
    running_worker,
    wait_until,
    wait_until_async,
)

from respire_actors.codecs import StrCodec
from respire_actors.jobs import ACK, Job, JobQueue, Outcome, QueueOptions, Worker
from respire_actors.jobs.options import CONSUMER_GROUP
from respire_actors.redis.client import ConnectionSettings, RedisClient, connect

pytestmark = pytest.mark.anyio

LEASE = timedelta(milliseconds=300)


async def idle_ms(client: RedisClient, queue: JobQueue[str]) -> list[tuple[str, str, int, int]]:
    """(entry id, consumer, idle ms, delivery count) of every pending entry."""
    rows = await client.execute("XPENDING", queue.keys.ready, CONSUMER_GROUP, "-", "+", 100)
    return [(r[0].decode(), r[1].decode(), int(r[2]), int(r[3])) for r in rows]


def child_names(worker: Worker) -> list[str]:
    """The children of the worker's only registration."""
    snapshot = worker.snapshot()
    assert snapshot is not None
    (registration,) = snapshot.children
    assert registration.supervisor is not None
    return [c.name for c in registration.supervisor.children]


async def test_a_renewed_long_job_completes_once_with_no_recovery(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    """The handler runs five visibility timeouts while a second worker recovers aggressively:
    renewal keeps the entry fresh, so nobody recovers it, and it completes once."""
    await queue.enqueue("long", "x")
    calls: list[str] = []

    async def handler(job: Job[str]) -> Outcome:
        calls.append(job.id)
        with anyio.fail_after(30):  # 5 x the lease, in small steps
            for _ in range(15):
                await anyio.sleep(LEASE.total_seconds() / 3)
        return ACK

    async def other(job: Job[str]) -> Outcome:
        calls.append(f"other:{job.id}")
        return ACK

    opts = fast_options(consumer_count=1, visibility_timeout=LEASE)
    async with running_worker(client, queue.name, handler, options=opts) as a:
        sa = a.statistics(queue.name)
        await wait_until(lambda: sa.started == 1)
        async with running_worker(client, queue.name, other, options=opts) as b:
            await wait_until(lambda: sa.acked == 1, timeout=30)
            sb = b.statistics(queue.name)
            assert sa.recovered == sb.recovered == sb.started == 0
        assert sa.leases_lost == 0 and sa.leases_renewed >= 5

    assert calls == ["long"]
    completed = await events_of_kind(client, queue.keys, "completed")
    assert [(e.job_id, e.attempt) for e in completed] == [("long", 1)]
    assert await pending_rows(client, queue.keys) == []


async def test_a_worker_with_a_shorter_visibility_timeout_leaves_longer_leases_alone(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    """Found by review (a rolling deploy that shortens the timeout): worker A (30 s, so it
    renews every 10 s) runs four 2.5 s jobs while worker B (0.5 s) recovers every 50 ms. B
    used to claim all four after 0.5 s and run them again; now its recovery waits for A's
    recorded 30 s, and every job runs once."""
    for i in range(4):
        await queue.enqueue(f"j{i}", "x")
    calls: list[tuple[str, str]] = []

    async def slow(job: Job[str]) -> Outcome:
        calls.append(("a", job.id))
        await anyio.sleep(2.5)
        return ACK

    async def other(job: Job[str]) -> Outcome:
        calls.append(("b", job.id))
        return ACK

    long_opts = fast_options(consumer_count=4, visibility_timeout=timedelta(seconds=30))
    short_opts = fast_options(consumer_count=4, visibility_timeout=timedelta(milliseconds=500))
    async with running_worker(client, queue.name, slow, options=long_opts) as a:
        sa = a.statistics(queue.name)
        await wait_until(lambda: sa.started == 4)
        await anyio.sleep(0.2)  # A's first recovery pass has recorded its 30 s
        async with running_worker(client, queue.name, other, options=short_opts) as b:
            await wait_until(lambda: sa.acked == 4, timeout=15)
            sb = b.statistics(queue.name)
            assert sb.recovered == sb.started == 0
    assert sorted(calls) == [("a", f"j{i}") for i in range(4)]
    assert sa.stale_completions == 0
    completed = await events_of_kind(client, queue.keys, "completed")
    assert sorted((e.job_id, e.attempt) for e in completed) == [(f"j{i}", 1) for i in range(4)]


async def test_without_renewal_the_same_job_is_cancelled_and_recovered(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    """renew_leases=False keeps the fixed lease: the handler is cancelled at the visibility
    timeout and the job is delivered again (attempt 2), and no renewer runs."""
    await queue.enqueue("long", "x")
    attempts: list[int] = []

    async def handler(job: Job[str]) -> Outcome:
        attempts.append(job.attempt)
        if job.attempt == 1:
            await anyio.sleep(5 * LEASE.total_seconds())
        return ACK

    opts = fast_options(consumer_count=1, visibility_timeout=LEASE, renew_leases=False)
    async with running_worker(client, queue.name, handler, options=opts) as worker:
        stats = worker.statistics(queue.name)
        await wait_until(lambda: stats.acked == 1)
        assert stats.leases_lost == 1 and stats.recovered == 1
        assert stats.renewal_passes == stats.leases_renewed == 0
        assert "renewer" not in child_names(worker)
    assert attempts == [1, 2]


async def test_the_renewer_is_a_child_of_each_registration(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    async def handler(job: Job[str]) -> Outcome:
        return ACK

    async with running_worker(client, queue.name, handler) as worker:
        names = child_names(worker)
        # started before the completer and the runners: stopped after both
        assert names.index("renewer") < names.index("completer") < names.index("runners")


async def test_the_budget_cancels_the_handler_and_the_nack_path_follows(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    """Attempt 1 runs out of its budget: a nack below the limit (the entry stays pending and
    is recovered); attempt 2 runs out too: at the limit it is dead-lettered as
    processing-failed, with the timeout in the detail. No lease is lost."""
    await queue.enqueue("slow", "x")
    cancelled: list[int] = []

    async def handler(job: Job[str]) -> Outcome:
        try:
            await anyio.sleep_forever()
        except anyio.get_cancelled_exc_class():
            cancelled.append(job.attempt)
            raise
        return ACK  # pragma: no cover

    opts = fast_options(consumer_count=1, visibility_timeout=LEASE, timeout=0.2, delivery_limit=2)
    async with running_worker(client, queue.name, handler, options=opts) as worker:
        stats = worker.statistics(queue.name)
        await wait_until(lambda: stats.dead_lettered == 1, timeout=20)
        assert stats.timed_out == 2 and stats.nacked == 2
        assert stats.leases_lost == 0 and stats.recovered == 1

    assert cancelled == [1, 2]
    ((_, letter),) = await queue.read_dead_letters()
    assert letter["_respire.reason"] == b"processing-failed"
    assert letter["_respire.attempt"] == b"2"
    assert letter["_respire.detail"].startswith(b"timeout")
    assert await pending_rows(client, queue.keys) == []


@pytest.mark.parametrize("how", ["swallowed", "shielded"])
async def test_a_handler_that_overruns_its_budget_by_ignoring_the_cancellation_is_no_success(
    client: RedisClient, queue: JobQueue[str], how: str
) -> None:
    """Found by review: a handler that caught the budget's cancellation (or shielded its
    work) and returned after the budget was acknowledged, as if the budget did not exist. It
    takes the nack path and counts as timed out, like one the budget cancelled."""
    await queue.enqueue("stubborn", "x")

    async def handler(job: Job[str]) -> Outcome:
        if how == "shielded":
            with anyio.CancelScope(shield=True):
                await anyio.sleep(0.5)
        else:
            try:
                await anyio.sleep(5)
            except anyio.get_cancelled_exc_class():
                pass
        return ACK

    opts = fast_options(consumer_count=1, visibility_timeout=LEASE, timeout=0.2, delivery_limit=1)
    async with running_worker(client, queue.name, handler, options=opts) as worker:
        stats = worker.statistics(queue.name)
        await wait_until(lambda: stats.dead_lettered == 1, timeout=20)
        assert stats.timed_out == 1 and stats.acked == 0
    ((_, letter),) = await queue.read_dead_letters()
    assert letter["_respire.detail"].startswith(b"timeout")


async def test_a_budget_with_a_retry_backoff_stages_a_durable_retry(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    await queue.enqueue("slow", "x")
    totals: list[int] = []

    async def handler(job: Job[str]) -> Outcome:
        totals.append(job.total_attempts)
        if job.total_attempts == 1:
            await anyio.sleep_forever()
        return ACK

    worker = Worker()
    worker.register(
        queue.name,
        handler,
        queue.codec,
        fast_options(consumer_count=1, timeout=0.2),
        queue_options=QueueOptions(
            retry_backoff=timedelta(milliseconds=1),
            scheduling_poll_interval=timedelta(milliseconds=50),
        ),
    )
    async with anyio.create_task_group() as tg:
        await tg.start(worker.run, client)
        stats = worker.statistics(queue.name)
        await wait_until(lambda: stats.acked == 1, timeout=20)
        assert stats.timed_out == 1 and stats.retried == 1
        await worker.stop()
    assert totals == [1, 2]


async def test_a_handler_whose_renewal_finds_another_owner_is_cancelled(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    """Another consumer takes the entry (as its recovery would); the handler makes no fenced
    call, yet the renewer's next pass finds the new owner and cancels it: no outcome."""
    enqueued = await queue.enqueue("j", "x")
    started = anyio.Event()
    cancelled: list[str] = []

    async def handler(job: Job[str]) -> Outcome:
        started.set()
        try:
            while True:  # noqa: ASYNC110 - busy with awaits, but no fenced call
                await anyio.sleep(0.01)
        except anyio.get_cancelled_exc_class():
            cancelled.append(job.id)
            raise

    opts = fast_options(consumer_count=1, visibility_timeout=LEASE)
    async with running_worker(client, queue.name, handler, options=opts) as worker:
        stats = worker.statistics(queue.name)
        with anyio.fail_after(10):
            await started.wait()
        await client.execute(
            "XCLAIM", queue.keys.ready, CONSUMER_GROUP, "thief", 0, enqueued.entry_id
        )
        await wait_until(lambda: stats.leases_lost == 1)
        await wait_until(lambda: cancelled == ["j"])
        assert stats.acked == stats.stale_completions == stats.nacked == 0
        assert stats.leases_expired == 0  # found lost by the renewal, not given up

    assert await pending_rows(client, queue.keys) == [(enqueued.entry_id, "thief", 2)]
    assert await all_events(client, queue.keys) == []


async def test_a_handler_whose_job_was_settled_elsewhere_is_cancelled(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    """The entry is acknowledged under the handler (another process recovered and finished
    it): the renewal finds nothing pending and cancels the handler."""
    enqueued = await queue.enqueue("j", "x")
    started = anyio.Event()

    async def handler(job: Job[str]) -> Outcome:
        started.set()
        await anyio.sleep_forever()

    async with running_worker(
        client, queue.name, handler, options=fast_options(visibility_timeout=LEASE)
    ) as worker:
        stats = worker.statistics(queue.name)
        with anyio.fail_after(10):
            await started.wait()
        await client.execute("XACK", queue.keys.ready, CONSUMER_GROUP, enqueued.entry_id)
        await wait_until(lambda: stats.leases_lost == 1)
        assert stats.acked == stats.nacked == stats.leases_expired == 0
    assert await pending_rows(client, queue.keys) == []


async def test_a_hung_server_ends_the_lease_one_visibility_timeout_after_the_last_renewal(
    spawn_valkey: Any, unique_name: str
) -> None:
    """No renewal can be confirmed (the server is stopped with SIGSTOP): the lease is given up
    a visibility timeout after the last confirmed renewal, not before, and the handler is
    cancelled without an outcome, since others may recover the job from then on."""
    server = spawn_valkey()
    vis = 0.6
    async with connect(f"{server.url}?command_timeout=30") as client:
        queue = JobQueue(client, unique_name, StrCodec())
        await queue.enqueue("j", "x")
        started = anyio.Event()
        cancelled_at: list[float] = []

        async def handler(job: Job[str]) -> Outcome:
            started.set()
            try:
                await anyio.sleep_forever()
            finally:
                cancelled_at.append(anyio.current_time())
            return ACK  # pragma: no cover

        opts = fast_options(
            consumer_count=1,
            visibility_timeout=vis,
            recovery_interval=timedelta(seconds=60),
            shutdown_grace=timedelta(milliseconds=100),
        )
        worker = Worker()
        worker.register(queue.name, handler, queue.codec, opts)
        async with anyio.create_task_group() as tg:
            await tg.start(worker.run, client)
            stats = worker.statistics(queue.name)
            with anyio.fail_after(10):
                await started.wait()
            await wait_until(lambda: stats.leases_renewed >= 2)
            os.kill(server.pid, signal.SIGSTOP)
            try:
                stopped_at = anyio.current_time()
                renewed = stats.leases_renewed
                await wait_until(lambda: stats.leases_expired == 1, timeout=10)
                await wait_until(lambda: cancelled_at != [])
                assert stats.leases_renewed == renewed
                assert stats.leases_lost == 1 and stats.renewal_failures >= 1
                # the last confirmed renewal was sent at most a pass before the stop
                assert cancelled_at[0] - stopped_at >= vis - vis / 3 - 0.05
                assert cancelled_at[0] - stopped_at <= vis + 2.0
            finally:
                os.kill(server.pid, signal.SIGCONT)
            await worker.stop()
        assert stats.acked == stats.nacked == 0


LONG_WORKER = textwrap.dedent(
    """
    import sys
    from datetime import timedelta

    import anyio

    from respire_actors.codecs import StrCodec
    from respire_actors.jobs import ACK, Worker, WorkerOptions
    from respire_actors.redis.client import connect

    url, queue, record, backend = sys.argv[1:5]

    async def main():
        async with connect(url) as client:
            async def handler(job):
                await client.execute("RPUSH", record, f"started:{job.attempt}")
                try:
                    while True:
                        await anyio.sleep(0.05)
                except anyio.get_cancelled_exc_class():
                    with anyio.CancelScope(shield=True):
                        await client.execute("RPUSH", record, f"cancelled:{job.attempt}")
                    raise

            worker = Worker()
            options = WorkerOptions(
                consumer_name="doomed",
                visibility_timeout=timedelta(seconds=1),
                recovery_interval=timedelta(seconds=60),
            )
            worker.register(queue, handler, StrCodec(), options)
            await worker.run(client)

    anyio.run(main, backend=backend)
    """
)


async def start_long_worker(
    server_url: str, queue: JobQueue[str], record: str, backend: str
) -> anyio.abc.Process:
    return await anyio.open_process(
        [sys.executable, "-c", LONG_WORKER, server_url, queue.name, record, backend],
        stdin=subprocess.DEVNULL,
        stdout=None,
        stderr=None,
    )


async def records(client: RedisClient, key: str) -> list[str]:
    return [r.decode() for r in await client.execute("LRANGE", key, 0, -1)]


@pytest.mark.slow
async def test_a_killed_workers_job_is_recovered_one_visibility_timeout_after_its_last_renewal(
    server_url: str, client: RedisClient, queue: JobQueue[str], anyio_backend: str
) -> None:
    enqueued = await queue.enqueue("crash", "x")
    record = queue.keys.custom("record")
    vis = 1.0
    process = await start_long_worker(server_url, queue, record, anyio_backend)
    started_at: list[float] = []

    async def handler(job: Job[str]) -> Outcome:
        started_at.append(anyio.current_time())
        return ACK

    try:
        await wait_until_async(lambda: _has(client, record, "started:1"), timeout=30)
        opts = fast_options(visibility_timeout=vis, recovery_interval=timedelta(milliseconds=50))
        async with running_worker(client, queue.name, handler, options=opts) as rescuer:
            stats = rescuer.statistics(queue.name)
            # Three visibility timeouts with a live owner and an eager rescuer: renewal keeps
            # the entry's idle time under the visibility timeout, so nothing is recovered.
            with anyio.move_on_after(3 * vis):
                while True:
                    ((_, owner, idle, count),) = await idle_ms(client, queue)
                    assert (owner, count) == ("doomed", 1) and idle < vis * 1000
                    await anyio.sleep(0.1)
            assert stats.recovered == 0
            process.kill()  # SIGKILL: no cleanup, no acknowledgement
            with anyio.fail_after(10, shield=True):
                await process.aclose()
            ((_, _, idle, _),) = await idle_ms(client, queue)
            last_renewal = anyio.current_time() - idle / 1000
            await wait_until(lambda: stats.acked == 1, timeout=15)
            assert stats.recovered == 1
    finally:
        if process.returncode is None:
            process.kill()
            with anyio.fail_after(10, shield=True):
                await process.aclose()

    waited = started_at[0] - last_renewal
    assert vis - 0.1 <= waited <= vis + 3.0  # recovered about one visibility timeout later
    completed = await events_of_kind(client, queue.keys, "completed")
    assert [(e.entry_id, e.attempt) for e in completed] == [(enqueued.entry_id, 2)]
    assert await pending_rows(client, queue.keys) == []


async def _has(client: RedisClient, key: str, item: str) -> bool:
    return item in await records(client, key)


@pytest.mark.slow
async def test_a_stopped_worker_is_cancelled_when_it_resumes_and_its_job_completes_once(
    server_url: str, client: RedisClient, queue: JobQueue[str], anyio_backend: str
) -> None:
    """SIGSTOP a worker past its visibility timeout: another worker recovers and completes the
    job. On SIGCONT the stopped worker's renewer finds the job is no longer its own and cancels
    the handler; the job was completed exactly once."""
    enqueued = await queue.enqueue("paused", "x")
    record = queue.keys.custom("record")
    process = await start_long_worker(server_url, queue, record, anyio_backend)

    async def handler(job: Job[str]) -> Outcome:
        return ACK

    try:
        await wait_until_async(lambda: _has(client, record, "started:1"), timeout=30)
        process.send_signal(signal.SIGSTOP)
        opts = fast_options(visibility_timeout=1.0, recovery_interval=timedelta(milliseconds=50))
        async with running_worker(client, queue.name, handler, options=opts) as rescuer:
            await wait_until(lambda: rescuer.statistics(queue.name).acked == 1, timeout=15)
        process.send_signal(signal.SIGCONT)
        await wait_until_async(lambda: _has(client, record, "cancelled:1"), timeout=15)
    finally:
        process.send_signal(signal.SIGCONT)
        process.kill()
        with anyio.fail_after(10, shield=True):
            await process.aclose()

    assert await records(client, record) == ["started:1", "cancelled:1"]
    completed = await events_of_kind(client, queue.keys, "completed")
    assert [(e.entry_id, e.attempt) for e in completed] == [(enqueued.entry_id, 2)]
    assert await pending_rows(client, queue.keys) == []


async def test_a_handler_whose_entry_body_was_deleted_is_cancelled(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    """The entry is deleted under the running handler: renewal cannot renew it (XCLAIM would
    drop it from the pending list), so the handler is cancelled like a lost lease and the
    pending reference is left for recovery to clear."""
    enqueued = await queue.enqueue("j", "x")
    started = anyio.Event()

    async def handler(job: Job[str]) -> Outcome:
        started.set()
        await anyio.sleep_forever()

    opts = fast_options(visibility_timeout=LEASE, recovery_interval=timedelta(seconds=60))
    async with running_worker(client, queue.name, handler, options=opts) as worker:
        stats = worker.statistics(queue.name)
        with anyio.fail_after(10):
            await started.wait()
        await client.execute("XDEL", queue.keys.ready, enqueued.entry_id)
        await wait_until(lambda: stats.leases_lost == 1)
        assert stats.leases_expired == stats.acked == stats.nacked == 0
        consumer = worker.consumer_name(queue.name)
    assert await pending_rows(client, queue.keys) == [(enqueued.entry_id, consumer, 1)]


async def test_renewal_on_a_cluster(cluster_client: RedisClient, unique_name: str) -> None:
    """One key per renewal call (the ready stream): it runs on the queue's node."""
    queue = JobQueue(cluster_client, unique_name, StrCodec())
    await queue.enqueue("long", "x")

    async def handler(job: Job[str]) -> Outcome:
        await anyio.sleep(4 * LEASE.total_seconds())
        return ACK

    opts = fast_options(consumer_count=1, visibility_timeout=LEASE)
    async with running_worker(cluster_client, queue.name, handler, options=opts) as worker:
        stats = worker.statistics(queue.name)
        await wait_until(lambda: stats.acked == 1, timeout=20)
        assert stats.leases_lost == stats.recovered == 0 and stats.leases_renewed >= 3


async def test_an_outcome_whose_send_is_cancelled_leaves_no_lease_behind(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    """The completer's mailbox is full (it is busy with an earlier batch during an outage) and
    the runner is cancelled while sending its outcome (the end of its shutdown grace): the
    lease must not stay in the running set, where it would be renewed forever and its entry
    never recovered while the process lives."""
    import math

    from jobs_helpers import create_group, deliver, new_runtime

    from respire_actors.actors.messages import Completion
    from respire_actors.actors.runner import process
    from supervisors import Mailbox

    async def handler(job: Job[str]) -> Outcome:
        return ACK

    await queue.enqueue("j1", "x")
    await create_group(client, queue.keys)
    rt = new_runtime(client, queue.name, handler=handler)
    rt.completions.close()
    rt.completions = Mailbox[Completion](1, name="completions")
    try:
        (delivery,) = await deliver(client, queue.keys, "tester")
        rt.completions.send_nowait(Completion(delivery, "ack"))  # full
        with anyio.move_on_after(0.3):
            await process(rt, delivery, math.inf)
        assert rt.leases == set()
    finally:
        rt.completions.close()
        rt.deliveries.close()


async def test_an_outcome_waiting_out_an_outage_longer_than_its_lease_is_not_run_again(
    client: RedisClient, server_url: str, queue: JobQueue[str]
) -> None:
    """Found by review: handlers returned during a network outage longer than the visibility
    timeout; their leases, expired unconfirmed, were no longer renewed, so when the server
    came back this worker's own recovery claimed the entries before its completer's retry
    committed them, and every finished job ran a second time (at the delivery limit it was
    dead-lettered, though its handler had succeeded)."""
    await queue.enqueue_many([(f"j{i}", "x") for i in range(4)])
    port = ConnectionSettings.from_url(server_url).port
    runs: dict[str, int] = {}
    returned: list[str] = []

    async def handler(job: Job[str]) -> Outcome:
        runs[job.id] = runs.get(job.id, 0) + 1
        await anyio.sleep(0.5)
        returned.append(job.id)
        return ACK

    options = fast_options(
        visibility_timeout=timedelta(seconds=1),
        recovery_interval=timedelta(milliseconds=200),
    )
    async with (
        open_fault_proxy(port) as proxy,
        connect(f"{proxy.url}?command_timeout=0.5") as proxied,
        running_worker(proxied, queue.name, handler, options=options) as worker,
    ):
        stats = worker.statistics(queue.name)
        await wait_until(lambda: len(runs) == 4)
        proxy.go_down()
        await wait_until(lambda: len(returned) == 4)  # outcomes decided while down
        await anyio.sleep(6)  # well past the visibility timeout (the commit retries back off)
        proxy.come_back()
        await wait_until(lambda: stats.acked == 4, timeout=20)
        await anyio.sleep(1.0)  # a recovery pass or two after the commits
    assert runs == {f"j{i}": 1 for i in range(4)}
    assert await client.execute("XLEN", queue.keys.dead) == 0
