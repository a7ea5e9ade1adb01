"""ACL refusals in scripts: every command checked before the first write, typed errors naming
the command, and commands refused inside a script mapped to PermissionDenied."""

from __future__ import annotations

import pytest
from helpers.acl import acl_user, key_dump

from respire_actors.errors import PermissionDenied, ServerError
from respire_actors.jobs.options import CONSUMER_GROUP
from respire_actors.keys import JobQueueKeys
from respire_actors.redis.client import RedisClient, _map_reply
from respire_actors.redis.scripts import load

pytestmark = pytest.mark.anyio

LOG = load("job_log")
PROMOTE = load("job_promote")
ENQUEUE = load("job_enqueue")
EVERYTHING = ("~*", "&*", "+@all")


@pytest.fixture
def keys(unique_name: str) -> JobQueueKeys:
    return JobQueueKeys(unique_name)


async def _delivered(client: RedisClient, keys: JobQueueKeys) -> str:
    await client.execute("XGROUP", "CREATE", keys.ready, CONSUMER_GROUP, "0", "MKSTREAM")
    await client.execute("XADD", keys.ready, "*", "_respire.job.id", "a")
    reply = await client.execute(
        "XREADGROUP", "GROUP", CONSUMER_GROUP, "c1", "COUNT", 1, "STREAMS", keys.ready, ">"
    )
    rows = reply[keys.ready.encode()] if isinstance(reply, dict) else reply[0][1]
    entry = rows[0][0]
    return entry.decode() if isinstance(entry, bytes) else str(entry)


@pytest.mark.parametrize("command", ["pexpiretime", "pexpireat", "time", "xpending", "type"])
async def test_log_checks_every_command_before_appending(
    client: RedisClient, server_url: str, keys: JobQueueKeys, unique_name: str, command: str
) -> None:
    entry = await _delivered(client, keys)
    args = (CONSUMER_GROUP, "c1", entry, 1, "a line", 100, 60_000, 0)
    async with acl_user(client, server_url, unique_name, (*EVERYTHING, f"-{command}")) as c:
        with pytest.raises(PermissionDenied) as caught:
            await LOG(c, (keys.ready, keys.logs("a")), args)
    assert caught.value.code == "RESPIRE_NOPERM"
    assert caught.value.command == command
    assert await client.execute("EXISTS", keys.logs("a")) == 0  # nothing appended
    # with every permission the line is appended and the list expires
    assert await LOG(client, (keys.ready, keys.logs("a")), args) == 1
    assert int(await client.execute("PTTL", keys.logs("a"))) > 0


@pytest.mark.parametrize("command", ["zrange", "zrangebyscore", "xrange", "time", "type"])
async def test_promote_checks_every_command_before_promoting(
    client: RedisClient, server_url: str, keys: JobQueueKeys, unique_name: str, command: str
) -> None:
    staged = await client.execute("XADD", keys.scheduled, "*", "_respire.job.id", "a")
    await client.execute("ZADD", keys.due, 0, staged)
    before = await key_dump(client, f"*{unique_name}*")
    promote_keys = (keys.scheduled, keys.due, keys.ready)
    async with acl_user(client, server_url, unique_name, (*EVERYTHING, f"-{command}")) as c:
        with pytest.raises(PermissionDenied) as caught:
            await PROMOTE(c, promote_keys, (8,))
    assert caught.value.command == command
    assert await key_dump(client, f"*{unique_name}*") == before  # nothing promoted
    assert [int(x) for x in await PROMOTE(client, promote_keys, (8,))][:2] == [1, 0]


async def test_type_is_checked_before_it_is_called(
    client: RedisClient, server_url: str, keys: JobQueueKeys, unique_name: str
) -> None:
    """Without TYPE a script used to fail inside its preflight with an error that, on Redis
    7.0, names no command; now the preflight names TYPE."""
    async with acl_user(client, server_url, unique_name, (*EVERYTHING, "-type")) as c:
        with pytest.raises(PermissionDenied) as caught:
            await ENQUEUE(
                c, (keys.ready, keys.dedup("a"), keys.control, keys.scheduled), (60_000, "f", "v")
            )
    assert caught.value.code == "RESPIRE_NOPERM"
    assert caught.value.command == "type"
    assert await key_dump(client, f"*{unique_name}*") == {}


