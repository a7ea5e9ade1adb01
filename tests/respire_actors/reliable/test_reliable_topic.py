"""Reliable topic: independent subscriptions, lifecycle, and retention that keeps what is needed."""

from __future__ import annotations

from datetime import timedelta

import anyio
import pytest
from reliable_helpers import entry_ids, pending_count, wait_for_server_time

from respire_actors.codecs import StrCodec
from respire_actors.redis.client import RedisClient
from respire_actors.reliable import ReliableTopic, SubscriptionNotFound

pytestmark = pytest.mark.anyio

LONG = 30.0
SHORT = 0.2


@pytest.fixture
def topic(client: RedisClient, unique_name: str) -> ReliableTopic[str]:
    return ReliableTopic(client, unique_name, StrCodec())


async def drain(sub: object, *, ack: bool = True) -> list[str]:
    from respire_actors.reliable import Subscription

    assert isinstance(sub, Subscription)
    payloads: list[str] = []
    while batch := await sub.receive(LONG, max=100):
        payloads.extend(m.payload for m in batch)
        if ack:
            assert all(await sub.ack_many(batch))
    return payloads


async def test_every_subscription_receives_every_publication(topic: ReliableTopic[str]) -> None:
    for name in ("billing", "audit", "search"):
        assert await topic.create_subscription(name, start="tail") is True
    assert await topic.create_subscription("billing", start="beginning") is False
    ids = await topic.publish_many([f"e{i}" for i in range(5)])
    ids.append(await topic.publish("e5"))

    results = {}
    for name in ("billing", "audit", "search"):
        results[name] = await drain(topic.subscription(name))

    expected = [f"e{i}" for i in range(6)]
    assert results == {"billing": expected, "audit": expected, "search": expected}
    assert await entry_ids(topic.client, topic.stream_key) == ids  # acks never delete
    infos = await topic.subscriptions()
    assert [(i.name, i.pending, i.last_delivered_id) for i in infos] == [
        ("audit", 0, ids[-1]),
        ("billing", 0, ids[-1]),
        ("search", 0, ids[-1]),
    ]


async def test_a_slow_subscription_does_not_hold_up_another(topic: ReliableTopic[str]) -> None:
    await topic.create_subscription("fast", start="tail")
    await topic.create_subscription("slow", start="tail")
    fast, slow = topic.subscription("fast"), topic.subscription("slow")
    await topic.publish("one")
    (held,) = await slow.receive(LONG)  # slow keeps its lease and never acks

    assert await drain(fast) == ["one"]
    await topic.publish("two")
    assert await drain(fast) == ["two"]
    (nxt,) = await slow.receive(LONG)
    assert (held.payload, nxt.payload) == ("one", "two")
    assert await pending_count(topic.client, topic.stream_key, "slow") == 2
    assert await pending_count(topic.client, topic.stream_key, "fast") == 0


async def test_dead_letters_of_one_subscription_do_not_affect_another(
    client: RedisClient, topic: ReliableTopic[str]
) -> None:
    await topic.create_subscription("picky", start="tail")
    await topic.create_subscription("easy", start="tail")
    picky = topic.subscription("picky", delivery_limit=1)
    easy = topic.subscription("easy")
    source = await topic.publish("hard to digest")

    (first,) = await picky.receive(LONG)
    assert await picky.nack(first, 0)
    assert await picky.receive(LONG) == []  # moved to picky's dead letters

    (letter,) = await picky.dead_letters()
    assert (letter.source_id, letter.delivery_count, letter.payload) == (
        source,
        1,
        b"hard to digest",
    )
    assert await easy.dead_letters() == []
    (ok,) = await easy.receive(LONG)
    assert (ok.id, ok.delivery_count) == (source, 1)
    assert await easy.ack(ok)
    assert await entry_ids(client, topic.stream_key) == [source]  # still retained
    assert picky.dead_letter_stream_key != easy.dead_letter_stream_key


