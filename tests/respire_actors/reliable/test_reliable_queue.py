"""Reliable queue: delivery, receipts, visibility, nack, dead letters, deduplication."""

from __future__ import annotations

import itertools
from collections import Counter
from datetime import timedelta

import anyio
import pytest
from reliable_helpers import entry_ids, pending_count, text, wait_for_server_time

from respire_actors.codecs import BytesCodec, StrCodec
from respire_actors.redis.client import RedisClient, connect
from respire_actors.reliable import Message, MessageDecodeError, ReliableQueue

pytestmark = pytest.mark.anyio

LONG = 30.0  # a visibility that never expires during a test
SHORT = 0.2  # a visibility the test waits out (measured on the server clock)
# a visibility the test waits out, but only after asserting on the next lines that the message
# is still leased: long enough that a loaded machine cannot stall past it in between
MEDIUM = 0.6


@pytest.fixture
def queue(client: RedisClient, unique_name: str) -> ReliableQueue[str]:
    return ReliableQueue(client, unique_name, StrCodec())


async def test_send_receive_ack_removes_message_and_metadata(
    client: RedisClient, queue: ReliableQueue[str]
) -> None:
    first = await queue.send("hello")
    second = await queue.send("world")

    batch = await queue.receive(LONG, max=10)

    assert [(m.id, m.payload, m.delivery_count) for m in batch] == [
        (first, "hello", 1),
        (second, "world", 1),
    ]
    assert len({m.receipt for m in batch}) == 2
    now = await client.time_ms()
    assert all(now < m.lease_deadline_ms <= now + LONG * 1000 for m in batch)
    assert await queue.ack(batch[0]) is True
    assert await queue.ack(batch[0]) is False  # already completed
    assert await entry_ids(client, queue.stream_key) == [second]
    assert await client.execute("HEXISTS", queue.keys.receipts, first) == 0
    assert await client.execute("ZSCORE", queue.keys.deadlines, first) is None
    assert await pending_count(client, queue.stream_key, "respire") == 1
    state = await queue.inspect()
    assert (state.messages, state.in_flight, state.dead_letters) == (1, 1, 0)


async def test_receive_is_nonblocking_and_bounded_by_max(queue: ReliableQueue[str]) -> None:
    assert await queue.receive(LONG, max=5) == []  # empty queue, no stream yet: returns at once
    ids = await queue.send_many([f"m{i}" for i in range(7)])

    first = await queue.receive(LONG, max=5)
    second = await queue.receive(LONG, max=5)
    third = await queue.receive(LONG, max=5)

    assert [m.id for m in first + second] == ids
    assert (len(first), len(second), third) == (5, 2, [])


async def test_concurrent_receivers_never_share_a_message_within_its_window(
    server_url: str, unique_name: str, queue: ReliableQueue[str]
) -> None:
    ids = await queue.send_many([str(i) for i in range(200)])
    seen: list[str] = []

    async def receiver() -> None:
        async with connect(server_url) as own:
            mine = ReliableQueue(own, unique_name, StrCodec())
            while batch := await mine.receive(LONG, max=7):
                seen.extend(m.id for m in batch)
                await anyio.lowlevel.checkpoint()

    async with anyio.create_task_group() as tg:
        for _ in range(6):
            tg.start_soon(receiver)

    duplicates = [i for i, n in Counter(seen).items() if n > 1]
    assert duplicates == []
    assert sorted(seen) == sorted(ids)


async def test_receivers_may_use_different_visibility_durations(
    client: RedisClient, queue: ReliableQueue[str]
) -> None:
    await queue.send("short")
    await queue.send("long")

    (short,) = await queue.receive(MEDIUM, max=1)
    (long,) = await queue.receive(LONG, max=1)
    assert long.lease_deadline_ms - short.lease_deadline_ms > (LONG - 1) * 1000
    score = float(await client.execute("ZSCORE", queue.keys.deadlines, short.id))
    assert score == short.lease_deadline_ms

    assert await queue.receive(LONG, max=10) == []  # both leased
    await wait_for_server_time(client, short.lease_deadline_ms)
    again = await queue.receive(LONG, max=10)

    assert [(m.id, m.payload, m.delivery_count) for m in again] == [(short.id, "short", 2)]


