"""The chaos suite's worker process (``python -m respire_actors.chaos.worker --help``).

Its handler's behaviour comes from each job's JSON payload, so a scenario's producer decides
what every job does:

* ``{"sleep": 0.2}`` - sleep that long (inside the lease's cancel scope);
* ``{"fail": "transient", "times": 2}`` - raise for the first ``times`` attempts, then succeed;
* ``{"fail": "permanent"}`` - return ``DeadLetter`` (no retry);
* ``{"fail": "poison"}`` - raise on every attempt (the delivery limit dead-letters it);
* ``{"fail": "ambiguous"}`` - record the effect, then raise (the effect happened, the outcome
  was not reported: the retry re-executes it);
* ``{"fail": "hang"}`` - never return (the execution budget, ``--timeout-ms``, bounds it);
* ``{"kill": "after-delivery"}`` / ``{"kill": "mid-handler"}`` - SIGKILL this process before /
  after recording the effect, on attempt ``kill_attempt`` (default 1) only;
  ``{"kill": "before-commit"}`` / ``{"kill": "after-commit"}`` - return, having armed the
  completer's fault point (:mod:`respire_actors.faults`) so the process is SIGKILLed right
  before the batch holding this outcome is sent / right after its script replied;
  ``"kill_total_attempt": n`` compares ``n`` with the total attempt count (across durable
  retries) instead of the entry's; ``"kill_once": true`` kills on the job's first execution
  (in any process: a ``kill`` line in the effects ledger marks it) whose total attempt is at
  least ``kill_from_total`` (default 1), whichever delivery that is;
* ``{"fail": "permanent", "times": 1}`` - dead-letter only the first ``times`` attempts;
* ``{"hold": 3}`` - sleep that long on the first total attempt only (a long first run);
  with ``"progress": true`` it reports progress every 0.1 s (fenced calls);
* ``{"record_start": true}`` - append a ``start`` line to the effects ledger first;
* ``{"result": true}`` - return ``{"pid", "attempt"}`` (kept with ``--keep-results-ms``).

``RESPIRE_FAULT_POINT`` arms fault points at start-up (see :mod:`respire_actors.faults`).

Every handler execution that reaches its effect appends ``{"kind": "effect", "job", "attempt",
"pid", "entry", "total"}`` to the ``--effects`` ledger (fsynced) before returning; every start
appends a ``start`` line and a cancelled handler a ``cancelled`` line (with its wall-clock
time ``at``). ``--ready-file`` is
written once the worker has started every actor; ``--stats-file`` gets the worker's statistics
(JSON) when it stops.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
from collections.abc import Callable
from dataclasses import asdict
from datetime import timedelta
from pathlib import Path
from typing import Any

import anyio

from .. import faults
from ..actors.messages import DeadLetter
from ..codecs import JsonValueCodec
from ..jobs import ACK, Job, QueueOptions, Worker, WorkerOptions
from ..redis.client import connect
from .ledger import Ledger, read_ledger


class HandlerFailure(RuntimeError):
    """The failure a chaos job asked for."""


def _kill_self() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _killed_before(effects: Path, job_id: str) -> bool:
    """Whether a ``kill`` line for ``job_id`` is in the effects ledger (any process)."""
    return any(
        line.get("kind") == "kill" and line["job"] == job_id for line in read_ledger(effects)
    )


def _holds(entry_id: str) -> Callable[[object], bool]:
    """A fault predicate: the completer's batch holds the outcome of this entry."""

    def holds(batch: object) -> bool:
        return isinstance(batch, list) and any(c.delivery.entry_id == entry_id for c in batch)

    return holds


async def _hold(job: Job[Any], seconds: float, progress: bool) -> None:
    """Sleep ``seconds`` in 0.1 s steps, reporting progress after each step if asked."""
    end = anyio.current_time() + seconds
    while (left := end - anyio.current_time()) > 0:
        await anyio.sleep(min(0.1, left))
        if progress:
            await job.report_progress(min(99, int(100 * (1 - left / seconds))))


