"""Batches with two real worker processes: the final completions of a batch race across the
processes (members held at a barrier, then released together), and each callback is still
published and run exactly once, with one batch-completed event per batch."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import anyio.abc
import pytest
from jobs_helpers import events_of_kind, fields_of, text, wait_until_async

from respire_actors.errors import ServerError
from respire_actors.jobs import Callback, JobQueue
from respire_actors.redis.client import RedisClient

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

WORKER_SCRIPT = r"""
import sys, anyio
from datetime import timedelta
from respire_actors import connect, StrCodec, Worker, WorkerOptions
from respire_actors.keys import JobQueueKeys

url, queue, tag = sys.argv[1:4]
keys = JobQueueKeys(queue)

async def main():
    async with connect(url) as client:
        async def handler(job):
            if job.batch_id is not None:
                # hold every member until the test opens the barrier of its batch
                while await client.execute("EXISTS", keys.custom("go:" + job.batch_id)) == 0:
                    await anyio.sleep(0.005)
                await client.execute("HSET", keys.custom("ran-by"), job.id, tag)
            await client.execute("HINCRBY", keys.custom("runs"), job.id, 1)
        worker = Worker()
        worker.register(
            queue, handler, StrCodec(),
            WorkerOptions(consumer_count=4, visibility_timeout=timedelta(seconds=30),
                          recovery_interval=timedelta(milliseconds=300),
                          poll_interval=timedelta(milliseconds=100),
                          shutdown_grace=timedelta(seconds=1)),
        )
        await worker.run(client)

anyio.run(main)
"""

ROUNDS = 6
MEMBERS = 8


@asynccontextmanager
async def worker_process(server_url: str, queue: str, tag: str) -> AsyncIterator[None]:
    proc = await anyio.open_process(
        [sys.executable, "-c", WORKER_SCRIPT, server_url, queue, tag], stdout=subprocess.DEVNULL
    )
    try:
        yield
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
        with anyio.fail_after(20, shield=True):
            await proc.wait()
            await proc.aclose()


async def test_two_processes_racing_final_completions_publish_each_callback_once(
    client: RedisClient, server_url: str, queue: JobQueue[str]
) -> None:
    runs_key = queue.keys.custom("runs")
    batches: list[str] = []

    async def held() -> bool:
        # every member of the round's batch is running: 4 permits in each process, so each
        # process holds 4 of the 8 members at the barrier
        try:
            info = await client.execute("XPENDING", queue.keys.ready, "respire")
        except ServerError:  # the workers have not created the consumer group yet
            return False
        return int(info[0]) >= MEMBERS

    async def finished(r: int) -> bool:
        runs = await client.execute("HMGET", runs_key, f"ok-{r}", f"done-{r}")
        return all(v is not None for v in runs)

    with anyio.fail_after(120):
        async with (
            worker_process(server_url, queue.name, "a"),
            worker_process(server_url, queue.name, "b"),
        ):
            for r in range(ROUNDS):
                batch = await queue.create_batch(
                    on_success=Callback(f"ok-{r}", "s"),
                    on_failure=Callback(f"fail-{r}", "f"),
                    on_complete=Callback(f"done-{r}", "c"),
                    batch_id=f"b{r}",
                )
                await queue.add_many_to_batch(
                    batch, [(f"{batch}-m{i}", "x") for i in range(MEMBERS)]
                )
                await queue.seal_batch(batch)
                batches.append(batch)
                await wait_until_async(held, timeout=30)
                await client.execute("SET", queue.keys.custom(f"go:{batch}"), "1")
                await wait_until_async(lambda r=r: finished(r), timeout=30)
            await anyio.sleep(0.5)  # time for a duplicate publication to run, were there one

    runs = {text(k): int(v) for k, v in (await _hgetall(client, runs_key)).items()}
    for r, batch in enumerate(batches):
        status = await queue.batch_status(batch)
        assert status is not None
        assert (status.succeeded, status.pending, status.completed) == (MEMBERS, 0, True)
        assert runs[f"ok-{r}"] == 1 and runs[f"done-{r}"] == 1 and f"fail-{r}" not in runs
    rows = await client.execute("XRANGE", queue.keys.ready, "-", "+")
    callbacks = [
        text(f["_respire.job.id"])
        for f in (fields_of(flat) for _, flat in rows)
        if "_respire.batch" not in f
    ]
    assert sorted(callbacks) == sorted(
        [f"ok-{r}" for r in range(ROUNDS)] + [f"done-{r}" for r in range(ROUNDS)]
    )
    completed = await events_of_kind(client, queue.keys, "batch-completed")
    assert sorted(e.batch_id or "" for e in completed) == sorted(batches)
    # both processes finished members, so final completions really came from two processes
    ran_by = {text(v) for v in (await _hgetall(client, queue.keys.custom("ran-by"))).values()}
    assert ran_by == {"a", "b"}


async def _hgetall(client: RedisClient, key: str) -> dict[object, object]:
    reply = await client.execute("HGETALL", key)
    if isinstance(reply, dict):
        return reply
    return dict(zip(reply[0::2], reply[1::2], strict=True))
