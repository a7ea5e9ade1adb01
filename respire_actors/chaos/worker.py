"""The chaos suite's worker process (``python -m respire_actors.chaos.worker --help``).

Its handler's behaviour comes from each job's JSON payload, so a scenario's producer decides
what every job does:

* ``{"sleep": 0.2}`` - sleep that long (inside the lease's cancel scope);
* ``{"stall": 60, "stall_attempts": 1}`` - sleep that long first, on attempts up to
  ``stall_attempts`` (default 1) only: a first delivery that holds its lease until its worker
  is killed, and a recovered one that runs normally;
* ``{"fail": "transient", "times": 2}`` - raise for the first ``times`` attempts, then succeed;
* ``{"fail": "permanent"}`` - return ``DeadLetter`` (no retry);
* ``{"fail": "poison"}`` - raise on every attempt (the delivery limit dead-letters it);
* ``{"fail": "ambiguous"}`` - record the effect, then raise (the effect happened, the outcome
  was not reported: the retry re-executes it);
* ``{"fail": "hang"}`` - never return (the execution budget, ``--timeout-ms``, bounds it);
* ``{"kill": "after-delivery"}`` / ``{"kill": "mid-handler"}`` - SIGKILL this process before /
  after recording the effect, on attempt ``kill_attempt`` (default 1) only.

Every handler execution that reaches its effect appends ``{"kind": "effect", "job", "attempt",
"pid", "running"}`` to the ``--effects`` ledger (fsynced) before returning; ``running`` is how
many handlers of this process were executing at that moment (at most ``--consumers``). With
``--record-recovery`` each recovery pass that claimed deliveries appends ``{"kind":
"recovery-pass", "claimed", "pages", "pid"}`` (from the ``recovery-pass`` telemetry log).
``--ready-file`` is written once the worker has started every actor.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
from datetime import timedelta
from pathlib import Path
from typing import Any

import anyio

from ..actors.messages import DeadLetter
from ..codecs import JsonValueCodec
from ..jobs import ACK, Job, Outcome, QueueOptions, Worker, WorkerOptions
from ..redis.client import connect
from .ledger import Ledger


class HandlerFailure(RuntimeError):
    """The failure a chaos job asked for."""


def _kill_self() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def build_worker(args: argparse.Namespace, effects: Ledger) -> Worker:
    worker = Worker(f"chaos-{os.getpid()}")
    options = WorkerOptions(
        consumer_count=args.consumers,
        visibility_timeout=timedelta(milliseconds=args.visibility_ms),
        recovery_interval=timedelta(milliseconds=args.recovery_ms),
        delivery_limit=args.delivery_limit,
        recovery_page_size=args.recovery_page_size,
        recovery_max_pages=args.recovery_max_pages,
        shutdown_grace=timedelta(milliseconds=args.grace_ms),
        renew_leases=not args.no_renew,
        timeout=timedelta(milliseconds=args.timeout_ms) if args.timeout_ms else None,
    )
    queue_options = QueueOptions() if args.durable_retries else None

    running = 0

    @worker.job(args.queue, JsonValueCodec(), options, queue_options=queue_options)
    async def handle(job: Job[Any]) -> Outcome:
        nonlocal running
        running += 1
        try:
            return await behave(job)
        finally:
            running -= 1

    async def behave(job: Job[Any]) -> Outcome:
        spec = job.payload if isinstance(job.payload, dict) else {}
        kill = spec.get("kill")
        kill_now = kill and job.attempt == int(spec.get("kill_attempt", 1))
        if kill_now and kill == "after-delivery":
            _kill_self()
        if spec.get("stall") and job.attempt <= int(spec.get("stall_attempts", 1)):
            await anyio.sleep(float(spec["stall"]))
        if spec.get("sleep"):
            await anyio.sleep(float(spec["sleep"]))
        fail = spec.get("fail")
        if fail == "hang":
            await anyio.sleep_forever()
        if fail == "transient" and job.attempt <= int(spec.get("times", 1)):
            raise HandlerFailure(f"transient failure on attempt {job.attempt}")
        if fail == "poison":
            raise HandlerFailure("poison payload")
        if fail == "permanent":
            return DeadLetter(detail="permanent failure")
        effects.record(
            kind="effect", job=job.id, attempt=job.attempt, pid=os.getpid(), running=running
        )
        if kill_now and kill == "mid-handler":
            _kill_self()
        if fail == "ambiguous" and job.attempt <= int(spec.get("times", 1)):
            raise HandlerFailure("the effect happened but the call failed")
        return ACK

    return worker


class _RecoveryPasses(logging.Handler):
    """Copies ``recovery-pass`` telemetry records into the effect ledger."""

    def __init__(self, effects: Ledger) -> None:
        super().__init__(logging.INFO)
        self.effects = effects

    def emit(self, record: logging.LogRecord) -> None:
        if getattr(record, "event", None) == "recovery-pass":
            self.effects.record(
                kind="recovery-pass",
                claimed=getattr(record, "claimed", 0),
                pages=getattr(record, "pages", 0),
                pid=os.getpid(),
            )


async def _main(args: argparse.Namespace) -> None:
    with Ledger(Path(args.effects)) as effects:
        if args.record_recovery:
            telemetry = logging.getLogger("respire_actors.telemetry")
            telemetry.setLevel(logging.INFO)
            telemetry.addHandler(_RecoveryPasses(effects))
        worker = build_worker(args, effects)
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
    p.add_argument("--recovery-page-size", type=int, default=64)
    p.add_argument("--recovery-max-pages", type=int, default=4)
    p.add_argument("--record-recovery", action="store_true",
                   help="append recovery-pass lines (claimed, pages) to the effects")  # fmt: skip
    p.add_argument("--grace-ms", type=int, default=2000)
    p.add_argument("--timeout-ms", type=int, default=0, help="execution budget (0: none)")
    p.add_argument("--no-renew", action="store_true", help="no lease renewer")
    p.add_argument("--durable-retries", action="store_true", help="QueueOptions (durable retries)")
    return p


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    anyio.run(_main, args, backend=args.backend)


if __name__ == "__main__":
    main()
