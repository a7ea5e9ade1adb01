"""Application group controls with real worker processes: a group's concurrency limit and GCRA
rate hold across two processes (admission times from Redis TIME, read back from the lease
owners), a SIGKILLed worker's permit frees itself at expiry and its job is recovered, and a
SIGSTOPped worker's stale completion cannot free the permit of the attempt that replaced it."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta

import anyio
import anyio.abc
import pytest
from jobs_helpers import text, wait_until_async

from respire_actors.jobs import JobEnqueueOptions, JobQueue, RateLimit
from respire_actors.redis.client import RedisClient

pytestmark = pytest.mark.anyio

WORKER_SCRIPT = r"""
import sys, anyio
from datetime import timedelta
from respire_actors import connect, StrCodec, Worker, WorkerOptions, QueueOptions
from respire_actors.keys import JobQueueKeys

url, queue, record, tag, mode, visibility = sys.argv[1:7]
keys = JobQueueKeys(queue)

async def main():
    async with connect(url) as client:
        async def handler(job):
            if mode == "conc":
                n = await client.execute("INCR", keys.custom("running"))
                await client.execute("RPUSH", record, n)
                await anyio.sleep(0.03)
                await client.execute("DECR", keys.custom("running"))
            elif mode == "rate":
                g = job.group.encode()
                member = b"%08x" % len(g) + g + job.entry_id.encode()
                owner = await client.execute("HGET", keys.group_owners, member)
                attempt, expiry, _ = owner.decode().split(":", 2)
                await client.execute("RPUSH", record, int(expiry) - 60_000)
            else:
                await client.execute("RPUSH", record, f"{tag}:{job.id}:start")
                if job.id == "victim" and tag == "doomed":
                    await anyio.sleep_forever()
                if job.id == "victim":
                    # a lost lease may cancel the handler in its sleep or in the RPUSH after
                    # it (a resumed process wakes both at once): either is recorded
                    try:
                        await anyio.sleep(1.5)
                        await client.execute("RPUSH", record, f"{tag}:{job.id}:end")
                    except anyio.get_cancelled_exc_class():
                        with anyio.CancelScope(shield=True):
                            await client.execute("RPUSH", record, f"{tag}:{job.id}:cancelled")
                        raise
                    return
                await client.execute("RPUSH", record, f"{tag}:{job.id}:end")
        worker = Worker()
        worker.register(
            queue, handler, StrCodec(),
            WorkerOptions(consumer_count=4,
                          visibility_timeout=timedelta(seconds=float(visibility)),
                          recovery_interval=timedelta(milliseconds=300),
                          poll_interval=timedelta(milliseconds=200),
                          shutdown_grace=timedelta(seconds=1)),
            queue_options=QueueOptions(scheduling_poll_interval=timedelta(milliseconds=100)),
        )
        await worker.run(client)

