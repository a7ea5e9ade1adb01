"""The completion scripts' shared coordination hooks that do not need a flow or a batch: the
'cancelled' kind, refusing unknown kinds before any write, the flow-result arguments of
job_finish, and ordinary jobs completing unchanged on a queue that has the coordination marker."""

from __future__ import annotations

from typing import Any

import pytest
from test_job_scripts import GROUP, complete, delivered, pairs, pending, s, xlen

from respire_actors.errors import ScriptError
from respire_actors.keys import JobQueueKeys
from respire_actors.redis.client import RedisClient
from respire_actors.redis.scripts import load

pytestmark = pytest.mark.anyio

FINISH = load("job_finish")


@pytest.fixture
def keys(unique_name: str) -> JobQueueKeys:
    return JobQueueKeys(unique_name)


async def finish(client: RedisClient, keys: JobQueueKeys, entry: str, *tail: Any) -> Any:
    return await FINISH(
        client,
        (keys.ready, keys.events, keys.dead, keys.result("a"), *keys.lease_keys),
        (GROUP, "c1", entry, 1, "ack", "", "a", "", 0, "", "", "ack", *tail),
    )


async def test_cancelled_acknowledges_with_a_cancelled_event(
    client: RedisClient, keys: JobQueueKeys
) -> None:
    (a,) = await delivered(client, keys, "a")
    assert await complete(client, keys, "c1", (a, 1, "cancelled", "", "a")) == [1]
    assert await pending(client, keys) == []
    (event,) = await client.execute("XRANGE", keys.events, "-", "+")
    fields = pairs(event[1])
    assert fields["kind"] == b"cancelled" and fields["job_id"] == b"a"
    assert "batch" not in fields and "flow" not in fields
    assert await client.execute("EXISTS", keys.dead) == 0


async def test_an_unknown_kind_is_refused_before_any_write(
    client: RedisClient, keys: JobQueueKeys
) -> None:
    a, b = await delivered(client, keys, "a", "b")
    with pytest.raises(ScriptError, match="unknown outcome kind"):
        await complete(client, keys, "c1", (a, 1, "ack", "", "a"), (b, 1, "skipped", "", "b"))
    assert [p[0] for p in await pending(client, keys)] == [a, b]  # not even the first
    assert await client.execute("EXISTS", keys.events) == 0


@pytest.mark.parametrize(
    "tail",
    [("2", ""), ("0", "x"), ("1", "x" * 4097), ("1",)],
    ids=["bad-flag", "result-without-flag", "oversize", "missing-result"],
)
async def test_finish_refuses_malformed_flow_results(
    client: RedisClient, keys: JobQueueKeys, tail: tuple[str, ...]
) -> None:
    (a,) = await delivered(client, keys, "a")
    with pytest.raises(ScriptError, match="RESPIRE_ARGUMENT"):
        await finish(client, keys, a, *tail)
    assert [p[0] for p in await pending(client, keys)] == [a]
    assert await client.execute("EXISTS", keys.events) == 0


async def test_ordinary_jobs_complete_unchanged_on_a_coordinated_queue(
    client: RedisClient, keys: JobQueueKeys
) -> None:
    a, b, c = await delivered(client, keys, "a", "b", "c")
    await client.execute("SET", keys.coordinated, "1")
    assert await complete(
        client, keys, "c1", (a, 1, "ack", "", "a"), (b, 1, "dead", "nack", "b")
    ) == [
        1,
        1,
    ]
    assert await finish(client, keys, c, "1", b"") == 1  # a result outside a flow: a success
    assert await pending(client, keys) == []
    kinds = [pairs(e[1])["kind"] for e in await client.execute("XRANGE", keys.events, "-", "+")]
    assert kinds == [b"completed", b"dead-letter", b"completed"]
    assert await xlen(client, keys.dead) == 1
    assert s(await client.execute("TYPE", keys.coordinated)) == "string"


async def test_flow_and_batch_keys_match_the_lua_derivation(
    client: RedisClient, keys: JobQueueKeys
) -> None:
    derived = await client.execute(
        "EVAL",
        "local b = string.sub(KEYS[1], 1, #KEYS[1] - 6) "
        "return {b .. ':flow:' .. redis.sha1hex(ARGV[1]), "
        "b .. ':batch:' .. redis.sha1hex(ARGV[1])}",
        1,
        keys.ready,
        "rapport é/42",
    )
    assert [s(k) for k in derived] == [keys.flow("rapport é/42"), keys.batch("rapport é/42")]
