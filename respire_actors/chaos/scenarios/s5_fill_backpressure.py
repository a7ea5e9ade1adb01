"""Scenario 5: fill and backpressure (seed 004: a bounded queue under producers, and recovery
after an outage that must not overwhelm the workers).

Case ``bounded-queue/slow-workers``: producers race to enqueue into a queue with a backlog bound
while a slow worker process drains it. The backlog (accepted, not finished: ready, running,
awaiting recovery) must never exceed the bound; each refusal must be a typed ``QueueFull`` that
wrote nothing; the application then republishes its refused jobs with ``wait=`` and every
accepted job completes exactly once.

Case ``outage/expired-leases``: a worker process takes a lease on every job, then is SIGKILLed
while holding them, so the whole backlog sits pending with expiring leases. A second worker
recovers it: no recovery pass may claim more than ``recovery_page_size * recovery_max_pages``
(read from its ``recovery-pass`` telemetry) and no more than ``consumer_count`` handlers may
run at once (counted by the handlers themselves).
"""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any, ClassVar

import anyio

from ...codecs import JsonValueCodec
from ...errors import ServerError
from ...jobs import JobQueue
from ...redis.client import RedisClient, connect
from ..ledger import Ledger, read_ledger
from ..model import ChaosContext, Verdict
from ..processes import WorkerProcess, start_worker
from ..producer import produce
from ..reconcile import accepted_jobs, read_outcomes, reconcile, wait_for_outcomes
from . import register

NAME = "fill-and-backpressure"


async def drop_queue(client: RedisClient, queue: JobQueue[Any]) -> None:
    """Delete every key of ``queue`` (SCAN on its hash tag): a chaos run leaves nothing behind."""
    pattern = queue.keys.base.replace("{", "[{]").replace("}", "[}]") + "*"
    cursor: Any = 0
    while True:
        cursor, found = await client.execute("SCAN", cursor, "MATCH", pattern, "COUNT", 1000)
        for key in found:
            await client.execute("UNLINK", key)
        if int(cursor) == 0:
            return


def max_running(effects: Path, pid: int | None = None) -> int:
    return max(
        (
            int(line.get("running", 0))
            for line in read_ledger(effects)
            if line.get("kind") == "effect" and (pid is None or line.get("pid") == pid)
        ),
        default=0,
    )


def _check_running(
    effects: Path, consumers: int, violations: list[str], pid: int | None = None
) -> int:
    """:func:`max_running`, with a violation when it exceeds ``consumers``."""
    running = max_running(effects, pid)
    if running > consumers:
        violations.append(f"{running} handlers ran at once; consumer_count is {consumers}")
    return running


