"""Scenario 1: consumer-group bootstrap. Concurrent first deploys on an empty queue, a backlog
enqueued before the first worker, stream workers starting at ``$`` and migrating an existing
stream from ``0-0``, and a consumer group deleted under running workers, which must never
replay acknowledged history (the worker stops, or recreates the group at ``$`` when told to).
"""

from __future__ import annotations

import signal
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import anyio

from ...codecs import JsonValueCodec
from ...jobs import JobQueue
from ...jobs.queue import _s
from ...redis.client import RedisClient, connect
from ...reliable import ReliableQueue
from ..ledger import Ledger, read_ledger
from ..model import ChaosContext, Verdict
from ..observe import wait_until_settled
from ..processes import WorkerProcess, start_worker
from ..producer import produce
from ..reconcile import Outcomes, accepted_jobs, read_outcomes, reconcile, with_violations
from . import register

MISSING = "ConsumerGroupMissing"


def start_together(
    ctx: ChaosContext, queue: str, effects: Path, count: int, *extra: str
) -> tuple[list[WorkerProcess], float]:
    """Start ``count`` worker processes at the same instant (none waits for another), then
    wait until each is ready; returns them and the spread of their starts in ms."""
    assert ctx.redis_url is not None
    first = time.monotonic()
    workers = [
        start_worker(
            ctx.redis_url,
            queue,
            effects,
            ctx.path(queue, "w"),
            *extra,
            backend=ctx.backend,
            wait=False,
        )
        for _ in range(count)
    ]
    spread = (time.monotonic() - first) * 1000
    for worker in workers:
        worker.wait_ready()
    return workers, round(spread, 1)


def stop_all(workers: Sequence[WorkerProcess], timeout: float = 15.0) -> list[str]:
    """Stop every worker (SIGTERM to all first, so their graceful stops overlap; SIGKILL after
    ``timeout``); a problem for each that did not exit cleanly."""
    for w in workers:
        w.signal(signal.SIGTERM)
    problems = []
    for w in workers:
        code = w.wait_exit(timeout)
        if code is None:
            w.kill()
            code = w.process.returncode
        if code != 0:
            problems.append(f"worker {w.pid} exited with {code}: {w.tail(3)}")
    return problems


async def group_names(client: RedisClient, stream: str) -> list[str]:
    if not await client.execute("EXISTS", stream):
        return []
    out = []
    for group in await client.execute("XINFO", "GROUPS", stream) or ():
        info = (
            {_s(k): v for k, v in group.items()}
            if isinstance(group, dict)
            else dict(zip(map(_s, group[::2]), group[1::2], strict=False))
        )
        out.append(_s(info["name"]))
    return out


async def wait_for(predicate: Any, timeout: float) -> bool:
    """Poll ``await predicate()`` every 50 ms until true or ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await predicate():
            return True
        await anyio.sleep(0.05)
    return False


def executions(effects: Path) -> Outcomes:
    out = Outcomes()
    for line in read_ledger(effects):
        if line.get("kind") == "effect":
            out.executions[str(line["job"])] += 1
    return out


async def xadd_jobs(
    client: RedisClient, stream: str, jobs: Sequence[str], ledger: Ledger | None = None
) -> list[str]:
    """Append stream entries ``job=<id> spec={}`` (a producer the application owns); returns
    their entry ids. With a ledger, each gets intent / accepted lines."""
    ids = []
    for job in jobs:
        if ledger:
            ledger.record(kind="intent", job=job)
        ids.append(_s(await client.execute("XADD", stream, "*", "job", job, "spec", "{}")))
        if ledger:
            ledger.record(kind="accepted", job=job)
    return ids


async def stream_settled(
    client: RedisClient, stream: str, group: str, effects: Path, jobs: Sequence[str]
) -> Outcomes:
    """Wait (up to 30 s) until every job ran and the group has nothing pending; the outcome of
    a stream job is its acknowledged execution, so ``completed`` counts jobs that ran once the
    group's pending list is empty."""

    async def done() -> bool:
        ran = executions(effects).executions
        pending = await client.execute("XPENDING", stream, group)
        return all(ran[j] for j in jobs) and int(pending[0]) == 0

    await wait_for(done, 30)
    out = executions(effects)
    pending = int((await client.execute("XPENDING", stream, group))[0])
    for job in jobs:
        if out.executions[job] and not pending:
            out.completed[job] = 1
    return out