async def test_a_command_refused_inside_a_script_is_permission_denied(
    client: RedisClient, server_url: str, unique_name: str
) -> None:
    info = await client.server_info()
    rules = (f"~{unique_name}:*", "+eval", "+get", "+command|info")
    async with acl_user(client, server_url, unique_name, rules) as c:
        with pytest.raises(PermissionDenied) as caught:
            await c.execute("EVAL", "return redis.call('SET', KEYS[1], 'v')", 1, f"{unique_name}:a")
        # Valkey names the command; Redis 7.0's text names none
        assert caught.value.command == ("set" if info.flavor == "valkey" else "")
        with pytest.raises(PermissionDenied):  # a key outside the user's patterns
            await c.execute("EVAL", "return redis.call('GET', KEYS[1])", 1, f"x{unique_name}")
        with pytest.raises(PermissionDenied) as direct:
            await c.execute("SET", f"{unique_name}:a", "v")
        assert (direct.value.code, direct.value.command) == ("NOPERM", "set")
    assert await client.execute("EXISTS", f"{unique_name}:a") == 0


@pytest.mark.parametrize(
    ("text", "command"),
    [
        ("NOPERM this user has no permissions to run the 'info' command", "info"),
        ("NOPERM User u has no permissions to run the 'xgroup|create' command", "xgroup|create"),
        ("NOPERM this user has no permissions to access one of the keys used as arguments", ""),
        ("RESPIRE_NOPERM the ACL user may not run PEXPIRETIME on {q}:logs", "pexpiretime"),
        (
            "ERR The user executing the script can't run this command or subcommand script: "
            "219bb33e, on @user_script:1.",
            "",
        ),
        (
            "ERR The user executing the script can't access at least one of the keys "
            "mentioned in the command arguments script: 3b0b, on @user_script:1.",
            "",
        ),
        (
            "ERR ACL failure in script: User u has no permissions to run the 'set' command "
            "script: on @user_script:1.",
            "set",
        ),
        ("ERR ACL failure in script: No permissions to access a key script: on @x:1.", ""),
        ("ERR NOPERM User u has no permissions to run the 'zadd' command script: x", "zadd"),
    ],
)
def test_permission_errors_are_mapped_with_the_command(text: str, command: str) -> None:
    error = _map_reply(text)
    assert isinstance(error, PermissionDenied)
    assert error.command == command
    assert str(error) == text  # the server's own text


def test_other_script_errors_stay_server_errors() -> None:
    error = _map_reply("ERR user_script:1: Script attempted to access nonexistent global")
    assert type(error) is ServerError


SELECT = load("job_select")
WORKER_READS = ["time", "xpending", "xrange", "xreadgroup", "xrevrange", "exists", "get", "hget",
                "hexists", "zrangebylex", "zlexcount", "zrange", "zrangebyscore"]  # fmt: skip


@pytest.mark.parametrize("command", WORKER_READS)
async def test_select_checks_its_reads_before_delivering_anything(
    client: RedisClient, server_url: str, keys: JobQueueKeys, unique_name: str, command: str
) -> None:
    """Found by review: job_select delivered a plain job (XREADGROUP) and a grouped one
    (append, read, lease), then failed on a read its preflight never checked (GET of the
    rotation cursor, ZRANGE of the parked groups...): the jobs stayed delivered to a consumer
    that never ran them, until visibility recovery met the same failure."""
    from respire_actors.codecs import StrCodec
    from respire_actors.jobs import JobEnqueueOptions, JobQueue

    queue = JobQueue(client, unique_name, StrCodec())
    await client.execute("XGROUP", "CREATE", keys.ready, CONSUMER_GROUP, "0", "MKSTREAM")
    await queue.set_group_options("tenant", max_concurrency=2)
    await queue.enqueue_scheduled("g1", "x", JobEnqueueOptions(group="tenant"))
    await queue.enqueue("plain", "x")
    before = await key_dump(client, f"*{unique_name}*")
    select_keys = (keys.ready, keys.control, keys.scheduled, keys.group_order, keys.group_jobs,
                   keys.group_cursor, keys.group_policy, keys.group_owners, keys.group_leases,
                   keys.group_parked)  # fmt: skip
    args = (CONSUMER_GROUP, "c1", 10, "ack", 0, 8, 64)
    async with acl_user(client, server_url, unique_name, (*EVERYTHING, f"-{command}")) as c:
        with pytest.raises(PermissionDenied) as caught:
            await SELECT(c, select_keys, args)
    assert caught.value.command == command
    assert await key_dump(client, f"*{unique_name}*") == before  # nothing delivered
    reply = await SELECT(client, select_keys, args)
    assert [e[0] for e in reply[1]] and len(reply[1]) == 2  # with every permission: both