@register
class FillAndBackpressure:
    number: ClassVar[int] = 5
    name: ClassVar[str] = NAME
    title: ClassVar[str] = "a bounded queue under racing producers; bounded recovery after outage"
    ci: ClassVar[bool] = True
    own_servers: ClassVar[bool] = False

    async def run(self, ctx: ChaosContext) -> list[Verdict]:
        assert ctx.redis_url is not None
        async with connect(ctx.redis_url) as client:
            return [await self.bounded_fill(ctx, client), await self.outage(ctx, client)]

    # -- bounded queue --------------------------------------------------------------------
    async def bounded_fill(self, ctx: ChaosContext, client: RedisClient) -> Verdict:
        case = "bounded-queue/slow-workers"
        bound, producers, per_producer, consumers = (
            (200, 8, 500, 16) if ctx.full else (20, 3, 60, 4)
        )
        started = time.monotonic()
        queue = JobQueue(client, ctx.name("fill"), JsonValueCodec())
        work = ctx.path("s5", "fill")
        ledger_path, effects = work / "producer.jsonl", work / "effects.jsonl"
        await queue.set_max_backlog(bound)
        worker = start_worker(
            ctx.redis_url or "", queue.name, effects, work / "workers",
            "--consumers", str(consumers), backend=ctx.backend,
        )  # fmt: skip
        violations: list[str] = []
        peak = 0
        sampling = True

        async def sample() -> None:
            nonlocal peak
            while sampling:
                peak = max(peak, (await queue.backlog()).backlog)
                await anyio.sleep(0.005)

        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(sample)
                with Ledger(ledger_path) as ledger:
                    # phase 1: producers race without waiting: the bound refuses the excess
                    async with anyio.create_task_group() as producing:
                        for p in range(producers):
                            jobs = [(f"p{p}-{i}", {"sleep": 0.05}) for i in range(per_producer)]
                            producing.start_soon(produce, queue, jobs, ledger)
                    lines = list(read_ledger(ledger_path))
                    refused = [line for line in lines if line["kind"] == "failed"]
                    refused_ids = {str(line["job"]) for line in refused}
                    for line in refused:
                        if not str(line["error"]).startswith("QueueFull(") or line["ran"]:
                            violations.append(f"{line['job']}: refused with {line['error']}")
                    early = await read_outcomes(queue, effects)
                    ran_refused = [j for j in refused_ids if early.executions[j]]
                    if ran_refused:
                        violations.append(f"refused jobs ran: {sorted(ran_refused)[:5]}")
                    # phase 2: the outbox republishes the refused jobs, waiting for room
                    again = [(j, {"sleep": 0.05}) for j in sorted(refused_ids)]
                    _, still_failed = await produce(queue, again, ledger, wait=60.0)
                accepted = set(accepted_jobs(ledger_path))
                outcomes = await wait_for_outcomes(queue, effects, accepted, 60.0)
                sampling = False
        finally:
            code = worker.stop()
            await drop_queue(client, queue)
        if peak > bound:
            violations.append(f"the backlog reached {peak}, over the bound of {bound}")
        if not refused:
            violations.append("no enqueue was refused: the bound was never reached")
        if still_failed:
            violations.append(f"{still_failed} jobs still refused after waiting 60 s")
        running = _check_running(effects, consumers, violations)
        return reconcile(
            NAME, case, accepted, outcomes, time.monotonic() - started,
            violations=violations,
            details={
                "bound": bound,
                "peak_backlog": peak,
                "queue_full_raised": len(refused),
                "republished_with_wait": len(refused_ids),
                "max_running": running,
                "consumers": consumers,
                "worker_exit": code,
            },
        )  # fmt: skip

    # -- outage and recovery ----------------------------------------------------------------
    async def outage(self, ctx: ChaosContext, client: RedisClient) -> Verdict:
        case = "outage/expired-leases"
        jobs, consumers, page, pages = (1000, 32, 16, 2) if ctx.full else (120, 16, 4, 2)
        per_pass = page * pages
        started = time.monotonic()
        queue = JobQueue(client, ctx.name("outage"), JsonValueCodec())
        work = ctx.path("s5", "outage")
        ledger_path, effects = work / "producer.jsonl", work / "effects.jsonl"
        common = ("--visibility-ms", "1000", "--recovery-ms", "250", "--grace-ms", "200")
        violations: list[str] = []
        holder: WorkerProcess | None = None
        rescuer: WorkerProcess | None = None
        try:
            with Ledger(ledger_path) as ledger:
                specs = [(f"j{i}", {"stall": 120, "sleep": 0.02}) for i in range(jobs)]
                await produce(queue, specs, ledger)
            holder = start_worker(
                ctx.redis_url or "", queue.name, effects, work / "workers",
                "--consumers", str(jobs), *common, backend=ctx.backend,
            )  # fmt: skip
            held = await self._wait_pending(client, queue, jobs, 30.0)
            holder.kill()
            killed_by = holder.process.returncode
            if killed_by != -signal.SIGKILL:
                violations.append(f"the lease holder exited with {killed_by}, not SIGKILL")
            rescuer = start_worker(
                ctx.redis_url or "", queue.name, effects, work / "workers",
                "--consumers", str(consumers), "--recovery-page-size", str(page),
                "--recovery-max-pages", str(pages), "--record-recovery", *common,
                backend=ctx.backend,
            )  # fmt: skip
            accepted = set(accepted_jobs(ledger_path))
            outcomes = await wait_for_outcomes(queue, effects, accepted, 90.0)
        finally:
            if holder is not None and holder.alive():
                holder.kill()
            code = rescuer.stop() if rescuer is not None else None
            await drop_queue(client, queue)
        passes = [
            int(line["claimed"])
            for line in read_ledger(effects)
            if line.get("kind") == "recovery-pass" and rescuer and line.get("pid") == rescuer.pid
        ]
        if not passes:
            violations.append("the rescuing worker recorded no recovery pass")
        elif max(passes) > per_pass:
            violations.append(f"a recovery pass claimed {max(passes)}; the bound is {per_pass}")
        if held < jobs:
            violations.append(f"only {held} of {jobs} leases were held at the kill")
        running = _check_running(effects, consumers, violations, rescuer.pid if rescuer else None)
        return reconcile(
            NAME, case, accepted, outcomes, time.monotonic() - started,
            violations=violations,
            details={
                "leases_held_at_sigkill": held,
                "holder_exit": killed_by,
                "recovery_passes": len(passes),
                "max_claimed_per_pass": max(passes, default=0),
                "pass_bound": per_pass,
                "max_running": running,
                "consumers": consumers,
                "rescuer_exit": code,
            },
        )  # fmt: skip

    @staticmethod
    async def _wait_pending(
        client: RedisClient, queue: JobQueue[Any], want: int, timeout: float
    ) -> int:
        """Wait until ``want`` deliveries are pending (leases held); returns the count seen."""
        deadline = time.monotonic() + timeout
        count = 0
        while time.monotonic() < deadline:
            try:
                summary = await client.execute("XPENDING", queue.keys.ready, "respire")
            except ServerError:  # the group is created by the worker's start-up
                summary = [0]
            count = int(summary[0] or 0)
            if count >= want:
                break
            await anyio.sleep(0.05)
        return count
