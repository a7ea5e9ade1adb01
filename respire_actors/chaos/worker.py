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
* ``{"gate": "/path", "gate_attempt": 2}`` - on delivery attempts from ``gate_attempt``
  (default 2) on, wait until the file ``/path`` exists before doing anything else (a recovered
  delivery that holds its lease while a scenario acts);
* ``{"result": true}`` - return ``{"pid", "attempt"}`` (kept with ``--keep-results-ms``).

``RESPIRE_FAULT_POINT`` arms fault points at start-up (see :mod:`respire_actors.faults`).

With ``--stream-start-id ID`` the process is a stream worker instead: it consumes the stream
``--queue`` (a raw key) in consumer group ``--group``, creating the group at ``ID`` (``$``,
``0-0`` or an entry id) when missing; each entry's ``job`` field names the job and its ``spec``
field (JSON, optional) says what the handler does, as above.

Every handler execution that reaches its effect appends ``{"kind": "effect", "job", "attempt",
"total", "entry", "pid", "running", "at"}`` to the ``--effects`` ledger (fsynced) before
returning: ``attempt`` is the entry's delivery attempt, ``total`` the job's total attempts
(across durable retries; the failure counters above use it), ``running`` how many handlers of
this process were executing at that moment (at most ``--consumers``), ``at`` the wall-clock
time. Every start appends a ``start`` line when asked, a failed handler an ``error`` line (with
the exception) and a cancelled handler a ``cancelled`` line (both with ``at``). With
``--record-recovery`` each recovery pass that claimed deliveries
appends ``{"kind": "recovery-pass", "claimed", "pages", "pid"}`` (from the ``recovery-pass``
telemetry log). ``--ready-file`` is written once the worker has started every actor;
``--stats-file`` gets the worker's statistics (JSON) when it stops.

``--username`` with ``--password-file`` connects through a credential provider that reads the
file on every new connection, so a password rotated in the file is used by the next reconnect
(docs/security.md, "Rotating credentials").
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
from dataclasses import asdict, dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import anyio

from .. import faults
from ..actors.messages import DeadLetter
from ..codecs import JsonValueCodec
from ..jobs import ACK, Job, QueueOptions, Worker, WorkerOptions
from ..streams import StreamEntry, StreamWorker, StreamWorkerOptions
from . import process_main
from .ledger import Ledger
from .process_main import holds, kill_self, killed_before, serve


class HandlerFailure(RuntimeError):
    """The failure a chaos job asked for."""


@dataclass(frozen=True)
class Run:
    """One handler execution: the job id, the entry's delivery ``attempt``, the job's
    ``total`` attempts (across durable retries), the entry id, and the Job (job queues only:
    progress reports)."""

    job_id: str
    attempt: int
    total: int
    entry: str
    job: Job[Any] | None = None


async def _hold(run: Run, seconds: float, progress: bool) -> None:
    """Sleep ``seconds`` in 0.1 s steps, reporting progress after each step if asked."""
    end = anyio.current_time() + seconds
    while (left := end - anyio.current_time()) > 0:
        await anyio.sleep(min(0.1, left))
        if progress and run.job is not None:
            await run.job.report_progress(min(99, int(100 * (1 - left / seconds))))


_running = 0  # handlers of this process executing now (recorded in effect lines)


async def perform(spec: dict[str, Any], run: Run, effects: Ledger) -> Any:
    """What a chaos job's ``spec`` asks for (see the module docstring)."""
    global _running
    common = {"job": run.job_id, "attempt": run.attempt, "pid": os.getpid()}
    if spec.get("record_start"):
        effects.record(kind="start", **common)
    _running += 1
    try:
        return await _behave(spec, run, effects, common)
    except anyio.get_cancelled_exc_class():
        effects.record(kind="cancelled", at=time.time(), **common)
        raise
    except Exception as exc:  # the handler failed: say how (a verdict shows it)
        error = f"{type(exc).__name__}: {exc}"[:300]
        effects.record(kind="error", at=time.time(), error=error, **common)
        raise
    finally:
        _running -= 1


