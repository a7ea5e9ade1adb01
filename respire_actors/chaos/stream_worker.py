"""A chaos stream-worker process (``python -m respire_actors.chaos.stream_worker``).

It consumes an application-owned stream (``--queue`` is the stream key, group ``chaos``, from
``0-0``) with :class:`~respire_actors.streams.StreamWorker`, one handler at a time. Each entry's
``spec`` field is JSON ``{"id": ..., "kill": ...}``; a kill happens on the entry's first
execution in any process (a ``kill`` line in the effects ledger marks it): ``after-delivery``,
``mid-handler``, ``before-commit`` / ``after-commit`` (the completer's fault points, for the
batch holding this entry's outcome). The handler records ``{"kind": "effect", "job": id,
"entry", "attempt", "pid"}`` before it returns. ``--ready-file`` is written once every actor
started; SIGTERM stops the worker gracefully.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
from datetime import timedelta
from pathlib import Path
from typing import Any

import anyio

from .. import faults
from ..actors.messages import ACK
from ..redis.client import connect
from ..streams import StreamEntry, StreamWorker, StreamWorkerOptions
from .ledger import Ledger
from .worker import _holds, _killed_before

GROUP = "chaos"


def build(args: argparse.Namespace, effects: Ledger) -> StreamWorker:
    workers = StreamWorker(f"chaos-{os.getpid()}")
    options = StreamWorkerOptions(
        group=GROUP,
        start_id="0-0",
        concurrency=1,
        visibility_timeout=timedelta(milliseconds=args.visibility_ms),
        recovery_interval=timedelta(milliseconds=200),
        block=timedelta(milliseconds=200),
        shutdown_grace=timedelta(seconds=2),
    )

    @workers.stream(args.queue, options)
    async def handle(entry: StreamEntry) -> Any:
        spec = json.loads(entry.fields.get(b"spec", b"{}"))
        job = str(spec.get("id", entry.id))
        line = {"job": job, "entry": entry.id, "attempt": entry.attempt, "pid": os.getpid()}
        kill = spec.get("kill")
        kill_now = kill and not _killed_before(effects.path, job)
        if kill_now:
            effects.record(kind="kill", point=kill, **line)
        if kill_now and kill == "after-delivery":
            os.kill(os.getpid(), signal.SIGKILL)
        effects.record(kind="effect", **line)
        if kill_now and kill == "mid-handler":
            os.kill(os.getpid(), signal.SIGKILL)
        if kill_now and kill in ("before-commit", "after-commit"):
            faults.arm(f"completer.{kill}:kill", when=_holds(entry.id))
        return ACK

    return workers


async def _main(args: argparse.Namespace) -> None:
    faults.arm_from_environment()
    with Ledger(Path(args.effects)) as effects:
        workers = build(args, effects)
        async with connect(args.url) as client, anyio.create_task_group() as tg:
            await tg.start(workers.run, client)
            if args.ready_file:
                await anyio.Path(args.ready_file).write_text(str(os.getpid()))

            async def stop_on_sigterm() -> None:
                with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                    async for _ in signals:
                        workers.request_stop()
                        return

            tg.start_soon(stop_on_sigterm)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m respire_actors.chaos.stream_worker")
    p.add_argument("--url", required=True)
    p.add_argument("--queue", required=True, help="the stream key")
    p.add_argument("--effects", required=True, help="the effect ledger (JSON lines)")
    p.add_argument("--ready-file")
    p.add_argument("--backend", default="asyncio", choices=["asyncio", "trio"])
    p.add_argument("--visibility-ms", type=int, default=1000)
    return p


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    anyio.run(_main, args, backend=args.backend)


if __name__ == "__main__":
    main()
