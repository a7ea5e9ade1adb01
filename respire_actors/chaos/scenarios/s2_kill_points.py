"""Scenario 2: SIGKILL a worker process at each kill point, then let the next one recover.

Kill points: ``after-delivery`` (the handler started, no effect yet), ``mid-handler`` (the
effect happened, no outcome), ``before-commit`` (the handler returned; the completer is about
to send the batch: the fault point ``completer.before-commit``), ``after-commit`` (the
completion script ran and replied; the worker dies before handling the reply:
``completer.after-commit``). For a job queue the completion script is the acknowledgement, so
the last two are "before" and "after the ack". ``after-promotion`` kills the worker right after
its promoter moved due scheduled jobs to the ready stream (``promoter.after-promote``).

Each case runs a chain of worker processes on one queue (one handler at a time, so each kill
job kills exactly one process): whenever the running process dies, the next one starts and
recovers what it left pending, until every accepted job has its outcome. Workloads: ``plain``
(a worker without QueueOptions) and ``scheduling`` (QueueOptions: durable retries with a
transient failure first, a scheduled job staged in a transaction, grouped jobs with a group
concurrency of 1, a flow whose child and parent kill, a batch whose member kills, with an
``on_success`` callback).

Verdict per case: every accepted job completes, exactly one completed event each, the number
of kills is the number of kill jobs (every exit was SIGKILL), re-executions only where a killed
process had not committed (see :func:`respire_actors.chaos.chains.disallowed_reexecutions`),
one ``batch-completed`` event and one callback run per batch, one run of the flow parent.
"""

from __future__ import annotations

import json
import signal
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, ClassVar

import anyio

from ...codecs import JsonValueCodec
from ...errors import ServerError
from ...jobs import JobEnqueueOptions, JobQueue
from ...jobs.batches import Callback
from ...jobs.flows import FlowNode
from ...redis.client import RedisClient, connect
from ...reliable import ReliableQueue
from .. import chains
from ..ledger import Ledger, read_ledger
from ..model import ChaosContext, Verdict
from ..processes import WorkerProcess, start_worker
from ..reconcile import Outcomes, read_outcomes, reconcile
from . import register

KILL_POINTS = ("after-delivery", "mid-handler", "before-commit", "after-commit")
RELIABLE_KILL_POINTS = ("after-delivery", "mid-handler", "before-ack", "after-ack")
KINDS = ("durable-retry", "scheduled", "grouped", "flow-child", "flow-parent", "batch-member")
VISIBILITY_MS = 1000
STREAM_GROUP = "chaos"  # the stream case's consumer group (chaos.worker --group)


@dataclass
class Plan:
    """What a case enqueued: job ids expected to complete, kill jobs, batches."""

    expected: list[str] = field(default_factory=list)
    kills: int = 0
    batches: list[str] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)


def _spec(kill: str | None, **extra: Any) -> dict[str, Any]:
    """A job's payload; with ``kill``, its first execution (whichever delivery: the next job
    may already be delivered when a process dies) kills the process at that point."""
    return {**({"kill": kill, "kill_once": True} if kill else {}), "sleep": 0.02, **extra}


class _Producer:
    """Enqueues with an outbox ledger: ``intent`` before the call, ``accepted`` after it."""

    def __init__(self, queue: JobQueue[Any], ledger: Ledger, plan: Plan) -> None:
        self.queue, self.ledger, self.plan = queue, ledger, plan

    def accepted(self, *job_ids: str) -> None:
        for job_id in job_ids:
            self.ledger.record(kind="accepted", job=job_id)
            self.plan.expected.append(job_id)

    async def plain(self, job_id: str, spec: dict[str, Any]) -> None:
        self.ledger.record(kind="intent", job=job_id)
        await self.queue.enqueue(job_id, spec)
        self.accepted(job_id)


async def _enqueue_plain(p: _Producer, point: str, fillers: int) -> None:
    for i in range(fillers):
        await p.plain(f"plain-{i}", _spec(None))
        if i == fillers // 2:
            await p.plain("plain-kill", _spec(point or None))
            if point:
                p.plan.kills += 1
                p.plan.kinds.append("plain")