async def _behave(spec: dict[str, Any], run: Run, effects: Ledger, common: dict[str, Any]) -> Any:
    kill = spec.get("kill")
    if spec.get("kill_once"):
        # the first execution at or after total attempt kill_from_total, in any process
        kill_now = (
            kill
            and run.total >= int(spec.get("kill_from_total", 1))
            and not killed_before(effects.path, run.job_id)
        )
        if kill_now:
            effects.record(kind="kill", point=kill, **common)
    elif "kill_total_attempt" in spec:
        kill_now = kill and run.total == int(spec["kill_total_attempt"])
    else:
        kill_now = kill and run.attempt == int(spec.get("kill_attempt", 1))
    if kill_now and kill == "after-delivery":
        kill_self()
    if spec.get("gate") and run.attempt >= int(spec.get("gate_attempt", 2)):
        gate = anyio.Path(str(spec["gate"]))
        while True:  # another process opens it: polled, there is nothing to wait on
            if await gate.exists():
                break
            await anyio.sleep(0.05)
    if spec.get("stall") and run.attempt <= int(spec.get("stall_attempts", 1)):
        await anyio.sleep(float(spec["stall"]))
    if spec.get("sleep"):
        await anyio.sleep(float(spec["sleep"]))
    if spec.get("hold") and run.total == 1:
        await _hold(run, float(spec["hold"]), bool(spec.get("progress")))
    fail = spec.get("fail")
    failing = run.total <= int(spec.get("times", 1))
    if fail == "hang":
        await anyio.sleep_forever()
    if fail == "transient" and failing:
        raise HandlerFailure(f"transient failure on attempt {run.total}")
    if fail == "poison":
        raise HandlerFailure("poison payload")
    if fail == "permanent" and ("times" not in spec or failing):
        return DeadLetter(detail="permanent failure")
    effects.record(
        kind="effect", entry=run.entry, total=run.total, running=_running, at=time.time(), **common
    )
    if kill_now and kill == "mid-handler":
        kill_self()
    if kill_now and kill in ("before-commit", "after-commit"):
        # only at the commit of the batch holding this job's outcome (an earlier batch may
        # be in flight when the handler returns)
        faults.arm(f"completer.{kill}:kill", when=holds(run.entry))
    if fail == "ambiguous" and failing:
        raise HandlerFailure("the effect happened but the call failed")
    if spec.get("result"):
        return {"pid": os.getpid(), "attempt": run.total}
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

    async def handle(entry: StreamEntry) -> Any:
        job_id = entry.fields.get(b"job", entry.id.encode()).decode()
        raw = entry.fields.get(b"spec")
        spec = json.loads(raw) if raw else {}
        run = Run(job_id, entry.attempt, entry.attempt, entry.id)
        return await perform(spec if isinstance(spec, dict) else {}, run, effects)

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
        run = Run(job.id, job.attempt, job.total_attempts, job.entry_id, job)
        return await perform(spec, run, effects)

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
    faults.arm_from_environment()
    with Ledger(Path(args.effects)) as effects:
        if args.record_recovery:
            telemetry = logging.getLogger("respire_actors.telemetry")
            telemetry.setLevel(logging.INFO)
            telemetry.addHandler(_RecoveryPasses(effects))
        if args.stream_start_id:
            await serve(
                args.url, args.ready_file, build_stream_worker(args, effects), **_credentials(args)
            )
            return
        worker = build_worker(args, effects)
        try:
            await serve(args.url, args.ready_file, worker, **_credentials(args))
        finally:
            if args.stats_file:
                stats = asdict(worker.statistics(args.queue))
                await anyio.Path(args.stats_file).write_text(json.dumps(stats))


def _credentials(args: argparse.Namespace) -> dict[str, Any]:
    if not args.password_file:
        return {}
    password_file = Path(args.password_file)

    def provider() -> tuple[str, str]:
        return args.username or "default", password_file.read_text().strip()

    return {"credential_provider": provider}


def parser() -> argparse.ArgumentParser:
    p = process_main.parser("respire_actors.chaos.worker", visibility_ms=2000)
    p.add_argument("--consumers", type=int, default=8)
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
        help="with --durable-retries: nacks stage a retry after this backoff (0: no backoff, "
        "nacked entries stay pending; default 100)",
    )
    p.add_argument("--poll-ms", type=int, default=100, help="with --durable-retries: promoter poll")
    p.add_argument("--keep-results-ms", type=int, default=0, help="keep results (0: no)")
    p.add_argument("--stats-file", help="write the worker's statistics (JSON) here on exit")
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
    process_main.run(_main, parser(), argv)


if __name__ == "__main__":
    main()
