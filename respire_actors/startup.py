"""Start-up waits shared by the CLI, the embedded server and workers.

A server that has just restarted answers some commands (``INFO``, ``COMMAND``) while it is
still loading its data set, and refuses the rest with ``LOADING``. Nothing runs during that
time, so a start-up step that is refused this way is safe to repeat: :func:`wait_until_loaded`
waits for the data set, and :func:`retry_while_loading` repeats one start-up step.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

import anyio

from .errors import RedisUnavailable, ServerLoading
from .redis.client import RedisClient

T = TypeVar("T")

log = logging.getLogger("respire_actors.startup")

DEFAULT_LOADING_TIMEOUT = 300.0
"""How long start-up waits for a server to load its data set before giving up (seconds)."""


async def wait_until_loaded(
    client: RedisClient, *, timeout: float = DEFAULT_LOADING_TIMEOUT
) -> None:
    """Return once the server answers ``PING`` (so it has finished loading its data set).

    Raises :class:`RedisUnavailable` if it is still loading after ``timeout`` seconds.
    Cancelling it sends nothing that writes.
    """
    await retry_while_loading(lambda: client.execute("PING"), timeout=timeout)


async def retry_while_loading(
    step: Callable[[], Awaitable[T]], *, timeout: float = DEFAULT_LOADING_TIMEOUT
) -> T:
    """Run ``step`` and repeat it while the server answers ``LOADING``.

    Only for steps that are safe to repeat (a ``LOADING`` refusal means nothing ran). Waits
    with a growing pause (50 ms up to 1 s); raises :class:`RedisUnavailable` after ``timeout``.
    """
    delay = 0.05
    told = False
    with anyio.move_on_after(timeout):
        while True:
            try:
                return await step()
            except ServerLoading:
                if not told:
                    log.info("the server is loading its data set; waiting for it")
                    told = True
            await anyio.sleep(delay)
            delay = min(delay * 2, 1.0)
    raise RedisUnavailable(
        f"the server was still loading its data set after {timeout:g} s; "
        "wait for it to finish (INFO persistence shows loading:0) and start again"
    )


__all__ = ["DEFAULT_LOADING_TIMEOUT", "retry_while_loading", "wait_until_loaded"]
