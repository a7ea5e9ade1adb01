"""Contract of ``lease_renew``, called directly on real servers (Redis 7.0 and Valkey 9).

It renews, per delivery, only what is still pending for this consumer with this delivery count
(the fence), resetting the idle time with XCLAIM ... JUSTID, which keeps the delivery count; a
deleted body is reported and left pending; arguments and key types are checked before the
first write.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from respire_actors.errors import ScriptError, ServerError, WrongKeyType
from respire_actors.redis.client import RedisClient
from respire_actors.redis.scripts import load

pytestmark = pytest.mark.anyio

RENEW = load("lease_renew")
GROUP = "g"


def s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@pytest.fixture
def stream(unique_name: str) -> str:
    return unique_name


async def setup(client: RedisClient, stream: str, count: int, consumer: str = "me") -> list[str]:
    await client.execute("XGROUP", "CREATE", stream, GROUP, "0", "MKSTREAM")
    ids = [s(await client.execute("XADD", stream, "*", "n", str(i))) for i in range(count)]
    await client.execute(
        "XREADGROUP", "GROUP", GROUP, consumer, "COUNT", count, "STREAMS", stream, ">"
    )
    return ids


async def renew(client: RedisClient, stream: str, consumer: str, *items: Any) -> list[int]:
    args: list[Any] = [GROUP, consumer, len(items)]
    for entry_id, attempt in items:
        args += [entry_id, attempt]
    return [int(x) for x in await RENEW(client, (stream,), args)]


async def pending(client: RedisClient, stream: str) -> list[tuple[str, str, int, int]]:
    """(entry id, consumer, idle ms, delivery count)."""
    rows = await client.execute("XPENDING", stream, GROUP, "-", "+", 100)
    return [(s(r[0]), s(r[1]), int(r[2]), int(r[3])) for r in rows]


async def test_renewal_resets_idle_time_without_counting_a_delivery(
    client: RedisClient, stream: str
) -> None:
    ids = await setup(client, stream, 2)
    await anyio.sleep(0.3)
    assert await renew(client, stream, "me", (ids[0], 1)) == [1]
    rows = {r[0]: r for r in await pending(client, stream)}
    assert rows[ids[0]][1:2] == ("me",) and rows[ids[0]][3] == 1  # same owner, same count
    assert rows[ids[0]][2] < 200 <= rows[ids[1]][2]  # only the renewed one is fresh


async def test_renewal_is_fenced_by_consumer_and_delivery_count(
    client: RedisClient, stream: str
) -> None:
    ids = await setup(client, stream, 4)
    # ids[1]: recovered by another consumer; ids[2]: delivered again to me (count 2);
    # ids[3]: acknowledged
    await client.execute("XCLAIM", stream, GROUP, "other", 0, ids[1])
    await client.execute("XCLAIM", stream, GROUP, "me", 0, ids[2])
    await client.execute("XACK", stream, GROUP, ids[3])
    await anyio.sleep(0.3)
    statuses = await renew(client, stream, "me", *((i, 1) for i in ids))
    assert statuses == [1, 0, 0, 0]
    rows = {r[0]: r for r in await pending(client, stream)}
    assert rows[ids[1]][1] == "other" and rows[ids[1]][2] >= 200  # not touched, not taken back
    assert rows[ids[2]][3] == 2 and rows[ids[2]][2] >= 200
    assert ids[3] not in rows
    assert await renew(client, stream, "me", (ids[2], 2)) == [1]  # the current delivery renews


async def test_a_deleted_body_is_reported_and_left_pending(
    client: RedisClient, stream: str
) -> None:
    (entry,) = await setup(client, stream, 1)
    await client.execute("XDEL", stream, entry)
    assert await renew(client, stream, "me", (entry, 1)) == [2]
    # XCLAIM would have dropped it from the pending list; it stays for recovery to clear
    assert [r[:2] for r in await pending(client, stream)] == [(entry, "me")]


async def test_an_empty_batch_renews_nothing(client: RedisClient, stream: str) -> None:
    await setup(client, stream, 0)
    assert await renew(client, stream, "me") == []


async def test_without_the_group_it_is_nogroup(client: RedisClient, stream: str) -> None:
    await client.execute("XADD", stream, "*", "n", "1")
    with pytest.raises(ServerError) as info:
        await renew(client, stream, "me", ("1-1", 1))
    assert info.value.code == "NOGROUP"


async def test_a_wrong_type_key_fails(client: RedisClient, stream: str) -> None:
    await client.execute("SET", stream, "x")
    with pytest.raises(WrongKeyType):
        await renew(client, stream, "me", ("1-1", 1))


@pytest.mark.parametrize(
    "args",
    [
        [GROUP, "me"],
        [GROUP, "me", "x"],
        [GROUP, "me", -1],
        [GROUP, "me", 1001],
        [GROUP, "me", 2, "1-1", 1],
        [GROUP, "me", 1, "1-1", 1, "extra"],
    ],
)
async def test_a_malformed_batch_is_refused(
    client: RedisClient, stream: str, args: list[Any]
) -> None:
    await setup(client, stream, 1)
    with pytest.raises(ScriptError, match="RESPIRE_ARGUMENT"):
        await RENEW(client, (stream,), args)


@pytest.mark.parametrize(
    "bad", [("1-1", "x"), ("1-1", 0), ("1-1", 1.5), ("nope", 1), ("1", 1)], ids=str
)
async def test_a_bad_item_is_refused_before_renewing_any(
    client: RedisClient, stream: str, bad: tuple[str, Any]
) -> None:
    (entry,) = await setup(client, stream, 1)
    await anyio.sleep(0.3)
    with pytest.raises(ScriptError, match="RESPIRE_ARGUMENT"):
        await renew(client, stream, "me", (entry, 1), bad)
    assert (await pending(client, stream))[0][2] >= 200  # the good first item was not renewed
