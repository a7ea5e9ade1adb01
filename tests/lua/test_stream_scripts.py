"""Contracts of the stream worker's Lua scripts, called directly on real servers.

``stream_read`` admits never-delivered entries; ``stream_claim_pending`` replays / recovers
pending entries and dead-letters those past the limit; ``stream_complete`` commits fenced
outcomes. Arguments are validated and keys preflighted before the first write.
"""

from __future__ import annotations

from typing import Any

import pytest

from respire_actors.errors import ScriptError, ServerError, WrongKeyType
from respire_actors.redis.client import RedisClient
from respire_actors.redis.scripts import load

pytestmark = pytest.mark.anyio

READ = load("stream_read")
CLAIM = load("stream_claim_pending")
COMPLETE = load("stream_complete")
GROUP = "g"


def s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def pairs(flat: Any) -> dict[str, bytes]:
    items = flat.items() if isinstance(flat, dict) else zip(flat[0::2], flat[1::2], strict=True)
    return {s(k): v for k, v in items}


@pytest.fixture
def stream(unique_name: str) -> str:
    return unique_name


@pytest.fixture
def dead(unique_name: str) -> str:
    return f"{unique_name}:dead"


async def setup(client: RedisClient, stream: str, count: int) -> list[str]:
    await client.execute("XGROUP", "CREATE", stream, GROUP, "0", "MKSTREAM")
    return [s(await client.execute("XADD", stream, "*", "n", str(i))) for i in range(count)]


async def read(client: RedisClient, stream: str, consumer: str, count: Any = 10) -> Any:
    return await READ(client, (stream,), (GROUP, consumer, count))


async def claim(
    client: RedisClient,
    stream: str,
    dead: str,
    consumer: str,
    mode: str = "recover",
    min_idle: Any = 0,
    cursor: str = "0-0",
    count: Any = 10,
    limit: Any = 0,
    *extra: Any,
) -> Any:
    return await CLAIM(
        client, (stream, dead), (GROUP, consumer, mode, min_idle, cursor, count, limit, *extra)
    )


async def complete(
    client: RedisClient, stream: str, dead: str, consumer: str, *outcomes: Any, delete: int = 0
) -> list[int]:
    args: list[Any] = [GROUP, consumer, delete, len(outcomes)]
    for outcome in outcomes:
        args += list(outcome)
    return [int(x) for x in await COMPLETE(client, (stream, dead), args)]


async def pending(client: RedisClient, stream: str) -> list[tuple[str, str, int]]:
    rows = await client.execute("XPENDING", stream, GROUP, "-", "+", 100)
    return [(s(r[0]), s(r[1]), int(r[3])) for r in rows]


async def xrange(client: RedisClient, key: str) -> list[tuple[str, dict[str, bytes]]]:
    return [(s(i), pairs(f)) for i, f in await client.execute("XRANGE", key, "-", "+") or []]


# -------------------------------------------------------------------------------------------
# stream_read


async def test_read_admits_new_entries_then_reports_the_last_id(
    client: RedisClient, stream: str
) -> None:
    ids = await setup(client, stream, 3)
    status, rows = await read(client, stream, "c", 2)
    assert s(status) == "ok"
    assert [(s(i), pairs(f)) for i, f in rows] == [(ids[0], {"n": b"0"}), (ids[1], {"n": b"1"})]
    assert await pending(client, stream) == [(ids[0], "c", 1), (ids[1], "c", 1)]
    assert [s(i) for i, _ in (await read(client, stream, "c", 5))[1]] == [ids[2]]
    assert [s(x) for x in await read(client, stream, "c")] == ["empty", ids[2]]


async def test_read_of_an_empty_stream_reports_zero(client: RedisClient, stream: str) -> None:
    await setup(client, stream, 0)
    assert [s(x) for x in await read(client, stream, "c")] == ["empty", "0-0"]


async def test_read_without_the_group_is_nogroup(client: RedisClient, stream: str) -> None:
    with pytest.raises(ServerError) as info:
        await read(client, stream, "c")
    assert info.value.code == "NOGROUP"