# Destroy a group and return, atomically, the entries it still owed: pending ones and those
# after its last-delivered id (a group recreated at $ skips both).
_DESTROY = """
local owed = {}
for _, row in ipairs(redis.call('XPENDING', KEYS[1], ARGV[1], '-', '+', 100000)) do
  owed[#owed + 1] = row[1]
end
for _, g in ipairs(redis.call('XINFO', 'GROUPS', KEYS[1])) do
  local name, last = nil, nil
  for i = 1, #g, 2 do
    if g[i] == 'name' then name = g[i + 1] end
    if g[i] == 'last-delivered-id' then last = g[i + 1] end
  end
  if name == ARGV[1] then
    for _, row in ipairs(redis.call('XRANGE', KEYS[1], '(' .. last, '+')) do
      owed[#owed + 1] = row[1]
    end
  end
end
redis.call('XGROUP', 'DESTROY', KEYS[1], ARGV[1])
return owed
"""


async def destroy_group(client: RedisClient, stream: str, group: str) -> list[str]:
    """``XGROUP DESTROY`` in a script that first lists the job ids the group still owed."""
    owed = [_s(i) for i in await client.execute("EVAL", _DESTROY, 1, stream, group)]
    jobs = []
    for entry_id in owed:
        for _, flat in await client.execute("XRANGE", stream, entry_id, entry_id) or ():
            fields = dict(zip(map(_s, flat[::2]), map(_s, flat[1::2]), strict=False))
            jobs.append(fields.get("_respire.job.id", entry_id))
    return jobs


