"""What every chaos worker process shares (:mod:`~respire_actors.chaos.worker`,
:mod:`~respire_actors.chaos.reliable_worker`):
the common command-line options, the ready file, stopping on SIGTERM / SIGINT, serving a
worker, and the kill helpers a handler uses at its kill points."""

from __future__ import annotations

import argparse
import os
import signal
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
from anyio.abc import TaskGroup

from ..jobs import Worker
from ..redis.client import connect
from ..streams import StreamWorker
from .ledger import read_ledger
from .processes import PARENT_ENV


def kill_self() -> None:
    """SIGKILL this process (a kill point)."""
    os.kill(os.getpid(), signal.SIGKILL)


def killed_before(effects: Path, job_id: str) -> bool:
    """Whether a ``kill`` line for ``job_id`` is in the effects ledger (any process)."""
    return any(
        line.get("kind") == "kill" and line["job"] == job_id for line in read_ledger(effects)
    )


def holds(entry_id: str) -> Callable[[object], bool]:
    """A fault predicate: the completer's batch holds the outcome of this entry."""

    def holds(batch: object) -> bool:
        return isinstance(batch, list) and any(c.delivery.entry_id == entry_id for c in batch)

    return holds


async def write_ready(ready_file: str | None) -> None:
    """Write this process's pid to ``--ready-file`` (when one was given)."""
    if ready_file:
        await anyio.Path(ready_file).write_text(str(os.getpid()))


ORPHAN_GRACE = 30.0
"""Seconds an orphaned worker's graceful stop may take before it kills itself."""


def stop_on_signal(tg: TaskGroup, stop: Callable[[], object]) -> None:
    """Call ``stop()`` once, at the first SIGTERM or SIGINT, or when the process that started
    this worker (``$RESPIRE_CHAOS_PARENT``) is gone: a suite killed without cleanup never
    leaves workers running against the server. Both watchers end at the first of the two, so
    they do not hold ``tg`` open once the worker stopped; an orphan whose graceful stop takes
    longer than :data:`ORPHAN_GRACE` kills itself."""
    watchers = anyio.CancelScope()
    parent = int(os.environ.get(PARENT_ENV, "0") or 0)

    async def watch() -> None:
        with watchers:
            async with anyio.create_task_group() as inner:
                inner.start_soon(wait_for_signal)
                if parent:
                    inner.start_soon(watch_parent)

    async def wait_for_signal() -> None:
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for _ in signals:
                break
        stop()
        watchers.cancel()

    async def watch_parent() -> None:
        while os.getppid() == parent:  # noqa: ASYNC110 (no event tells a parent died)
            await anyio.sleep(0.5)
        stop()
        watchers.cancel()
        # a daemon timer, so a worker that stops in time exits at once
        timer = threading.Timer(ORPHAN_GRACE, kill_self)
        timer.daemon = True
        timer.start()

    tg.start_soon(watch)


async def serve(
    url: str, ready_file: str | None, worker: Worker | StreamWorker, **connect_options: Any
) -> None:
    """Run ``worker`` until a SIGTERM / SIGINT stops it gracefully; the ready file is written
    once every actor has started."""
    async with connect(url, **connect_options) as client, anyio.create_task_group() as tg:
        await tg.start(worker.run, client)
        await write_ready(ready_file)
        stop_on_signal(tg, worker.request_stop)


def parser(
    module: str, *, visibility_ms: int, queue_help: str | None = None
) -> argparse.ArgumentParser:
    """The options every chaos worker takes: ``--url``, ``--queue``, ``--effects``,
    ``--ready-file``, ``--backend`` and ``--visibility-ms``."""
    p = argparse.ArgumentParser(prog=f"python -m {module}")
    p.add_argument("--url", required=True)
    p.add_argument("--queue", required=True, help=queue_help)
    p.add_argument("--effects", required=True, help="the effect ledger (JSON lines)")
    p.add_argument("--ready-file")
    p.add_argument("--backend", default="asyncio", choices=["asyncio", "trio"])
    p.add_argument("--visibility-ms", type=int, default=visibility_ms)
    return p


def run(
    main: Callable[[argparse.Namespace], Awaitable[None]],
    parser: argparse.ArgumentParser,
    argv: list[str] | None,
) -> None:
    """Parse ``argv`` and run ``main(args)`` on the chosen anyio backend."""
    args = parser.parse_args(argv)
    anyio.run(main, args, backend=args.backend)
