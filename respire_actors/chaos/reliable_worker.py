"""A chaos consumer of a reliable queue (``python -m respire_actors.chaos.reliable_worker``).

It receives one message at a time (``--visibility-ms`` lease), records the effect, then acks
it: the acknowledgement is a separate call after the handler, unlike a job queue's completion
script. Each message's JSON payload ``{"id": ..., "kill": ...}`` may ask for a SIGKILL on its
first delivery: ``after-delivery`` (before the effect), ``mid-handler`` (after the effect, before
the ack), ``before-ack`` / ``after-ack`` (at the fault points ``reliable.before-ack`` /
``reliable.after-ack``: right before the ack script is sent, right after it ran and replied).

Effects ledger lines: ``{"kind": "effect", "job": id, "attempt": delivery count, "pid"}`` and,
after an ack, ``{"kind": "acked" | "stale-ack", "job", "attempt", "pid"}``. ``--ready-file`` is
written once the consumer is connected; SIGTERM stops it after the current message.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

import anyio

from .. import faults
from ..codecs import JsonValueCodec
from ..redis.client import connect
from ..reliable import ReliableQueue
from . import process_main
from .ledger import Ledger
from .process_main import kill_self, stop_on_signal, write_ready


async def _consume(queue: ReliableQueue[Any], effects: Ledger, visibility: float) -> None:
    while True:
        messages = await queue.receive(visibility, max=1)
        if not messages:
            await anyio.sleep(0.05)
            continue
        message = messages[0]
        spec = message.payload if isinstance(message.payload, dict) else {}
        job = str(spec.get("id", message.id))
        line = {"job": job, "attempt": message.delivery_count, "pid": os.getpid()}
        kill = spec.get("kill") if message.delivery_count == 1 else None
        if kill == "after-delivery":
            kill_self()
        effects.record(kind="effect", entry=message.id, **line)
        if kill == "mid-handler":
            kill_self()
        if kill in ("before-ack", "after-ack"):
            faults.arm(f"reliable.{kill}:kill")
        acked = await queue.ack(message)
        effects.record(kind="acked" if acked else "stale-ack", **line)


async def _main(args: argparse.Namespace) -> None:
    faults.arm_from_environment()
    with Ledger(Path(args.effects)) as effects:
        async with connect(args.url) as client, anyio.create_task_group() as tg:
            queue = ReliableQueue(client, args.queue, JsonValueCodec())
            await write_ready(args.ready_file)
            stop_on_signal(tg, tg.cancel_scope.cancel)
            await _consume(queue, effects, args.visibility_ms / 1000)


def parser() -> argparse.ArgumentParser:
    return process_main.parser("respire_actors.chaos.reliable_worker", visibility_ms=1000)


def main(argv: list[str] | None = None) -> None:
    process_main.run(_main, parser(), argv)


if __name__ == "__main__":
    main()
