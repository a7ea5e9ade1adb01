"""The chaos suite's worker process (``python -m respire_actors.chaos.worker --help``).

Its handler's behaviour comes from each job's JSON payload, so a scenario's producer decides
what every job does:

* ``{"sleep": 0.2}`` - sleep that long (inside the lease's cancel scope);
* ``{"stall": 60, "stall_attempts": 1}`` - sleep that long first, on attempts up to
  ``stall_attempts`` (default 1) only: a first delivery that holds its lease until its worker
  is killed, and a recovered one that runs normally;
* ``{"fail": "transient", "times": 2}`` - raise for the first ``times`` attempts, then succeed
  (attempts are the job's total attempts, across durable retries);
* ``{"fail": "permanent"}`` - return ``DeadLetter`` (no retry);
* ``{"fail": "poison"}`` - raise on every attempt (the delivery limit dead-letters it);
* ``{"fail": "ambiguous"}`` - record the effect, then raise (the effect happened, the outcome
  was not reported: the retry re-executes it);
* ``{"fail": "hang"}`` - never return (the execution budget, ``--timeout-ms``, bounds it);
* ``{"kill": "after-delivery"}`` / ``{"kill": "mid-handler"}`` - SIGKILL this process before /
  after recording the effect, on attempt ``kill_attempt`` (default 1) only.

With ``--stream-start-id ID`` the process is a stream worker instead: it consumes the stream
``--queue`` (a raw key) in consumer group ``--group``, creating the group at ``ID`` (``$``,
``0-0`` or an entry id) when missing; each entry's ``job`` field names the job and its ``spec``
field (JSON, optional) says what the handler does, as above.

Every handler execution that reaches its effect appends ``{"kind": "effect", "job", "attempt",
"pid", "running", "at"}`` to the ``--effects`` ledger (fsynced) before returning; ``running``
is how many handlers of this process were executing at that moment (at most ``--consumers``),
``at`` the wall-clock time in seconds. With ``--record-recovery`` each recovery pass that
claimed deliveries appends ``{"kind": "recovery-pass", "claimed", "pages", "pid"}`` (from the
``recovery-pass`` telemetry log). ``--ready-file`` is written once the worker has started
every actor.

``--username`` with ``--password-file`` connects through a credential provider that reads the
file on every new connection, so a password rotated in the file is used by the next reconnect
(docs/security.md, "Rotating credentials").
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import anyio

from ..actors.messages import DeadLetter
from ..codecs import JsonValueCodec
from ..jobs import ACK, Job, Outcome, QueueOptions, Worker, WorkerOptions
from ..redis.client import connect
from ..streams import StreamEntry, StreamWorker, StreamWorkerOptions
from .ledger import Ledger


class HandlerFailure(RuntimeError):
    """The failure a chaos job asked for."""


def _kill_self() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


_running = 0  # handlers of this process executing now (recorded in effect lines)


async def perform(spec: dict[str, Any], job_id: str, attempt: int, effects: Ledger) -> Outcome:
    """What a chaos job's ``spec`` asks for (see the module docstring)."""
    global _running
    _running += 1
    try:
        return await _perform(spec, job_id, attempt, effects)
    finally:
        _running -= 1


async def _perform(spec: dict[str, Any], job_id: str, attempt: int, effects: Ledger) -> Outcome:
    kill = spec.get("kill")
    kill_now = kill and attempt == int(spec.get("kill_attempt", 1))
    if kill_now and kill == "after-delivery":
        _kill_self()
    if spec.get("stall") and attempt <= int(spec.get("stall_attempts", 1)):
        await anyio.sleep(float(spec["stall"]))
    if spec.get("sleep"):
        await anyio.sleep(float(spec["sleep"]))
    fail = spec.get("fail")
    if fail == "hang":
        await anyio.sleep_forever()
    if fail == "transient" and attempt <= int(spec.get("times", 1)):
        raise HandlerFailure(f"transient failure on attempt {attempt}")
    if fail == "poison":
        raise HandlerFailure("poison payload")
    if fail == "permanent":
        return DeadLetter(detail="permanent failure")
    effects.record(
        kind="effect",
        job=job_id,
        attempt=attempt,
        pid=os.getpid(),
        running=_running,
        at=time.time(),
    )
    if kill_now and kill == "mid-handler":
        _kill_self()
    if fail == "ambiguous" and attempt <= int(spec.get("times", 1)):
        raise HandlerFailure("the effect happened but the call failed")
    return ACK