def build_worker(args: argparse.Namespace, effects: Ledger) -> Worker:
    worker = Worker(f"chaos-{os.getpid()}")
    options = WorkerOptions(
        consumer_count=args.consumers,
        visibility_timeout=timedelta(milliseconds=args.visibility_ms),
        recovery_interval=timedelta(milliseconds=args.recovery_ms),
        delivery_limit=args.delivery_limit,
        shutdown_grace=timedelta(milliseconds=args.grace_ms),
        renew_leases=not args.no_renew,
        timeout=timedelta(milliseconds=args.timeout_ms) if args.timeout_ms else None,
        keep_results=timedelta(milliseconds=args.keep_results_ms) if args.keep_results_ms else None,
    )
    queue_options = None
    if args.durable_retries:
        queue_options = QueueOptions(
            scheduling_poll_interval=timedelta(milliseconds=args.poll_ms),
            retry_backoff=(
                timedelta(milliseconds=args.retry_backoff_ms) if args.retry_backoff_ms else None
            ),
        )

    @worker.job(args.queue, JsonValueCodec(), options, queue_options=queue_options)
    async def handle(job: Job[Any]) -> Any:
        spec = job.payload if isinstance(job.payload, dict) else {}
        common = {"job": job.id, "attempt": job.attempt, "pid": os.getpid()}
        if spec.get("record_start"):
            effects.record(kind="start", **common)
        try:
            return await _behave(job, spec, common)
        except anyio.get_cancelled_exc_class():
            effects.record(kind="cancelled", at=time.time(), **common)
            raise

    async def _behave(job: Job[Any], spec: dict[str, Any], common: dict[str, Any]) -> Any:
        kill = spec.get("kill")
        if spec.get("kill_once"):
            # the first execution at or after total attempt kill_from_total, in any process
            kill_now = (
                kill
                and job.total_attempts >= int(spec.get("kill_from_total", 1))
                and not _killed_before(effects.path, job.id)
            )
            if kill_now:
                effects.record(kind="kill", point=kill, **common)
        elif "kill_total_attempt" in spec:
            kill_now = kill and job.total_attempts == int(spec["kill_total_attempt"])
        else:
            kill_now = kill and job.attempt == int(spec.get("kill_attempt", 1))
        if kill_now and kill == "after-delivery":
            _kill_self()
        if spec.get("sleep"):
            await anyio.sleep(float(spec["sleep"]))
        if spec.get("hold") and job.total_attempts == 1:
            await _hold(job, float(spec["hold"]), bool(spec.get("progress")))
        fail = spec.get("fail")
        failing = job.total_attempts <= int(spec.get("times", 1))
        if fail == "hang":
            await anyio.sleep_forever()
        if fail == "transient" and failing:
            raise HandlerFailure(f"transient failure on attempt {job.attempt}")
        if fail == "poison":
            raise HandlerFailure("poison payload")
        if fail == "permanent" and ("times" not in spec or failing):
            return DeadLetter(detail="permanent failure")
        effects.record(kind="effect", entry=job.entry_id, total=job.total_attempts, **common)
        if kill_now and kill == "mid-handler":
            _kill_self()
        if kill_now and kill in ("before-commit", "after-commit"):
            # only at the commit of the batch holding this job's outcome (an earlier batch may
            # be in flight when the handler returns)
            faults.arm(f"completer.{kill}:kill", when=_holds(job.entry_id))
        if fail == "ambiguous" and failing:
            raise HandlerFailure("the effect happened but the call failed")
        if spec.get("result"):
            return {"pid": os.getpid(), "attempt": job.total_attempts}
        return ACK

    return worker


async def _main(args: argparse.Namespace) -> None:
    faults.arm_from_environment()
    with Ledger(Path(args.effects)) as effects:
        worker = build_worker(args, effects)
        try:
            await _serve(args, worker)
        finally:
            if args.stats_file:
                stats = asdict(worker.statistics(args.queue))
                await anyio.Path(args.stats_file).write_text(json.dumps(stats))


async def _serve(args: argparse.Namespace, worker: Worker) -> None:
    async with connect(args.url) as client, anyio.create_task_group() as tg:
        await tg.start(worker.run, client)
        if args.ready_file:
            await anyio.Path(args.ready_file).write_text(str(os.getpid()))

        async def stop_on_sigterm() -> None:
            with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                async for _ in signals:
                    worker.request_stop()
                    return

        tg.start_soon(stop_on_sigterm)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m respire_actors.chaos.worker")
    p.add_argument("--url", required=True)
    p.add_argument("--queue", required=True)
    p.add_argument("--effects", required=True, help="the effect ledger (JSON lines)")
    p.add_argument("--ready-file")
    p.add_argument("--backend", default="asyncio", choices=["asyncio", "trio"])
    p.add_argument("--consumers", type=int, default=8)
    p.add_argument("--visibility-ms", type=int, default=2000)
    p.add_argument("--recovery-ms", type=int, default=250)
    p.add_argument("--delivery-limit", type=int, default=5)
    p.add_argument("--grace-ms", type=int, default=2000)
    p.add_argument("--timeout-ms", type=int, default=0, help="execution budget (0: none)")
    p.add_argument("--no-renew", action="store_true", help="no lease renewer")
    p.add_argument("--durable-retries", action="store_true", help="QueueOptions (durable retries)")
    p.add_argument(
        "--retry-backoff-ms",
        type=int,
        default=0,
        help="with --durable-retries: nacks stage a retry after this backoff (0: none)",
    )
    p.add_argument(
        "--poll-ms", type=int, default=1000, help="with --durable-retries: promoter poll"
    )
    p.add_argument("--keep-results-ms", type=int, default=0, help="keep results (0: no)")
    p.add_argument("--stats-file", help="write the worker's statistics (JSON) here on exit")
    return p


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    anyio.run(_main, args, backend=args.backend)


if __name__ == "__main__":
    main()
