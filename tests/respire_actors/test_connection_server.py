"""The connection layer against real servers: transports, ACL users, server detection, errors."""

from __future__ import annotations

import shutil
import socket
from collections.abc import Callable, Iterator
from pathlib import Path

import anyio
import pytest
from helpers.resp import info_fields
from helpers.servers import ValkeyProcess, running_valkey, short_tmp_dir
from helpers.waiting import wait_until
from hiredis import ProtocolError, ReplyError

from respire_actors.errors import (
    CommandTimeout,
    ConfigurationError,
    CredentialsRefused,
    PermissionDenied,
    RedisUnavailable,
    RespireError,
    ScriptError,
    ServerError,
    ServerLoading,
    TransactionAborted,
    UnsupportedServer,
    WrongKeyType,
)
from respire_actors.redis.client import (
    RedisClient,
    ServerInfo,
    _parse_version,
    connect,
    map_error,
)

pytestmark = pytest.mark.anyio


# ------------------------------------------------------------------------------------------
# transports and credentials


@pytest.fixture
def socket_dir() -> Iterator[Path]:
    path = short_tmp_dir()
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


async def test_unix_socket(
    spawn_valkey: Callable[..., ValkeyProcess], socket_dir: Path, unique_name: str
) -> None:
    server = spawn_valkey(unix_socket=str(socket_dir / "v.sock"))
    async with connect(f"{server.unix_url}?db=1") as client:
        assert await client.execute("SET", unique_name, "over-unix") == b"OK"
        line = (await client.execute("CLIENT", "INFO")).decode()
        assert " db=1 " in f" {line} "
        assert str(socket_dir / "v.sock") in line  # really connected over the socket
    # db=1 was honoured: the key is not in db 0
    assert server.execute("EXISTS", unique_name) == 0
    assert server.execute("SELECT", 1) == b"OK"


@pytest.fixture
def acl_user(valkey_server: ValkeyProcess, unique_name: str) -> Iterator[tuple[str, str]]:
    user, password = f"user-{unique_name}", f"pw-{unique_name}"
    valkey_server.execute(
        "ACL", "SETUSER", user, "reset", "on", f">{password}", "~*", "&*", "+@all", "-incr"
    )
    try:
        yield user, password
    finally:
        valkey_server.execute("ACL", "DELUSER", user)


async def test_acl_user_connects_and_is_who_it_says(
    anyio_backend: str, valkey_url: str, acl_user: tuple[str, str], unique_name: str
) -> None:
    user, password = acl_user
    url = valkey_url.replace("redis://", f"redis://{user}:{password}@")
    async with connect(url) as client:
        assert (await client.execute("ACL", "WHOAMI")).decode() == user
        await client.execute("SET", unique_name, "1")
        # the user may not INCR: NOPERM maps to PermissionDenied and keeps its code
        with pytest.raises(PermissionDenied) as info:
            await client.execute("INCR", unique_name)
        assert info.value.code == "NOPERM"
        await client.execute("DEL", unique_name)


async def test_a_user_refused_select_gets_permission_denied_not_db_advice(
    client: RedisClient, server_url: str, unique_name: str
) -> None:
    user = f"noselect-{unique_name}"
    await client.execute("ACL", "SETUSER", user, "reset", "on", "nopass", "+@all", "-select")
    try:
        url = server_url.replace("redis://", f"redis://{user}@")
        with pytest.raises(PermissionDenied, match=r"\+select") as caught:
            async with connect(url, db=2):
                pass
        assert caught.value.command == "select"
    finally:
        await client.execute("ACL", "DELUSER", user)


async def test_a_closed_client_says_it_was_closed(server_url: str) -> None:
    """Found by review: a client used after its async with block said to enter it first."""
    async with connect(server_url) as client:
        assert await client.execute("PING") == b"PONG"
    with pytest.raises(RuntimeError, match="was closed"):
        await client.execute("PING")
    with pytest.raises(RuntimeError, match="enter the RedisClient"):
        await connect(server_url).execute("PING")


