"""Contracts of the rq_* and topic_* Lua scripts: headers, loading, preflight before writes."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest
from helpers.acl import acl_denials, acl_user
from reliable_helpers import pending_count, text

from respire_actors.codecs import StrCodec
from respire_actors.errors import PermissionDenied, ScriptError, WrongKeyType
from respire_actors.redis.client import RedisClient, connect
from respire_actors.redis.scripts import Script, all_scripts, load
from respire_actors.reliable import ReliableQueue, ReliableTopic

pytestmark = pytest.mark.anyio

OURS = (
    "rq_send",
    "rq_receive",
    "rq_ack",
    "rq_nack",
    "topic_subscribe",
    "topic_unsubscribe",
    "topic_trim",
)


def our_scripts() -> list[Script]:
    return [s for s in all_scripts() if s.name.startswith(("rq_", "topic_"))]


def test_every_script_is_shipped_with_a_header_naming_each_key() -> None:
    scripts = our_scripts()
    assert sorted(s.name for s in scripts) == sorted(OURS)
    for script in scripts:
        header = script.source.split("--!include", 1)[0]
        assert header.startswith(f"-- {script.name}:"), script.name
        named = sorted(int(n) for n in re.findall(r"^-- KEYS\[(\d+)\]", header, re.MULTILINE))
        assert named == list(range(1, script.numkeys + 1)), script.name
        assert "ARGV[1]" in header and "Returns" in header and "Errors" in header, script.name


async def test_every_script_loads_on_the_server(client: RedisClient) -> None:
    for script in our_scripts():
        sha = await client.execute("SCRIPT", "LOAD", script.source)
        assert text(sha) == script.sha, script.name


async def test_wrong_key_type_is_refused_before_any_write(
    client: RedisClient, unique_name: str
) -> None:
    queue = ReliableQueue(client, unique_name, StrCodec())
    await queue.send("x")
    await client.execute("SET", queue.keys.deadlines, "not a zset")

    with pytest.raises(WrongKeyType) as caught:
        await queue.receive(30)

    assert caught.value.code == "RESPIRE_WRONGTYPE"
    assert await client.execute("EXISTS", queue.keys.receipts) == 0
    reply = await client.execute("XINFO", "STREAM", queue.stream_key)
    groups = reply[b"groups"] if isinstance(reply, dict) else reply[reply.index(b"groups") + 1]
    assert int(groups) == 0  # not even the group was created


async def test_bad_script_arguments_are_refused(client: RedisClient, unique_name: str) -> None:
    queue = ReliableQueue(client, unique_name, StrCodec())
    keys = [queue.stream_key, queue.keys.deadlines, queue.keys.receipts, queue.keys.dead]
    with pytest.raises(ScriptError, match="RESPIRE_ARGUMENT"):
        await load("rq_receive")(client, keys, ["respire", "c", 0, 1000, 5, "queue"])
    with pytest.raises(ScriptError, match="RESPIRE_ARGUMENT"):
        await load("rq_ack")(client, keys[:3], ["respire", "queue", "1-0", "1", "-"])
    with pytest.raises(ScriptError, match="RESPIRE_ARGUMENT"):
        await load("rq_nack")(client, keys[:3], ["-1", "1-0", "1", "5"])
    assert await client.execute("EXISTS", *keys) == 0


@pytest.fixture
async def limited_user(
    client: RedisClient, server_url: str, unique_name: str
) -> AsyncIterator[tuple[str, str]]:
    """An ACL user that may do everything except ZADD; yields (url, user)."""
    user = f"{unique_name}-user"
    await client.execute(
        "ACL", "SETUSER", user, "on", f">{unique_name}", "~*", "&*", "+@all", "-zadd", "-command"
    )
    parts = urlsplit(server_url)
    url = urlunsplit(parts._replace(netloc=f"{user}:{unique_name}@{parts.hostname}:{parts.port}"))
    try:
        yield url, user
    finally:
        await client.execute("ACL", "DELUSER", user)


async def test_missing_permission_is_refused_before_any_write(
    client: RedisClient, unique_name: str, limited_user: tuple[str, str]
) -> None:
    url, _user = limited_user
    queue = ReliableQueue(client, unique_name, StrCodec())
    await queue.send("x")
    (leased,) = await queue.receive(30)
    await queue.nack(leased, 0)
    async with connect(url) as restricted:
        info = await restricted.server_info()
        assert "xackdel" not in info.commands  # discovery was denied (COMMAND is not allowed)
        limited = ReliableQueue(restricted, unique_name, StrCodec())
        await limited.send("y")  # XADD is allowed
        with pytest.raises(PermissionDenied) as caught:
            await limited.receive(30, max=10)  # would need ZADD for the leases

    assert caught.value.code == "RESPIRE_NOPERM"
    assert text(await client.execute("HGET", queue.keys.receipts, leased.id)) == "1:-"
    assert await pending_count(client, queue.stream_key, "respire") == 1  # "y" not delivered


async def test_denied_discovery_still_completes_with_xack_and_xdel(
    client: RedisClient, unique_name: str, limited_user: tuple[str, str]
) -> None:
    url, user = limited_user
    await client.execute("ACL", "SETUSER", user, "+zadd")  # only COMMAND is denied now
    async with connect(url) as restricted:
        queue = ReliableQueue(restricted, unique_name, StrCodec())
        await queue.send("x")
        (message,) = await queue.receive(30)
        assert await queue.ack(message) is True
    assert await client.execute("XLEN", queue.stream_key) == 0
    assert await pending_count(client, queue.stream_key, "respire") == 0


async def test_topic_scripts_preflight_types(client: RedisClient, unique_name: str) -> None:
    topic = ReliableTopic(client, unique_name, StrCodec())
    await client.execute("SET", topic.stream_key, "oops")
    with pytest.raises(WrongKeyType):
        await topic.create_subscription("s", start="tail")
    with pytest.raises(WrongKeyType):
        await topic.trim(max_length=0)
    with pytest.raises(WrongKeyType):
        await topic.publish("x", dedup_id="d")
    assert await client.execute("EXISTS", topic.keys.dedup("d")) == 0
    assert text(await client.execute("GET", topic.stream_key)) == "oops"


def documented_recipe() -> list[str]:
    """The rules of the ACL SETUSER example in docs/reliable-queue.md."""
    docs = Path(__file__).resolve().parents[3] / "docs" / "reliable-queue.md"
    lines = docs.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("ACL SETUSER orders-app"))
    block: list[str] = []
    for line in lines[start:]:
        if line.startswith("```"):
            break
        block.extend(line.split())
    _, _, _user, on, password, *rules = block
    assert (on, password) == ("on", ">secret")
    return rules


async def test_the_documented_recipe_runs_the_whole_path_with_nothing_denied(
    client: RedisClient, server_url: str, unique_name: str
) -> None:
    """Found by review: the docs asked for INFO (never sent any more) and left out COMMAND
    INFO, so every connection of a user set up by the recipe left a denial in the ACL log."""
    rules = [
        rule.replace("~{respire-queue:*}*", f"~{{respire-queue:{unique_name}}}*")
        for rule in documented_recipe()
    ]
    user = f"rq-{unique_name}"
    async with acl_user(client, server_url, user, rules) as restricted:
        queue = ReliableQueue(restricted, unique_name, StrCodec(), delivery_limit=2)
        await queue.send("a", dedup_id="a")
        await queue.send_many(["b", "c"])
        received = await queue.receive(30, max=3)
        assert len(received) == 3
        assert await queue.ack(received[0]) is True
        assert await queue.ack_many([received[1]]) == [True]
        assert await queue.nack(received[2]) is True
        (again,) = await queue.receive(30)
        assert await queue.nack(again) is True  # its second delivery: the limit
        assert await queue.receive(30) == []  # ... so it went to the dead letters
        assert len(await queue.dead_letters()) == 1
        assert (await queue.inspect()).dead_letters == 1
    assert await acl_denials(client, user) == []
