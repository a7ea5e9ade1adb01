"""Scenario 3: pause a worker (SIGSTOP) beyond the visibility timeout, let another worker
recover and complete its jobs, then resume it (SIGCONT): fencing rejects every stale
transition.

Two pauses, each with the lease renewer on and with ``--no-renew``:

* ``handler-returned``: the handlers returned (a success with a kept result, a transient
  failure that stages a durable retry, a permanent failure that dead-letters) and the worker
  stops itself at the fault point ``completer.before-commit``, right before sending their
  outcomes. Once resumed it sends them: each must be refused as stale.
* ``handler-running``: the handlers are mid-way through a long first run (reporting
  progress) when the scenario stops the process. Once resumed, each handler must find its
  lease lost (renewal, a fenced progress call or its fixed lease's end) and be cancelled.

The second worker recovers every job (attempt 2, which succeeds). With the renewer on, its
recovered handlers wait at a gate (a file) until the stale worker has been resumed and has
stopped: the stale transitions then meet entries that are pending, for the second worker's
current delivery, which only the fence (consumer and delivery attempt) tells apart from the
stale worker's own; without the renewer the second worker completes first (its fixed lease
must not run out while held). Verdict: one completed event per job; no dead letter, no staged
retry, every kept result written by the second worker, none of the second worker's
completions refused; the stale worker's counters show the rejected transitions
(``stale_completions`` + ``leases_lost`` > 0, so the case cannot pass without the fault).
"""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any, ClassVar

import anyio

from ...codecs import JsonValueCodec
from ...errors import RespireError
from ...jobs import JobQueue
from ...redis.client import connect
from .. import chains
from ..ledger import Ledger, read_ledger
from ..model import ChaosContext, Verdict
from ..processes import WorkerProcess
from ..reconcile import read_outcomes, reconcile
from . import register

VISIBILITY_MS = 1000
# without renewal a running handler's fixed lease must outlive the moment the scenario stops
# the worker (right after every handler started), or it is cancelled before the pause
FIXED_LEASE_MS = 4000
PAUSES = ("handler-returned", "handler-running")
# a running handler's pause outlasts the client's default command timeout (5 s)
LONG_PAUSE_S = 6.0


def _jobs(pause: str, count: int, gate: Path | None) -> list[tuple[str, dict[str, Any]]]:
    """The jobs of a case; with ``gate``, recovered deliveries (attempt 2) wait for that file."""
    gated: dict[str, Any] = {} if gate is None else {"gate": str(gate), "gate_attempt": 2}
    if pause == "handler-returned":
        jobs: list[tuple[str, dict[str, Any]]]
        # every handler starts before the first one returns (one consumer per job)
        common = {"sleep": 0.5, "result": True, "record_start": True, **gated}
        jobs = [(f"ok-{i}", common) for i in range(count)]
        jobs.append(("retry", {**common, "fail": "transient", "times": 1}))
        jobs.append(("dead", {**common, "fail": "permanent", "times": 1}))
        return jobs
    # long enough never to end by itself: only the lost lease may end the first run
    spec = {"hold": 60.0, "progress": True, "record_start": True, "result": True, **gated}
    return [(f"held-{i}", spec) for i in range(count)]