async def test_a_nopass_user_connects_with_its_name_alone(
    client: RedisClient, server_url: str, unique_name: str
) -> None:
    user = f"nopass-{unique_name}"
    await client.execute("ACL", "SETUSER", user, "reset", "on", "nopass", "+acl|whoami")
    try:
        async with connect(server_url.replace("redis://", f"redis://{user}@")) as as_user:
            assert (await as_user.execute("ACL", "WHOAMI")).decode() == user
    finally:
        await client.execute("ACL", "DELUSER", user)


async def test_wrong_password_is_a_configuration_error(
    valkey_url: str, acl_user: tuple[str, str]
) -> None:
    user, _ = acl_user
    url = valkey_url.replace("redis://", f"redis://{user}:not-the-password@")
    with pytest.raises(ConfigurationError, match="credentials") as raised:
        async with connect(url):
            pass
    # also a RedisUnavailable: a running worker whose reconnects are refused for a while (a
    # password rotation) waits and retries instead of dropping the outcomes in flight
    assert isinstance(raised.value, CredentialsRefused)
    assert isinstance(raised.value, RedisUnavailable)


async def test_a_database_the_server_lacks_is_a_configuration_error(server_url: str) -> None:
    """Found by review: serve and the operator commands printed the raw 'ReplyError: ERR DB
    index is out of range' with no advice."""
    with pytest.raises(ConfigurationError, match=r"cannot select database 99.*/DB part"):
        async with connect(server_url, db=99):
            pass


async def test_credentials_refused_on_a_reconnect_are_transient(
    valkey_url: str, valkey_server: ValkeyProcess, acl_user: tuple[str, str]
) -> None:
    user, password = acl_user
    url = valkey_url.replace("redis://", f"redis://{user}:{password}@")
    async with connect(url) as client:
        await client.execute("PING")
        valkey_server.execute("ACL", "SETUSER", user, "resetpass", ">another")
        valkey_server.execute("CLIENT", "KILL", "USER", user)
        with pytest.raises(RedisUnavailable):  # the dropped connection, or its refused return
            await client.execute("PING")
        with pytest.raises(CredentialsRefused):
            await client.execute("PING")
        valkey_server.execute("ACL", "SETUSER", user, f">{password}")
        await anyio.sleep(1.1)  # the reconnect backoff after failed attempts
        assert await client.execute("PING") == b"PONG"


async def test_unreachable_server_is_redis_unavailable() -> None:
    from respire_actors.embedded import free_port

    url = f"redis://127.0.0.1:{free_port()}?connect_timeout=2"
    with pytest.raises(RedisUnavailable):
        async with connect(url):
            pass


async def test_client_is_entered_once(server_url: str) -> None:
    client = connect(server_url)
    with pytest.raises(RuntimeError, match="enter"):
        await client.execute("PING")
    async with client:
        with pytest.raises(RuntimeError, match="once"):
            await client.__aenter__()
        assert await client.execute("PING") == b"PONG"


# ------------------------------------------------------------------------------------------
# server detection


async def test_server_info_detects_flavor_and_version(client: RedisClient, server_url: str) -> None:
    info = await client.server_info()
    fields = info_fields(await client.execute("INFO", "server"))
    if "valkey_version" in fields:
        assert info.flavor == "valkey"
        assert info.version_text == fields["valkey_version"]
    else:
        assert info.flavor == "redis"
        assert info.version_text == fields["redis_version"]
        assert info.version >= (7, 0, 0)
    assert info.mode == "standalone"
    assert info.role == "master"
    assert info.has_xautoclaim_deleted
    assert info.describe().startswith(("Valkey ", "Redis "))
    # cached until refreshed
    assert await client.server_info() is info
    assert await client.server_info(refresh=True) == info


async def test_capabilities_match_the_server(client: RedisClient) -> None:
    info = await client.server_info()
    for name in ("xackdel", "hexpire"):
        reply = await client.execute("COMMAND", "INFO", name)
        present = bool(reply and reply[0])
        assert (name in info.commands) is present
    expected_xackdel = bool((await client.execute("COMMAND", "INFO", "xackdel"))[0])
    assert info.has_xackdel is expected_xackdel
    if info.flavor == "redis" and info.version < (8, 2, 0):
        assert not info.has_xackdel