async def test_read_of_a_wrong_type_key_fails(client: RedisClient, stream: str) -> None:
    await client.execute("SET", stream, "x")
    with pytest.raises(WrongKeyType):
        await read(client, stream, "c")
    assert await client.execute("GET", stream) == b"x"


@pytest.mark.parametrize("count", [0, 1001, "x", -1])
async def test_read_count_is_validated(client: RedisClient, stream: str, count: Any) -> None:
    await setup(client, stream, 1)
    with pytest.raises(ScriptError, match="RESPIRE_ARGUMENT"):
        await read(client, stream, "c", count)
    assert await pending(client, stream) == []


# -------------------------------------------------------------------------------------------
# stream_claim_pending


async def test_recover_claims_idle_entries_and_dead_letters_past_the_limit(
    client: RedisClient, stream: str, dead: str
) -> None:
    ids = await setup(client, stream, 2)
    await read(client, stream, "crashed")
    await client.execute("XCLAIM", stream, GROUP, "crashed", 0, ids[1])  # ids[1]: count 2
    reply = await claim(client, stream, dead, "me", limit=2)
    assert s(reply[0]) == "ok" and s(reply[1]) == "0-0"
    assert [(s(i), pairs(f), int(d)) for i, f, d in reply[2]] == [(ids[0], {"n": b"0"}, 2)]
    assert (int(reply[3]), int(reply[4])) == (0, 1)
    assert await pending(client, stream) == [(ids[0], "me", 2)]
    ((_, fields),) = await xrange(client, dead)
    assert fields == {
        "n": b"1",
        "_respire.source_id": ids[1].encode(),
        "_respire.attempt": b"2",
        "_respire.reason": b"delivery-limit",
        "_respire.consumer": b"me",
    }


@pytest.mark.parametrize("delete", ["0", "1"])
async def test_recover_deletes_what_it_dead_letters_when_asked(
    client: RedisClient, stream: str, dead: str, delete: str
) -> None:
    ids = await setup(client, stream, 1)
    await read(client, stream, "crashed")
    reply = await claim(client, stream, dead, "me", "recover", 0, "0-0", 10, 1, delete)
    assert int(reply[4]) == 1
    assert await pending(client, stream) == []
    left = [i for i, _ in await xrange(client, stream)]
    assert left == ([] if delete == "1" else [ids[0]])


@pytest.mark.parametrize("delete", ["2", "yes", ""])
async def test_recover_refuses_a_bad_delete_flag(
    client: RedisClient, stream: str, dead: str, delete: str
) -> None:
    await setup(client, stream, 1)
    await read(client, stream, "crashed")
    with pytest.raises(ScriptError, match="RESPIRE_ARGUMENT"):
        await claim(client, stream, dead, "me", "recover", 0, "0-0", 10, 1, delete)
    assert [c for _, c, _ in await pending(client, stream)] == ["crashed"]


async def test_recover_respects_the_idle_time(client: RedisClient, stream: str, dead: str) -> None:
    await setup(client, stream, 1)
    await read(client, stream, "crashed")
    reply = await claim(client, stream, dead, "me", min_idle=60_000)
    assert list(reply[2]) == []
    assert [c for _, c, _ in await pending(client, stream)] == ["crashed"]


async def test_replay_reclaims_only_this_consumers_entries_page_by_page(
    client: RedisClient, stream: str, dead: str
) -> None:
    ids = await setup(client, stream, 3)
    await read(client, stream, "me", 2)
    await read(client, stream, "other", 1)
    first = await claim(client, stream, dead, "me", mode="replay", min_idle=60_000, count=1)
    assert [s(r[0]) for r in first[2]] == [ids[0]] and s(first[1]) == ids[0]
    second = await claim(
        client, stream, dead, "me", mode="replay", min_idle=60_000, cursor=ids[0], count=1
    )
    assert [(s(r[0]), int(r[2])) for r in second[2]] == [(ids[1], 2)]
    third = await claim(
        client, stream, dead, "me", mode="replay", min_idle=60_000, cursor=ids[1], count=1
    )
    assert list(third[2]) == [] and s(third[1]) == "0-0"
    assert await pending(client, stream) == [
        (ids[0], "me", 2),
        (ids[1], "me", 2),
        (ids[2], "other", 1),
    ]


