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
from datetime import timedelta
from pathlib import Path
from typing import Any

from .. import faults
from ..actors.messages import ACK
from ..streams import StreamEntry, StreamWorker, StreamWorkerOptions
from . import process_main
from .ledger import Ledger
from .process_main import holds, kill_self, killed_before, serve

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
        kill_now = kill and not killed_before(effects.path, job)
        if kill_now:
            effects.record(kind="kill", point=kill, **line)
        if kill_now and kill == "after-delivery":
            kill_self()
        effects.record(kind="effect", **line)
        if kill_now and kill == "mid-handler":
            kill_self()
        if kill_now and kill in ("before-commit", "after-commit"):
            faults.arm(f"completer.{kill}:kill", when=holds(entry.id))
        return ACK

    return workers


async def _main(args: argparse.Namespace) -> None:
    faults.arm_from_environment()
    with Ledger(Path(args.effects)) as effects:
        await serve(args.url, args.ready_file, build(args, effects))


def parser() -> argparse.ArgumentParser:
    return process_main.parser(
        "respire_actors.chaos.stream_worker", visibility_ms=1000, queue_help="the stream key"
    )


def main(argv: list[str] | None = None) -> None:
    process_main.run(_main, parser(), argv)


if __name__ == "__main__":
    main()
