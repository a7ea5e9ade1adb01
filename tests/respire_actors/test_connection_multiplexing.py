"""The multiplexed connection: FIFO reply matching under cancellation, connection loss with
requests in flight, partial reads, RESP3 push frames, auto-pipelining and blocking commands."""

from __future__ import annotations

from collections.abc import Callable

import anyio
import pytest
from helpers.proxy import open_fault_proxy
from helpers.servers import ValkeyProcess
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from respire_actors.errors import CommandTimeout, RedisUnavailable, ValidationError
from respire_actors.redis.client import ConnectionSettings, RedisClient, connect

pytestmark = pytest.mark.anyio


async def wait_until(predicate: Callable[[], bool], *, timeout: float = 10.0) -> None:
    with anyio.fail_after(timeout):
        while True:
            if predicate():
                return
            await anyio.sleep(0.005)


# ------------------------------------------------------------------------------------------
# reply matching under random cancellation (hypothesis)

# How a caller is cancelled: never, before it calls (it must send nothing), or after the
# given number of event-loop checkpoints (its request is usually queued or in flight by then).
policies = st.one_of(st.just("none"), st.just("before"), st.integers(min_value=0, max_value=6))


@pytest.mark.timeout(300)  # four examples of up to 2,500 callers each; slow on a loaded machine
@settings(
    max_examples=4,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(plan=st.lists(policies, min_size=1000, max_size=2500))
async def test_replies_match_callers_under_random_cancellation(
    client: RedisClient, unique_name: str, plan: list[str | int]
) -> None:
    """Thousands of concurrent callers, each INCRBY-ing its own key by its own number: a reply
    that arrives is always the caller's own; a caller cancelled before calling sent nothing;
    the connection stays aligned for everyone after."""
    run = unique_name + "-" + str(id(plan))
    replies: dict[int, int] = {}

    async def caller(i: int, policy: str | int) -> None:
        key = f"{run}:{i}"
        with anyio.CancelScope() as scope:
            if policy == "before":
                scope.cancel()
            elif policy != "none":
                assert isinstance(policy, int)

                async def cancel_later() -> None:
                    for _ in range(policy):
                        await anyio.lowlevel.checkpoint()
                    scope.cancel()

                tg.start_soon(cancel_later)
            replies[i] = await client.execute("INCRBY", key, i + 1)

    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            for i, policy in enumerate(plan):
                tg.start_soon(caller, i, policy)

    for i, reply in replies.items():
        assert reply == i + 1, f"caller {i} got someone else's reply {reply}"
    values = await client.pipeline([("GET", f"{run}:{i}") for i in range(len(plan))])
    for i, (policy, value) in enumerate(zip(plan, values, strict=True)):
        if policy == "before":
            assert value is None, f"caller {i} was cancelled before calling, yet its INCR ran"
        elif i in replies:
            assert value == str(i + 1).encode()
        else:
            assert value in (None, str(i + 1).encode())  # cancelled in flight: ran at most once
    assert await client.execute("ECHO", "aligned") == b"aligned"
    await wait_until(lambda: client.statistics().in_flight == 0)
    await client.execute("UNLINK", *[f"{run}:{i}" for i in range(len(plan))])


# ------------------------------------------------------------------------------------------
# a connection lost with many requests in flight


async def test_killed_connection_fails_every_in_flight_request(
    spawn_valkey: Callable[..., ValkeyProcess], unique_name: str
) -> None:
    server = spawn_valkey()
    n = 200
    async with connect(server.url, command_timeout=30) as client:
        shared_id = int(await client.execute("CLIENT", "ID"))
        opened = client.statistics().connections_opened
        server.execute("CLIENT", "PAUSE", 20_000, "WRITE")
        outcomes: list[BaseException | object] = []

        async def incr(i: int) -> None:
            try:
                outcomes.append(await client.execute("INCR", f"{unique_name}:{i}"))
            except RedisUnavailable as exc:
                outcomes.append(exc)

        with anyio.fail_after(20):  # nobody hangs
            async with anyio.create_task_group() as tg:
                for i in range(n):
                    tg.start_soon(incr, i)
                await wait_until(lambda: client.statistics().in_flight == n)
                server.execute("CLIENT", "KILL", "ID", shared_id)
        server.execute("CLIENT", "UNPAUSE")
        assert len(outcomes) == n
        assert all(type(o) is RedisUnavailable for o in outcomes), outcomes[:3]
        assert "may have run" in str(outcomes[0])  # the outcome is unknown, and said so
        # nothing was re-sent: the paused INCRs died with their connection
        assert all(server.execute("GET", f"{unique_name}:{i}") is None for i in range(n))
        # the next call reconnects (once) and works
        assert await client.execute("INCR", f"{unique_name}:0") == 1
        assert client.statistics().connections_opened == opened + 1


async def test_hung_server_fails_requests_behind_the_late_one(
    spawn_valkey: Callable[..., ValkeyProcess], unique_name: str
) -> None:
    """A reply late past the command timeout closes the shared connection: the late request
    gets CommandTimeout, the ones queued behind it RedisUnavailable; none hangs."""
    server = spawn_valkey()
    async with connect(server.url, command_timeout=1.0) as client:
        server.execute("CLIENT", "PAUSE", 4000, "ALL")
        errors: dict[int, BaseException] = {}

        async def echo(i: int) -> None:
            try:
                await client.execute("ECHO", str(i))
            except RedisUnavailable as exc:
                errors[i] = exc

        with anyio.fail_after(8):
            async with anyio.create_task_group() as tg:
                tg.start_soon(echo, 0)
                await wait_until(lambda: client.statistics().in_flight == 1)
                await anyio.sleep(0.3)  # the first request is 0.3 s old when the others join
                for i in range(1, 11):
                    tg.start_soon(echo, i)
        assert sorted(errors) == list(range(11))
        assert isinstance(errors[0], CommandTimeout)  # the late one
        assert all(isinstance(e, RedisUnavailable) for e in errors.values())
        assert any(not isinstance(e, CommandTimeout) for e in errors.values())
        server.execute("CLIENT", "UNPAUSE")
        assert await client.execute("ECHO", "back") == b"back"


# ------------------------------------------------------------------------------------------
# partial reads, large replies, push frames


async def test_large_replies_arrive_in_pieces(server_url: str, unique_name: str) -> None:
    """Replies forwarded a few bytes at a time (and a 2 MB one) still match their callers."""
    big = bytes(range(256)) * 8192  # 2 MiB
    port = ConnectionSettings.from_url(server_url).port
    async with open_fault_proxy(port) as proxy, connect(proxy.url) as client:
        await client.execute("SET", f"{unique_name}:big", big)
        proxy.split_replies(7)
        got: dict[int, bytes] = {}

        async def echo(i: int) -> None:
            got[i] = await client.execute("ECHO", f"{i}:" + "x" * i)

        async with anyio.create_task_group() as tg:
            for i in range(50):
                tg.start_soon(echo, i)
        assert got == {i: f"{i}:".encode() + b"x" * i for i in range(50)}
        assert proxy.pieces > 50
        proxy.split_replies(65_521)  # a prime: pieces never align with the reader's buffer
        with anyio.fail_after(30):
            replies = await client.pipeline(
                [("GET", f"{unique_name}:big"), ("ECHO", "after"), ("GET", f"{unique_name}:big")]
            )
        assert replies == [big, b"after", big]
        await client.execute("DEL", f"{unique_name}:big")


async def test_push_frames_are_not_replies(
    client: RedisClient, server_url: str, unique_name: str
) -> None:
    """RESP3 invalidation pushes (client tracking) arrive between replies and are skipped."""
    key = f"{unique_name}:tracked"
    await client.execute("SET", key, "1")
    assert await client.execute("CLIENT", "TRACKING", "ON") == b"OK"
    before = client.statistics().push_frames
    async with connect(server_url) as other:
        for round_ in range(20):
            assert await client.execute("GET", key) is not None  # tracked now
            await other.execute("SET", key, str(round_))  # invalidates: a push to `client`
            assert await client.execute("ECHO", f"r{round_}") == f"r{round_}".encode()
    await wait_until(lambda: client.statistics().push_frames >= before + 20)
    assert await client.execute("CLIENT", "TRACKING", "OFF") == b"OK"
    assert await client.execute("GET", key) == b"19"


# ------------------------------------------------------------------------------------------
# auto-pipelining, blocking and stateful commands


async def test_concurrent_callers_share_writes(client: RedisClient, unique_name: str) -> None:
    """100 concurrent callers on one shared connection: every reply right, one socket."""
    opened = client.statistics().connections_opened
    results: dict[int, object] = {}

    async def call(i: int) -> None:
        results[i] = await client.execute("ECHO", str(i))

    async with anyio.create_task_group() as tg:
        for i in range(100):
            tg.start_soon(call, i)
    assert results == {i: str(i).encode() for i in range(100)}
    assert client.statistics().connections_opened == opened
    assert client.statistics().shared_connected == 1


async def test_blocking_commands_use_a_dedicated_connection(
    client: RedisClient, unique_name: str
) -> None:
    got: list[object] = []

    async def pop() -> None:
        got.append(await client.execute("BLPOP", f"{unique_name}:q", 10))

    async with anyio.create_task_group() as tg:
        tg.start_soon(pop)
        await wait_until(lambda: client.statistics().dedicated_in_use == 1)
        with anyio.fail_after(2):  # the shared connection is not blocked by the BLPOP
            for _ in range(20):
                assert await client.execute("PING") == b"PONG"
        await client.execute("RPUSH", f"{unique_name}:q", "v")
    assert got == [[f"{unique_name}:q".encode(), b"v"]]


@pytest.mark.parametrize(
    "command",
    [("SELECT", 1), ("MULTI",), ("WATCH", "k"), ("CLIENT", "REPLY", "OFF")],
)
async def test_stateful_commands_are_refused_on_the_shared_connection(
    client: RedisClient, command: tuple[object, ...]
) -> None:
    with pytest.raises(ValidationError, match="transaction"):
        await client.execute(*command)  # type: ignore[arg-type]
    with pytest.raises(ValidationError):
        await client.pipeline([("PING",), command])  # type: ignore[list-item]
    assert await client.execute("PING") == b"PONG"


async def test_an_idle_connection_closed_by_the_server_is_replaced_before_sending(
    client: RedisClient, server_url: str, unique_name: str
) -> None:
    """Nobody reads an idle shared connection; a server that closed it (restart, idle timeout,
    CLIENT KILL) is noticed before the next command is written, so that command runs on a new
    connection instead of failing with an unknown outcome."""
    key = f"{unique_name}:idle"
    assert await client.execute("INCR", key) == 1
    own_id = await client.execute("CLIENT", "ID")
    opened = client.statistics().connections_opened
    async with connect(server_url) as other:
        assert await other.execute("CLIENT", "KILL", "ID", own_id) == 1
    await anyio.sleep(0.05)  # let the close reach this side's socket
    assert await client.execute("INCR", key) == 2  # ran once, on a new connection
    assert client.statistics().connections_opened == opened + 1
    await client.execute("DEL", key)


@pytest.mark.parametrize("command", [("SUBSCRIBE", "c"), ("PSUBSCRIBE", "c*"), ("MONITOR",)])
async def test_pub_sub_is_refused_before_anything_is_sent(
    client: RedisClient, command: tuple[object, ...]
) -> None:
    """Found by review: SUBSCRIBE was refused on the shared connection with advice to use
    open_blocking(), where it waited for a reply that only comes as a push frame and timed
    out; pub/sub and MONITOR are now refused everywhere, before anything is sent."""
    with pytest.raises(ValidationError, match="pub/sub"):
        await client.execute(*command)  # type: ignore[arg-type]
    async with client.open_blocking() as blocking:
        with anyio.fail_after(1), pytest.raises(ValidationError, match="pub/sub"):
            await blocking.execute(*command)  # type: ignore[arg-type]
        assert await blocking.execute("PING") == b"PONG"


async def test_a_pooled_connection_closed_by_the_server_is_replaced_before_use(
    client: RedisClient, server_url: str, unique_name: str
) -> None:
    """Found by review: the dedicated pool (transactions, blocking reads) handed out an idle
    connection the server had closed, and the next transaction failed with "the command may
    have run" although nothing had been sent; it is now replaced on the way out of the pool."""
    key = f"{unique_name}:pooled"
    (pooled_id,) = await client.pipeline([("CLIENT", "ID")], transaction=True)
    async with connect(server_url) as other:
        assert await other.execute("CLIENT", "KILL", "ID", pooled_id) == 1
    await anyio.sleep(0.05)  # let the close reach this side's socket
    assert await client.pipeline([("INCR", key)], transaction=True) == [1]
    # the same pool serves blocking commands
    (pooled_id,) = await client.pipeline([("CLIENT", "ID")], transaction=True)
    async with connect(server_url) as other:
        assert await other.execute("CLIENT", "KILL", "ID", pooled_id) == 1
    await anyio.sleep(0.05)
    assert await client.execute("BLPOP", f"{key}:list", 0.01) is None
    assert await client.execute("GET", key) == b"1"
    await client.execute("DEL", key)


async def test_a_command_larger_than_the_socket_buffer_is_written_whole(
    client: RedisClient, unique_name: str
) -> None:
    """An 8 MiB command takes several socket writes (and the reply several reads); the
    commands after it follow intact."""
    key = f"{unique_name}:big"
    value = bytes(range(256)) * (32 * 1024)  # 8 MiB
    assert await client.execute("SET", key, value) == b"OK"
    assert await client.execute("STRLEN", key) == len(value)
    assert await client.execute("GET", key) == value
    assert await client.execute("DEL", key) == 1