async def test_nack_with_zero_delay_redelivers_immediately_and_revokes_receipt(
    queue: ReliableQueue[str],
) -> None:
    await queue.send("retry me")
    (first,) = await queue.receive(LONG)

    assert await queue.nack(first, 0) is True
    assert await queue.ack(first) is False  # revoked
    assert await queue.nack(first, 0) is False
    (second,) = await queue.receive(LONG)

    assert (second.id, second.delivery_count, second.payload) == (first.id, 2, "retry me")
    assert second.receipt != first.receipt
    assert await queue.ack(second) is True


async def test_nack_with_delay_hides_the_message_until_due(
    client: RedisClient, queue: ReliableQueue[str]
) -> None:
    await queue.send("later")
    (first,) = await queue.receive(LONG)
    before = await client.time_ms()

    assert await queue.nack(first, timedelta(milliseconds=600)) is True
    due = int(float(await client.execute("ZSCORE", queue.keys.deadlines, first.id)))
    assert before + 600 <= due <= before + 600 + 1000
    assert await queue.receive(LONG) == []

    await wait_for_server_time(client, due)
    (second,) = await queue.receive(LONG)
    assert (second.id, second.delivery_count) == (first.id, 2)


async def test_stale_receiver_cannot_complete_a_newer_delivery(
    client: RedisClient, queue: ReliableQueue[str]
) -> None:
    await queue.send("contested")
    (stale,) = await queue.receive(SHORT)
    await wait_for_server_time(client, stale.lease_deadline_ms)

    assert await queue.ack(stale) is False  # expired, not yet redelivered
    (fresh,) = await queue.receive(LONG)
    assert fresh.delivery_count == 2
    assert await queue.ack(stale) is False  # superseded
    assert await queue.nack(stale, 0) is False
    assert await queue.ack(fresh.receipt) is True  # a bare receipt string works too
    assert await entry_ids(client, queue.stream_key) == []


async def test_ack_and_nack_through_another_instance_sharing_the_queue(
    server_url: str, unique_name: str, queue: ReliableQueue[str]
) -> None:
    await queue.send("a")
    await queue.send("b")
    first, second = await queue.receive(LONG, max=2)

    async with connect(server_url) as other_client:
        other = ReliableQueue(other_client, unique_name, StrCodec())
        assert await other.ack(first) is True
        assert await other.nack(second.receipt, 0) is True
        (again,) = await other.receive(LONG)

    assert (again.id, again.delivery_count) == (second.id, 2)
    assert await queue.ack(again) is True


async def test_delivery_limit_moves_message_to_dead_letters_atomically(
    client: RedisClient, unique_name: str
) -> None:
    queue = ReliableQueue(client, unique_name, StrCodec(), delivery_limit=2)
    source = await queue.send("poison", dedup_id="poison-1")
    keep = await queue.send("fine")

    (d1,) = await queue.receive(LONG)
    assert await queue.nack(d1, 0)
    (d2,) = await queue.receive(LONG)
    assert (d2.id, d2.delivery_count) == (source, 2)
    assert await queue.nack(d2, 0)

    batch = await queue.receive(LONG, max=1)  # meets the due, exhausted message first

    # moving it does not use up the batch: the never-delivered message fills it
    assert [(m.payload, m.delivery_count) for m in batch] == [("fine", 1)]
    assert queue.statistics().dead_lettered == 1
    (letter,) = await queue.dead_letters()
    assert (letter.payload, letter.source_id, letter.delivery_count) == (b"poison", source, 2)
    assert await entry_ids(client, queue.stream_key) == [keep]
    assert await client.execute("HEXISTS", queue.keys.receipts, source) == 0
    assert await queue.ack(batch[0]) is True
    assert await client.execute("ZSCORE", queue.keys.deadlines, source) is None
    assert await pending_count(client, queue.stream_key, "respire") == 0
    assert await queue.ack(d2) is False
    # a duplicate send after dead-lettering returns the original id and appends nothing
    assert await queue.send("poison again", dedup_id="poison-1") == source
    assert await entry_ids(client, queue.stream_key) == []


