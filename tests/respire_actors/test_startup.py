"""Start-up against a server that is still loading its data set: connect, wait, then run."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
from helpers.loading import is_loading, loading_server

from respire_actors.errors import RedisUnavailable, ServerLoading
from respire_actors.redis.client import connect
from respire_actors.startup import connect_when_loaded, is_loading_refusal

pytestmark = pytest.mark.anyio


async def test_connect_when_loaded_waits_for_the_data_set(tmp_path: Path) -> None:
    server = loading_server(tmp_path)
    try:
        assert is_loading(server)
        with anyio.fail_after(60):
            async with connect_when_loaded(server.url) as client:
                assert await client.execute("DBSIZE") == 20_000
        assert not is_loading(server)
    finally:
        server.stop()


async def test_a_plain_connect_is_refused_while_loading(tmp_path: Path) -> None:
    # What connect_when_loaded exists for: the connection is up (HELLO and INFO are served while
    # loading) but the first real command is refused with LOADING.
    server = loading_server(tmp_path, delay_us=500)
    try:
        assert is_loading(server)
        with pytest.raises((RedisUnavailable, ServerLoading)) as info:
            async with connect(server.url) as client:
                await client.execute("DBSIZE")
        assert is_loading_refusal(info.value)
    finally:
        server.stop()


async def test_other_failures_are_not_retried(tmp_path: Path) -> None:
    with anyio.fail_after(20), pytest.raises(RedisUnavailable) as info:
        async with connect_when_loaded("redis://127.0.0.1:1"):
            pass
    assert not is_loading_refusal(info.value)