async def test_claim_clears_references_to_deleted_entries(
    client: RedisClient, stream: str, dead: str
) -> None:
    ids = await setup(client, stream, 2)
    await read(client, stream, "crashed")
    await client.execute("XDEL", stream, ids[0])
    reply = await claim(client, stream, dead, "me")
    assert [s(r[0]) for r in reply[2]] == [ids[1]]
    assert int(reply[3]) == 1
    assert await pending(client, stream) == [(ids[1], "me", 2)]


@pytest.mark.parametrize("wrong", ["stream", "dead"])
async def test_claim_preflights_key_types_before_any_write(
    client: RedisClient, stream: str, dead: str, wrong: str
) -> None:
    if wrong == "stream":
        await client.execute("SET", stream, "x")
    else:
        await setup(client, stream, 1)
        await read(client, stream, "crashed")
        await client.execute("SET", dead, "x")
    with pytest.raises(WrongKeyType, match="RESPIRE_WRONGTYPE"):
        await claim(client, stream, dead, "me", limit=1)
    if wrong == "dead":  # nothing was claimed: still the crashed consumer's, count 1
        assert [(c, n) for _, c, n in await pending(client, stream)] == [("crashed", 1)]


async def test_a_dead_letter_key_in_a_bad_state_stops_only_what_writes_to_it(
    client: RedisClient, stream: str, dead: str
) -> None:
    """Found by review: with the dead-letter key overwritten by a string, every plain ack and
    every recovery page was refused, so all work done meanwhile ran again later. Now only a
    completion or page that dead-letters checks that key."""
    ids = await setup(client, stream, 3)
    await read(client, stream, "crashed", 2)
    await client.execute("SET", dead, "x")
    # recovery of entries below the limit goes on
    reply = await claim(client, stream, dead, "me", limit=5)
    assert [s(e[0]) for e in reply[2]] == ids[:2]
    # plain acks commit; a dead letter is refused before any write
    assert await complete(client, stream, dead, "me", (ids[0], 2, "ack", "")) == [1]
    with pytest.raises(WrongKeyType, match="RESPIRE_WRONGTYPE"):
        await complete(client, stream, dead, "me", (ids[1], 2, "dead", "nack"))
    assert [(i, c, n) for i, c, n in await pending(client, stream)] == [(ids[1], "me", 2)]
    # an entry at the limit needs the dead-letter stream: that page is refused unclaimed
    await client.execute("DEL", dead)
    await client.execute("SET", dead, "x")
    with pytest.raises(WrongKeyType, match="RESPIRE_WRONGTYPE"):
        await claim(client, stream, dead, "other", limit=2)
    assert [(i, c, n) for i, c, n in await pending(client, stream)] == [(ids[1], "me", 2)]


@pytest.mark.parametrize(
    "changes",
    [
        {"count": 0},
        {"count": 1001},
        {"count": "x"},
        {"limit": "x"},
        {"limit": -1},
        {"min_idle": "soon"},
        {"mode": "steal"},
    ],
)
async def test_claim_arguments_are_validated(
    client: RedisClient, stream: str, dead: str, changes: dict[str, Any]
) -> None:
    await setup(client, stream, 1)
    await read(client, stream, "crashed")
    with pytest.raises(ScriptError, match="RESPIRE_ARGUMENT"):
        await claim(client, stream, dead, "me", **changes)
    assert [(c, n) for _, c, n in await pending(client, stream)] == [("crashed", 1)]


# -------------------------------------------------------------------------------------------
# stream_complete