@register
class GroupBootstrapScenario:
    number: ClassVar[int] = 1
    name: ClassVar[str] = "group-bootstrap"
    title: ClassVar[str] = (
        "consumer-group bootstrap: concurrent deploys, $ vs 0-0 starts, a group deleted under "
        "running workers never replays acknowledged history"
    )
    ci: ClassVar[bool] = True
    own_servers: ClassVar[bool] = False

    async def run(self, ctx: ChaosContext) -> list[Verdict]:
        assert ctx.redis_url is not None
        async with connect(ctx.redis_url) as client:
            return [
                await self.concurrent_deploy(ctx, client),
                await self.stream_start(ctx, client, "$"),
                await self.stream_start(ctx, client, "0-0"),
                await self.deleted_job_group(ctx, client),
                await self.deleted_stream_group(ctx, client),
                await self.deleted_mid_run(ctx, client),
                await self.deleted_reliable_group(ctx, client),
            ]

    def _size(self, ctx: ChaosContext) -> int:
        return 500 if ctx.full else 30

    async def concurrent_deploy(self, ctx: ChaosContext, client: RedisClient) -> Verdict:
        """Job-worker processes (3, or 4 with ``full``) started at once on a queue that does
        not exist yet, with a backlog enqueued before any worker ran (the group must start at
        the beginning) and jobs enqueued after."""
        started = time.monotonic()
        name = ctx.name("boot-deploy")
        queue = JobQueue(client, name, JsonValueCodec())
        effects, ledger_path = ctx.path(name, "effects.jsonl"), ctx.path(name, "producer.jsonl")
        n = self._size(ctx)
        deploys = 4 if ctx.full else 3
        extra: list[str] = []
        with Ledger(ledger_path) as ledger:
            await produce(queue, [(f"backlog-{i}", {"sleep": 0.01}) for i in range(n)], ledger)
            workers, spread = start_together(ctx, name, effects, deploys, "--consumers", "4")
            try:
                await produce(queue, [(f"new-{i}", {"sleep": 0.01}) for i in range(n)], ledger)
                accepted = accepted_jobs(ledger_path)
                await wait_until_settled(queue, accepted, 30)
                groups = await group_names(client, queue.keys.ready)
            finally:
                extra += stop_all(workers)
        if groups != ["respire"]:
            extra.append(f"consumer groups after the deploy: {groups}")
        outcomes = await read_outcomes(queue, effects)
        backlog_done = sum(bool(outcomes.completed[f"backlog-{i}"]) for i in range(n))
        verdict = reconcile(
            self.name,
            "concurrent-deploy+backlog/job-queue",
            accepted,
            outcomes,
            time.monotonic() - started,
        )
        return with_violations(
            verdict,
            extra,
            {"workers": deploys, "start spread ms": spread, "groups": groups,
             "backlog completed": backlog_done},
        )  # fmt: skip

    async def stream_start(self, ctx: ChaosContext, client: RedisClient, start: str) -> Verdict:
        """Stream workers on a stream with history: ``$`` must skip it and take only new
        entries; ``0-0`` (a migration) must process the history and the new entries, each once.
        Three processes (four with ``full``) start at once."""
        started = time.monotonic()
        label = "start-$" if start == "$" else "migrate-from-0-0"
        stream = ctx.name(f"boot-stream-{'tail' if start == '$' else 'zero'}")
        effects, ledger_path = ctx.path(stream, "effects.jsonl"), ctx.path(stream, "producer.jsonl")
        n = self._size(ctx)
        history = [f"old-{i}" for i in range(n)]
        deploys = 4 if ctx.full else 3
        extra: list[str] = []
        with Ledger(ledger_path) as ledger:
            # the history: for 0-0 it is work to migrate (in the ledger); for $ it is not
            await xadd_jobs(client, stream, history, ledger if start == "0-0" else None)
            workers, spread = start_together(
                ctx, stream, effects, deploys, "--consumers", "4", "--stream-start-id", start
            )
            try:
                await xadd_jobs(client, stream, [f"new-{i}" for i in range(n)], ledger)
                accepted = accepted_jobs(ledger_path)
                outcomes = await stream_settled(client, stream, "chaos", effects, accepted)
                groups = await group_names(client, stream)
            finally:
                extra += stop_all(workers)
        replayed = sum(outcomes.executions[j] for j in history) if start == "$" else 0
        if replayed:
            extra.append(f"{replayed} executions of entries older than the group's start ($)")
        if groups != ["chaos"]:
            extra.append(f"consumer groups after the deploy: {groups}")
        verdict = reconcile(
            self.name, f"{label}/stream-worker", accepted, outcomes, time.monotonic() - started
        )
        return with_violations(
            verdict,
            extra,
            {
                "workers": deploys,
                "start spread ms": spread,
                "history entries": n,
                "history executed": sum(outcomes.executions[j] for j in history),
            },
        )

    async def deleted_job_group(self, ctx: ChaosContext, client: RedisClient) -> Verdict:
        """``XGROUP DESTROY`` under two running job workers after a first wave completed.

        With ``recreate_missing_group="fail"`` (the default) every worker stops with
        ConsumerGroupMissing, a worker started afterwards refuses too, and nothing is replayed;
        the operator then recreates the group after the last acknowledged entry and a new
        worker runs the second wave only (``$`` is the mid-run case)."""
        started = time.monotonic()
        name = ctx.name("boot-deleted-fail")
        url, logs = ctx.redis_url or "", ctx.path(name, "w")
        queue = JobQueue(client, name, JsonValueCodec())
        ready = queue.keys.ready
        effects, ledger_path = ctx.path(name, "effects.jsonl"), ctx.path(name, "producer.jsonl")
        n = self._size(ctx)
        flags = ("--consumers", "4", "--recreate-missing-group", "fail")
        extra: list[str] = []
        details: dict[str, Any] = {}
        with Ledger(ledger_path) as ledger:
            workers, _ = start_together(ctx, name, effects, 2, *flags)
            try:
                await produce(queue, [(f"first-{i}", {}) for i in range(n)], ledger)
                await wait_until_settled(queue, accepted_jobs(ledger_path), 30)
                last_acked = _s(
                    (await client.execute("XREVRANGE", ready, "+", "-", "COUNT", 1))[0][0]
                )
                await client.execute("XGROUP", "DESTROY", ready, "respire")
                codes = [w.wait_exit(20) for w in workers]
                details["worker exits"] = codes
                stopped = [w for w in workers if MISSING in w.log.read_text(errors="replace")]
                if len(stopped) != len(workers) or any(c in (None, 0) for c in codes):
                    extra.append(f"workers did not stop with {MISSING}: exits {codes}")
                await produce(queue, [(f"second-{i}", {}) for i in range(n)], ledger)
                late = start_worker(
                    url, name, effects, logs, *flags, backend=ctx.backend, wait=False
                )
                late_code = late.wait_exit(20)
                details["worker started after the deletion"] = late_code
                if late_code in (None, 0) or MISSING not in late.log.read_text(errors="replace"):
                    extra.append(f"a worker started on the vanished group ran (exit {late_code})")
                    late.kill()
                if await group_names(client, ready):
                    extra.append("a stopped worker recreated the group")
                # the operator's repair: recreate it after the last acknowledged entry
                await client.execute("XGROUP", "CREATE", ready, "respire", last_acked)
                workers = [start_worker(url, name, effects, logs, *flags, backend=ctx.backend)]
                accepted = accepted_jobs(ledger_path)
                await wait_until_settled(queue, accepted, 30)
            finally:
                extra += stop_all(workers)
        outcomes = await read_outcomes(queue, effects)
        replayed = sum(max(0, outcomes.executions[f"first-{i}"] - 1) for i in range(n))
        details["first-wave re-executions"] = replayed
        if replayed:
            extra.append(f"{replayed} acknowledged jobs ran again after the group was deleted")
        verdict = reconcile(
            self.name,
            "group-deleted:fail/job-queue",
            accepted,
            outcomes,
            time.monotonic() - started,
        )
        return with_violations(verdict, extra, details)

    async def deleted_mid_run(self, ctx: ChaosContext, client: RedisClient) -> Verdict:
        """``XGROUP DESTROY`` while jobs run and a backlog waits, workers told to recreate at
        ``$``. Measured, not hidden: the deliveries pending in the deleted group and the
        entries it had not delivered yet are skipped (documented loss); the verdict fails if
        any other job is lost, an acknowledged job runs again or a job completes twice."""
        started = time.monotonic()
        name = ctx.name("boot-deleted-midrun")
        queue = JobQueue(client, name, JsonValueCodec())
        effects, ledger_path = ctx.path(name, "effects.jsonl"), ctx.path(name, "producer.jsonl")
        n = self._size(ctx)
        flags = ("--consumers", "4", "--recreate-missing-group", "$")
        extra: list[str] = []
        with Ledger(ledger_path) as ledger:
            workers, _ = start_together(ctx, name, effects, 2, *flags)
            try:
                await produce(queue, [(f"first-{i}", {"sleep": 0.1}) for i in range(n)], ledger)

                async def some_done() -> bool:
                    return len(executions(effects).executions) >= n // 3

                await wait_for(some_done, 20)
                owed = await destroy_group(client, queue.keys.ready, "respire")

                async def recreated() -> bool:
                    return "respire" in await group_names(client, queue.keys.ready)

                if not await wait_for(recreated, 20):
                    extra.append("the workers did not recreate the group at $")
                await produce(queue, [(f"second-{i}", {}) for i in range(n)], ledger)
                accepted = accepted_jobs(ledger_path)
                survivors = [j for j in accepted if j not in set(owed)]
                await wait_until_settled(queue, survivors, 30)
                await anyio.sleep(0.5)  # let stale completions of the owed jobs arrive
            finally:
                extra += stop_all(workers)
        outcomes = await read_outcomes(queue, effects)
        done_before = {j for j in accepted if j.startswith("first-") and j not in set(owed)}
        replayed = sum(max(0, outcomes.executions[j] - 1) for j in done_before)
        if replayed:
            extra.append(f"{replayed} acknowledged jobs ran again after the group was deleted")
        lost = [j for j in accepted if not (outcomes.completed[j] or outcomes.dead[j])]
        unexpected = [j for j in lost if j not in set(owed)]
        if unexpected:
            extra.append(f"lost beyond what the deleted group owed: {unexpected[:5]}")
        verdict = reconcile(
            self.name,
            "group-deleted-mid-run:recreate-$/job-queue",
            accepted,
            outcomes,
            time.monotonic() - started,
            allowed_loss=len(owed),
        )
        return with_violations(
            verdict,
            extra,
            {
                "owed by the deleted group (skipped, documented)": len(owed),
                "of them ran before the deletion": sum(bool(outcomes.executions[j]) for j in owed),
                "first-wave re-executions": replayed,
            },
        )

    async def deleted_reliable_group(self, ctx: ChaosContext, client: RedisClient) -> Verdict:
        """A reliable queue (client-driven: send / receive / ack) whose private group is
        deleted with messages acknowledged, leased and waiting. The next ``receive`` recreates
        the group at ``0``: acknowledged messages (deleted entries) must not come back, the
        waiting ones are delivered, and the leased ones keep their leases: they are not handed
        to a second receiver, and their holders' acks still succeed."""
        started = time.monotonic()
        name = ctx.name("boot-deleted-reliable")
        queue = ReliableQueue(client, name, JsonValueCodec())
        ledger_path = ctx.path(name, "producer.jsonl")
        n = self._size(ctx)
        acks: Counter[str] = Counter()
        deliveries: Counter[str] = Counter()
        extra: list[str] = []
        with Ledger(ledger_path) as ledger:
            for i in range(n):
                ledger.record(kind="intent", job=f"msg-{i}")
                await queue.send({"job": f"msg-{i}"}, dedup_id=f"msg-{i}")
                ledger.record(kind="accepted", job=f"msg-{i}")

        async def settle(batch: Sequence[Any]) -> list[bool]:
            results = await queue.ack_many(batch)
            for message, ok in zip(batch, results, strict=True):
                acks[message.payload["job"]] += ok
            return results

        first = await queue.receive(30, max=n // 2)
        for message in first:
            deliveries[message.payload["job"]] += 1
        await settle(first)
        leased = await queue.receive(30, max=5)
        for message in leased:
            deliveries[message.payload["job"]] += 1
        await client.execute("XGROUP", "DESTROY", queue.keys.stream, "respire")
        while batch := await queue.receive(30, max=50):
            for message in batch:
                deliveries[message.payload["job"]] += 1
            await settle(batch)
        late_acks = await settle(leased)  # the holders finish after the deletion
        replayed = sum(deliveries[m.payload["job"]] - 1 for m in first)
        if replayed:
            extra.append(f"{replayed} acknowledged messages were delivered again")
        stolen = sum(deliveries[m.payload["job"]] - 1 for m in leased)
        if stolen:
            extra.append(f"{stolen} leased messages were handed to another receiver")
        if not all(late_acks):
            extra.append(f"{late_acks.count(False)} acks of live leases were refused")
        outcomes = Outcomes()
        for job in acks:
            outcomes.completed[job] = acks[job]
            outcomes.executions[job] = deliveries[job]
        verdict = reconcile(
            self.name,
            "group-deleted:recreate-0/reliable-queue",
            accepted_jobs(ledger_path),
            outcomes,
            time.monotonic() - started,
        )
        return with_violations(
            verdict,
            extra,
            {"acknowledged before": len(first), "leased at the deletion": len(leased),
             "late acks accepted": late_acks.count(True), "acknowledged redelivered": replayed},
        )  # fmt: skip

    async def deleted_stream_group(self, ctx: ChaosContext, client: RedisClient) -> Verdict:
        """A stream worker whose group starts at ``0-0``, told to recreate a vanished group at
        ``$``: deleting the group under it must not replay the stream from ``0-0``."""
        started = time.monotonic()
        stream = ctx.name("boot-deleted-stream")
        effects, ledger_path = ctx.path(stream, "effects.jsonl"), ctx.path(stream, "producer.jsonl")
        n = self._size(ctx)
        flags = ("--consumers", "4", "--stream-start-id", "0-0", "--recreate-missing-group", "$")
        extra: list[str] = []
        details: dict[str, Any] = {}
        with Ledger(ledger_path) as ledger:
            workers, _ = start_together(ctx, stream, effects, 2, *flags)
            try:
                first = [f"first-{i}" for i in range(n)]
                await xadd_jobs(client, stream, first, ledger)
                await stream_settled(client, stream, "chaos", effects, first)
                await client.execute("XGROUP", "DESTROY", stream, "chaos")
                destroyed = time.monotonic()

                async def recreated() -> bool:
                    return "chaos" in await group_names(client, stream)

                if not await wait_for(recreated, 20):
                    extra.append("the workers did not recreate the group at $")
                details["recreated after ms"] = round((time.monotonic() - destroyed) * 1000)
                await xadd_jobs(client, stream, [f"second-{i}" for i in range(n)], ledger)
                accepted = accepted_jobs(ledger_path)
                outcomes = await stream_settled(client, stream, "chaos", effects, accepted)
            finally:
                extra += stop_all(workers)
        replayed = sum(max(0, outcomes.executions[j] - 1) for j in first)
        details["first-wave re-executions"] = replayed
        if replayed:
            extra.append(f"{replayed} acknowledged entries ran again after the group was deleted")
        verdict = reconcile(
            self.name,
            "group-deleted:recreate-$/stream-worker-0-0",
            accepted,
            outcomes,
            time.monotonic() - started,
        )
        return with_violations(verdict, extra, details)