def build_stream_worker(args: argparse.Namespace, effects: Ledger) -> StreamWorker:
    """A stream worker on the raw stream ``args.queue`` (``--stream-start-id``)."""
    worker = StreamWorker(f"chaos-{os.getpid()}")
    options = StreamWorkerOptions(
        group=args.group,
        start_id=args.stream_start_id,
        concurrency=args.consumers,
        visibility_timeout=timedelta(milliseconds=args.visibility_ms),
        recovery_interval=timedelta(milliseconds=args.recovery_ms),
        delivery_limit=args.delivery_limit,
        shutdown_grace=timedelta(milliseconds=args.grace_ms),
        recreate_missing_group=args.recreate_missing_group,
        renew_leases=not args.no_renew,
        block=timedelta(milliseconds=200),
        timeout=timedelta(milliseconds=args.timeout_ms) if args.timeout_ms else None,
    )

    async def handle(entry: StreamEntry) -> Outcome:
        job_id = entry.fields.get(b"job", entry.id.encode()).decode()
        raw = entry.fields.get(b"spec")
        spec = json.loads(raw) if raw else {}
        return await perform(spec if isinstance(spec, dict) else {}, job_id, entry.attempt, effects)

    worker.register(args.queue, handle, options)
    return worker


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
        recreate_missing_group=args.recreate_missing_group,
    )
    queue_options = (
        QueueOptions(
            retry_backoff=timedelta(milliseconds=args.retry_backoff_ms),
            scheduling_poll_interval=timedelta(milliseconds=100),
        )
        if args.durable_retries
        else None
    )

    @worker.job(args.queue, JsonValueCodec(), options, queue_options=queue_options)
    async def handle(job: Job[Any]) -> Outcome:
        spec = job.payload if isinstance(job.payload, dict) else {}
        # total_attempts: with durable retries each retry is a new entry whose own delivery
        # count starts again at 1
        return await perform(spec, job.id, job.total_attempts, effects)

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
        worker: Worker | StreamWorker = (
            build_stream_worker(args, effects)
            if args.stream_start_id
            else build_worker(args, effects)
        )
        async with (
            connect(args.url, **_credentials(args)) as client,
            anyio.create_task_group() as tg,
        ):
            await tg.start(worker.run, client)
            if args.ready_file:
                await anyio.Path(args.ready_file).write_text(str(os.getpid()))

            async def stop_on_sigterm() -> None:
                with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                    async for _ in signals:
                        worker.request_stop()
                        return

            tg.start_soon(stop_on_sigterm)


def _credentials(args: argparse.Namespace) -> dict[str, Any]:
    if not args.password_file:
        return {}
    password_file = Path(args.password_file)

    def provider() -> tuple[str, str]:
        return args.username or "default", password_file.read_text().strip()

    return {"credential_provider": provider}


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
    p.add_argument("--username", help="ACL user (with --password-file)")
    p.add_argument("--password-file", help="read the password from this file per connection")
    p.add_argument("--durable-retries", action="store_true", help="QueueOptions (durable retries)")
    p.add_argument(
        "--retry-backoff-ms",
        type=int,
        default=100,
        help="with --durable-retries: the retry backoff's base (default 100)",
    )
    p.add_argument(
        "--recreate-missing-group",
        default="fail",
        help="WorkerOptions.recreate_missing_group: 'fail', '$' or an entry id",
    )
    p.add_argument(
        "--stream-start-id",
        default=None,
        help="be a stream worker on the raw stream --queue, its group created at this id",
    )
    p.add_argument("--group", default="chaos", help="the stream worker's consumer group")
    return p


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    anyio.run(_main, args, backend=args.backend)


if __name__ == "__main__":
    main()
