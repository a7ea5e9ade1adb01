"""A demo app for ``python -m respire_actors serve examples.batch_app:app``: a batch with
completion callbacks.

It creates a batch for one report with three callbacks (published on success, on failure, and
on completion either way), adds one member job per report part, seals the batch, prints the
batch's events as they happen and returns once both published callbacks have run. Then it prints
the final status and removes the batch's state. Callbacks are ordinary jobs on the same queue,
run by the same handler.

Environment: ``DEMO_PARTS`` (default 6), ``DEMO_FAIL_PART`` (a part number that is
dead-lettered, so ``on_failure`` runs instead of ``on_success``; default none), ``DEMO_RUN``
(default: a fresh id per run).
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass

import anyio
import anyio.abc

from respire_actors import (
    ACK,
    Callback,
    DeadLetter,
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
class ReportTask:
    action: str  # "render" (a member: one part of the report) or "notify" (a callback)
    text: str


CODEC = JsonCodec(ReportTask)
QUEUE = "demo-reports"
FAIL_PART = os.environ.get("DEMO_FAIL_PART", "")

worker = Worker("demo-batch")


@worker.job(QUEUE, CODEC, WorkerOptions(consumer_count=4))
async def handle(job: Job[ReportTask]) -> Outcome:
    if job.payload.action == "notify":
        print(f"callback {job.id}: {job.payload.text}", flush=True)
        return ACK
    await anyio.sleep(0.05)  # pretend to render the part
    if job.payload.text == f"part {FAIL_PART}":
        return DeadLetter(detail="the renderer refused this part")
    return ACK


class BatchDemo:
    """Worker + producer + observer; returns when the batch's callbacks have run."""

    def __init__(self, parts: int, run_id: str) -> None:
        self.parts = parts
        self.run_id = run_id

    async def run(
        self,
        client: RedisClient,
        *,
        task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        queue = JobQueue(client, QUEUE, CODEC)
        report = f"report:{self.run_id}"
        finished = f"{report}:finished"
        callbacks = {f"{report}:publish", f"{report}:alert", finished}
        ran: set[str] = set()
        async with anyio.create_task_group() as tg:
            await tg.start(worker.run, client)
            task_status.started()
            with current_child().stop_scope():
                async with queue.read_events() as events:
                    batch = await queue.create_batch(
                        on_success=Callback(f"{report}:publish", ReportTask("notify", "publish")),
                        on_failure=Callback(f"{report}:alert", ReportTask("notify", "alert")),
                        on_complete=Callback(finished, ReportTask("notify", "all parts done")),
                        batch_id=report,
                    )
                    added = await queue.add_many_to_batch(
                        batch,
                        [
                            (f"{report}:part-{i}", ReportTask("render", f"part {i}"))
                            for i in range(self.parts)
                        ],
                    )
                    await queue.seal_batch(batch)
                    print(f"batch {batch!r}: {sum(added)} new members, sealed", flush=True)
                    async for event in events:
                        if event.batch_id == batch:
                            print(f"{event.kind:<16} {event.job_id or event.extra}", flush=True)
                        if event.kind == "completed" and event.job_id in callbacks:
                            ran.add(event.job_id)
                            # on_complete, and on_success or on_failure: both have run
                            if finished in ran and len(ran) == 2:
                                break
            status = await queue.batch_status(batch)
            assert status is not None
            print(
                f"status: {status.succeeded} succeeded, {status.failed} failed, "
                f"{status.cancelled} cancelled, {status.pending} pending, "
                f"completed={status.completed}",
                flush=True,
            )
            print(f"removed: {await queue.remove_batch(batch)}", flush=True)
            await worker.stop()
            tg.cancel_scope.cancel()


app = BatchDemo(
    int(os.environ.get("DEMO_PARTS", "6")), os.environ.get("DEMO_RUN", uuid.uuid4().hex[:8])
)
