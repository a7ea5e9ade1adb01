"""Codecs at the job queue's boundary (issue 8, item 5): whatever a codec returns or raises
becomes an ``EncodeError`` before anything is sent, and ``JsonCodec`` is strict about field
types."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, time, timedelta
from decimal import Decimal
from enum import Enum
from typing import Any
from uuid import UUID

import anyio
import anyio.lowlevel
import pytest
from jobs_helpers import forbid_commands

from respire_actors.codecs import DecodeError, EncodeError, JsonCodec, JsonValueCodec
from respire_actors.jobs import JobEnqueueOptions, JobQueue
from respire_actors.redis.client import RedisClient

pytestmark = pytest.mark.anyio


class Broken:
    """A codec whose encode returns ``result`` (or raises it, if it is an exception)."""

    def __init__(self, result: Any) -> None:
        self.result = result

    def encode(self, value: object) -> Any:
        if isinstance(self.result, BaseException):
            raise self.result
        return self.result

    def decode(self, data: bytes) -> Any:
        return data


BROKEN = [None, "text", 7, ["b"], TypeError("bad"), ValueError("bad"), KeyError("k")]
BROKEN_IDS = ["none", "str", "int", "list", "typeerror", "valueerror", "keyerror"]

ENQUEUES = {
    "enqueue": lambda q: q.enqueue("j", "p"),
    "enqueue_many": lambda q: q.enqueue_many([("a", "p"), ("b", "p")]),
    "enqueue_scheduled": lambda q: q.enqueue_scheduled("j", "p", JobEnqueueOptions()),
    "enqueue_scheduled_many": lambda q: q.enqueue_scheduled_many([("a", "p")]),
}


@pytest.mark.parametrize("result", BROKEN, ids=BROKEN_IDS)
@pytest.mark.parametrize("path", list(ENQUEUES))
async def test_a_broken_codec_raises_encode_error_before_sending(
    client: RedisClient, unique_name: str, result: Any, path: str
) -> None:
    """Before the fix the codec's value (None, str, int) reached the shared connection, or its
    TypeError escaped untyped."""
    queue: JobQueue[str] = JobQueue(client, unique_name, Broken(result))
    with forbid_commands(client), pytest.raises(EncodeError):
        await ENQUEUES[path](queue)


@pytest.mark.parametrize("result", BROKEN, ids=BROKEN_IDS)
async def test_a_broken_codec_in_a_transaction_queues_nothing(
    client: RedisClient, unique_name: str, result: Any
) -> None:
    queue: JobQueue[str] = JobQueue(client, unique_name, Broken(result))
    marker = queue.keys.custom("marker")
    async with client.transaction() as tx:
        with pytest.raises(EncodeError):
            queue.enqueue_in(tx, "j", "p")
        with pytest.raises(EncodeError):
            queue.enqueue_scheduled_in(tx, "j", "p")
        saved = tx.queue("SET", marker, "1")
        assert await tx.commit()  # the rest of the transaction is unharmed
    saved.result()
    assert await client.execute("EXISTS", queue.keys.ready, queue.keys.scheduled) == 0


async def test_a_broken_codec_does_not_disturb_concurrent_commands(
    client: RedisClient, unique_name: str
) -> None:
    bad: JobQueue[str] = JobQueue(client, unique_name + "-bad", Broken(None))
    good: JobQueue[str] = JobQueue(client, unique_name, JsonCodec(str))
    errors: list[BaseException] = []

    async def bad_calls() -> None:
        for _ in range(20):
            try:
                await bad.enqueue("j", "p")
            except EncodeError as exc:
                errors.append(exc)
            await anyio.lowlevel.checkpoint()

    async def good_calls() -> None:
        for i in range(20):
            assert (await good.enqueue(f"g{i}", "p")).enqueued

    async with anyio.create_task_group() as tg:
        tg.start_soon(bad_calls)
        tg.start_soon(good_calls)
    assert len(errors) == 20
    assert await client.execute("XLEN", good.keys.ready) == 20


@dataclass
class Email:
    to: str
    retries: int
    urgent: bool = False
    weight: float = 1.0


@pytest.mark.parametrize(
    "data",
    [
        b'{"to": 123, "retries": 1}',
        b'{"to": "a", "retries": "5"}',
        b'{"to": "a", "retries": true}',
        b'{"to": "a", "retries": 1.5}',
        b'{"to": "a", "retries": 1, "urgent": 1}',
        b'{"to": "a", "retries": 1, "urgent": "yes"}',
        b'{"to": "a", "retries": 1, "weight": "2"}',
        b'{"to": "a", "retries": 1, "weight": false}',
        b'{"to": null, "retries": 1}',
    ],
)
def test_json_codec_refuses_fields_of_the_wrong_type(data: bytes) -> None:
    """Before the fix cattrs turned 123 into "123" and true into 1."""
    with pytest.raises(DecodeError):
        JsonCodec(Email).decode(data)


def test_json_codec_accepts_exact_types_and_ints_for_floats() -> None:
    codec = JsonCodec(Email)
    assert codec.decode(b'{"to": "a", "retries": 2, "urgent": true, "weight": 3}') == Email(
        "a", 2, True, 3.0
    )
    # unknown keys are ignored: producers may add fields before every worker is upgraded
    assert codec.decode(b'{"to": "a", "retries": 0, "new": 1}') == Email("a", 0)
    assert JsonCodec(list[int]).decode(b"[1, 2]") == [1, 2]
    with pytest.raises(DecodeError):
        JsonCodec(list[int]).decode(b'[1, "2"]')
    with pytest.raises(DecodeError):
        JsonCodec(int).decode(b"true")


@pytest.mark.parametrize(
    "payload",
    [Email(123, 1), Email("a", "5"), Email("a", True), Email("a", 1, urgent=1),  # type: ignore[arg-type]
     Email("a", 1, weight="2"), Email(None, 1)],  # type: ignore[arg-type]
)  # fmt: skip
@pytest.mark.parametrize("path", list(ENQUEUES))
async def test_a_payload_that_would_not_decode_is_refused_before_sending(
    client: RedisClient, unique_name: str, payload: Email, path: str
) -> None:
    """A plain dataclass does not check its fields' types: JsonCodec.encode checks that what
    it sends decodes back, so a mistyped payload never becomes a job no worker can decode."""
    queue: JobQueue[Email] = JobQueue(client, unique_name, JsonCodec(Email))
    enqueue = {
        "enqueue": lambda: queue.enqueue("j", payload),
        "enqueue_many": lambda: queue.enqueue_many([("a", Email("ok", 1)), ("b", payload)]),
        "enqueue_scheduled": lambda: queue.enqueue_scheduled("j", payload, JobEnqueueOptions()),
        "enqueue_scheduled_many": lambda: queue.enqueue_scheduled_many([("a", payload)]),
    }[path]
    with forbid_commands(client), pytest.raises(EncodeError, match="would not decode"):
        await enqueue()
    assert JsonCodec(Email).decode(JsonCodec(Email).encode(Email("a", 2, True, 3))) == Email(
        "a", 2, True, 3.0
    )


@dataclass
class Move:
    squares: tuple[int, int]
    counts: dict[Any, int]
    path: list[tuple[int, str]]


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (Move((1, 2, 3), {}, []), "3 items where tuple\\[int, int\\] holds exactly 2"),
        (Move((1,), {}, []), "1 items where tuple\\[int, int\\] holds exactly 2"),  # type: ignore[arg-type]
        (Move((1, 2), {}, [(1, "a"), (2, "b", "c")]), "3 items where tuple\\[int, str\\]"),  # type: ignore[list-item]
        (Move((1, 2), {1: 10, "1": 20}, []), "keys 1 and '1' would both be the JSON key '1'"),
    ],
)  # fmt: skip
async def test_json_codec_refuses_what_json_would_cut_or_merge(
    client: RedisClient, unique_name: str, payload: Move, message: str
) -> None:
    """Extra tuple items and colliding mapping keys used to be cut or merged silently (the
    worker got other data than the producer sent): now the enqueue fails before sending."""
    queue: JobQueue[Move] = JobQueue(client, unique_name, JsonCodec(Move))
    with forbid_commands(client), pytest.raises(EncodeError, match=message):
        await queue.enqueue("j", payload)
    fine = Move((1, 2), {"a": 1, 2: 3}, [(1, "a")])
    assert JsonCodec(Move).decode(JsonCodec(Move).encode(fine)) == Move(
        (1, 2), {"a": 1, "2": 3}, [(1, "a")]
    )


def test_json_codec_refuses_a_top_level_tuple_of_another_length_and_nan() -> None:
    with pytest.raises(EncodeError, match="3 items"):
        JsonCodec(tuple[int, int]).encode((1, 2, 3))  # type: ignore[arg-type]
    assert JsonCodec(tuple[int, ...]).encode((1, 2, 3)) == b"[1, 2, 3]"
    for value in (float("nan"), float("inf"), -float("inf")):
        with pytest.raises(EncodeError, match="not JSON compliant"):
            JsonCodec(float).encode(value)


def test_json_value_codec_round_trips_plain_values() -> None:
    codec = JsonValueCodec()
    assert codec.decode(codec.encode(Email("a", 1))) == {
        "to": "a",
        "retries": 1,
        "urgent": False,
        "weight": 1.0,
    }
    assert codec.decode(codec.encode(None)) is None
    for bad in (object(), float("nan"), {1: object()}):
        with pytest.raises(EncodeError):
            codec.encode(bad)
    with pytest.raises(DecodeError):
        codec.decode(b"{")


@pytest.mark.parametrize(
    "value",
    [{1: "a", "1": "b"}, {True: 1, "true": 2}, {None: 1, "null": 2}, {1.5: 1, "1.5": 2},
     {"outer": [{"x": {2: "a", "2": "b"}}]}],
)  # fmt: skip
def test_json_value_codec_refuses_keys_that_json_would_merge(value: Any) -> None:
    """Found by review: {1: "a", "1": "b"} was written with a duplicate key and read back as
    {"1": "b"}, a kept result silently changed."""
    with pytest.raises(EncodeError, match="would both be the JSON key"):
        JsonValueCodec().encode(value)


class Color(Enum):
    RED = 1
    BLUE = 2


@dataclass
class Holder:
    table: dict[Any, str]


@pytest.mark.parametrize(
    "value",
    [{Color.RED: "enum", 1: "int"},
     {datetime(2026, 1, 1): "dt", "2026-01-01T00:00:00": "str"},
     [Holder({Color.BLUE: "a", 2: "b"})],
     {"deep": {Color.RED: 1, "1": 2}}],
)  # fmt: skip
def test_json_value_codec_refuses_keys_that_collide_once_unstructured(value: Any) -> None:
    """Found by review: an enum member and its value, or a datetime and its ISO text, only
    collide once cattrs has unstructured them, and the unstructured copy had already merged
    them: the result was stored with one entry silently dropped."""
    with pytest.raises(EncodeError, match="would both be the JSON key"):
        JsonValueCodec().encode(value)


@pytest.mark.parametrize(
    "value",
    [{timedelta(seconds=1): "a", 1: "b"},
     {timedelta(seconds=1): "a", True: "b"},
     {Color.RED: "enum", 1.0: "float"}],
)  # fmt: skip
def test_json_value_codec_refuses_keys_python_merges_once_unstructured(value: Any) -> None:
    """Found by review: keys whose unstructured forms Python takes for one dict key
    (1 == 1.0 == True) were merged by cattrs before the JSON-text check saw them, and one
    entry was dropped without an error."""
    with pytest.raises(EncodeError, match="would merge into one JSON key"):
        JsonValueCodec().encode(value)


@dataclass
class Order:
    quantities: dict[int, int]
    prices: dict[float, str]
    flags: dict[bool, int]
    by_color: dict[Color, int]


def test_json_codec_reads_back_number_and_bool_mapping_keys() -> None:
    """Found by review: JSON writes every object key as text, and the strict int hook refused
    "7" as an int key, so a dataclass with a dict[int, int] field could never be enqueued
    (EncodeError: would not decode) and such results never read back."""
    order = Order({7: 2, -3: 1}, {1.5: "a", 2.0: "b"}, {True: 1, False: 0}, {Color.BLUE: 3})
    codec = JsonCodec(Order)
    assert codec.decode(codec.encode(order)) == order
    assert JsonCodec(Mapping[int, str]).decode(b'{"1": "a"}') == {1: "a"}
    for bad in (b'{"7.5": 1}', b'{"x": 1}', b'{"true": 1}', b'{"1e3": 1}'):
        with pytest.raises(DecodeError):
            JsonCodec(dict[int, int]).decode(bad)
    with pytest.raises(DecodeError):
        JsonCodec(dict[bool, int]).decode(b'{"1": 1}')
    # values stay strict: only keys are read from text
    with pytest.raises(DecodeError):
        JsonCodec(dict[int, int]).decode(b'{"1": "2"}')


class Status(Enum):
    OK = "200"
    YES = "true"


@dataclass
class Report:
    counts: dict[Status, int]


def test_json_codec_keeps_text_enum_keys_that_look_like_numbers() -> None:
    """Found by review of the number-key fix: an enum of text values such as "200" or "true"
    was taken for a number-keyed mapping, its keys parsed to 200 / True, and such payloads
    could no longer be enqueued (or decoded when written by an older producer)."""
    report = Report({Status.OK: 3, Status.YES: 1})
    codec = JsonCodec(Report)
    assert codec.decode(codec.encode(report)) == report
    assert codec.decode(b'{"counts": {"200": 3}}') == Report({Status.OK: 3})


def test_json_value_codec_converts_keys_and_bytes_as_documented() -> None:
    codec = JsonValueCodec()
    assert codec.decode(codec.encode({1: "a", None: "b", 2.5: "c"})) == {
        "1": "a",
        "null": "b",
        "2.5": "c",
    }
    import base64

    assert base64.b85decode(codec.decode(codec.encode(b"\x00\xff"))) == b"\x00\xff"


class Mixed(Enum):
    A = 1
    B = "x"
    C = "2"


def test_json_codec_keys_of_an_enum_mixing_numbers_and_text() -> None:
    """Found by review: an enum with both number and text values lost its number keys ("1"
    is no member value) once only all-number enums were read from number text."""
    codec = JsonCodec(dict[Mixed, int])
    value = {Mixed.A: 1, Mixed.B: 2, Mixed.C: 3}
    assert codec.decode(codec.encode(value)) == value


@pytest.mark.parametrize("given", [Email("x", 1), "Email", 42])
def test_json_codec_refuses_a_value_where_a_type_belongs(given: object) -> None:
    """Found by review: JsonCodec(Email("x")), JsonCodec("Email") or JsonCodec(42) was built
    and registered without complaint, then failed every enqueue with an EncodeError that did
    not say what to fix (and every decode on a worker)."""
    from respire_actors.errors import ValidationError

    with pytest.raises(ValidationError, match=r"pass the class, as in JsonCodec\(Email\)"):
        JsonCodec(given)  # type: ignore[arg-type]
    assert JsonCodec(list[Email]).decode(b'[{"to": "a", "retries": 1}]') == [Email("a", 1)]


@dataclass
class _Common:
    id: UUID
    amount: Decimal
    at: time
    wait: timedelta


def test_json_codecs_carry_uuid_decimal_time_and_timedelta() -> None:
    """Found by review: the most common values a handler returns (a UUID, a Decimal) were
    refused as payloads and dropped as results ('result-unencodable')."""
    value = _Common(
        UUID("12345678-1234-5678-1234-567812345678"),
        Decimal("12.30"),
        time(9, 30, 1, 5),
        timedelta(days=2, microseconds=7),
    )
    codec = JsonCodec(_Common)
    data = codec.encode(value)
    assert json.loads(data) == {
        "id": "12345678-1234-5678-1234-567812345678",
        "amount": "12.30",
        "at": "09:30:01.000005",
        "wait": 172800.000007,
    }
    assert codec.decode(data) == value
    assert json.loads(JsonValueCodec().encode({"id": value.id, "n": Decimal("-0.5")})) == {
        "id": "12345678-1234-5678-1234-567812345678",
        "n": "-0.5",
    }
    # read back strictly: a float is no exact Decimal, a number no UUID
    for bad in (
        {"id": 5, "amount": "1", "at": "09:00", "wait": 1},
        {"id": str(value.id), "amount": 1.5, "at": "09:00", "wait": 1},
        {"id": str(value.id), "amount": "one", "at": "09:00", "wait": 1},
        {"id": str(value.id), "amount": "1", "at": 9, "wait": 1},
        {"id": str(value.id), "amount": "1", "at": "09:00", "wait": "1s"},
    ):
        with pytest.raises(DecodeError):
            codec.decode(json.dumps(bad).encode())
