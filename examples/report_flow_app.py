"""A fan-out/fan-in report flow for ``python -m respire_actors serve examples.report_flow_app:app``.

One flow per run: ``report`` (the root) waits for one ``region:<name>`` job per region, and each
region waits for its ``shard:<region>:<n>`` jobs. Shards "fetch" a number, regions add their
shards' numbers, the report adds the regions'. Results are small JSON documents passed up the
tree with ``job.complete`` and read with ``job.child_results``. One shard fails on purpose
under the ``CONTINUE`` policy, so its region still runs and reports the gap.

The app waits for the root's terminal event on the queue's event stream, prints every node of
``flow_results``, removes the finished flow and returns (exit code 0).

Environment: ``REPORT_REGIONS`` (default 3), ``REPORT_SHARDS`` (per region, default 4),
``REPORT_RUN`` (default: a fresh id per run, so every run is a new flow).
"""

from __future__ import annotations

import json
import os
import uuid
from dataclasses import dataclass

import anyio
import anyio.abc

from respire_actors import (
    CONTINUE,
    DeadLetter,
    FlowNode,
    Job,
    JobQueue,
    JsonCodec,
    Outcome,
    RedisClient,
    Worker,
    WorkerOptions,
)
from supervisors import current_child


@dataclass(frozen=True)
class Task:
    kind: str  # "shard" | "region" | "report"
    name: str


CODEC = JsonCodec(Task)
QUEUE = "demo-reports"
FAILING_SHARD = "shard:region-0:1"

worker = Worker("reports")


@worker.job(QUEUE, CODEC, WorkerOptions(consumer_count=8))
async def build(job: Job[Task]) -> Outcome:
    if job.payload.kind == "shard":
        if job.id == FAILING_SHARD:
            return DeadLetter(detail="the shard's source is unavailable")
        await anyio.sleep(0.01)  # pretend to fetch
        number = sum(map(ord, job.id)) % 100
        return job.complete(json.dumps({"total": number}).encode())
    children = await job.child_results()
    total = sum(json.loads(c.result)["total"] for c in children if c.result is not None)
    missing = [c.id for c in children if c.status == "failed"]
    return job.complete(json.dumps({"total": total, "missing": missing}).encode())


def report_tree(regions: int, shards: int) -> FlowNode[Task]:
    return FlowNode(
        "report",
        Task("report", "all regions"),
        [
            FlowNode(
                f"region:region-{r}",
                Task("region", f"region-{r}"),
                [
                    FlowNode(f"shard:region-{r}:{s}", Task("shard", f"{r}/{s}"))
                    for s in range(shards)
                ],
            )
            for r in range(regions)
        ],
    )


class ReportFlowApp:
    """Worker + producer + observer; returns when the run's flow is terminal."""

    def __init__(self, regions: int, shards: int, run_id: str) -> None:
        self.regions = regions
        self.shards = shards
        self.flow_id = f"report:{run_id}"

    async def run(
        self,
        client: RedisClient,
        *,
        task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        queue = JobQueue(client, QUEUE, CODEC)
        async with anyio.create_task_group() as tg:
            await tg.start(worker.run, client)
            task_status.started()
            with current_child().stop_scope():
                async with queue.read_events() as events:
                    tree = report_tree(self.regions, self.shards)
                    created = await queue.enqueue_flow(self.flow_id, tree, CONTINUE)
                    print(f"flow {self.flow_id!r} enqueued: {created}")
                    async for event in events:
                        if event.flow_id == self.flow_id and event.job_id == "report":
                            print(f"root event: {event.kind}")
                            if event.kind in ("completed", "dead-letter"):
                                break
            for node in await queue.flow_results(self.flow_id):
                shown = node.result.decode() if node.result is not None else "-"
                print(f"{node.id:<20} {node.status:<10} {shown}")
            print(f"removed: {await queue.remove_flow(self.flow_id)}")
            await worker.stop()
            tg.cancel_scope.cancel()


app = ReportFlowApp(
    int(os.environ.get("REPORT_REGIONS", "3")),
    int(os.environ.get("REPORT_SHARDS", "4")),
    os.environ.get("REPORT_RUN", uuid.uuid4().hex[:8]),
)
