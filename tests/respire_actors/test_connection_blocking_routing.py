"""Mutation-testing gap: ``XREAD ... BLOCK`` runs on a dedicated connection, never on the
shared one . client.execute: "Blocking commands (BLPOP, ``XREAD BLOCK``...) run on a
pooled dedicated connection"; _protocol.is_blocking: "True for commands that may block their
connection (``XREAD ... BLOCK`` included)".

Added after a mutation review: no test failed with these guarantees broken.
"""

from __future__ import annotations

import anyio
import pytest

from respire_actors.redis._protocol import is_blocking
from respire_actors.redis.client import RedisClient


def test_xread_block_is_blocking() -> None:
    assert is_blocking(b"XREAD", (b"BLOCK", b"0", b"STREAMS", b"s", b"$"))
    assert is_blocking(b"XREADGROUP", ("GROUP", "g", "c", "block", 10, "STREAMS", "s", ">"))
    assert not is_blocking(b"XREAD", ("COUNT", 1, "STREAMS", "s", "0"))


@pytest.mark.anyio
@pytest.mark.parametrize("command", ["XREAD", "XREADGROUP"])
async def test_a_blocked_xread_does_not_hold_up_other_commands(
    client: RedisClient, unique_name: str, command: str
) -> None:
    stream = f"{unique_name}:s"
    await client.execute("XGROUP", "CREATE", stream, "g", "$", "MKSTREAM")
    args = (
        ("XREAD", "BLOCK", 1500, "STREAMS", stream, "$")
        if command == "XREAD"
        else ("XREADGROUP", "GROUP", "g", "c", "BLOCK", 1500, "STREAMS", stream, ">")
    )
    async with anyio.create_task_group() as tg:
        tg.start_soon(client.execute, *args)
        await anyio.sleep(0.1)  # the read is blocked on the server now
        with anyio.fail_after(0.7):
            assert await client.execute("PING") == b"PONG"
            await client.execute("XADD", stream, "*", "f", "v")  # wakes the read