async def test_expired_lease_at_the_limit_is_dead_lettered_by_next_receive(
    client: RedisClient, unique_name: str
) -> None:
    queue = ReliableQueue(client, unique_name, BytesCodec(), delivery_limit=1)
    source = await queue.send(b"\x00\xffbinary")
    (only,) = await queue.receive(SHORT)
    await wait_for_server_time(client, only.lease_deadline_ms)

    assert await queue.receive(LONG, max=5) == []

    (letter,) = await queue.dead_letters()
    assert (letter.payload, letter.source_id, letter.delivery_count) == (
        b"\x00\xffbinary",
        source,
        1,
    )
    assert (await queue.inspect()).messages == 0


async def test_due_entries_are_served_before_new_ones(
    client: RedisClient, queue: ReliableQueue[str]
) -> None:
    await queue.send("old")
    (old,) = await queue.receive(LONG)
    await queue.send_many(["new1", "new2"])
    await queue.nack(old, 0)

    batch = await queue.receive(LONG, max=2)

    assert [m.payload for m in batch] == ["old", "new1"]
    assert batch[0].delivery_count == 2


async def test_duplicate_sends_return_the_first_id_and_keep_the_first_payload(
    client: RedisClient, queue: ReliableQueue[str]
) -> None:
    original = await queue.send("first", dedup_id="order-42")

    results = []

    async def resend(i: int) -> None:
        results.append(await queue.send(f"dup {i}", dedup_id="order-42"))

    async with anyio.create_task_group() as tg:
        for i in range(20):
            tg.start_soon(resend, i)

    assert set(results) == {original}
    (message,) = await queue.receive(LONG, max=10)
    assert message.payload == "first"
    assert await queue.ack(message)
    assert await queue.send("after ack", dedup_id="order-42") == original
    assert await entry_ids(client, queue.stream_key) == []
    ttl = int(await client.execute("PTTL", queue.keys.dedup("order-42")))
    assert 0 < ttl <= 86_400_000


async def test_dedup_race_of_concurrent_first_sends_appends_exactly_one(
    server_url: str, client: RedisClient, unique_name: str
) -> None:
    results: list[str] = []

    async def sender(i: int) -> None:
        async with connect(server_url) as own:
            q = ReliableQueue(own, unique_name, StrCodec())
            results.append(await q.send(f"payload {i}", dedup_id="race"))

    async with anyio.create_task_group() as tg:
        for i in range(12):
            tg.start_soon(sender, i)

    assert len(results) == 12
    assert len(set(results)) == 1
    queue = ReliableQueue(client, unique_name, StrCodec())
    (message,) = await queue.receive(LONG, max=20)
    assert message.id == results[0]
    assert message.payload.startswith("payload ")
    stored = await client.execute("GET", queue.keys.dedup("race"))
    assert text(stored) == message.id


async def test_dedup_window_expiry_removes_only_the_dedup_record(
    client: RedisClient, unique_name: str
) -> None:
    queue = ReliableQueue(client, unique_name, StrCodec(), dedup_window=0.15)
    first = await queue.send("one", dedup_id="d")
    assert await queue.send("two", dedup_id="d") == first

    with anyio.fail_after(5):
        while int(await client.execute("EXISTS", queue.keys.dedup("d"))):  # noqa: ASYNC110
            await anyio.sleep(0.02)
    second = await queue.send("three", dedup_id="d")

    assert second != first
    assert await entry_ids(client, queue.stream_key) == [first, second]


async def test_decode_failure_leaves_the_whole_batch_leased(
    client: RedisClient, unique_name: str
) -> None:
    raw = ReliableQueue(client, unique_name, BytesCodec())
    typed = ReliableQueue(client, unique_name, StrCodec())
    good = await raw.send(b"fine")
    bad = await raw.send(b"\xff\xfe not utf-8")

    with pytest.raises(MessageDecodeError) as caught:
        await typed.receive(MEDIUM, max=10)

    assert caught.value.message_id == bad
    assert caught.value.batch_ids == (good, bad)
    assert await raw.receive(LONG, max=10) == []  # still leased
    deadline = int(float(await client.execute("ZSCORE", raw.keys.deadlines, bad)))
    await wait_for_server_time(client, deadline)
    again = await raw.receive(LONG, max=10)
    assert [(m.id, m.delivery_count) for m in again] == [(good, 2), (bad, 2)]