async def test_subscription_contract_matches_the_queue(
    client: RedisClient, topic: ReliableTopic[str]
) -> None:
    await topic.create_subscription("s", start="tail")
    sub = topic.subscription("s")
    await topic.publish("m")
    (short,) = await sub.receive(SHORT)
    await wait_for_server_time(client, short.lease_deadline_ms)
    (again,) = await sub.receive(LONG)

    assert again.delivery_count == 2
    assert await sub.ack(short) is False  # stale
    assert await sub.nack(again, 0.6) is True
    assert await sub.receive(LONG) == []
    due = int(
        float(await client.execute("ZSCORE", topic.keys.subscription("s", "deadlines"), again.id))
    )
    await wait_for_server_time(client, due)
    (third,) = await sub.receive(LONG)
    assert third.delivery_count == 3
    assert await sub.ack(third) is True


async def test_new_subscription_starts_at_beginning_or_tail(topic: ReliableTopic[str]) -> None:
    await topic.publish_many(["old1", "old2"])
    await topic.create_subscription("from-start", start="beginning")
    await topic.create_subscription("from-now", start="tail")
    await topic.publish("new")

    assert await drain(topic.subscription("from-start")) == ["old1", "old2", "new"]
    assert await drain(topic.subscription("from-now")) == ["new"]


async def test_removed_subscription_stops_and_can_be_recreated(
    client: RedisClient, topic: ReliableTopic[str]
) -> None:
    await topic.create_subscription("s", start="tail")
    sub = topic.subscription("s")
    await topic.publish("a")
    (leased,) = await sub.receive(LONG)

    assert await topic.remove_subscription("s") is True
    assert await topic.remove_subscription("s") is False
    assert await sub.ack(leased) is False  # receipts went with it
    with pytest.raises(SubscriptionNotFound):
        await sub.receive(LONG)
    with pytest.raises(SubscriptionNotFound):
        await topic.subscription("never-created").receive(LONG)
    assert await topic.subscriptions() == []

    assert await topic.create_subscription("s", start="beginning") is True
    (fresh,) = await sub.receive(LONG)
    assert (fresh.id, fresh.delivery_count) == (leased.id, 1)


async def test_trim_never_removes_a_publication_a_subscription_needs(
    client: RedisClient, topic: ReliableTopic[str]
) -> None:
    await topic.create_subscription("a", start="tail")
    await topic.create_subscription("b", start="tail")
    await topic.create_subscription("c", start="tail")
    ids = await topic.publish_many([f"p{i}" for i in range(10)])
    a, b, c = topic.subscription("a"), topic.subscription("b"), topic.subscription("c")

    # a: acks p0..p3, keeps a lease on p4, NACKs p5 with a long delay, never reads the rest
    batch = await a.receive(LONG, max=6)
    assert await a.ack_many(batch[:4]) == [True] * 4
    assert await a.nack(batch[5], 60)
    # b: has read and acked everything up to p6; p7.. not yet delivered
    assert await b.ack_many(await b.receive(LONG, max=7)) == [True] * 7
    # c: everything read and acked
    await drain(c)

    result = await topic.trim(max_length=0)  # the policy alone would remove everything

    assert result.cutoff == ids[4]  # a's lowest pending entry
    assert result.policy_cutoff is not None
    assert result.removed == 4
    assert result.held_by == ("a", "b")
    assert await entry_ids(client, topic.stream_key) == ids[4:]
    # every subscription still gets everything it has not completed
    b_rest = await b.receive(LONG, max=10)
    assert [m.payload for m in b_rest] == ["p7", "p8", "p9"]
    rest = await a.receive(LONG, max=10)
    assert [m.payload for m in rest] == ["p6", "p7", "p8", "p9"]
    assert await a.ack(batch[4]) is True  # the leased p4 is still completable

    # only a's delayed p5 is still needed: everything below it goes, nothing from it on
    assert await a.nack(batch[5], 0) is False  # its receipt was revoked by the first NACK
    assert await a.ack_many(rest) == [True] * 4
    assert await b.ack_many(b_rest) == [True] * 3
    final = await topic.trim(max_length=0)
    assert (final.cutoff, final.held_by, final.removed) == (ids[5], ("a",), 1)
    assert await entry_ids(client, topic.stream_key) == ids[5:]