async def test_complete_acks_dead_letters_and_fences(
    client: RedisClient, stream: str, dead: str
) -> None:
    ids = await setup(client, stream, 3)
    await read(client, stream, "me")
    statuses = await complete(
        client,
        stream,
        dead,
        "me",
        (ids[0], 1, "ack", ""),
        (ids[1], 1, "dead", "poison"),
        (ids[2], 2, "ack", ""),  # wrong attempt: stale
    )
    assert statuses == [1, 1, 0]
    assert await pending(client, stream) == [(ids[2], "me", 1)]
    ((_, fields),) = await xrange(client, dead)
    assert fields == {
        "n": b"1",
        "_respire.source_id": ids[1].encode(),
        "_respire.attempt": b"1",
        "_respire.reason": b"poison",
        "_respire.consumer": b"me",
    }
    assert [i for i, _ in await xrange(client, stream)] == ids  # kept without delete
    # another consumer, and a repeat of a committed outcome, are stale
    assert await complete(client, stream, dead, "you", (ids[2], 1, "ack", "")) == [0]
    assert await complete(client, stream, dead, "me", (ids[0], 1, "ack", "")) == [0]
    assert len(await xrange(client, dead)) == 1


async def test_complete_with_delete_removes_the_entries(
    client: RedisClient, stream: str, dead: str
) -> None:
    ids = await setup(client, stream, 3)
    await read(client, stream, "me")
    assert await complete(
        client, stream, dead, "me", (ids[0], 1, "ack", ""), (ids[1], 1, "dead", "x"), delete=1
    ) == [1, 1]
    assert [i for i, _ in await xrange(client, stream)] == [ids[2]]
    assert len(await xrange(client, dead)) == 1


async def test_complete_dead_letters_a_deleted_entry_with_its_metadata(
    client: RedisClient, stream: str, dead: str
) -> None:
    (entry,) = await setup(client, stream, 1)
    await read(client, stream, "me")
    await client.execute("XDEL", stream, entry)
    assert await complete(client, stream, dead, "me", (entry, 1, "dead", "gone")) == [1]
    ((_, fields),) = await xrange(client, dead)
    assert fields["_respire.source_id"] == entry.encode()
    assert "n" not in fields


@pytest.mark.parametrize("wrong", ["stream", "dead"])
async def test_complete_preflights_key_types_before_any_write(
    client: RedisClient, stream: str, dead: str, wrong: str
) -> None:
    if wrong == "stream":
        await client.execute("SET", stream, "x")
        entry = "1-0"
    else:
        (entry,) = await setup(client, stream, 1)
        await read(client, stream, "me")
        await client.execute("SET", dead, "x")
    with pytest.raises(WrongKeyType, match="RESPIRE_WRONGTYPE"):
        await complete(client, stream, dead, "me", (entry, 1, "ack", ""), (entry, 1, "dead", "r"))
    if wrong == "dead":
        assert await pending(client, stream) == [(entry, "me", 1)]


@pytest.mark.parametrize(
    "args",
    [
        [GROUP, "me", 0, 0],  # no outcomes
        [GROUP, "me", 0, "x", "1-0", 1, "ack", ""],  # n not a number
        [GROUP, "me", 0, 2, "1-0", 1, "ack", ""],  # fewer outcomes than n
        [GROUP, "me", 0, 1, "1-0", 1, "ack"],  # a short outcome
        [GROUP, "me", 0, 1, "ID", 1, "ack", "", "extra"],  # trailing argument
    ],
)
async def test_complete_rejects_a_malformed_batch(
    client: RedisClient, stream: str, dead: str, args: list[Any]
) -> None:
    await setup(client, stream, 1)
    with pytest.raises(ScriptError, match="RESPIRE_ARGUMENT"):
        await COMPLETE(client, (stream, dead), args)


@pytest.mark.parametrize("bad", [("1", "nope"), ("x", "ack")], ids=["kind", "attempt"])
async def test_complete_rejects_a_bad_outcome_before_committing_any(
    client: RedisClient, stream: str, dead: str, bad: tuple[str, str]
) -> None:
    ids = await setup(client, stream, 2)
    await read(client, stream, "me")
    attempt, kind = bad
    with pytest.raises(ScriptError, match="RESPIRE_ARGUMENT"):
        await complete(
            client, stream, dead, "me", (ids[0], 1, "dead", "r"), (ids[1], attempt, kind, "")
        )
    assert await pending(client, stream) == [(ids[0], "me", 1), (ids[1], "me", 1)]
    assert await xrange(client, dead) == []
