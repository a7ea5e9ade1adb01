"""Bounded waiting for state that has no change notification (worker statistics, Redis)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import anyio


async def wait_until(predicate: Callable[[], bool], *, timeout: float = 10.0) -> None:
    """Wait until ``predicate()`` holds, re-checking on a short cadence; the bound makes a
    missed condition fail the test instead of hanging it."""
    with anyio.fail_after(timeout):
        while not predicate():  # noqa: ASYNC110 - nothing to wait on but a bounded poll
            await anyio.sleep(0.005)


async def wait_until_async(
    predicate: Callable[[], Awaitable[bool]], *, timeout: float = 10.0
) -> None:
    """:func:`wait_until` for a predicate that asks Redis."""
    with anyio.fail_after(timeout):
        while not await predicate():  # noqa: ASYNC110 - see wait_until
            await anyio.sleep(0.01)


def text(value: Any) -> str:
    """A reply value as str."""
    return value.decode() if isinstance(value, bytes) else str(value)
