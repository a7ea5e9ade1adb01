"""A demo of recurring jobs for ``python -m respire_actors serve examples.recurring_app:app``.

It upserts two schedules on the ``demo-reports`` queue, a heartbeat every two seconds (with
catch-up, so ticks missed while nothing ran are enqueued after a restart) and a cron schedule
at the start of every minute, then runs a worker whose recurring ticker enqueues the ticks and
whose handler prints them. It stops after ``DEMO_TICKS`` (default 3) heartbeats and removes
its schedules, unless ``DEMO_KEEP=1``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import anyio
import anyio.abc

from respire_actors import (
    CATCH_UP,
    Job,
    JobQueue,
    JsonCodec,
    RecurringOptions,
    RedisClient,
    Worker,
    WorkerOptions,
)
from supervisors import current_child


@dataclass(frozen=True)
class Report:
    name: str


CODEC = JsonCodec(Report)
QUEUE = "demo-reports"

worker = Worker("recurring-demo")
heartbeats = anyio.Event()
seen = {"heartbeat": 0}


@worker.job(
    QUEUE,
    CODEC,
    WorkerOptions(consumer_count=2),
    recurring=RecurringOptions(poll_interval=timedelta(milliseconds=500)),
)
async def run_report(job: Job[Report]) -> None:
    when = job.tick.isoformat(timespec="seconds") if job.tick else "?"
    print(f"{job.payload.name:<10} tick {when}  job {job.id}")
    if job.schedule_id == "heartbeat":
        seen["heartbeat"] += 1
        if seen["heartbeat"] >= int(os.environ.get("DEMO_TICKS", "3")):
            heartbeats.set()


class RecurringDemo:
    async def run(
        self,
        client: RedisClient,
        *,
        task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        scheduler = JobQueue(client, QUEUE, CODEC).scheduler()
        beat = await scheduler.upsert(
            "heartbeat", Report("heartbeat"), interval=timedelta(seconds=2), missed=CATCH_UP
        )
        minute = await scheduler.upsert("minutely", Report("minutely"), cron="* * * * *")
        print(f"heartbeat next due {beat.next_due:%H:%M:%S}, minutely {minute.next_due:%H:%M:%S}")
        async with anyio.create_task_group() as tg:
            await tg.start(worker.run, client)
            task_status.started()
            with current_child().stop_scope():
                await heartbeats.wait()
            print(f"ticker statistics: {worker.ticker_statistics(QUEUE)}")
            await worker.stop()
            tg.cancel_scope.cancel()
        if os.environ.get("DEMO_KEEP") != "1":
            for schedule_id in ("heartbeat", "minutely"):
                await scheduler.remove(schedule_id)


app = RecurringDemo()
