"""Helpers for the reliable queue and topic tests."""

from __future__ import annotations

from typing import Any

import anyio

from respire_actors.redis.client import RedisClient


def text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


async def wait_for_server_time(client: RedisClient, at_ms: int) -> None:
    """Return once the server's clock (Redis TIME) has reached ``at_ms``.

    Expiry is decided by the server clock, so tests wait on it rather than on local sleeps.
    """
    with anyio.fail_after(10):
        while (now := await client.time_ms()) < at_ms:  # noqa: ASYNC110 - polls the server
            await anyio.sleep(max(at_ms - now, 1) / 1000)


async def entry_ids(client: RedisClient, stream: str) -> list[str]:
    rows = await client.execute("XRANGE", stream, "-", "+")
    return [text(row[0]) for row in rows or []]


async def pending_count(client: RedisClient, stream: str, group: str) -> int:
    if not int(await client.execute("EXISTS", stream)):
        return 0
    try:
        reply = await client.execute("XPENDING", stream, group)
    except Exception:
        return 0
    return int(reply[0])
