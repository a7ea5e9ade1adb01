"""Mutation-testing gap: RESP3 push frames on a dedicated connection are never a command's
reply . _protocol.py: "RESP3 push frames come back as PushNotification ... and are
never a command's reply".

Added after a mutation review: no test failed with these guarantees broken.
"""

from __future__ import annotations

import pytest

from respire_actors.redis.client import RedisClient


@pytest.mark.anyio
async def test_push_frames_on_a_blocking_connection_are_not_replies(
    client: RedisClient, unique_name: str
) -> None:
    key = f"{unique_name}:tracked"
    await client.execute("SET", key, "v0")
    async with client.open_blocking() as blocking:
        assert await blocking.execute("CLIENT", "TRACKING", "ON") == b"OK"
        for i in range(5):
            assert await blocking.execute("GET", key) == f"v{i}".encode()  # tracked now
            await client.execute("SET", key, f"v{i + 1}")  # an invalidation push follows
            assert await blocking.execute("PING") == b"PONG"
            assert await blocking.execute("ECHO", f"e{i}") == f"e{i}".encode()