async def _enqueue_scheduling(
    p: _Producer, client: RedisClient, point: str, kinds: Sequence[str], fillers: int
) -> None:
    """The scheduling workload; jobs of the kinds in ``kinds`` carry the kill."""
    queue, plan = p.queue, p.plan

    def kill(kind: str) -> str | None:
        if kind in kinds:
            plan.kills += 1
            plan.kinds.append(kind)
            return point
        return None

    await _enqueue_plain(p, "", fillers)  # plain jobs here carry no kill (the plain cases do)
    # durable retries: a transient failure (a staged retry), then the kill on the retry
    await p.plain(
        "durable", _spec(kill("durable-retry"), fail="transient", times=1, kill_from_total=2)
    )
    # a scheduled job, staged inside a transaction
    p.ledger.record(kind="intent", job="scheduled")
    async with client.transaction() as tx:
        pending = queue.enqueue_scheduled_in(
            tx, "scheduled", _spec(kill("scheduled")), JobEnqueueOptions(delay=0.3)
        )
        assert await tx.commit()
    assert pending.result().enqueued
    p.accepted("scheduled")
    # grouped jobs: one at a time in the group, one of them kills its worker
    await queue.set_group_options("g", max_concurrency=1, lease_duration=timedelta(seconds=1))
    for i in range(3):
        job_id = f"grouped-{i}"
        p.ledger.record(kind="intent", job=job_id)
        spec = _spec(kill("grouped") if i == 1 else None)
        await queue.enqueue_scheduled(job_id, spec, JobEnqueueOptions(group="g"))
        p.accepted(job_id)
    # a flow: its parent runs once both children are terminal
    child_kill, parent_kill = kill("flow-child"), kill("flow-parent")
    tree = FlowNode(
        "flow-parent",
        _spec(parent_kill),
        [FlowNode("flow-child-0", _spec(child_kill)), FlowNode("flow-child-1", _spec(None))],
    )
    for job_id in ("flow-parent", "flow-child-0", "flow-child-1"):
        p.ledger.record(kind="intent", job=job_id)
    assert await queue.enqueue_flow("flow", tree)
    p.accepted("flow-parent", "flow-child-0", "flow-child-1")
    # a batch: its callback is enqueued once, when every member has completed
    batch = await queue.create_batch(on_success=Callback("batch-callback", _spec(None)))
    members = [(f"batch-{i}", _spec(kill("batch-member") if i == 0 else None)) for i in range(3)]
    for job_id, _ in members:
        p.ledger.record(kind="intent", job=job_id)
    assert all(await queue.add_many_to_batch(batch, members))
    await queue.seal_batch(batch)
    p.accepted(*(job_id for job_id, _ in members))
    plan.expected.append("batch-callback")  # enqueued by the library, not the producer
    plan.batches.append(batch)


@dataclass(frozen=True)
class Case:
    point: str  # a kill point, or "after-promotion"
    workload: str  # "plain", "scheduling", "reliable" or "stream"
    kinds: tuple[str, ...] = ()  # scheduling: which job kinds carry the kill

    @property
    def label(self) -> str:
        return f"sigkill:{self.point}/{self.workload}"


def cases(full: bool) -> list[Case]:
    """Every kill point with every workload. The CI subset spreads the scheduling workload's
    kill jobs over the kill points (each kind killed at one point) and kills the stream worker
    only around its commit; the full run kills every kind at every point."""
    out = [Case(point, "plain") for point in KILL_POINTS]
    for i, point in enumerate(KILL_POINTS):
        kinds = KINDS if full else tuple(KINDS[j] for j in range(i, len(KINDS), len(KILL_POINTS)))
        out.append(Case(point, "scheduling", kinds))
    out.append(Case("after-promotion", "scheduling"))
    out += [Case(point, "reliable") for point in RELIABLE_KILL_POINTS]
    # a stream worker shares the job worker's runner and completer: CI kills it at the commit
    out += [Case(p, "stream") for p in KILL_POINTS if full or p.endswith("commit")]
    return out


