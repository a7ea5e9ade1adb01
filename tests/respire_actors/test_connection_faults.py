"""Connection faults: lost replies are never re-sent, hung servers time out, pools never stall."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from helpers.proxy import open_fault_proxy
from helpers.servers import ValkeyProcess

from respire_actors.errors import CommandTimeout, RedisUnavailable
from respire_actors.redis.client import ConnectionSettings, RedisClient, connect

pytestmark = pytest.mark.anyio


async def wait_until(predicate: Callable[[], bool], *, timeout: float = 5.0) -> None:
    """Poll a condition on in-process state (never a bare sleep)."""
    with anyio.fail_after(timeout):
        while True:
            if predicate():
                return
            await anyio.sleep(0.005)


async def wait_until_async(predicate: Callable[[], Awaitable[bool]], timeout: float = 5.0) -> None:
    with anyio.fail_after(timeout):
        while True:
            if await predicate():
                return
            await anyio.sleep(0.01)


def port_of(url: str) -> int:
    return ConnectionSettings.from_url(url).port


# ------------------------------------------------------------------------------------------
# no automatic retries


def is_integer_reply(chunk: bytes) -> bool:
    return chunk.startswith(b":")


async def test_lost_reply_is_not_resent(
    client: RedisClient, server_url: str, unique_name: str
) -> None:
    """The server runs INCR, the reply is lost: we raise RedisUnavailable and send nothing."""
    key = f"{unique_name}:counter"
    async with open_fault_proxy(port_of(server_url)) as proxy, connect(proxy.url) as proxied:
        proxy.cut_on_reply(is_integer_reply)
        with pytest.raises(RedisUnavailable) as lost:
            await proxied.execute("INCR", key)
        assert lost.value.ran is None  # it may have run (and did)
        assert proxy.cuts == 1
        assert await client.execute("GET", key) == b"1"  # it ran once, and only once
        # the client reconnects for the next command
        assert await proxied.execute("INCR", key) == 2
    assert await client.execute("GET", key) == b"2"


async def test_lost_script_reply_is_not_resent(
    client: RedisClient, server_url: str, unique_name: str
) -> None:
    key = f"{unique_name}:script-counter"
    script = "return redis.call('INCR', KEYS[1])"
    async with open_fault_proxy(port_of(server_url)) as proxy, connect(proxy.url) as proxied:
        proxy.cut_on_reply(is_integer_reply)
        with pytest.raises(RedisUnavailable):
            await proxied.execute("EVAL", script, 1, key)
        # the lost pipeline reply is not re-sent either
        proxy.cut_on_reply(lambda chunk: b":2\r\n" in chunk)
        with pytest.raises(RedisUnavailable):
            await proxied.pipeline([("EVAL", script, 1, key)])
    assert await client.execute("GET", key) == b"2"


async def test_killed_connection_is_not_resent(
    spawn_valkey: Callable[..., ValkeyProcess], unique_name: str
) -> None:
    """INCR held by CLIENT PAUSE, its connection killed: it fails and never runs later."""
    server = spawn_valkey()
    key = f"{unique_name}:paused"
    async with connect(server.url) as client:
        my_id = int(await client.execute("CLIENT", "ID"))
        server.execute("CLIENT", "PAUSE", 10_000, "WRITE")
        errors: list[BaseException] = []

        async def incr() -> None:
            try:
                await client.execute("INCR", key)
            except RedisUnavailable as exc:
                errors.append(exc)

        async def held_by_pause() -> bool:
            line = server.execute("CLIENT", "LIST", "ID", my_id)
            return b"cmd=incr" in line  # type: ignore[operator]

        async with anyio.create_task_group() as tg:
            tg.start_soon(incr)
            await wait_until_async(held_by_pause)
            server.execute("CLIENT", "KILL", "ID", my_id)
        server.execute("CLIENT", "UNPAUSE")
        assert len(errors) == 1
        assert server.execute("GET", key) is None
        # a later command runs on a new connection; the killed INCR was never re-sent
        assert await client.execute("INCR", key) == 1


# ------------------------------------------------------------------------------------------
# command timeout


async def test_hung_server_times_out_quickly(spawn_valkey: Callable[..., ValkeyProcess]) -> None:
    server = spawn_valkey()
    async with connect(server.url, command_timeout=0.3) as client:
        server.execute("CLIENT", "PAUSE", 1500, "ALL")
        started = time.monotonic()
        with pytest.raises(CommandTimeout):
            await client.execute("ECHO", "stale")
        elapsed = time.monotonic() - started
        assert 0.25 <= elapsed < 1.2
        # the late reply of the timed-out command is not handed to the next command
        with anyio.fail_after(5):
            while True:
                try:
                    assert await client.execute("ECHO", "fresh") == b"fresh"
                    break
                except RedisUnavailable:  # still paused (CommandTimeout is one)
                    continue  # still paused


async def test_pipeline_times_out_on_a_hung_server(
    spawn_valkey: Callable[..., ValkeyProcess],
) -> None:
    server = spawn_valkey()
    async with connect(server.url, command_timeout=0.3) as client:
        server.execute("CLIENT", "PAUSE", 1500, "ALL")
        started = time.monotonic()
        replies = await client.pipeline([("ECHO", "a"), ("ECHO", "b")])
        assert [type(r) for r in replies] == [CommandTimeout, CommandTimeout]
        # MULTI/EXEC raises (here while opening its connection: the HELLO times out)
        with pytest.raises(RedisUnavailable):
            await client.pipeline([("ECHO", "a"), ("ECHO", "b")], transaction=True)
        assert time.monotonic() - started < 1.4
        with anyio.fail_after(5):
            while True:
                try:
                    assert await client.execute("ECHO", "fresh") == b"fresh"
                    break
                except RedisUnavailable:  # still paused (CommandTimeout is one)
                    continue


# ------------------------------------------------------------------------------------------
# the dedicated-connection pool (blocking commands, WATCH transactions) never stalls


async def test_cancelled_pool_waiter_does_not_stall(
    client: RedisClient, server_url: str, unique_name: str
) -> None:
    """Fill a pool of 2 dedicated connections with BLPOPs, queue waiter C (another BLPOP) and
    then D (a WATCH transaction), cancel C, free one connection: D must get it."""
    list_a, list_b, counter = f"{unique_name}:a", f"{unique_name}:b", f"{unique_name}:counter"
    async with connect(server_url, max_connections=2, command_timeout=30) as small:
        d_done = anyio.Event()
        c_scope = anyio.CancelScope()
        c_finished = anyio.Event()

        async def waiter_c() -> None:
            with c_scope:
                await small.execute("BLPOP", f"{unique_name}:c", 0)
            c_finished.set()

        async def waiter_d() -> None:
            async with small.transaction(counter) as tx:
                pending = tx.queue("INCR", counter)
                assert await tx.commit()
            assert pending.result() == 1
            d_done.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(small.execute, "BLPOP", list_a, 0)
            tg.start_soon(small.execute, "BLPOP", list_b, 0)
            await wait_until(lambda: small.statistics().dedicated_in_use == 2)
            tg.start_soon(waiter_c)
            await wait_until(lambda: small.statistics().dedicated_waiting == 1)
            tg.start_soon(waiter_d)
            await wait_until(lambda: small.statistics().dedicated_waiting == 2)
            c_scope.cancel()
            await c_finished.wait()
            assert small.statistics().dedicated_waiting == 1
            await client.execute("LPUSH", list_a, "x")  # frees one connection
            with anyio.fail_after(10):
                await d_done.wait()
            await client.execute("LPUSH", list_b, "x")
        # and the pool is healthy afterwards
        with anyio.fail_after(5):
            assert await small.execute("GET", counter) == b"1"
            assert small.statistics().dedicated_in_use == 0


async def test_cancelled_blocking_read_does_not_leak_the_slot(
    client: RedisClient, unique_name: str
) -> None:
    async with client.open_blocking() as blocking:
        for _ in range(3):
            with anyio.move_on_after(0.1) as scope:
                await blocking.execute("BLPOP", f"{unique_name}:empty", 5)
            assert scope.cancelled_caught
            with anyio.fail_after(5):
                assert await blocking.execute("PING") == b"PONG"
        # a real blocking read still works after the cancellations
        await client.execute("RPUSH", f"{unique_name}:full", "job")
        with anyio.fail_after(5):
            reply = await blocking.execute("BLPOP", f"{unique_name}:full", 1)
        assert reply == [f"{unique_name}:full".encode(), b"job"]


async def test_blocking_connection_is_separate(client: RedisClient, unique_name: str) -> None:
    """A BLOCKed reader does not hold up ordinary commands on the shared client."""
    async with client.open_blocking() as blocking, anyio.create_task_group() as tg:
        got: list[Any] = []

        async def read() -> None:
            got.append(await blocking.execute("BLPOP", f"{unique_name}:q", 5))

        tg.start_soon(read)
        with anyio.fail_after(2):
            for _ in range(20):
                assert await client.execute("PING") == b"PONG"
            await client.execute("RPUSH", f"{unique_name}:q", "v")
    assert got == [[f"{unique_name}:q".encode(), b"v"]]


async def test_a_stalled_client_does_not_blame_the_server(server_url: str) -> None:
    """A client whose own event loop (or process) did not run for longer than the command
    timeout (a handler's blocking call, SIGSTOP, a suspended VM) finds the replies that arrived
    meanwhile: its in-flight commands succeed instead of timing out and closing the link."""
    failures: list[BaseException] = []
    replies = 0
    async with connect(server_url, command_timeout=0.3) as client:

        async def ping_loop() -> None:
            nonlocal replies
            while True:
                try:
                    assert await client.execute("ECHO", "x") == b"x"
                    replies += 1
                except RedisUnavailable as exc:  # CommandTimeout is one
                    failures.append(exc)
                await anyio.lowlevel.checkpoint()

        async with anyio.create_task_group() as tg:
            for _ in range(4):  # some command is always in flight
                tg.start_soon(ping_loop)
            await wait_until(lambda: replies > 50)
            for _ in range(3):
                time.sleep(0.8)  # noqa: ASYNC251 - the loop stalls with commands in flight
                before = replies
                await wait_until(lambda: replies > before + 50)  # noqa: B023
            tg.cancel_scope.cancel()
    assert failures == []


async def test_callers_waiting_on_a_failing_connect_fail_with_it(
    spawn_valkey: Callable[..., ValkeyProcess],
) -> None:
    """A frozen server: callers queued behind a connect attempt that fails get its error at
    once. Each used to make its own attempt in turn, so the last of N callers waited N connect
    timeouts (with ten actors of a worker on one dead node, about ten seconds)."""
    import os
    import signal

    server = spawn_valkey()
    async with connect(server.url, command_timeout=0.3, connect_timeout=0.3) as client:
        assert await client.execute("PING") == b"PONG"
        os.kill(server.pid, signal.SIGSTOP)
        try:
            with pytest.raises(RedisUnavailable):
                await client.execute("PING")  # the link times out and closes
            errors: list[BaseException] = []

            async def call() -> None:
                try:
                    await client.execute("PING")
                except RedisUnavailable as exc:
                    errors.append(exc)

            started = time.monotonic()
            async with anyio.create_task_group() as tg:
                for _ in range(10):
                    tg.start_soon(call)
            elapsed = time.monotonic() - started
        finally:
            os.kill(server.pid, signal.SIGCONT)
        assert len(errors) == 10
        assert elapsed < 2.5, elapsed  # one failed attempt (and its backoff), not ten
        with anyio.fail_after(5):
            while True:
                try:
                    assert await client.execute("PING") == b"PONG"
                    break
                except RedisUnavailable:
                    await anyio.sleep(0.05)


async def test_a_command_that_could_not_be_sent_says_it_did_not_run(
    spawn_valkey: Callable[..., ValkeyProcess],
) -> None:
    """``RedisUnavailable.ran`` is False when nothing was sent (connect refused, on entry and
    for a command after the server went away), so generic retry code can tell it from a lost
    reply (``ran`` None)."""
    server = spawn_valkey()
    async with connect(server.url, connect_timeout=2) as client:
        assert await client.execute("PING") == b"PONG"
        server.stop()
        for _ in range(2):
            with pytest.raises(RedisUnavailable) as refused:
                await client.execute("INCR", "counter")
            assert refused.value.ran is False, refused.value
            assert "cannot connect" in str(refused.value)
    with pytest.raises(RedisUnavailable) as on_entry:
        async with connect(server.url, connect_timeout=2):
            pass
    assert on_entry.value.ran is False


def test_a_script_stopped_at_a_non_local_key_may_have_written() -> None:
    """Found by review: the "non local key" refusal became a ClusterReconfiguring with
    ran=False although the script is not rolled back (what it wrote before that key
    stays); repeating blindly is not what ran=False promises. Other cluster refusals still
    certainly did not run."""
    from respire_actors.errors import ClusterReconfiguring
    from respire_actors.redis.client import _map_reply

    nonlocal_key = _map_reply(
        "ERR Script attempted to access a non local key in a cluster node script: x"
    )
    assert isinstance(nonlocal_key, ClusterReconfiguring) and nonlocal_key.ran is None
    tryagain = _map_reply("TRYAGAIN Multiple keys request during rehashing of slot")
    assert isinstance(tryagain, ClusterReconfiguring) and tryagain.ran is False


async def test_a_tcp_connect_that_hangs_is_unavailable_and_certainly_did_not_run() -> None:
    """A listener whose accept queue is full drops new SYNs, so the TCP connect itself hangs
    (no handshake reached): after ``connect_timeout`` the error is RedisUnavailable with
    ``ran=False``, nothing having been sent (a mutation review found no test for this path)."""
    import socket

    listener = socket.socket()
    fillers: list[socket.socket] = []
    try:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)  # never accepted: one queued connection fills it
        port = listener.getsockname()[1]
        for _ in range(4):
            filler = socket.socket()
            filler.setblocking(False)
            filler.connect_ex(("127.0.0.1", port))  # in progress, or queued
            fillers.append(filler)
        await anyio.sleep(0.2)
        started = time.monotonic()
        with pytest.raises(RedisUnavailable) as caught:
            async with connect(f"redis://127.0.0.1:{port}", connect_timeout=0.5) as client:
                await client.execute("PING")
        assert caught.value.ran is False
        assert "timed out after 0.5 s" in str(caught.value)
        assert time.monotonic() - started < 5
    finally:
        for s in [*fillers, listener]:
            s.close()