anyio.run(main)
"""


@asynccontextmanager
async def worker_process(
    server_url: str,
    queue: JobQueue[str],
    record: str,
    tag: str,
    mode: str,
    visibility: float = 30,
) -> AsyncIterator[anyio.abc.Process]:
    proc = await anyio.open_process(
        [
            sys.executable,
            "-c",
            WORKER_SCRIPT,
            server_url,
            queue.name,
            record,
            tag,
            mode,
            str(visibility),
        ],
        stdout=subprocess.DEVNULL,
    )
    try:
        yield proc
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGCONT)
            proc.terminate()
        with anyio.fail_after(20, shield=True):
            await proc.wait()
            await proc.aclose()


async def records(client: RedisClient, record: str) -> list[str]:
    return [text(v) for v in await client.execute("LRANGE", record, 0, -1)]


async def test_max_concurrency_holds_across_two_processes(
    client: RedisClient, server_url: str, queue: JobQueue[str]
) -> None:
    record = queue.keys.custom("handled")
    await queue.set_group_options("t", max_concurrency=3)
    await queue.enqueue_scheduled_many(
        [(f"j{i}", "x") for i in range(120)], JobEnqueueOptions(group="t")
    )
    with anyio.fail_after(60):
        async with (
            worker_process(server_url, queue, record, "a", "conc"),
            worker_process(server_url, queue, record, "b", "conc"),
        ):

            async def all_done() -> bool:
                return len(await records(client, record)) >= 120

            await wait_until_async(all_done, timeout=50)
    counts = [int(x) for x in await records(client, record)]
    assert max(counts) == 3  # reached, never exceeded by 8 runners in two processes


async def test_gcra_admissions_across_two_processes(
    client: RedisClient, server_url: str, queue: JobQueue[str]
) -> None:
    """A burst of 4, then one admission per 250 ms: for admissions sorted by Redis time,
    the (i+k)-th comes at least (k - 3) * 250 ms after the i-th."""
    record = queue.keys.custom("handled")
    await queue.set_group_options("r", rate_limit=RateLimit(4, timedelta(seconds=1)))
    await queue.enqueue_scheduled_many(
        [(f"j{i}", "x") for i in range(14)], JobEnqueueOptions(group="r")
    )
    with anyio.fail_after(60):
        async with (
            worker_process(server_url, queue, record, "a", "rate"),
            worker_process(server_url, queue, record, "b", "rate"),
        ):

            async def all_done() -> bool:
                return len(await records(client, record)) >= 14

            await wait_until_async(all_done, timeout=40)
    admits = sorted(int(x) for x in await records(client, record))
    for i in range(len(admits)):
        for k in range(1, len(admits) - i):
            assert admits[i + k] - admits[i] >= (k - 3) * 250, (i, k, admits)
    # and the limiter really admitted at its rate, not slower (a loaded machine may add delay)
    assert admits[-1] - admits[0] >= (14 - 4) * 250


async def test_a_killed_workers_group_permit_frees_at_expiry_and_its_job_is_recovered(
    client: RedisClient, server_url: str, queue: JobQueue[str]
) -> None:
    record = queue.keys.custom("handled")
    await queue.set_group_options("k", max_concurrency=1, lease_duration=1)
    await queue.enqueue_scheduled("victim", "x", JobEnqueueOptions(group="k"))
    with anyio.fail_after(60):
        async with worker_process(server_url, queue, record, "doomed", "kill", 2) as doomed:

            async def victim_started() -> bool:
                return "doomed:victim:start" in await records(client, record)

            await wait_until_async(victim_started, timeout=20)
            await queue.enqueue_scheduled_many(
                [(f"o{i}", "x") for i in range(3)], JobEnqueueOptions(group="k")
            )
            doomed.send_signal(signal.SIGKILL)
            async with worker_process(server_url, queue, record, "survivor", "kill", 2):

                async def all_done() -> bool:
                    done = await records(client, record)
                    if not all(f"survivor:{j}:end" in done for j in ("victim", "o0", "o1", "o2")):
                        return False
                    # a handler records its end before its completion (which releases the
                    # permit) is committed: wait for the release while the survivor runs
                    info = await queue.get_group("k")
                    return info.running == 0 and info.staged == 0

                await wait_until_async(all_done, timeout=30)


async def test_a_stopped_workers_stale_completion_does_not_free_the_replacements_permit(
    client: RedisClient, server_url: str, queue: JobQueue[str]
) -> None:
    record = queue.keys.custom("handled")
    await queue.set_group_options(
        "s", max_concurrency=1, lease_duration=timedelta(milliseconds=2500)
    )
    await queue.enqueue_scheduled("victim", "x", JobEnqueueOptions(group="s"))
    with anyio.fail_after(90):
        # the stopped worker's own visibility timeout is long, its group lease short: after
        # SIGCONT its handler either completes first (a stale completion) or is cancelled by
        # the renewer, which finds the lease lost; neither may free the replacement's permit
        async with worker_process(server_url, queue, record, "stopped", "stop", 60) as stopped:

            async def victim_started() -> bool:
                return "stopped:victim:start" in await records(client, record)

            await wait_until_async(victim_started, timeout=20)
            stopped.send_signal(signal.SIGSTOP)
            async with worker_process(server_url, queue, record, "other", "stop", 2):

                async def recovered() -> bool:
                    return "other:victim:start" in await records(client, record)

                await wait_until_async(recovered, timeout=20)
                await queue.enqueue_scheduled_many(
                    [(f"o{i}", "x") for i in range(3)], JobEnqueueOptions(group="s")
                )
                stopped.send_signal(signal.SIGCONT)

                async def stale_done() -> bool:
                    done = await records(client, record)
                    return "stopped:victim:end" in done or "stopped:victim:cancelled" in done

                # the resumed process needs a renewal pass (about 1 s) to find its lease
                # lost; generous for a loaded CI machine (it once took over 10 s there)
                await wait_until_async(stale_done, timeout=30)
                await anyio.sleep(0.2)  # its completion (stale) has been sent by now
                done = await records(client, record)
                if "other:victim:end" not in done:
                    # the replacement still holds the group's only permit
                    assert (await queue.get_group("s")).running == 1

                async def all_done() -> bool:
                    done = await records(client, record)
                    return sum(x.endswith(":end") and ":o" in x for x in done) == 3

                await wait_until_async(all_done, timeout=20)
    done = await records(client, record)
    victim_end = done.index("other:victim:end")
    starts = [i for i, x in enumerate(done) if ":o" in x and x.endswith(":start")]
    assert starts and min(starts) > victim_end, done  # no second job while the permit was held
