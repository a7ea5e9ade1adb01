"""Apps that cannot be served, for the CLI's start-up errors (tests/respire_actors/test_cli.py).

Importing this module is fine; ``tests.apps.broken_import`` raises at import.
"""

from __future__ import annotations

from typing import Any


class SyncRun:
    """An app whose run is not async."""

    def run(self, client: Any, **kwargs: Any) -> None:
        print("sync run called", flush=True)
        return None


sync_run = SyncRun()


class NoTaskStatus:
    """An app whose run takes no task_status."""

    async def run(self, client: Any) -> None:
        return None


no_task_status = NoTaskStatus()


class OneShot:
    """An app that does its work and returns without ever calling ``task_status.started()``."""

    async def run(self, client: Any, **kwargs: Any) -> None:
        print("one-shot work:", (await client.execute("PING")).decode(), flush=True)


one_shot = OneShot()


class FailsWhileStopping:
    """An app that starts, and raises when asked to stop."""

    async def run(self, client: Any, *, task_status: Any) -> None:
        from supervisors import current_child

        task_status.started()
        print("serving", flush=True)
        await current_child().wait_stop_requested()
        raise ValueError("failed while stopping")


fails_while_stopping = FailsWhileStopping()


class SlowStart:
    """An app whose start-up takes long (a SIGINT lands during it)."""

    async def run(self, client: Any, *, task_status: Any) -> None:
        import anyio

        print("starting up", flush=True)
        await anyio.sleep(30)
        task_status.started()


slow_start = SlowStart()


class IgnoresStops:
    """An app that starts, then runs work that ignores cancellation (a shielded wait and a
    blocking call in a worker thread), as a handler may."""

    async def run(self, client: Any, *, task_status: Any) -> None:
        import time

        import anyio

        task_status.started()
        print("serving", flush=True)
        with anyio.CancelScope(shield=True):
            await anyio.sleep(60)
        await anyio.to_thread.run_sync(time.sleep, 60)


ignores_stops = IgnoresStops()


class ExitingHandler:
    """A worker app whose handler calls ``sys.exit(4)``: it enqueues one job into the queue
    named by ``EXIT_QUEUE`` and serves it."""

    async def run(self, client: Any, *, task_status: Any) -> None:
        import os
        import sys

        import anyio

        from respire_actors import JobQueue, StrCodec, Worker

        async def handler(job: Any) -> Any:
            sys.exit(4)

        queue = JobQueue(client, os.environ["EXIT_QUEUE"], StrCodec())
        worker = Worker()
        worker.register(queue.name, handler, StrCodec())
        async with anyio.create_task_group() as tg:
            await tg.start(worker.run, client)
            await queue.enqueue("exit", "x")
            task_status.started()


exiting_handler = ExitingHandler()