async def test_message_with_a_deleted_body_is_forgotten(
    client: RedisClient, queue: ReliableQueue[str]
) -> None:
    gone = await queue.send("deleted behind our back")
    (message,) = await queue.receive(SHORT)
    await client.execute("XDEL", queue.stream_key, gone)
    await wait_for_server_time(client, message.lease_deadline_ms)

    assert await queue.receive(LONG) == []
    assert await client.execute("ZCARD", queue.keys.deadlines) == 0
    assert await client.execute("HLEN", queue.keys.receipts) == 0
    assert await pending_count(client, queue.stream_key, "respire") == 0


async def test_key_prefix_is_honoured(server_url: str, unique_name: str) -> None:
    prefix = f"{unique_name}:"
    async with connect(server_url, key_prefix=prefix) as prefixed:
        queue = ReliableQueue(prefixed, "orders", StrCodec())
        try:
            assert queue.stream_key == f"{prefix}{{respire-queue:orders}}:stream"
            await queue.send("x", dedup_id="once")
            (message,) = await queue.receive(LONG)
            await queue.nack(message, 30)
            keys = sorted(text(k) for k in await prefixed.execute("KEYS", f"{prefix}*"))
            assert keys == sorted(
                [
                    queue.keys.stream,
                    queue.keys.deadlines,
                    queue.keys.receipts,
                    queue.keys.dedup("once"),
                ]
            )
            assert all(k.startswith(prefix + "{respire-queue:orders}") for k in keys)
        finally:
            await prefixed.execute(
                "DEL", *[k for k in await prefixed.execute("KEYS", f"{prefix}*")]
            )


async def test_message_payload_types_follow_the_codec(queue: ReliableQueue[str]) -> None:
    await queue.send("ünïcödé ✓")
    (message,) = await queue.receive(LONG)
    assert isinstance(message, Message)
    assert message.payload == "ünïcödé ✓"


async def test_recovery_work_per_receive_is_bounded(client: RedisClient, unique_name: str) -> None:
    queue = ReliableQueue(client, unique_name, StrCodec(), delivery_limit=1)
    await queue.send_many([f"p{i}" for i in range(5)])
    batch = await queue.receive(SHORT, max=5)
    await wait_for_server_time(client, batch[-1].lease_deadline_ms)

    assert await queue.receive(LONG, max=1) == []  # empty, yet it moved exhausted messages
    assert queue.statistics().dead_lettered == 2  # at most 2 * max due entries examined
    assert len(await queue.dead_letters()) == 2
    while await queue.receive(LONG, max=1) or queue.statistics().dead_lettered < 5:
        pass
    assert [d.payload for d in await queue.dead_letters()] == [f"p{i}".encode() for i in range(5)]


async def test_leases_of_one_message_never_overlap_under_concurrent_redelivery(
    server_url: str, unique_name: str, queue: ReliableQueue[str]
) -> None:
    """Receivers that let every first lease expire: on the server clock, each redelivery starts
    no earlier than the previous lease of that message ended. (An acknowledgement that comes
    after its short lease ended on a loaded machine is refused and the message delivered once
    more; every lease is checked, however many there were.)"""
    visibility_ms = 150
    ids = await queue.send_many([str(i) for i in range(12)])
    deliveries: list[tuple[str, int, int]] = []  # (id, count, lease deadline)
    acked: set[str] = set()

    async def receiver() -> None:
        async with connect(server_url) as own:
            mine = ReliableQueue(own, unique_name, StrCodec())
            with anyio.fail_after(20):
                while len(acked) < len(ids):
                    for m in await mine.receive(visibility_ms / 1000, max=3):
                        deliveries.append((m.id, m.delivery_count, m.lease_deadline_ms))
                        if m.delivery_count >= 2 and await mine.ack(m):
                            acked.add(m.id)
                    await anyio.sleep(0.01)

    async with anyio.create_task_group() as tg:
        for _ in range(4):
            tg.start_soon(receiver)

    for message_id in ids:
        leases = sorted((c, d) for i, c, d in deliveries if i == message_id)
        counts = [c for c, _ in leases]
        assert counts == list(range(1, len(leases) + 1)) and len(leases) >= 2, message_id
        for (_, earlier_end), (_, later_end) in itertools.pairwise(leases):
            assert later_end - visibility_ms >= earlier_end, message_id