def test_parse_version() -> None:
    assert _parse_version("7.0.15") == (7, 0, 15)
    assert _parse_version("9.1") == (9, 1, 0)
    assert _parse_version("8.2.1-rc1") == (8, 2, 0)
    assert _parse_version("garbage") == (0, 0, 0)


async def test_old_redis_is_unsupported(server_url: str) -> None:
    async with connect(server_url) as client:
        # what a Redis 6.2 says in its connection handshake
        client._stats.last_hello = {b"server": b"redis", b"version": b"6.2.0", b"role": b"master"}
        with pytest.raises(UnsupportedServer, match=r"6\.2\.0.*Redis 7\.0 or later"):
            await client.server_info(refresh=True)


async def test_old_valkey_is_accepted(server_url: str) -> None:
    async with connect(server_url) as client:
        client._stats.last_hello = {b"server": b"valkey", b"version": b"7.2.5", b"mode": b"x"}
        info = await client.server_info(refresh=True)
        assert (info.flavor, info.version, info.mode) == ("valkey", (7, 2, 5), "x")


def test_server_info_capability_flags() -> None:
    old = ServerInfo("redis", (7, 0, 0), "standalone", "master")
    new = ServerInfo("redis", (8, 2, 0), "standalone", "master", frozenset({"xackdel"}))
    assert not old.has_xackdel and new.has_xackdel
    assert old.describe() == "Redis 7.0.0 (standalone, master)"


# ------------------------------------------------------------------------------------------
# error mapping (real server replies)


async def test_wrongtype(client: RedisClient, unique_name: str) -> None:
    await client.execute("SET", unique_name, "x")
    with pytest.raises(WrongKeyType) as info:
        await client.execute("LPUSH", unique_name, "y")
    assert info.value.code == "WRONGTYPE"


async def test_script_error_codes(client: RedisClient) -> None:
    with pytest.raises(ScriptError) as info:
        await client.execute("EVAL", "return redis.error_reply('RESPIRE_STALE fence moved')", 0)
    assert (info.value.code, info.value.detail) == ("RESPIRE_STALE", "fence moved")
    with pytest.raises(WrongKeyType) as wrong:
        await client.execute("EVAL", "return redis.error_reply('RESPIRE_WRONGTYPE k')", 0)
    assert wrong.value.code == "RESPIRE_WRONGTYPE"
    with pytest.raises(PermissionDenied) as denied:
        await client.execute("EVAL", "return redis.error_reply('RESPIRE_NOPERM no XADD')", 0)
    assert denied.value.code == "RESPIRE_NOPERM"


async def test_noscript_code(client: RedisClient) -> None:
    with pytest.raises(ServerError) as info:
        await client.execute("EVALSHA", "0" * 40, 0)
    assert info.value.code == "NOSCRIPT"
    assert type(info.value) is ServerError


async def test_busygroup_and_nogroup_codes(client: RedisClient, unique_name: str) -> None:
    stream = f"{unique_name}:stream"
    await client.execute("XGROUP", "CREATE", stream, "g", "$", "MKSTREAM")
    with pytest.raises(ServerError) as busy:
        await client.execute("XGROUP", "CREATE", stream, "g", "$", "MKSTREAM")
    assert busy.value.code == "BUSYGROUP"
    with pytest.raises(ServerError) as nogroup:
        await client.execute("XREADGROUP", "GROUP", "missing", "c", "STREAMS", stream, ">")
    assert nogroup.value.code == "NOGROUP"


async def test_errors_inside_pipelines_are_mapped_and_redacted(
    client: RedisClient, unique_name: str
) -> None:
    await client.execute("SET", unique_name, "x")
    secret_script = "return redis.error_reply('RESPIRE_STALE moved') -- secret-body"
    replies = await client.pipeline(
        [
            ("LPUSH", unique_name, "y"),
            ("EVAL", secret_script, 0),
            ("EVALSHA", "0" * 40, 0),
            ("GET", unique_name),
        ]
    )
    assert isinstance(replies[0], WrongKeyType)
    assert isinstance(replies[1], ScriptError) and replies[1].code == "RESPIRE_STALE"
    assert "secret-body" not in str(replies[1])  # the pipeline's rewrite is stripped
    assert isinstance(replies[2], ServerError) and replies[2].code == "NOSCRIPT"
    assert replies[3] == b"x"


