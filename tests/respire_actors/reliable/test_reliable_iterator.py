"""The polling async iterator: bounded leases, back-off when empty, hand-back on close."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from respire_actors.codecs import StrCodec
from respire_actors.redis.client import RedisClient
from respire_actors.reliable import Message, ReliableQueue
from respire_actors.reliable.iterator import MessageIterator

pytestmark = pytest.mark.anyio


@pytest.fixture
def queue(client: RedisClient, unique_name: str) -> ReliableQueue[str]:
    return ReliableQueue(client, unique_name, StrCodec())


async def test_iterator_never_holds_more_than_max_leased(
    client: RedisClient, queue: ReliableQueue[str]
) -> None:
    await queue.send_many([str(i) for i in range(10)])
    messages = queue.iter_messages(30, batch_size=2, max_leased=3, poll_interval=0.01)
    got: list[Message[str]] = []
    for _ in range(3):
        got.append(await messages.__anext__())
    assert messages.held == 3
    assert await client.execute("ZCARD", queue.keys.deadlines) == 3

    fourth: list[Message[str]] = []

    async def take_one() -> None:
        fourth.append(await messages.__anext__())

    async with anyio.create_task_group() as tg:
        tg.start_soon(take_one)
        # it must wait for room: give it many chances to misbehave
        for _ in range(20):
            await anyio.sleep(0.005)
        assert fourth == []
        assert await client.execute("ZCARD", queue.keys.deadlines) == 3
        assert await queue.ack(got[0]) is True  # frees room, wakes the iterator

    assert [m.payload for m in got + fourth] == ["0", "1", "2", "3"]
    assert await client.execute("ZCARD", queue.keys.deadlines) == 3
    assert messages.held == 3


async def test_iterator_counts_a_message_free_once_its_lease_expired(
    queue: ReliableQueue[str],
) -> None:
    await queue.send_many(["a", "b"])
    messages = queue.iter_messages(0.2, batch_size=1, max_leased=1, poll_interval=0.01)
    first = await messages.__anext__()
    with anyio.fail_after(5):
        second = await messages.__anext__()  # unblocked by the expiry, not by an ack

    # after expiry the server may hand "a" out again before "b": both are legitimate
    assert first.payload == "a"
    assert second.payload in {"a", "b"}
    assert messages.held == 1


async def test_iterator_backs_off_when_empty_then_picks_up_new_messages(
    queue: ReliableQueue[str],
) -> None:
    calls = 0
    original = queue._receive_ms

    async def counting(visibility_ms: int, count: int) -> list[Message[str]]:
        nonlocal calls
        calls += 1
        return await original(visibility_ms, count)

    queue._receive_ms = counting  # type: ignore[method-assign]
    messages = queue.iter_messages(30, poll_interval=0.01, max_poll_interval=0.08)
    got: list[str] = []

    async def consume() -> None:
        async for message in messages:
            got.append(message.payload)
            await queue.ack(message)
            return

    async with anyio.create_task_group() as tg:
        tg.start_soon(consume)
        await anyio.sleep(0.4)
        # without back-off it would poll ~40 times in 0.4 s; with doubling to 80 ms, ~8
        assert 3 <= calls <= 12
        await queue.send("late")

    assert got == ["late"]


async def test_closing_the_iterator_hands_back_buffered_messages(
    client: RedisClient, queue: ReliableQueue[str]
) -> None:
    await queue.send_many(["a", "b", "c"])
    async with queue.iter_messages(30, batch_size=3, poll_interval=0.01) as messages:
        first = await messages.__anext__()

    assert first.payload == "a"
    # b and c are due again at once, and the delivery they never had is not counted
    again = await queue.receive(30, max=10)
    assert [(m.payload, m.delivery_count) for m in again] == [("b", 1), ("c", 1)]
    assert await queue.ack(first) is True
    assert queue.statistics().nacked == 0


async def test_closing_iterators_often_never_dead_letters_unseen_messages(
    client: RedisClient, unique_name: str
) -> None:
    """A consumer that takes one message per session (request-scoped, frequent deploys) used
    to charge every buffered message a delivery per close: with a limit of 3, messages the
    application never saw went to the dead letters after three sessions."""
    queue = ReliableQueue(client, unique_name, StrCodec(), delivery_limit=3)
    await queue.send_many([f"m{i}" for i in range(8)])
    seen: list[tuple[str, int]] = []
    for _ in range(8):
        async with queue.iter_messages(30, batch_size=8, poll_interval=0.01) as messages:
            with anyio.fail_after(5):  # the messages left went to the dead letters
                message = await messages.__anext__()
            seen.append((message.payload, message.delivery_count))
            assert await queue.ack(message) is True
    assert sorted(seen) == [(f"m{i}", 1) for i in range(8)]
    assert (await queue.inspect()).dead_letters == 0


class SlowReplies:
    """The real queue, its receive replies arriving ``delay`` seconds late (a slow network)."""

    def __init__(self, queue: ReliableQueue[str], delay: float) -> None:
        self.queue, self.delay = queue, delay

    async def _receive_ms(self, visibility_ms: int, count: int) -> list[Message[str]]:
        batch = await self.queue._receive_ms(visibility_ms, count)
        await anyio.sleep(self.delay)
        return batch

    async def nack_many(self, messages: Any, delay: Any = 0) -> Any:
        return await self.queue.nack_many(messages, delay)

    async def _release_unseen(self, messages: Any) -> Any:
        return await self.queue._release_unseen(messages)


async def test_a_buffered_message_is_not_handed_out_once_its_lease_may_have_ended(
    queue: ReliableQueue[str],
) -> None:
    """The lease is measured from before the request, not from the late reply: found by
    review, a buffered message was handed out up to one round trip after its lease ended."""
    await queue.send_many(["a", "b"])
    slow = SlowReplies(queue, 0.2)
    messages = MessageIterator(
        slow, 300, batch_size=2, max_leased=10, poll_interval=0.01, max_poll_interval=0.05
    )
    first = await messages.__anext__()  # about 0.2 s after the request: "a", "b" buffered
    assert (first.payload, first.delivery_count) == ("a", 1)
    await anyio.sleep(0.15)  # 0.35 s after the request: "b"'s 0.3 s lease is over
    with anyio.fail_after(5):
        second = await messages.__anext__()
    assert second.delivery_count == 2  # a fresh lease (redelivered), never "b"'s stale one


async def test_a_buffered_message_with_too_little_lease_left_is_handed_back_unseen(
    client: RedisClient, queue: ReliableQueue[str]
) -> None:
    """Found by review: a buffered message was yielded while any of its lease was left, however
    little, so the application could get one whose lease ended before it could finish. With
    less than a tenth of the visibility timeout (at most 1 s) left it is handed back unseen
    (its delivery not counted) and received again with a fresh lease."""
    await queue.send_many(["a", "b", "c"])
    messages = queue.iter_messages(4, batch_size=3, max_leased=10, poll_interval=0.01)
    async with messages:
        first = await messages.__anext__()
        assert (first.payload, first.delivery_count) == ("a", 1)
        await anyio.sleep(3.75)  # "b" and "c": about 0.25 s of their 4 s lease left (< 0.4 s)
        with anyio.fail_after(5):
            second = await messages.__anext__()
        sec, usec = await client.execute("TIME")
        now_ms = int(sec) * 1000 + int(usec) // 1000
        assert second.payload == "b"
        assert second.delivery_count == 1  # handed back unseen: not counted
        assert second.lease_deadline_ms - now_ms > 3_000  # a fresh lease
