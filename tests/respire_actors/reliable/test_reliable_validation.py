"""Bad input raises ValidationError (or ConfigurationError) before anything is sent."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from respire_actors.codecs import EncodeError, JsonCodec, StrCodec
from respire_actors.errors import ConfigurationError, ValidationError
from respire_actors.redis.client import ConnectionSettings, RedisClient
from respire_actors.reliable import ReliableQueue, ReliableTopic

pytestmark = pytest.mark.anyio


def unentered(prefix: str = "") -> RedisClient:
    """A client that was never entered: any command raises RuntimeError, so a ValidationError
    proves the check ran before anything was sent."""
    return RedisClient(ConnectionSettings(key_prefix=prefix))


@pytest.mark.parametrize("name", ["", "   ", "a{b", "a}b", 42, None, "x" * 513])
def test_bad_queue_and_topic_names(name: Any) -> None:
    with pytest.raises(ValidationError):
        ReliableQueue(unentered(), name, StrCodec())
    with pytest.raises(ValidationError):
        ReliableTopic(unentered(), name, StrCodec())


@pytest.mark.parametrize(
    "kwargs",
    [
        {"delivery_limit": 0},
        {"delivery_limit": True},
        {"delivery_limit": 2.5},
        {"dedup_window": 0},
        {"dedup_window": -1},
        {"dedup_window": float("inf")},
        {"dedup_window": timedelta(days=30)},  # above 2**31-1 ms
    ],
)
def test_bad_queue_settings(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        ReliableQueue(unentered(), "q", StrCodec(), **kwargs)


def test_bad_codec_and_client() -> None:
    with pytest.raises(ValidationError):
        ReliableQueue(unentered(), "q", object())  # type: ignore[arg-type]
    with pytest.raises(ValidationError):
        ReliableQueue("redis://x", "q", StrCodec())  # type: ignore[arg-type]


def test_prefix_that_splits_the_slot_is_refused() -> None:
    # an empty hash tag makes Redis hash each whole key: the keys would land in many slots
    with pytest.raises(ConfigurationError):
        ReliableQueue(unentered("{}"), "q", StrCodec())
    with pytest.raises(ConfigurationError):
        ReliableTopic(unentered("{}"), "t", StrCodec()).subscription("s")
    # a prefix with its own tag moves every key into that tag's slot: fine
    queue = ReliableQueue(unentered("{tenant}:"), "q", StrCodec())
    assert queue.stream_key == "{tenant}:{respire-queue:q}:stream"


@pytest.mark.parametrize(
    ("visibility", "max_"),
    [
        (0, 1),
        (-1, 1),
        (float("nan"), 1),
        ("5", 1),
        (timedelta(0), 1),
        (2**31, 1),
        (1, 0),
        (1, 1001),
        (1, 2.0),
        (1, True),
    ],
)
async def test_bad_receive_arguments(visibility: Any, max_: Any) -> None:
    queue = ReliableQueue(unentered(), "q", StrCodec())
    with pytest.raises(ValidationError):
        await queue.receive(visibility, max=max_)


async def test_bad_send_ack_nack_arguments() -> None:
    queue = ReliableQueue(unentered(), "q", StrCodec())
    with pytest.raises(EncodeError):
        await queue.send(b"not a str")  # type: ignore[arg-type]
    with pytest.raises(ValidationError):
        await queue.send("x", dedup_id="")
    with pytest.raises(ValidationError):
        await queue.send("x", dedup_id=7)  # type: ignore[arg-type]
    with pytest.raises(EncodeError):
        await queue.send_many(["ok", 3])  # type: ignore[list-item]
    bad_receipts = ["", "1-0", "1-0:1", "1-0:x:5", "1-0:1:5:6", "abc:1:2", 17,
                    "1-0:0:5", "1-0:2147483648:5",  # delivery counts start at 1, fit 31 bits
                    "\u0661-\u0660:1:5", "1-0:\u0661:5",  # digits, but not ASCII ones
                    "18446744073709551616-0:1:5", "1-18446744073709551616:1:5"]  # fmt: skip
    for receipt in bad_receipts:
        with pytest.raises(ValidationError):
            await queue.ack(receipt)  # type: ignore[arg-type]
        with pytest.raises(ValidationError):
            await queue.nack(receipt)  # type: ignore[arg-type]
        # a batch with one bad receipt is refused whole, before anything is sent
        with pytest.raises(ValidationError):
            await queue.ack_many(["1-0:1:5", receipt])  # type: ignore[list-item]
        with pytest.raises(ValidationError):
            await queue.nack_many(["1-0:1:5", receipt])  # type: ignore[list-item]
    with pytest.raises(ValidationError):
        await queue.nack("1-0:1:5", -0.5)
    with pytest.raises(ValidationError):
        await queue.nack("1-0:1:5", 2**31)
    with pytest.raises(ValidationError):
        await queue.dead_letters(0)
    with pytest.raises(ValidationError):
        await queue.dead_letters(after="nope")
    with pytest.raises(ValidationError):
        queue.iter_messages(0)
    with pytest.raises(ValidationError):
        queue.iter_messages(1, batch_size=0)
    with pytest.raises(ValidationError):
        queue.iter_messages(1, max_leased=0)


async def test_bad_topic_arguments() -> None:
    topic: ReliableTopic[int] = ReliableTopic(unentered(), "t", JsonCodec(int))
    with pytest.raises(EncodeError):
        await topic.publish(object())  # type: ignore[arg-type]
    for name in ["", "a{", None]:
        with pytest.raises(ValidationError):
            topic.subscription(name)  # type: ignore[arg-type]
        with pytest.raises(ValidationError):
            await topic.create_subscription(name, start="tail")  # type: ignore[arg-type]
        with pytest.raises(ValidationError):
            await topic.remove_subscription(name)  # type: ignore[arg-type]
    with pytest.raises(ValidationError):
        await topic.create_subscription("s", start="middle")  # type: ignore[arg-type]
    with pytest.raises(ValidationError):
        await topic.trim()
    with pytest.raises(ValidationError):
        await topic.trim(max_length=-1)
    with pytest.raises(ValidationError):
        await topic.trim(max_age=-1)
    bad_limits: list[dict[str, object]] = [
        {"min_id": "yesterday"}, {"min_id": "5"}, {"min_id": "\u0661-\u0660"},
        {"min_id": "1-0\n"}, {"min_id": 5},
        {"min_id": "18446744073709551616-0"}, {"min_id": "1-18446744073709551616"},
        {"max_length": 2**53}, {"max_length": True}, {"max_length": 1.5},
        {"max_age": timedelta(days=3653)}, {"max_age": float("nan")}, {"max_age": "1"},
    ]  # fmt: skip
    for limits in bad_limits:
        with pytest.raises(ValidationError):
            await topic.trim(**limits)  # type: ignore[arg-type]
    with pytest.raises(ValidationError):
        await topic.subscription("s").receive(1, max=0)


def test_durations_round_up_to_milliseconds() -> None:
    from respire_actors.reliable._durations import to_ms

    assert to_ms(0.2, "v") == 200
    assert to_ms(0.0001, "v") == 1
    assert to_ms(timedelta(microseconds=1500), "v") == 2
    assert to_ms(0, "d", allow_zero=True) == 0
    assert to_ms((2**31 - 1) / 1000, "v") == 2**31 - 1
    with pytest.raises(ValidationError):
        to_ms(True, "v")
