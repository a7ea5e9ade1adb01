"""Running a worker in a test's task group while expecting it to stop with an error."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import anyio
import anyio.abc


class Runnable(Protocol):
    async def run(self, client: Any, *, task_status: anyio.abc.TaskStatus[None]) -> None: ...


def run_catching(
    worker: Runnable, client: Any, kind: type[BaseException], caught: list[BaseException]
) -> Callable[..., Awaitable[None]]:
    """A function for ``tg.start``: runs ``worker`` and appends the ``kind`` error it stops
    with to ``caught`` (any other error propagates)."""

    async def run(*, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        try:
            await worker.run(client, task_status=task_status)
        except kind as exc:
            caught.append(exc)

    return run