async def test_trim_protects_the_start_of_a_new_subscription(
    client: RedisClient, topic: ReliableTopic[str]
) -> None:
    ids = await topic.publish_many(["x", "y", "z"])
    await topic.create_subscription("late", start="beginning")

    result = await topic.trim(max_length=1)

    assert (result.removed, result.held_by, result.cutoff) == (0, ("late",), ids[0])
    assert await drain(topic.subscription("late")) == ["x", "y", "z"]
    assert (await topic.trim(max_length=1)).removed == 2
    assert await entry_ids(client, topic.stream_key) == ids[2:]


@pytest.mark.parametrize("keep", [1500, 1499, 1501, 2499, 1250, 1249, 1, 0])
async def test_a_length_trim_across_pages_keeps_exactly_the_newest(
    client: RedisClient, topic: ReliableTopic[str], keep: int
) -> None:
    """The length cutoff is found from the nearer end: newest first when the limit is the
    smaller count, else from the oldest a page (1,000 entries) at a time (it used to read
    every entry kept, newest first, into one script call: seconds on a long topic with a
    large limit, even with nothing to remove)."""
    ids: list[str] = []
    for start in range(0, 2500, 500):
        ids += await topic.publish_many([str(i) for i in range(start, start + 500)])
    result = await topic.trim(max_length=keep)
    assert result.removed == 2500 - keep and result.held_by == ()
    assert await client.execute("XLEN", topic.stream_key) == keep
    if keep:
        assert (await entry_ids(client, topic.stream_key))[0] == ids[-keep]
    assert (await topic.trim(max_length=keep)).removed == 0


async def test_a_length_trim_held_by_a_subscription_stops_at_its_boundary(
    client: RedisClient, topic: ReliableTopic[str]
) -> None:
    await topic.create_subscription("s", start="tail")
    ids: list[str] = []
    for start in range(0, 3000, 500):
        ids += await topic.publish_many([str(i) for i in range(start, start + 500)])
    sub = topic.subscription("s")
    batch = await sub.receive(LONG, max=20)
    assert await sub.ack_many(batch[:10]) == [True] * 10  # the 11th is leased
    result = await topic.trim(max_length=100)
    assert (result.removed, result.cutoff, result.held_by) == (10, ids[10], ("s",))
    assert await entry_ids(client, topic.stream_key) == ids[10:]
    # a large limit, counted from the oldest end: the walk stops past the boundary
    assert await sub.ack_many(batch[10:15]) == [True] * 5
    held = await topic.trim(max_length=2000)
    assert (held.removed, held.cutoff, held.held_by) == (5, ids[15], ("s",))


async def test_trim_by_age_and_min_id(client: RedisClient, topic: ReliableTopic[str]) -> None:
    ids = await topic.publish_many(["a", "b"])
    await topic.create_subscription("s", start="tail")
    newer = await topic.publish("c")

    assert (await topic.trim(max_age=3600)).removed == 0  # everything is recent
    # retention ages beyond 2**31-1 ms (about 24.8 days) are ordinary: keep a month, a year
    assert (await topic.trim(max_age=timedelta(days=31))).removed == 0
    assert (await topic.trim(max_age=365 * 86400, min_id="0-1")).removed == 0
    result = await topic.trim(min_id=ids[1])
    assert result.removed == 1 and result.held_by == ()
    await wait_for_server_time(client, int(newer.split("-")[0]) + 5)
    aged = await topic.trim(max_age=0.001)  # "c" is pending delivery to s: it must stay
    assert aged.held_by == ("s",)
    assert await entry_ids(client, topic.stream_key) == [newer]
    assert await drain(topic.subscription("s")) == ["c"]


async def test_trim_of_a_missing_topic_and_concurrent_trims(topic: ReliableTopic[str]) -> None:
    empty = await topic.trim(max_length=0)
    assert (empty.removed, empty.cutoff) == (0, None)
    await topic.create_subscription("s", start="tail")
    await topic.publish_many([str(i) for i in range(20)])
    sub = topic.subscription("s")
    got: list[str] = []

    async def consume() -> None:
        while batch := await sub.receive(LONG, max=3):
            got.extend(m.payload for m in batch)
            await sub.ack_many(batch)

    async def trimmer() -> None:
        for _ in range(10):
            await topic.trim(max_length=0)
            await anyio.lowlevel.checkpoint()

    async with anyio.create_task_group() as tg:
        tg.start_soon(consume)
        tg.start_soon(trimmer)

    assert got == [str(i) for i in range(20)]