def test_map_error_table() -> None:
    assert isinstance(map_error(TimeoutError("x")), CommandTimeout)
    assert isinstance(map_error(ConnectionResetError()), RedisUnavailable)
    assert isinstance(map_error(anyio.BrokenResourceError()), RedisUnavailable)
    assert isinstance(map_error(anyio.EndOfStream()), RedisUnavailable)
    assert isinstance(map_error(ProtocolError("bad byte")), RedisUnavailable)
    wrongpass = map_error(ReplyError("WRONGPASS invalid username-password pair"))
    assert isinstance(wrongpass, ConfigurationError) and "credentials" in str(wrongpass)
    assert isinstance(map_error(ReplyError("NOAUTH Authentication required.")), ConfigurationError)
    wrong = map_error(ReplyError("WRONGTYPE Operation against a key"))
    assert isinstance(wrong, WrongKeyType) and wrong.code == "WRONGTYPE"
    noperm = map_error(ReplyError("NOPERM User x has no permissions to run the 'incr' command"))
    assert isinstance(noperm, PermissionDenied) and noperm.code == "NOPERM"
    loading = map_error(ReplyError("LOADING Redis is loading the dataset in memory"))
    assert isinstance(loading, ServerLoading) and loading.code == "LOADING"
    # a producer written for outages (RedisUnavailable, ran) handles a restart's LOADING too
    assert isinstance(loading, RedisUnavailable) and loading.ran is False
    noscript = map_error(ReplyError("NOSCRIPT No matching script. Please use EVAL."))
    assert type(noscript) is ServerError and noscript.code == "NOSCRIPT"
    busy = map_error(ReplyError("BUSYGROUP Consumer Group name already exists"))
    assert type(busy) is ServerError and busy.code == "BUSYGROUP"
    nogroup = map_error(ReplyError("NOGROUP No such key 's' or consumer group 'g'"))
    assert type(nogroup) is ServerError and nogroup.code == "NOGROUP"
    script = map_error(ReplyError("RESPIRE_FENCE stale delivery"))
    assert isinstance(script, ScriptError) and script.code == "RESPIRE_FENCE"
    assert isinstance(map_error(ReplyError("RESPIRE_WRONGTYPE k")), WrongKeyType)
    assert isinstance(map_error(ReplyError("RESPIRE_NOPERM no XADD")), PermissionDenied)
    plain = map_error(ReplyError("ERR unknown command 'FOO'"))
    assert type(plain) is ServerError and plain.code == "ERR"
    # already mapped, and foreign exceptions, pass through unchanged
    mine = ScriptError("RESPIRE_X y")
    assert map_error(mine) is mine
    other = ValueError("not redis")
    assert map_error(other) is other
    assert issubclass(CommandTimeout, RedisUnavailable) and issubclass(CommandTimeout, TimeoutError)
    assert all(
        issubclass(e, RespireError)
        for e in (ScriptError, WrongKeyType, PermissionDenied, TransactionAborted)
    )


# ------------------------------------------------------------------------------------------
# transactions


async def test_transaction_commit(client: RedisClient, unique_name: str) -> None:
    a, b = f"{{{unique_name}}}:a", f"{{{unique_name}}}:b"
    async with client.transaction() as tx:
        first = tx.queue("SET", a, "1")
        second = tx.queue("INCR", b, convert=int)
        broken = tx.queue("LPUSH", a, "x")  # fails at run time inside EXEC
        assert not first.done
        with pytest.raises(RuntimeError, match="not been committed"):
            first.result()
        assert await tx.commit() is True
    assert first.result() == b"OK"
    assert second.result() == 1
    with pytest.raises(WrongKeyType):
        broken.result()  # Redis does not roll back: inspect every result
    assert await client.execute("MGET", a, b) == [b"1", b"1"]


