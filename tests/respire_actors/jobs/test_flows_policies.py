"""Parent/child flows run by a worker (issue 11, docs/flows.md): leaves first, a parent after
its last child, each failure policy on a three-level tree, results (None vs b""), events
with the flow id, durable retries keeping membership, exceptions retried until the delivery
limit, and the dead letter by recovery at the delivery limit failing the node."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from jobs_helpers import all_events, fast_options, running_worker, wait_until_async

from respire_actors.codecs import StrCodec
from respire_actors.jobs import (
    ACK,
    CONTINUE,
    FAIL_PARENT,
    IGNORE,
    DeadLetter,
    FlowFailurePolicy,
    FlowNode,
    FlowNodeResult,
    Job,
    JobQueue,
    QueueOptions,
    Worker,
)
from respire_actors.redis.client import RedisClient

pytestmark = pytest.mark.anyio


def three_levels() -> FlowNode[str]:
    """root -> (a -> (a1, a2), b); breadth-first: root, a, b, a1, a2."""
    return FlowNode(
        "root",
        "r",
        [FlowNode("a", "pa", [FlowNode("a1", "p1"), FlowNode("a2", "p2")]), FlowNode("b", "pb")],
    )


async def finished(queue: JobQueue[str], flow_id: str) -> list[FlowNodeResult]:
    async def root_terminal() -> bool:
        nodes = await queue.flow_results(flow_id)
        return bool(nodes) and nodes[0].status in ("completed", "failed")

    await wait_until_async(root_terminal, timeout=15)
    return await queue.flow_results(flow_id)


class Recorder:
    """A handler that fails the job ids in ``failing`` (dead letter, at once), returns
    ``<id>(<children>)`` as the result of the rest, and records what each call saw."""

    def __init__(self, failing: set[str] = frozenset()) -> None:  # type: ignore[assignment]
        self.failing = failing
        self.calls: list[str] = []
        self.seen: dict[str, list[FlowNodeResult]] = {}

    async def __call__(self, job: Job[str]) -> Any:
        self.calls.append(job.id)
        children = await job.child_results()
        self.seen[job.id] = children
        if job.id in self.failing:
            return DeadLetter("explicit", "failing on purpose")
        inner = ",".join(
            f"{c.id}={c.status}:{'-' if c.result is None else c.result.decode()}" for c in children
        )
        return job.complete(f"{job.id}({inner})".encode())


async def run_flow(
    client: RedisClient, queue: JobQueue[str], policy: FlowFailurePolicy, handler: Recorder
) -> list[FlowNodeResult]:
    assert await queue.enqueue_flow("f", three_levels(), policy)
    async with running_worker(client, queue.name, handler):
        return await finished(queue, "f")


async def test_leaves_run_first_and_parents_read_their_children(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    handler = Recorder()
    nodes = await run_flow(client, queue, FAIL_PARENT, handler)

    assert set(handler.calls[:3]) == {"b", "a1", "a2"}
    assert handler.calls.index("a") > max(handler.calls.index("a1"), handler.calls.index("a2"))
    assert handler.calls[-1] == "root" and len(handler.calls) == 5
    assert [c.id for c in handler.seen["root"]] == ["a", "b"]
    assert handler.seen["a1"] == []
    assert [(n.id, n.status) for n in nodes] == [
        (n, "completed") for n in ("root", "a", "b", "a1", "a2")
    ]
    assert (
        nodes[0].result
        == b"root(a=completed:a(a1=completed:a1(),a2=completed:a2()),b=completed:b())"
    )
    # completion events carry the flow id
    completed = [e for e in await all_events(client, queue.keys) if e.kind == "completed"]
    assert sorted(e.job_id for e in completed) == ["a", "a1", "a2", "b", "root"]
    assert {e.flow_id for e in completed} == {"f"}
    # once terminal, the flow can be removed
    assert await queue.remove_flow("f") is True
    assert await queue.flow_results("f") == []


async def test_fail_parent_fails_ancestors_without_running_them(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    handler = Recorder({"a1"})
    nodes = await run_flow(client, queue, FAIL_PARENT, handler)

    assert sorted(handler.calls) == ["a1", "a2", "b"]
    assert [(n.id, n.status) for n in nodes] == [
        ("root", "failed"),
        ("a", "failed"),
        ("b", "completed"),
        ("a1", "failed"),
        ("a2", "completed"),
    ]
    assert nodes[0].result is None and nodes[1].result is None
    dead = [e for e in await all_events(client, queue.keys) if e.kind == "dead-letter"]
    unrun = [e for e in dead if e.reason == "child-failed"]
    assert [(e.job_id, e.entry_id, e.attempt, e.flow_id) for e in unrun] == [
        ("a", "0-0", 0, "f"),
        ("root", "0-0", 0, "f"),
    ]
    assert [(e.job_id, e.reason, e.flow_id) for e in dead if e not in unrun] == [
        ("a1", "explicit", "f")
    ]
    # a parent failed without execution has no delivery: nothing reaches the dead-letter stream
    assert await client.execute("XLEN", queue.keys.dead) == 1


async def test_ignore_runs_parents_without_the_failed_children(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    handler = Recorder({"a1"})
    nodes = await run_flow(client, queue, IGNORE, handler)

    assert sorted(handler.calls) == ["a", "a1", "a2", "b", "root"]
    assert [c.id for c in handler.seen["a"]] == ["a2"]
    assert [(n.id, n.status) for n in nodes] == [
        ("root", "completed"),
        ("a", "completed"),
        ("b", "completed"),
        ("a1", "failed"),  # still shown by flow_results
        ("a2", "completed"),
    ]
    assert nodes[1].result == b"a(a2=completed:a2())"


async def test_continue_runs_parents_with_the_failed_children(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    handler = Recorder({"a1", "b"})
    nodes = await run_flow(client, queue, CONTINUE, handler)

    assert sorted(handler.calls) == ["a", "a1", "a2", "b", "root"]
    assert handler.seen["a"] == [
        FlowNodeResult("a1", "failed", None, "a"),
        FlowNodeResult("a2", "completed", b"a2()", "a"),
    ]
    assert [(c.id, c.status) for c in handler.seen["root"]] == [("a", "completed"), ("b", "failed")]
    assert nodes[0].result == (b"root(a=completed:a(a1=failed:-,a2=completed:a2()),b=failed:-)")


async def test_no_result_and_an_empty_result_are_distinct(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    async def handler(job: Job[str]) -> Any:
        if job.id == "empty":
            return job.complete(b"")
        if job.id == "none":
            return ACK
        return job.complete(repr([(c.id, c.result) for c in await job.child_results()]).encode())

    tree = FlowNode("root", "r", [FlowNode("empty", "e"), FlowNode("none", "n")])
    assert await queue.enqueue_flow("f", tree)
    async with running_worker(client, queue.name, handler):
        nodes = await finished(queue, "f")
    assert nodes[1:] == [
        FlowNodeResult("empty", "completed", b"", "root"),
        FlowNodeResult("none", "completed", None, "root"),
    ]
    assert nodes[0].result == b"[('empty', b''), ('none', None)]"


async def test_exceptions_retry_and_durable_retries_keep_membership(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    attempts: dict[str, int] = {}

    async def handler(job: Job[str]) -> Any:
        attempts[job.id] = attempts.get(job.id, 0) + 1
        if job.id == "leaf" and job.total_attempts < 3:
            raise RuntimeError("transient")
        return job.complete(f"{job.id}@{job.total_attempts}".encode())

    tree = FlowNode("root", "r", [FlowNode("leaf", "l")])
    assert await queue.enqueue_flow("f", tree)
    worker = Worker()
    worker.register(
        queue.name,
        handler,
        StrCodec(),
        fast_options(delivery_limit=5),
        queue_options=QueueOptions(retry_backoff=0.01, scheduling_poll_interval=0.05),
    )
    async with anyio.create_task_group() as tg:
        await tg.start(worker.run, client)
        nodes = await finished(queue, "f")
        assert worker.statistics(queue.name).retried == 2
        await worker.stop()
    assert attempts == {"leaf": 3, "root": 1}
    assert [(n.id, n.status, n.result) for n in nodes] == [
        ("root", "completed", b"root@1"),
        ("leaf", "completed", b"leaf@3"),
    ]


async def test_a_flow_runs_end_to_end_on_a_cluster(
    cluster_client: RedisClient, unique_name: str
) -> None:
    """Every flow key shares the queue's hash tag: enqueue, completions that activate parents,
    child results, flow_results and remove_flow all run on the queue's node."""
    queue: JobQueue[str] = JobQueue(cluster_client, unique_name, StrCodec())
    handler = Recorder({"a2"})
    assert await queue.enqueue_flow("f", three_levels(), CONTINUE)
    async with running_worker(cluster_client, queue.name, handler):
        nodes = await finished(queue, "f")
    assert [(n.id, n.status) for n in nodes] == [
        ("root", "completed"),
        ("a", "completed"),
        ("b", "completed"),
        ("a1", "completed"),
        ("a2", "failed"),
    ]
    assert nodes[1].result == b"a(a1=completed:a1(),a2=failed:-)"
    assert await queue.remove_flow("f") is True
