"""Scenario 6: trim the ready stream as hard as the policy allows (``max_length=0``: every entry
is out of policy) near the oldest pending entry, and prove the safe trim never removes a
payload some consumer still needs: pending entries of a SIGKILLed worker, entries a lagging
second consumer group has not read, durable retries, delayed jobs and job groups' staged jobs.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import anyio

from ...admin import QueueAdmin
from ...codecs import JsonValueCodec
from ...errors import RespireError
from ...jobs import JobEnqueueOptions, JobQueue
from ...jobs.queue import _s
from ...redis.client import RedisClient, connect
from ...retention import apply_trim, entry_id_key
from ..ledger import Ledger
from ..model import ChaosContext, Verdict
from ..observe import wait_until_settled
from ..processes import start_worker
from ..producer import produce
from ..reconcile import accepted_jobs, read_outcomes, reconcile, with_violations
from . import register


@dataclass
class TrimWatch:
    """What an aggressive trimmer did and saw: trims, entries removed, trims whose cutoff was
    the oldest pending entry itself, pending payloads checked, and violations."""

    trims: int = 0
    removed: int = 0
    at_oldest_pending: int = 0
    payload_checks: int = 0
    violations: list[str] = field(default_factory=list)

    def details(self) -> dict[str, Any]:
        return {
            "trims": self.trims,
            "entries removed": self.removed,
            "trims cut at the oldest pending entry": self.at_oldest_pending,
            "pending payloads checked": self.payload_checks,
        }


async def pending_ids(client: RedisClient, stream: str, group: str = "respire") -> list[str]:
    rows = await client.execute("XPENDING", stream, group, "-", "+", 1000)
    return [_s(row[0]) for row in rows or ()]


async def check_payloads(client: RedisClient, stream: str, watch: TrimWatch) -> None:
    """Every pending entry of every group still has its payload."""
    groups = await client.execute("XINFO", "GROUPS", stream)
    for group in groups or ():
        info = (
            dict(zip(map(_s, group[::2]), group[1::2], strict=False))
            if isinstance(group, list)
            else {_s(k): v for k, v in group.items()}
        )
        for entry_id in await pending_ids(client, stream, _s(info["name"])):
            watch.payload_checks += 1
            if not await client.execute("XRANGE", stream, entry_id, entry_id):
                watch.violations.append(f"pending entry {entry_id} lost its payload to a trim")


async def trim_hard(client: RedisClient, stream: str, watch: TrimWatch) -> int:
    """One trim with every entry out of policy; checks the pending payloads afterwards."""
    oldest = await pending_ids(client, stream)
    result = await apply_trim(client, stream, max_length=0)
    watch.trims += 1
    watch.removed += result.removed
    if result.removed and oldest and result.cutoff == oldest[0]:
        watch.at_oldest_pending += 1
    if result.removed and oldest and entry_id_key(result.cutoff or "0") > entry_id_key(oldest[0]):
        # fine if it was acknowledged between the XPENDING and the trim; not if still pending
        still = await client.execute("XPENDING", stream, "respire", oldest[0], oldest[0], 1)
        if still:
            watch.violations.append(f"trim cutoff {result.cutoff} is past pending {oldest[0]}")
    await check_payloads(client, stream, watch)
    return result.removed


async def trim_loop(client: RedisClient, stream: str, watch: TrimWatch, stop: anyio.Event) -> None:
    while not stop.is_set():
        await trim_hard(client, stream, watch)
        await anyio.sleep(0.02)


@register
class TrimScenario:
    number: ClassVar[int] = 6
    name: ClassVar[str] = "trim"
    title: ClassVar[str] = (
        "trim near the oldest pending entry: the safe trim never removes a needed payload"
    )
    ci: ClassVar[bool] = True
    own_servers: ClassVar[bool] = False

    async def run(self, ctx: ChaosContext) -> list[Verdict]:
        assert ctx.redis_url is not None
        async with connect(ctx.redis_url) as client:
            return [
                await self.killed_worker(ctx, client),
                await self.lagging_group(ctx, client),
                *await self.staged(ctx, client),
            ]

    async def killed_worker(self, ctx: ChaosContext, client: RedisClient) -> Verdict:
        """A worker SIGKILLed holding deliveries: trim to the oldest of them while nobody runs,
        then keep trimming while a new worker recovers them."""
        started = time.monotonic()
        name = ctx.name("trim-killed")
        n = 200 if ctx.full else 20
        queue = JobQueue(client, name, JsonValueCodec())
        effects, producer_ledger = ctx.path(name, "effects.jsonl"), ctx.path(name, "producer.jsonl")
        flags = ("--consumers", "4", "--visibility-ms", "1000", "--recovery-ms", "100")
        worker = start_worker(
            ctx.redis_url or "", name, effects, ctx.path(name, "w"), *flags, backend=ctx.backend
        )
        watch = TrimWatch()
        with Ledger(producer_ledger) as ledger:
            done_before: list[tuple[str, dict[str, Any]]] = [(f"before-{i}", {}) for i in range(n)]
            await produce(queue, done_before, ledger)
            await wait_until_settled(queue, [j for j, _ in done_before], 30)
            # this job kills the worker on its first delivery (after delivery, before the
            # handler's effect): the worker dies holding it pending
            await produce(queue, [("killer", {"kill": "after-delivery"})], ledger)
            code = worker.wait_exit(30)
            await produce(queue, [(f"after-{i}", {}) for i in range(n)], ledger)
        pending = await pending_ids(client, queue.keys.ready)
        admin = QueueAdmin(client, name)
        plan = await admin.trim_plan("ready", max_length=0)
        result = await admin.trim(plan)
        watch.trims += 1
        watch.removed += result.removed
        if pending and result.cutoff == pending[0]:
            watch.at_oldest_pending += 1
        await check_payloads(client, queue.keys.ready, watch)
        extra = list(watch.violations)
        if code != -signal.SIGKILL:
            extra.append(f"the worker was not SIGKILLed (exit {code}): {worker.tail(5)}")
        if not pending:
            extra.append("the killed worker left nothing pending")
        if result.removed != n:
            extra.append(f"the trim removed {result.removed} entries, expected the {n} before")
        watch.violations.clear()
        recovering = start_worker(
            ctx.redis_url or "", name, effects, ctx.path(name, "w"), *flags, backend=ctx.backend
        )
        stop = anyio.Event()
        accepted = accepted_jobs(producer_ledger)
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(trim_loop, client, queue.keys.ready, watch, stop)
                await wait_until_settled(queue, accepted, 30)
                stop.set()
        finally:
            exit_code = recovering.stop()
        extra += watch.violations
        if exit_code != 0:
            extra.append(f"the recovering worker exited with {exit_code}")
        outcomes = await read_outcomes(queue, effects)
        verdict = reconcile(
            self.name,
            "sigkill:oldest-pending/ready",
            accepted,
            outcomes,
            time.monotonic() - started,
        )
        return with_violations(
            verdict,
            extra,
            {
                "worker exit": "SIGKILL" if code == -signal.SIGKILL else code,
                "pending at the trim": len(pending),
                "plan cutoff = oldest pending": plan.cutoff == (pending[0] if pending else None),
                **watch.details(),
            },
            once=True,
        )

    async def lagging_group(self, ctx: ChaosContext, client: RedisClient) -> Verdict:
        """A second consumer group (an audit reader) that lags: a trim keeps everything from its
        first unread entry and its oldest pending one, and an operator's planned trim aborts
        when that group moves back or a group appears between the plan and the trim."""
        started = time.monotonic()
        name = ctx.name("trim-lagging")
        n = 200 if ctx.full else 20
        queue = JobQueue(client, name, JsonValueCodec())
        ready = queue.keys.ready
        effects, producer_ledger = ctx.path(name, "effects.jsonl"), ctx.path(name, "producer.jsonl")
        await client.execute("XGROUP", "CREATE", ready, "audit", "0", "MKSTREAM")
        worker = start_worker(
            ctx.redis_url or "",
            name,
            effects,
            ctx.path(name, "w"),
            "--consumers",
            "4",
            backend=ctx.backend,
        )
        extra: list[str] = []
        watch = TrimWatch()
        try:
            with Ledger(producer_ledger) as ledger:
                await produce(queue, [(f"job-{i}", {}) for i in range(n)], ledger)
            accepted = accepted_jobs(producer_ledger)
            await wait_until_settled(queue, accepted, 30)
            if await trim_hard(client, ready, watch):
                extra.append("a trim removed entries the audit group has not read")
            # the audit group reads half and acknowledges the first quarter
            rows = await client.execute(
                "XREADGROUP", "GROUP", "audit", "a1", "COUNT", n // 2, "STREAMS", ready, ">"
            )
            if not rows:  # a broken trim removed what the audit group had not read
                entries = []
            else:
                entries = next(iter(rows.values())) if isinstance(rows, dict) else rows[0][1]
            read = [_s(row[0]) for row in entries]
            if read:
                await client.execute("XACK", ready, "audit", *read[: n // 4])
            removed = await trim_hard(client, ready, watch)
            if removed != n // 4:
                extra.append(f"trimmed {removed} entries, expected the {n // 4} audit acked")
            # an operator plans; the audit group is reset to the start before the trim
            if read[n // 4 :]:
                await client.execute("XACK", ready, "audit", *read[n // 4 :])
            admin = QueueAdmin(client, name)
            plan = await admin.trim_plan("ready", max_length=0)
            await client.execute("XGROUP", "SETID", ready, "audit", "0")
            moved_back = await admin.trim(plan)
            if moved_back.aborted is None or moved_back.removed:
                extra.append(f"a trim planned before the group moved back ran: {moved_back}")
            # the audit group catches up; a new group appears between a plan and its trim
            await client.execute("XGROUP", "SETID", ready, "audit", "$")
            plan = await admin.trim_plan("ready", max_length=0)
            if plan.count != n - n // 4:
                extra.append(f"the plan would remove {plan.count}, expected {n - n // 4}")
            await client.execute("XGROUP", "CREATE", ready, "late", "0")
            new_group = await admin.trim(plan)
            if new_group.aborted is None or new_group.removed:
                extra.append(f"a trim planned before a new group ran: {new_group}")
            await check_payloads(client, ready, watch)
            remaining = int(await client.execute("XLEN", ready))
            if remaining != n - n // 4:
                extra.append(f"{remaining} entries left, expected {n - n // 4}")
        finally:
            exit_code = worker.stop()
        if exit_code != 0:
            extra.append(f"the worker exited with {exit_code}: {worker.tail(5)}")
        extra += watch.violations
        outcomes = await read_outcomes(queue, effects)
        verdict = reconcile(
            self.name, "lagging-second-group/ready", accepted, outcomes, time.monotonic() - started
        )
        return with_violations(
            verdict,
            extra,
            {
                **watch.details(),
                "aborted: group moved back": moved_back.aborted,
                "aborted: new group": new_group.aborted,
            },
            once=True,
        )

    async def staged(self, ctx: ChaosContext, client: RedisClient) -> list[Verdict]:
        """Durable retries, delayed jobs and job groups' staged jobs while the ready stream is
        trimmed as hard as possible, continuously."""
        started = time.monotonic()
        name = ctx.name("trim-staged")
        n = 60 if ctx.full else 6
        queue = JobQueue(client, name, JsonValueCodec())
        effects, producer_ledger = ctx.path(name, "effects.jsonl"), ctx.path(name, "producer.jsonl")
        await queue.set_group_options("tenant-a", max_concurrency=1)
        await queue.set_group_options("tenant-b", max_concurrency=1)
        worker = start_worker(
            ctx.redis_url or "",
            name,
            effects,
            ctx.path(name, "w"),
            "--consumers",
            "8",
            "--durable-retries",
            "--retry-backoff-ms",
            "300",
            "--delivery-limit",
            "5",
            backend=ctx.backend,
        )
        watch = TrimWatch()
        stop = anyio.Event()
        staged_seen = 0
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(trim_loop, client, queue.keys.ready, watch, stop)
                with Ledger(producer_ledger) as ledger:
                    retries = [(f"retry-{i}", {"fail": "transient", "times": 2}) for i in range(n)]
                    await produce(queue, retries, ledger)
                    await _stage(
                        queue,
                        ledger,
                        [f"delayed-{i}" for i in range(n)],
                        JobEnqueueOptions(delay=0.5),
                    )
                    for group in ("tenant-a", "tenant-b"):
                        await _stage(
                            queue,
                            ledger,
                            [f"{group}-{i}" for i in range(n)],
                            JobEnqueueOptions(group=group),
                            {"sleep": 0.05},
                        )
                accepted = accepted_jobs(producer_ledger)
                staged_seen = int(await client.execute("XLEN", queue.keys.scheduled))
                await wait_until_settled(queue, accepted, 40)
                stop.set()
        finally:
            exit_code = worker.stop()
        outcomes = await read_outcomes(queue, effects)
        elapsed = time.monotonic() - started
        extra = list(watch.violations)
        if exit_code != 0:
            extra.append(f"the worker exited with {exit_code}: {worker.tail(5)}")
        if not watch.removed:
            extra.append("the trimmer removed nothing: the case proved nothing")
        verdicts = []
        for case, prefixes in (
            ("durable-retries", ("retry-",)),
            ("delayed", ("delayed-",)),
            ("job-groups", ("tenant-a-", "tenant-b-")),
        ):
            jobs = [j for j in accepted if j.startswith(prefixes)]
            verdict = reconcile(
                self.name, f"staged:{case}/ready", jobs, outcomes, elapsed, expect_dead=["(no job)"]
            )
            verdicts.append(
                with_violations(
                    verdict, extra, {**watch.details(), "staged at start": staged_seen}, once=True
                )
            )
        return verdicts


async def _stage(
    queue: JobQueue[Any],
    ledger: Ledger,
    jobs: Sequence[str],
    options: JobEnqueueOptions,
    spec: dict[str, Any] | None = None,
) -> None:
    """``enqueue_scheduled`` with the producer ledger's intent / accepted / failed lines."""
    for job in jobs:
        ledger.record(kind="intent", job=job)
        try:
            await queue.enqueue_scheduled(job, spec or {}, options)
        except RespireError as exc:
            ledger.record(kind="failed", job=job, error=repr(exc)[:500])
            continue
        ledger.record(kind="accepted", job=job)
