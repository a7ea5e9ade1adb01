"""Codecs: round trips, typed failures, and sharing one instance between threads."""

from __future__ import annotations

import threading
from dataclasses import dataclass

import attrs
import pytest

from respire_actors.codecs import (
    BytesCodec,
    Codec,
    CodecError,
    DecodeError,
    EncodeError,
    JsonCodec,
    StrCodec,
)
from respire_actors.errors import ValidationError


@dataclass(frozen=True)
class Order:
    id: int
    items: list[str]
    note: str | None = None


@attrs.frozen
class Shipment:
    order: Order
    carrier: str


def test_bytes_and_str_codecs_round_trip() -> None:
    assert BytesCodec().decode(BytesCodec().encode(b"\x00\xff")) == b"\x00\xff"
    assert BytesCodec().encode(bytearray(b"ab")) == b"ab"
    assert StrCodec().encode("ü") == "ü".encode()
    assert StrCodec().decode("ü".encode()) == "ü"


def test_json_codec_structures_dataclasses_and_attrs_classes() -> None:
    codec = JsonCodec(Shipment)
    value = Shipment(Order(7, ["a", "b"]), "post")
    data = codec.encode(value)
    assert isinstance(data, bytes)
    assert codec.decode(data) == value
    assert JsonCodec(list[int]).decode(b"[1, 2]") == [1, 2]


@pytest.mark.parametrize(
    ("codec", "data"),
    [
        (StrCodec(), b"\xff"),
        (JsonCodec(Order), b"not json"),
        (JsonCodec(Order), b'{"id": "x", "items": []}'),
        (JsonCodec(Order), b'{"items": []}'),
    ],
)
def test_decode_failures_are_typed_validation_errors(codec: Codec[object], data: bytes) -> None:
    with pytest.raises(DecodeError) as caught:
        codec.decode(data)
    assert isinstance(caught.value, CodecError)
    assert isinstance(caught.value, ValidationError)


@pytest.mark.parametrize(
    ("codec", "value"),
    [
        (BytesCodec(), "str"),
        (StrCodec(), b"bytes"),
        (StrCodec(), "\ud800"),
        (JsonCodec(int), object()),
    ],
)
def test_encode_failures_are_typed(codec: Codec[object], value: object) -> None:
    with pytest.raises(EncodeError):
        codec.encode(value)


def test_codecs_satisfy_the_protocol_and_are_shareable_between_threads() -> None:
    codec = JsonCodec(Order)
    assert isinstance(codec, Codec) and isinstance(StrCodec(), Codec)
    errors: list[BaseException] = []

    def work(n: int) -> None:
        try:
            for i in range(300):
                value = Order(n * 1000 + i, [str(i)])
                assert codec.decode(codec.encode(value)) == value
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