@register
class KillPoints:
    number: ClassVar[int] = 2
    name: ClassVar[str] = "kill-points"
    title: ClassVar[str] = "SIGKILL a worker at each kill point; the next one recovers every job"
    ci: ClassVar[bool] = True
    own_servers: ClassVar[bool] = False

    async def run(self, ctx: ChaosContext) -> list[Verdict]:
        assert ctx.redis_url is not None
        limiter = anyio.CapacityLimiter(4)
        selected = cases(ctx.full)
        verdicts: list[Verdict | None] = [None] * len(selected)

        async def one(i: int, case: Case) -> None:
            async with limiter:
                verdicts[i] = await self.case(ctx, case)
                ctx.progress(f"kill-points: {case.label} done")

        async with anyio.create_task_group() as tg:
            for i, case in enumerate(selected):
                tg.start_soon(one, i, case)
        return [v for v in verdicts if v is not None]

    async def case(self, ctx: ChaosContext, case: Case) -> Verdict:
        if case.workload == "reliable":
            return await self.reliable_case(ctx, case)
        if case.workload == "stream":
            return await self.stream_case(ctx, case)
        assert ctx.redis_url is not None
        label = f"kill-{case.point}-{case.workload}"
        work = ctx.work_dir / "kill-points" / label
        work.mkdir(parents=True, exist_ok=True)
        effects, producer_path = work / "effects.jsonl", work / "producer.jsonl"
        name = ctx.name(label)
        args = ["--consumers", "1", "--visibility-ms", str(VISIBILITY_MS), "--recovery-ms", "200"]
        env: dict[str, str] = {}
        if case.workload == "scheduling":
            args += ["--durable-retries", "--retry-backoff-ms", "100", "--poll-ms", "100"]
        if case.point == "after-promotion":
            env["RESPIRE_FAULT_POINT"] = "promoter.after-promote:kill"
        started = time.monotonic()
        plan = Plan()
        async with connect(ctx.redis_url) as client:
            queue = JobQueue(client, name, JsonValueCodec())
            with Ledger(producer_path) as ledger:
                p = _Producer(queue, ledger, plan)
                fillers = 20 if ctx.full else 6
                if case.workload == "plain":
                    await _enqueue_plain(p, case.point, fillers)
                elif case.point == "after-promotion":
                    await _enqueue_scheduling(p, client, "", (), fillers)
                    plan.kills = 1  # the promoter's fault point
                    plan.kinds.append("promoter")
                else:
                    await _enqueue_scheduling(p, client, case.point, case.kinds, fillers)
            killed, exits, final = await self._chain(ctx, queue, plan, effects, work, args, env)
            outcomes = await read_outcomes(queue, effects)
            completed = await chains.completions(queue)
            batch_events = await chains.count_events(queue, "batch-completed")
        violations = _chain_violations(killed, exits, final, plan.kills)
        signals = [rc for _, rc in exits]
        violations += chains.disallowed_reexecutions(effects, completed, killed)
        if batch_events != len(plan.batches):
            violations.append(f"{batch_events} batch-completed events for {len(plan.batches)}")
        return reconcile(
            self.name,
            case.label,
            plan.expected,
            outcomes,
            time.monotonic() - started,
            expect_dead=["(none)"],
            violations=violations,
            details={
                "kills": len(killed),
                "exit_signals": sorted({-rc for rc in signals}),
                "killed_by": plan.kinds,
                "workers": len(killed) + 1,
            },
        )

    async def _chain(
        self,
        ctx: ChaosContext,
        queue: JobQueue[Any],
        plan: Plan,
        effects: Path,
        work: Path,
        args: list[str],
        env: dict[str, str],
    ) -> tuple[list[int], list[tuple[int, int]], int | None]:
        expected = set(plan.expected)

        async def done() -> bool:
            outcomes = await read_outcomes(queue)
            return expected <= set(outcomes.completed) | set(outcomes.dead)

        return await run_chain(ctx, queue.name, done, effects, work, args, env)

    async def reliable_case(self, ctx: ChaosContext, case: Case) -> Verdict:
        """A reliable queue's consumers (the ack is a call of its own after the handler)."""
        assert ctx.redis_url is not None
        label, work, started, specs = _one_kill_case(ctx, case, "reliable", "m")
        effects = work / "effects.jsonl"
        count = len(specs)
        async with connect(ctx.redis_url) as client:
            queue = ReliableQueue(client, ctx.name(label), JsonValueCodec())
            with Ledger(work / "producer.jsonl") as ledger:
                for spec in specs:
                    ledger.record(kind="intent", job=spec["id"])
                    await queue.send(spec, dedup_id=spec["id"])
                    ledger.record(kind="accepted", job=spec["id"])

            async def drained() -> bool:
                state = await queue.inspect()
                return state.messages == 0

            killed, exits, final = await run_chain(
                ctx, queue.name, drained, effects, work,
                ["--visibility-ms", str(VISIBILITY_MS)], {},
                module="respire_actors.chaos.reliable_worker",
            )  # fmt: skip
            state = await queue.inspect()
        violations = _chain_violations(killed, exits, final, 1)
        outcomes = Outcomes()
        for line in read_ledger(effects):
            if line["kind"] == "effect":
                outcomes.executions[line["job"]] += 1
            elif line["kind"] == "acked":
                outcomes.completed[line["job"]] += 1
        killer = str(specs[count // 2]["id"])
        # a message without a seen ack was acknowledged by a process killed before its reply
        # (only the after-ack kill may do that): the queue holds no message and no dead letter
        unseen = [str(s["id"]) for s in specs if not outcomes.completed[str(s["id"])]]
        if state.messages or state.dead_letters:
            violations.append(f"left in the queue: {state}")
        elif unseen == [killer] and case.point == "after-ack":
            outcomes.completed[killer] = 1
        elif unseen:
            violations.append(f"never acknowledged as seen: {unseen}")
        runs = [line for line in read_ledger(effects) if line["kind"] == "effect"]
        return self._chain_verdict(
            case, specs, outcomes, started, violations, runs, killed, exits,
            workload="reliable", last_point="after-ack", last_step="ack",
        )  # fmt: skip

    async def stream_case(self, ctx: ChaosContext, case: Case) -> Verdict:
        """A stream worker on an application-owned stream (the same completer as a job
        worker; no completed events: an entry is done once acknowledged)."""
        assert ctx.redis_url is not None
        label, work, started, specs = _one_kill_case(ctx, case, "stream", "e")
        effects = work / "effects.jsonl"
        count = len(specs)
        stream = ctx.name(label)
        async with connect(ctx.redis_url) as client:
            with Ledger(work / "producer.jsonl") as ledger:
                for spec in specs:
                    ledger.record(kind="intent", job=spec["id"])
                    # kill_once: the job's first execution in any process kills (worker.py)
                    body = json.dumps({**spec, "kill_once": True})
                    await client.execute("XADD", stream, "*", "job", spec["id"], "spec", body)
                    ledger.record(kind="accepted", job=spec["id"])

            async def pending() -> int:
                try:
                    reply = await client.execute("XPENDING", stream, STREAM_GROUP)
                except ServerError:  # no group yet
                    return -1
                return int(reply[0])

            async def drained() -> bool:
                executed = {
                    line["job"] for line in read_ledger(effects) if line["kind"] == "effect"
                }
                return len(executed) == count and await pending() == 0

            killed, exits, final = await run_chain(
                ctx, stream, drained, effects, work,
                ["--visibility-ms", str(VISIBILITY_MS), "--stream-start-id", "0-0",
                 "--group", STREAM_GROUP, "--consumers", "1", "--recovery-ms", "200"], {},
            )  # fmt: skip
            left = await pending()
            dead = await client.execute("XLEN", f"{stream}:dead")
            await client.execute("DEL", stream, f"{stream}:dead")
        violations = _chain_violations(killed, exits, final, 1)
        if left or dead:
            violations.append(f"{left} entries still pending, {dead} dead-lettered")
        outcomes = Outcomes()
        runs = [line for line in read_ledger(effects) if line["kind"] == "effect"]
        for line in runs:
            outcomes.executions[line["job"]] += 1
            if not left and not dead:
                outcomes.completed[line["job"]] = 1  # acknowledged: nothing is pending
        return self._chain_verdict(
            case, specs, outcomes, started, violations, runs, killed, exits,
            workload="stream", last_point="after-commit", last_step="commit",
        )  # fmt: skip

    def _chain_verdict(
        self,
        case: Case,
        specs: list[dict[str, Any]],
        outcomes: Outcomes,
        started: float,
        violations: list[str],
        runs: list[dict[str, Any]],
        killed: list[int],
        exits: list[tuple[int, int]],
        *,
        workload: str,
        last_point: str,
        last_step: str,
    ) -> Verdict:
        """The verdict of a chain of ``workload`` processes with one kill message (the middle
        of ``specs``): besides ``violations``, a message may run at most once in processes that
        were not killed, and the kill message not at all after a kill at ``last_point`` (its
        ``last_step`` had run)."""
        killer = str(specs[len(specs) // 2]["id"])
        survivors = [line["job"] for line in runs if line["pid"] not in killed]
        for job, n in Counter(survivors).items():
            if n > 1:
                violations.append(f"{job}: ran {n} times in processes that were not killed")
        if case.point == last_point and killer in survivors:
            violations.append(f"{killer}: delivered again after its {last_step} ran")
        return reconcile(
            self.name,
            case.label,
            [str(s["id"]) for s in specs],
            outcomes,
            time.monotonic() - started,
            violations=violations,
            details={
                "kills": len(killed),
                "exit_signals": sorted({-rc for _, rc in exits}),
                "killed_by": [workload],
                "workers": len(killed) + 1,
            },
        )


def _one_kill_case(
    ctx: ChaosContext, case: Case, workload: str, prefix: str
) -> tuple[str, Path, float, list[dict[str, Any]]]:
    """A reliable or stream case's label, work directory, start time and message specs
    (``{"id": "<prefix>-<i>"}``, the middle one asking for the kill at ``case.point``)."""
    label = f"kill-{case.point}-{workload}"
    work = ctx.work_dir / "kill-points" / label
    work.mkdir(parents=True, exist_ok=True)
    count = 20 if ctx.full else 6
    specs: list[dict[str, Any]] = [{"id": f"{prefix}-{i}"} for i in range(count)]
    specs[count // 2]["kill"] = case.point
    return label, work, time.monotonic(), specs


def _chain_violations(
    killed: list[int], exits: list[tuple[int, int]], final: int | None, kills: int
) -> list[str]:
    violations = []
    signals = [rc for _, rc in exits]
    if len(killed) != kills:
        violations.append(f"{kills} kill jobs but {len(killed)} processes were killed")
    if any(rc != -signal.SIGKILL for rc in signals):
        violations.append(f"a worker exited otherwise than by SIGKILL: {signals}")
    if final not in (0, None):
        violations.append(f"the last worker exited with {final}")
    return violations


async def run_chain(
    ctx: ChaosContext,
    queue: str,
    done: Callable[[], Awaitable[bool]],
    effects: Path,
    work: Path,
    args: list[str],
    env: dict[str, str],
    *,
    module: str = "respire_actors.chaos.worker",
) -> tuple[list[int], list[tuple[int, int]], int | None]:
    """Run worker after worker until ``done()`` (or the time is up). Returns the killed
    pids, (pid, exit code) of the processes that died, and the last worker's exit code after
    its graceful stop (None when the time ran out)."""
    assert ctx.redis_url is not None
    deadline = time.monotonic() + (120 if ctx.full else 40)
    killed: list[int] = []
    exits: list[tuple[int, int]] = []
    fault_env = dict(env)
    while True:
        # not waiting for readiness: a worker may die at a kill point before it reports ready
        worker = start_worker(
            ctx.redis_url, queue, effects, work, *args,
            backend=ctx.backend, env=fault_env, wait=False, module=module,
        )  # fmt: skip
        fault_env = {}  # an environment-armed fault kills the first worker only

        async def settled(worker: WorkerProcess = worker) -> bool:
            return not worker.alive() or await done()

        await chains.wait_for(settled, deadline - time.monotonic())
        if worker.alive():
            # a worker started after the last job completed is stopped once it is up (a
            # SIGTERM before it installed its handler would kill it)
            await anyio.to_thread.run_sync(worker.wait_ready)
            return killed, exits, await chains.stop(worker)
        exits.append((worker.pid, worker.process.returncode))
        killed.append(worker.pid)
        if time.monotonic() >= deadline:
            return killed, exits, None
