"""Flows with real worker processes (issue 11): a worker SIGKILLed after its children's
completions activated the parent (and possibly while it held the parent's delivery) leaves the
parent queued exactly once; another process runs it to completion exactly once."""

from __future__ import annotations

import signal
from contextlib import AbstractAsyncContextManager

import anyio
import anyio.abc
import pytest
from jobs_helpers import fields_of, python_process, text, wait_until_async

from respire_actors.jobs import FlowNode, JobQueue
from respire_actors.redis.client import RedisClient

pytestmark = pytest.mark.anyio

WORKER_SCRIPT = r"""
import sys, anyio
from datetime import timedelta
from respire_actors import connect, StrCodec, Worker, WorkerOptions

url, queue, record, tag = sys.argv[1:5]

async def main():
    async with connect(url) as client:
        async def handler(job):
            await client.execute("RPUSH", record, f"{tag}:{job.id}:start")
            if job.id == "root" and tag == "doomed":
                await anyio.sleep_forever()  # the parent never finishes here
            children = await job.child_results()
            await client.execute("RPUSH", record, f"{tag}:{job.id}:end")
            return job.complete(",".join(c.id for c in children).encode())
        worker = Worker()
        worker.register(
            queue, handler, StrCodec(),
            WorkerOptions(consumer_count=4,
                          visibility_timeout=timedelta(seconds=1),
                          recovery_interval=timedelta(milliseconds=200),
                          poll_interval=timedelta(milliseconds=100),
                          shutdown_grace=timedelta(seconds=1)),
        )
        await worker.run(client)

anyio.run(main)
"""


def worker_process(
    server_url: str, queue: JobQueue[str], record: str, tag: str
) -> AbstractAsyncContextManager[anyio.abc.Process]:
    return python_process(WORKER_SCRIPT, server_url, queue.name, record, tag)


@pytest.mark.parametrize("moment", ["activated", "running"])
async def test_a_killed_worker_leaves_the_parent_queued_once_and_it_runs_once(
    client: RedisClient, server_url: str, queue: JobQueue[str], moment: str
) -> None:
    """``activated``: killed as soon as the last child's completion queued the parent (it may or
    may not have read it yet); ``running``: killed while it holds the parent's delivery."""
    record = queue.keys.custom("handled")
    tree = FlowNode("root", "r", [FlowNode(f"leaf{i}", "x") for i in range(3)])
    assert await queue.enqueue_flow("f", tree)

    async def root_is(status: str) -> bool:
        return (await queue.flow_results("f"))[0].status == status

    async def root_started() -> bool:
        handled = await client.execute("LRANGE", record, 0, -1)
        return b"doomed:root:start" in handled

    with anyio.fail_after(60):
        async with worker_process(server_url, queue, record, "doomed") as doomed:
            # the last child's completion activated the parent
            await wait_until_async(lambda: root_is("ready"), timeout=30)
            if moment == "running":
                await wait_until_async(root_started, timeout=30)
            doomed.send_signal(signal.SIGKILL)
            await doomed.wait()
        async with worker_process(server_url, queue, record, "survivor"):
            await wait_until_async(lambda: root_is("completed"), timeout=30)

    rows = await client.execute("XRANGE", queue.keys.ready, "-", "+")
    activated = [f for _, f in rows if fields_of(f)["_respire.job.id"] == b"root"]
    assert len(activated) == 1  # queued exactly once
    handled = [text(v) for v in await client.execute("LRANGE", record, 0, -1)]
    assert [h for h in handled if h.endswith("root:end")] == ["survivor:root:end"]
    assert sorted(h for h in handled if h.startswith("doomed:leaf") and h.endswith(":end")) == [
        f"doomed:leaf{i}:end" for i in range(3)
    ]
    root = (await queue.flow_results("f"))[0]
    assert root.result == b"leaf0,leaf1,leaf2"
    events = [fields_of(f) for _, f in await client.execute("XRANGE", queue.keys.events, "-", "+")]
    completed = [e for e in events if e["kind"] == b"completed" and e["job_id"] == b"root"]
    assert len(completed) == 1 and completed[0]["flow"] == b"f"