async def test_a_deleted_group_neither_replays_acked_messages_nor_breaks_live_leases(
    client: RedisClient, queue: ReliableQueue[str]
) -> None:
    # Someone deletes the queue's private group (XGROUP DESTROY). The next receive recreates it
    # at 0: acknowledged messages are gone with their entries, and a message still leased keeps
    # its lease (it is not handed to a second receiver) until the lease ends.
    ids = await queue.send_many(["acked", "leased", "waiting"])
    (acked,) = await queue.receive(LONG, max=1)
    assert await queue.ack(acked) is True
    # a lease long enough to outlast the next two receives on a loaded machine (0.6 s did not)
    (leased,) = await queue.receive(2.0, max=1)
    await client.execute("XGROUP", "DESTROY", queue.stream_key, "respire")

    batch = await queue.receive(LONG, max=10)
    assert [(m.id, m.payload, m.delivery_count) for m in batch] == [(ids[2], "waiting", 1)]
    assert await queue.receive(LONG, max=10) == []  # the leased one stays invisible
    assert await queue.ack(batch[0]) is True

    await wait_for_server_time(client, leased.lease_deadline_ms)
    (again,) = await queue.receive(LONG, max=10)  # its lease ended: redelivered once
    assert (again.id, again.payload, again.delivery_count) == (ids[1], "leased", 2)
    assert await queue.ack(leased) is False  # the first receipt is fenced off
    assert await queue.ack(again) is True
    assert await queue.receive(LONG, max=10) == []
    assert await entry_ids(client, queue.stream_key) == []


async def test_redeliveries_sharing_a_deadline_come_back_in_stream_order(
    client: RedisClient, queue: ReliableQueue[str]
) -> None:
    """A batch leased together shares one deadline; when it expires the messages are
    redelivered in the order they were sent (the deadline set alone would order their ids as
    text, '<ms>-10' before '<ms>-2')."""
    # the precondition that makes text order differ from stream order: some millisecond holds
    # sequence numbers past 9. Pipelined sends usually share one; a loaded machine can spread
    # them (one CI run split 12 over two milliseconds), so a batch that misses is cleared and
    # sent again.
    for _ in range(10):
        sent = await queue.send_many([str(i) for i in range(40)])
        if sorted(sent) != sent:
            break
        await queue.ack_many(await queue.receive(LONG, max=40))
    else:
        pytest.fail("no eleven sends shared a millisecond: the case was not exercised")
    first = await queue.receive(SHORT, max=40)
    assert [m.id for m in first] == sent
    await wait_for_server_time(client, first[0].lease_deadline_ms + 1)

    again = await queue.receive(LONG, max=40)

    assert [m.id for m in again] == sent
    assert {m.delivery_count for m in again} == {2}
    # handed back together with nack_many: the same
    await queue.nack_many(again, 0)
    assert [m.id for m in await queue.receive(LONG, max=40)] == sent


async def test_a_due_message_whose_entry_is_gone_is_counted_and_logged(
    client: RedisClient, queue: ReliableQueue[str], caplog: pytest.LogCaptureFixture
) -> None:
    gone = await queue.send("gone")
    kept = await queue.send("kept")
    (leased, other) = await queue.receive(LONG, max=2)
    assert leased.id == gone
    await client.execute("XDEL", queue.keys.stream, gone)  # outside the library
    await queue.nack_many([leased, other], 0)

    with caplog.at_level("WARNING", logger="respire_actors.reliable"):
        batch = await queue.receive(LONG, max=2)

    assert [m.id for m in batch] == [kept]
    assert queue.statistics().lost_payloads == 1
    assert any("gone from the stream" in r.getMessage() for r in caplog.records)
    assert await client.execute("ZCARD", queue.keys.deadlines) == 1
