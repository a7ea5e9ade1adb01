"""Polling before parking (``spin_wait``): a lone request's reply is read by busy-polling the
socket for a bounded time; never while another task is ready, never on TLS, backed off when
replies are slow, and a connection lost while polling fails the request with the typed error."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import anyio
import anyio.lowlevel
import pytest
from helpers.servers import ValkeyProcess

from respire_actors.errors import ConfigurationError, RedisUnavailable
from respire_actors.redis.client import ConnectionSettings, RedisClient, connect

pytestmark = pytest.mark.anyio


async def lone_pings(client: RedisClient, count: int) -> None:
    for _ in range(count):
        assert await client.execute("PING") == b"PONG"


def with_spin(url: str, seconds: float) -> str:
    return f"{url}{'&' if '?' in url else '?'}spin_wait={seconds}"


async def test_lone_requests_are_read_by_polling(server_url: str) -> None:
    """With a generous budget nearly every lone reply is read by polling, not by parking."""
    async with connect(with_spin(server_url, 0.005)) as client:
        await lone_pings(client, 200)
        stats = client.statistics()
    assert stats.spin_hits >= 100, stats
    assert stats.spin_hits + stats.spin_misses <= 201


async def test_the_default_polls_and_zero_turns_it_off(valkey_url: str) -> None:
    assert ConnectionSettings().spin_wait == 0.0001
    async with connect(with_spin(valkey_url, 0)) as client:
        await lone_pings(client, 100)
        stats = client.statistics()
    assert (stats.spin_hits, stats.spin_misses) == (0, 0)


async def test_unix_socket_polls(
    spawn_valkey: Callable[..., ValkeyProcess], tmp_path: Path
) -> None:
    server = spawn_valkey(unix_socket=str(tmp_path / "v.sock"))
    async with connect(with_spin(server.unix_url, 0.005)) as client:
        await lone_pings(client, 100)
        assert client.statistics().spin_hits >= 50


async def test_polling_never_holds_up_another_task(valkey_url: str) -> None:
    """The poller yields before every poll: a task that is always ready to run (it only
    yields) keeps running while lone replies are polled for."""
    async with connect(with_spin(valkey_url, 0.005)) as client:
        done = False
        yields = 0
        before = client.statistics()

        async def busy() -> None:
            nonlocal yields
            while not done:
                yields += 1
                await anyio.lowlevel.checkpoint()

        async with anyio.create_task_group() as tg:
            tg.start_soon(busy)
            await anyio.lowlevel.checkpoint()
            await lone_pings(client, 100)
            done = True
        stats = client.statistics()
    assert stats.spin_hits - before.spin_hits >= 50  # it did poll
    # every poll let the busy task run at least once
    polls_with_reply = stats.spin_hits - before.spin_hits
    assert yields >= polls_with_reply


async def test_concurrent_requests_are_not_polled(valkey_url: str) -> None:
    """Requests from many tasks are batched; polling is for a lone request only."""
    async with connect(with_spin(valkey_url, 0.005)) as client:
        before = client.statistics()
        async with anyio.create_task_group() as tg:
            for _ in range(32):
                tg.start_soon(lone_pings, client, 50)
        stats = client.statistics()
    # only stragglers may find themselves alone on the connection: about one per task at the
    # end (32) plus a few a busy scheduler leaves alone mid-run (43 seen in CI under load);
    # polling every read of the batched replies would be about 90 polls here
    polled = stats.spin_hits + stats.spin_misses - before.spin_hits - before.spin_misses
    assert polled <= 60, stats


async def test_slow_replies_back_off(
    spawn_valkey: Callable[..., ValkeyProcess],
) -> None:
    """Replies slower than the budget (the server paused for 3 ms before each request): a few
    polls give up, then polling backs off (skipping 1, 2, 4, 8... chances), so the cost stays
    bounded; every reply still reaches its caller."""
    server = spawn_valkey()
    async with connect(with_spin(server.url, 0.0005)) as client, connect(server.url) as pauser:
        for i in range(30):
            assert await pauser.execute("CLIENT", "PAUSE", 3, "ALL") == b"OK"
            assert await client.execute("ECHO", f"slow-{i}") == f"slow-{i}".encode()
        stats = client.statistics()
    # 30 slow replies would cost 30 misses without the back-off: 1 + skip 1, 2, 4, 8 = 5
    assert 1 <= stats.spin_misses <= 6, stats
    assert stats.spin_hits <= 2, stats


async def test_connection_lost_while_polling_is_the_typed_error(
    spawn_valkey: Callable[..., ValkeyProcess],
) -> None:
    """The server dies while a lone request is being polled for: the caller gets
    RedisUnavailable at once (no hang, no retry), and the next call reconnects.

    The kill comes from a timer 2 ms after the call starts. On a slow machine it can land
    before the request is written; the call then fails to reconnect (also RedisUnavailable,
    saying nothing was sent) and the case is tried again on a fresh server, up to five times:
    at least one must hit the request in flight."""
    for _ in range(5):
        server = spawn_valkey()
        async with connect(with_spin(server.url, 0.01), command_timeout=10) as client:
            assert await client.execute("PING") == b"PONG"
            async with connect(server.url) as other:
                assert await other.execute("CLIENT", "PAUSE", 10_000, "ALL") == b"OK"
            killer = threading.Timer(0.002, server.process.kill)
            killer.start()
            started = time.monotonic()
            try:
                with pytest.raises(RedisUnavailable) as caught:
                    await client.execute("GET", "anything")
            finally:
                killer.join()
            assert time.monotonic() - started < 5
            server.process.wait(5)
            with pytest.raises(RedisUnavailable):
                await client.execute("PING")
        if "may have run" in str(caught.value):
            return
        assert "cannot connect" in str(caught.value), caught.value  # killed before the write
    pytest.fail("in five tries the server never died while the request was in flight")


def test_spin_wait_is_validated() -> None:
    assert ConnectionSettings.from_url("redis://h?spin_wait=0.0002").spin_wait == 0.0002
    assert ConnectionSettings.from_url("redis://h?spin_wait=0").spin_wait == 0
    for bad in ("-0.001", "0.5", "nan", "inf"):
        with pytest.raises(ConfigurationError, match="spin_wait"):
            ConnectionSettings.from_url(f"redis://h?spin_wait={bad}")
    with pytest.raises(ConfigurationError, match="spin_wait"):
        ConnectionSettings(spin_wait=True)


async def test_a_lone_request_cancelled_while_polling_leaves_the_connection_aligned(
    valkey_url: str, unique_name: str
) -> None:
    """The reply of a request cancelled during its poll is read and dropped later; the next
    request on the same connection gets its own reply."""
    key = f"{unique_name}:polled"
    async with connect(with_spin(valkey_url, 0.01)) as client, connect(valkey_url) as pauser:
        for round_ in range(3):
            assert await pauser.execute("CLIENT", "PAUSE", 30, "WRITE") == b"OK"
            with anyio.move_on_after(0.002) as scope:
                await client.execute("INCR", key)  # held by the pause, cancelled while polled
            assert scope.cancelled_caught
            assert await client.execute("ECHO", f"mine-{round_}") == f"mine-{round_}".encode()
        # every cancelled INCR still ran (the server had it): the outcome was unknown, not lost
        assert await client.execute("GET", key) == b"3"
        await client.execute("DEL", key)


async def test_the_connection_killed_while_polling_fails_with_the_typed_error(
    valkey_url: str, unique_name: str
) -> None:
    async with connect(with_spin(valkey_url, 0.01)) as client, connect(valkey_url) as killer:
        await client.execute("CLIENT", "SETNAME", f"{unique_name}-victim")
        me = await client.execute("CLIENT", "ID")
        assert await killer.execute("CLIENT", "PAUSE", 200, "WRITE") == b"OK"

        async def kill_soon() -> None:
            await anyio.sleep(0.003)
            await killer.execute("CLIENT", "KILL", "ID", me)

        async with anyio.create_task_group() as tg:
            tg.start_soon(kill_soon)
            with pytest.raises(RedisUnavailable, match="may have run"):
                await client.execute("INCR", f"{unique_name}:killed")
        await killer.execute("CLIENT", "UNPAUSE")
        assert await client.execute("PING") == b"PONG"  # the next call reconnects
        await client.execute("DEL", f"{unique_name}:killed")