async def test_transaction_discard_writes_nothing(client: RedisClient, unique_name: str) -> None:
    key = f"{{{unique_name}}}:k"
    async with client.transaction() as tx:
        pending = tx.queue("SET", key, "1")
        await tx.discard()
        with pytest.raises(RuntimeError, match="not open"):
            tx.queue("SET", key, "2")
    with pytest.raises(TransactionAborted):
        pending.result()
    # leaving the block without commit also discards
    async with client.transaction() as tx:
        dropped = tx.queue("SET", key, "3")
    with pytest.raises(TransactionAborted):
        dropped.result()
    assert await client.execute("EXISTS", key) == 0


async def test_transaction_watch_abort(client: RedisClient, unique_name: str) -> None:
    key = f"{{{unique_name}}}:watched"
    await client.execute("SET", key, "1")
    async with client.transaction(key) as tx:
        assert await tx.read("GET", key) == b"1"
        await client.execute("SET", key, "changed")  # another connection writes the key
        pending = tx.queue("SET", key, "from-tx")
        assert await tx.commit() is False
    with pytest.raises(TransactionAborted):
        pending.result()
    assert await client.execute("GET", key) == b"changed"


async def test_transaction_watch_commit_and_read_rules(
    client: RedisClient, unique_name: str
) -> None:
    key = f"{{{unique_name}}}:watched"
    await client.execute("SET", key, "5")
    async with client.transaction(key) as tx:
        value = int(await tx.read("GET", key))
        pending = tx.queue("SET", key, value + 1)
        with pytest.raises(RuntimeError, match="before the first queued"):
            await tx.read("GET", key)
        assert await tx.commit() is True
        with pytest.raises(RuntimeError, match="not open"):
            await tx.commit()
    assert pending.result() == b"OK"
    assert await client.execute("GET", key) == b"6"
    async with client.transaction() as tx:
        with pytest.raises(RuntimeError, match="WATCH"):
            await tx.read("GET", key)


async def test_pipeline_transaction_flag(client: RedisClient, unique_name: str) -> None:
    key = f"{{{unique_name}}}:counter"
    replies = await client.pipeline([("INCR", key), ("INCR", key)], transaction=True)
    assert replies == [1, 2]
    assert await client.pipeline([]) == []


async def test_credential_provider_is_asked_for_every_new_connection(
    valkey_server: ValkeyProcess, valkey_url: str, acl_user: tuple[str, str], unique_name: str
) -> None:
    """Rotation: the provider's current password is used by each reconnect."""
    user, password = acl_user
    current = {"password": password}
    calls = 0

    async def provider() -> tuple[str, str]:
        nonlocal calls
        calls += 1
        await anyio.lowlevel.checkpoint()
        return user, current["password"]

    async with connect(valkey_url, credential_provider=provider) as client:
        assert (await client.execute("ACL", "WHOAMI")).decode() == user
        asked = calls
        rotated = f"{password}-rotated"
        valkey_server.execute("ACL", "SETUSER", user, "resetpass", f">{rotated}")
        current["password"] = rotated
        valkey_server.execute("CLIENT", "KILL", "USER", user)  # drop the old connections
        with anyio.fail_after(5):
            while True:
                try:
                    assert (await client.execute("ACL", "WHOAMI")).decode() == user
                    break
                except RedisUnavailable:
                    continue  # the in-flight call saw the kill; the next one reconnects
        assert calls > asked


async def test_a_credential_provider_that_hangs_or_fails_fails_the_connection_in_time(
    valkey_server: ValkeyProcess, valkey_url: str, unique_name: str
) -> None:
    """Found by review: the provider was asked between the connect and the handshake timeouts,
    so one that hung on a reconnect held a shielded pipeline (uncancellable) and the connect
    lock for as long as it hung; one that raised leaked its own exception."""
    mode = {"now": "ok"}

    async def provider() -> tuple[str | None, str | None]:
        if mode["now"] == "hang":
            await anyio.sleep(60)
        if mode["now"] == "fail":
            raise RuntimeError("secrets store unavailable")
        if mode["now"] == "garbage":
            return "just a password"  # type: ignore[return-value]
        return None, None

    name = f"{unique_name}-provider"
    async with connect(
        valkey_url, credential_provider=provider, connect_timeout=0.5, client_name=name
    ) as client:
        assert await client.execute("PING") == b"PONG"
        for now, error, text in (
            ("hang", RedisUnavailable, "did not answer within 0.5 s"),
            ("fail", RedisUnavailable, "RuntimeError: secrets store unavailable"),
            ("garbage", ConfigurationError, "must return (username, password)"),
        ):
            mode["now"] = now
            valkey_server.execute(
                "CLIENT", "KILL", "SKIPME", "no", "ID", _client_id(valkey_server, name)
            )
            with anyio.fail_after(5):  # bounded: the pipeline is shielded
                while True:  # the in-flight call may see the kill first; the next reconnects
                    try:
                        await client.pipeline([("PING",)])
                    except (RedisUnavailable, ConfigurationError) as exc:
                        if "credential provider" in str(exc):
                            caught: Exception = exc
                            break
            assert isinstance(caught, error), caught
            assert text in str(caught)
            if isinstance(caught, RedisUnavailable):
                assert caught.ran is False
            mode["now"] = "ok"
            assert await client.execute("PING") == b"PONG"


