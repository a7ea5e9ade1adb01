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
  after recording the effect, on attempt ``kill_attempt`` (default 1) only.

Every handler execution that reaches its effect appends ``{"kind": "effect", "job", "attempt",
"pid", "at"}`` (``at``: wall-clock seconds) to the ``--effects`` ledger (fsynced) before
returning. ``--ready-file`` is written once the worker has started every actor.

``--username`` with ``--password-file`` connects through a credential provider that reads the
file on every new connection, so a password rotated in the file is used by the next reconnect
(docs/security.md, "Rotating credentials").
"""

from __future__ import annotations

import argparse
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
        shutdown_grace=timedelta(milliseconds=args.grace_ms),
        renew_leases=not args.no_renew,
        timeout=timedelta(milliseconds=args.timeout_ms) if args.timeout_ms else None,
    )
    queue_options = QueueOptions() if args.durable_retries else None

    @worker.job(args.queue, JsonValueCodec(), options, queue_options=queue_options)
    async def handle(job: Job[Any]) -> Outcome:
        spec = job.payload if isinstance(job.payload, dict) else {}
        kill = spec.get("kill")
        kill_now = kill and job.attempt == int(spec.get("kill_attempt", 1))
        if kill_now and kill == "after-delivery":
            _kill_self()
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
            kind="effect", job=job.id, attempt=job.attempt, pid=os.getpid(), at=time.time()
        )
        if kill_now and kill == "mid-handler":
            _kill_self()
        if fail == "ambiguous" and job.attempt <= int(spec.get("times", 1)):
            raise HandlerFailure("the effect happened but the call failed")
        return ACK

    return worker


async def _main(args: argparse.Namespace) -> None:
    with Ledger(Path(args.effects)) as effects:
        worker = build_worker(args, effects)
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
    p.add_argument("--grace-ms", type=int, default=2000)
    p.add_argument("--timeout-ms", type=int, default=0, help="execution budget (0: none)")
    p.add_argument("--no-renew", action="store_true", help="no lease renewer")
    p.add_argument("--username", help="ACL user (with --password-file)")
    p.add_argument("--password-file", help="read the password from this file per connection")
    p.add_argument("--durable-retries", action="store_true", help="QueueOptions (durable retries)")
    return p


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    anyio.run(_main, args, backend=args.backend)


if __name__ == "__main__":
    main()