@register
class PauseFencing:
    number: ClassVar[int] = 3
    name: ClassVar[str] = "pause-fencing"
    title: ClassVar[str] = "SIGSTOP a worker past its leases; SIGCONT: fencing rejects it"
    ci: ClassVar[bool] = True
    own_servers: ClassVar[bool] = False

    async def run(self, ctx: ChaosContext) -> list[Verdict]:
        selected = [(pause, renew) for pause in PAUSES for renew in (True, False)]
        verdicts: list[Verdict | None] = [None] * len(selected)

        async def one(i: int, pause: str, renew: bool) -> None:
            verdicts[i] = await self.case(ctx, pause, renew)
            ctx.progress(f"pause-fencing: case {i + 1}/{len(selected)} done")

        async with anyio.create_task_group() as tg:
            for i, (pause, renew) in enumerate(selected):
                tg.start_soon(one, i, pause, renew)
        return [v for v in verdicts if v is not None]

    async def case(self, ctx: ChaosContext, pause: str, renew: bool) -> Verdict:
        assert ctx.redis_url is not None
        label = f"sigstop:{pause}/{'renew' if renew else 'no-renew'}"
        work = ctx.work_dir / "pause-fencing" / label.replace(":", "-").replace("/", "-")
        work.mkdir(parents=True, exist_ok=True)
        effects, producer_path = work / "effects.jsonl", work / "producer.jsonl"
        name = ctx.name(label.replace(":", "-").replace("/", "-"))
        visibility = FIXED_LEASE_MS if pause == "handler-running" and not renew else VISIBILITY_MS
        # renewed leases: the second worker can hold its deliveries while the stale one resumes
        gate = work / "gate" if renew else None
        jobs = _jobs(pause, 8 if ctx.full else 4, gate)
        args = [
            "--consumers", str(len(jobs)), "--visibility-ms", str(visibility),
            "--recovery-ms", "200",
            "--durable-retries", "--retry-backoff-ms", "100", "--poll-ms", "100",
            "--keep-results-ms", "600000", "--grace-ms", "5000",
        ]  # fmt: skip
        if not renew:
            args.append("--no-renew")
        job_ids = [job_id for job_id, _ in jobs]
        env = {"RESPIRE_FAULT_POINT": "completer.before-commit:stop"}
        stale_env = env if pause == "handler-returned" else {}
        stale_stats, fresh_stats = work / "stale.json", work / "fresh.json"
        violations: list[str] = []
        started = time.monotonic()
        stale: WorkerProcess | None = None
        fresh: WorkerProcess | None = None
        try:
            async with connect(ctx.redis_url) as client:
                queue = JobQueue(client, name, JsonValueCodec())
                with Ledger(producer_path) as ledger:
                    for job_id, spec in jobs:
                        ledger.record(kind="intent", job=job_id)
                        await queue.enqueue(job_id, spec)
                        ledger.record(kind="accepted", job=job_id)
                stale = await chains.start(
                    ctx.redis_url, name, effects, work / "stale", *args,
                    "--stats-file", str(stale_stats), backend=ctx.backend, env=stale_env,
                )  # fmt: skip
                paused_at = await self._pause(stale, pause, effects, len(jobs), violations)
                fresh = await chains.start(
                    ctx.redis_url, name, effects, work / "fresh", *args,
                    "--stats-file", str(fresh_stats), backend=ctx.backend,
                )  # fmt: skip

                async def all_completed() -> bool:
                    return set(job_ids) <= set((await read_outcomes(queue)).completed)

                def fresh_holds_all() -> bool:
                    assert fresh is not None
                    return _lines(effects, "start", fresh) >= len(jobs)

                if gate is not None:
                    if not await chains.wait_for(fresh_holds_all, 30):
                        violations.append("the second worker did not recover every job in 30 s")
                elif not await chains.wait_for(all_completed, 30):
                    violations.append("the second worker did not complete every job in 30 s")
                if pause == "handler-running":
                    # stopped longer than the command timeout, with progress calls in flight:
                    # the replies wait in the socket, and the resumed worker must read them
                    # rather than time them out (its handlers are then cancelled, not failed)
                    await anyio.sleep(max(0.0, paused_at + LONG_PAUSE_S - time.monotonic()))
                paused_for = time.monotonic() - paused_at
                if gate is None and await chains.stop(fresh) != 0:
                    violations.append(f"the second worker exited with an error: {fresh.tail()}")
                resumed_at = time.time()
                stale.signal(signal.SIGCONT)
                if pause == "handler-running":
                    # each resumed handler must find its lease lost and be cancelled
                    def cancelled() -> bool:
                        return _lines(effects, "cancelled", stale, resumed_at) >= len(jobs)

                    if not await chains.wait_for(cancelled, 15):
                        violations.append("a resumed handler was not cancelled within 15 s")
                code = await chains.stop(stale)
                if code != 0:
                    violations.append(f"the stale worker exited with {code}: {stale.tail()}")
                if gate is not None:  # the stale worker has sent all it had: let the holders go
                    gate.touch()
                    if not await chains.wait_for(all_completed, 30):
                        violations.append("the second worker did not complete every job in 30 s")
                    if await chains.stop(fresh) != 0:
                        violations.append(f"the second worker exited with an error: {fresh.tail()}")
                outcomes = await read_outcomes(queue, effects)
                violations += await self._check_state(queue, job_ids, fresh.pid)
        finally:
            for process in (stale, fresh):
                if process is not None and process.alive():
                    process.signal(signal.SIGCONT)
                    await anyio.to_thread.run_sync(process.kill)
        stats = chains.read_stats(stale_stats)
        rejected = stats.get("stale_completions", 0) + stats.get("leases_lost", 0)
        if not rejected:
            violations.append("the stale worker reports no rejected transition (vacuous)")
        if refused := chains.read_stats(fresh_stats).get("stale_completions", 0):
            violations.append(
                f"{refused} of the second worker's completions were refused as stale "
                "(a stale transition took its current delivery)"
            )
        return reconcile(
            self.name,
            label,
            job_ids,
            outcomes,
            time.monotonic() - started,
            expect_dead=["(none)"],
            violations=violations,
            details={
                "paused_s": round(paused_for, 2),
                "resumed_while_recovered_held": gate is not None,
                "stale_completions": stats.get("stale_completions", 0),
                "leases_lost": stats.get("leases_lost", 0),
                "rejected": rejected,
                "cancelled_after_resume": _lines(effects, "cancelled", stale, resumed_at),
                # how resumed handlers failed, when they failed instead of being cancelled
                "errors_after_resume": _errors(effects, stale, resumed_at)[:3],
                "stale_effects": _lines(effects, "effect", stale),
            },
        )

    async def _pause(
        self, stale: WorkerProcess, pause: str, effects: Path, jobs: int, violations: list[str]
    ) -> float:
        """Get the stale worker stopped, holding every job; returns when it was."""

        def all_started() -> bool:
            return _lines(effects, "start", stale) >= jobs

        if pause == "handler-running":
            if not await chains.wait_for(all_started, 20):
                violations.append("the first worker did not start every handler in 20 s")
            stale.signal(signal.SIGSTOP)
        # handler-returned: the worker stops itself at completer.before-commit
        if not await chains.wait_for(lambda: chains.process_state(stale.pid) == "T", 20):
            violations.append("the first worker never stopped")
        elif not all_started():
            violations.append("the first worker stopped before it had started every job")
        return time.monotonic()

    async def _check_state(self, queue: JobQueue[Any], job_ids: list[str], fresh: int) -> list[str]:
        """Nothing the stale worker sent may have landed: no dead letter, no staged retry, and
        every kept result is the second worker's."""
        found = []
        client, keys = queue.client, queue.keys
        if dead := await client.execute("XLEN", keys.dead):
            found.append(f"{dead} dead letters (a stale dead-letter was accepted)")
        staged = await client.execute("XLEN", keys.scheduled)
        due = await client.execute("ZCARD", keys.due)
        if staged or due:
            found.append(f"{staged} staged / {due} due entries (a stale retry was staged)")
        for job_id in job_ids:
            try:
                value = await queue.result(job_id, timeout=1)
            except (RespireError, TimeoutError) as exc:
                found.append(f"{job_id}: no kept result ({type(exc).__name__})")
                continue
            if not isinstance(value, dict) or value.get("pid") != fresh:
                found.append(f"{job_id}: kept result {value!r} is not the second worker's")
        return found


def _lines(effects: Path, kind: str, worker: WorkerProcess, since: float = 0.0) -> int:
    """Effect-ledger lines of ``kind`` written by ``worker`` (at or after ``since``, for lines
    with a time)."""
    return sum(
        1
        for line in read_ledger(effects)
        if line.get("kind") == kind and line["pid"] == worker.pid and line.get("at", since) >= since
    )


def _errors(effects: Path, worker: WorkerProcess, since: float) -> list[str]:
    """The ``error`` lines (failed handlers) ``worker`` wrote at or after ``since``."""
    return [
        str(line.get("error", ""))
        for line in read_ledger(effects)
        if line.get("kind") == "error" and line["pid"] == worker.pid and line.get("at", 0) >= since
    ]