def _client_id(server: ValkeyProcess, name: str) -> str:
    for line in server.execute("CLIENT", "LIST").decode().splitlines():
        fields = dict(part.split("=", 1) for part in line.split() if "=" in part)
        if fields.get("name") == name:
            return fields["id"]
    raise AssertionError(f"no client named {name}")


async def test_a_server_at_maxclients_refuses_as_unavailable_not_a_raw_reply(
    tmp_path: Path,
) -> None:
    """Found by review: the handshake's "max number of clients reached" escaped as a raw
    hiredis ReplyError (on a reconnect, a ServerError that crashed the reader actor); a
    surge at maxclients is an outage the runtime waits out, and nothing ran."""
    with running_valkey(tmp_path, "--maxclients", "1") as server:
        with socket.create_connection(("127.0.0.1", server.port)) as holder:
            holder.sendall(b"PING\r\n")
            assert holder.recv(64) == b"+PONG\r\n"  # the only client the server takes
            with pytest.raises(RedisUnavailable, match="max number of clients") as raised:
                async with connect(server.url):
                    pass
            assert raised.value.ran is False
        async with connect(server.url) as client:  # room again: it connects
            assert await client.execute("PING") in (b"PONG", "PONG")


async def test_a_transaction_waits_for_a_pooled_connection_at_most_the_command_timeout(
    server_url: str, unique_name: str
) -> None:
    """Found by review: a transaction runs shielded, and its wait for a pooled connection had
    no bound, so with every pooled connection held by a blocking read it could be neither
    timed out nor cancelled."""
    lists = [f"{unique_name}:a", f"{unique_name}:b"]
    counter = f"{unique_name}:n"
    async with connect(server_url, max_connections=2, command_timeout=0.5) as client:
        async with anyio.create_task_group() as tg:
            for key in lists:
                tg.start_soon(client.execute, "BLPOP", key, 0)
            await wait_until(lambda: client.statistics().dedicated_in_use == 2)
            with anyio.fail_after(5):
                with pytest.raises(RedisUnavailable, match="no pooled connection") as raised:
                    await client.pipeline([("INCR", counter)], transaction=True)
            assert raised.value.ran is False
            assert await client.execute("GET", counter) is None  # it did not run
            for key in lists:
                await client.execute("RPUSH", key, 1)
        # with the pool free again the same transaction runs
        assert await client.pipeline([("INCR", counter)], transaction=True) == [1]
        await client.execute("DEL", counter, *lists)


async def test_a_blocking_connection_closed_by_the_server_while_idle_reconnects(
    client: RedisClient, unique_name: str
) -> None:
    """Found by review: an idle ``open_blocking`` connection the server had closed (a restart,
    CLIENT KILL, its idle timeout) failed its next command with "may have run" although
    nothing had been sent; it reconnects first now, as the pooled connections do."""
    key = f"{unique_name}:s"
    await client.execute("XADD", key, "1-1", "f", "v")
    async with client.open_blocking() as blocking:
        own_id = await blocking.execute("CLIENT", "ID")
        await client.execute("CLIENT", "KILL", "ID", own_id)
        await anyio.sleep(0.05)
        reply = await blocking.execute("XREAD", "BLOCK", 10, "STREAMS", key, "0")
        assert reply
    await client.execute("DEL", key)
