"""The test harness's own key clean-up (helpers/keyspace.py): on the shared Redis a released
name's keys stay until the end-of-session sweep, which deletes exactly them."""

from __future__ import annotations

import anyio.to_thread
import pytest
from helpers.keyspace import new_name, release_keys, sweep_deferred

from respire_actors.redis.client import connect

pytestmark = pytest.mark.anyio


async def test_the_shared_redis_keeps_released_keys_until_the_sweep(redis_url: str) -> None:
    name, other = new_name(), new_name()
    mine = [f"{{respire-job:{name}}}:ready", f"x:{name}-a:y", f"{name}0123"]
    theirs = [f"{{respire-job:{other}}}:ready", name[:-1] + "X"]
    async with connect(redis_url) as client:
        try:
            for key in mine + theirs:
                await client.execute("SET", key, "1")
            await release_keys(client, f"*{name}*")
            assert await client.execute("EXISTS", *mine) == len(mine)  # deferred
            assert await anyio.to_thread.run_sync(sweep_deferred) >= len(mine)
            assert await client.execute("EXISTS", *mine) == 0
            assert await client.execute("EXISTS", *theirs) == len(theirs)
        finally:
            await client.execute("DEL", *mine, *theirs)


async def test_a_private_server_drops_released_keys_at_once(valkey_url: str) -> None:
    name = new_name()
    async with connect(valkey_url) as client:
        await client.execute("SET", f"k:{name}", "1")
        await release_keys(client, f"*{name}*")
        assert await client.execute("EXISTS", f"k:{name}") == 0
