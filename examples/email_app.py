"""A demo app for ``python -m respire_actors serve examples.email_app:app``.

It enqueues a batch of "welcome email" jobs, processes them with a handler that reports
progress and writes per-job logs, prints a progress table from the queue's event stream, and
stops once every job has completed. Run it twice: deduplication makes the second run's enqueues
no-ops unless you change ``DEMO_RUN``.

Environment: ``DEMO_JOBS`` (default 12), ``DEMO_RUN`` (default: a fresh id per run).
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass

import anyio
import anyio.abc

from respire_actors import (
    ACK,
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
class WelcomeEmail:
    recipient: str
    name: str


CODEC = JsonCodec(WelcomeEmail)
QUEUE = "demo-email"

worker = Worker("demo")


@worker.job(QUEUE, CODEC, WorkerOptions(consumer_count=4))
async def send_welcome(job: Job[WelcomeEmail]) -> Outcome:
    await job.log(f"rendering welcome email for {job.payload.name}")
    for percent in (25, 50, 75):
        await anyio.sleep(0.05)  # pretend to work
        if not await job.report_progress(percent):
            return ACK  # another delivery owns this job now; our scope is being cancelled
    await job.log(f"sent to {job.payload.recipient}")
    return ACK


class DemoApp:
    """Worker + producer + observer; returns when the demo batch has completed."""

    def __init__(self, jobs: int, run_id: str) -> None:
        self.jobs = jobs
        self.run_id = run_id

    async def run(
        self,
        client: RedisClient,
        *,
        task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        queue = JobQueue(client, QUEUE, CODEC)
        ids = [f"welcome:{self.run_id}:{i}" for i in range(self.jobs)]
        done: set[str] = set()
        async with anyio.create_task_group() as tg:
            await tg.start(worker.run, client)
            task_status.started()
            # serve's graceful stop (SIGINT/SIGTERM) ends the observer; the worker, a nested
            # supervisor, receives the same stop request and drains on its own.
            with current_child().stop_scope():
                async with queue.read_events() as events:
                    results = await queue.enqueue_many(
                        (job_id, WelcomeEmail(f"user{i}@example.com", f"User {i}"))
                        for i, job_id in enumerate(ids)
                    )
                    new = sum(r.enqueued for r in results)
                    print(f"enqueued {new} new jobs ({len(results) - new} duplicates) on {QUEUE!r}")
                    print(f"{'job':<28} {'event':<12} {'progress':>8}")
                    wanted = set(ids)
                    async for event in events:
                        if event.job_id not in wanted:
                            continue
                        shown = f"{event.percent}%" if event.percent is not None else ""
                        print(f"{event.job_id:<28} {event.kind:<12} {shown:>8}")
                        if event.kind in ("completed", "dead-letter"):
                            done.add(event.job_id)
                            if done == wanted:
                                break
            logs = await queue.get_logs(ids[0])
            print(f"logs of {ids[0]}: {logs}")
            print(
                f"{len(done)} of {len(ids)} jobs completed; statistics: {worker.statistics(QUEUE)}"
            )
            await worker.stop()
            tg.cancel_scope.cancel()


app = DemoApp(
    int(os.environ.get("DEMO_JOBS", "12")), os.environ.get("DEMO_RUN", uuid.uuid4().hex[:8])
)
