"""Explicit payload codecs: how a typed payload becomes bytes in Redis and back.

A codec is any object with ``encode(value) -> bytes`` and ``decode(data) -> value``. Every
codec here is stateless (or holds only immutable configuration), so one instance can be
shared by any number of tasks and threads.

``decode`` raises :class:`DecodeError` (a :class:`~respire_actors.errors.ValidationError`)
for bytes it cannot turn into a value; ``encode`` raises :class:`EncodeError` for a value it
cannot serialise. Both are raised locally, before or after talking to Redis, never by it.
"""

from __future__ import annotations

from typing import Any, Generic, Protocol, TypeVar, runtime_checkable

from cattrs.preconf.json import JsonConverter, make_converter

from .errors import ValidationError

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)
T_contra = TypeVar("T_contra", contravariant=True)


class CodecError(ValidationError):
    """A payload could not be encoded or decoded."""


class EncodeError(CodecError):
    """A value could not be serialised by its codec; nothing was sent."""


class DecodeError(CodecError):
    """Stored bytes could not be turned back into a value by the codec."""


@runtime_checkable
class Codec(Protocol[T]):
    """Turns values of type ``T`` into bytes and back. Implementations must be thread-safe."""

    def encode(self, value: T) -> bytes:
        """Serialise ``value``; raise :class:`EncodeError` if it cannot be."""
        ...

    def decode(self, data: bytes) -> T:
        """Deserialise ``data``; raise :class:`DecodeError` if it is not a valid payload."""
        ...


class BytesCodec:
    """Payloads are raw ``bytes`` (``bytearray`` and ``memoryview`` are accepted on encode)."""

    __slots__ = ()

    def encode(self, value: bytes | bytearray | memoryview) -> bytes:
        if isinstance(value, bytes):
            return value
        if isinstance(value, bytearray | memoryview):
            return bytes(value)
        raise EncodeError(f"BytesCodec encodes bytes, got {type(value).__name__}")

    def decode(self, data: bytes) -> bytes:
        return bytes(data)

    def __repr__(self) -> str:
        return "BytesCodec()"


class StrCodec:
    """Payloads are ``str``, stored as UTF-8."""

    __slots__ = ()

    def encode(self, value: str) -> bytes:
        if not isinstance(value, str):
            raise EncodeError(f"StrCodec encodes str, got {type(value).__name__}")
        try:
            return value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise EncodeError(f"payload is not valid Unicode: {exc}") from None

    def decode(self, data: bytes) -> str:
        try:
            return bytes(data).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise DecodeError(f"payload is not UTF-8: {exc}") from None

    def __repr__(self) -> str:
        return "StrCodec()"


_DEFAULT_CONVERTER: JsonConverter = make_converter()


class JsonCodec(Generic[T]):
    """Payloads of type ``T`` (dataclasses, attrs classes, builtins) as JSON via cattrs.

    ``JsonCodec(Order)`` structures decoded JSON into ``Order``; pass ``converter`` to use a
    customised :class:`cattrs.preconf.json.JsonConverter` (configure it fully before sharing:
    a converter is safe for concurrent use once its hooks are registered).
    """

    __slots__ = ("_converter", "_type")

    def __init__(self, type_: type[T], *, converter: JsonConverter | None = None) -> None:
        self._type = type_
        self._converter = converter if converter is not None else _DEFAULT_CONVERTER

    @property
    def type(self) -> Any:
        """The payload type this codec structures into."""
        return self._type

    def encode(self, value: T) -> bytes:
        try:
            return self._converter.dumps(value, unstructure_as=self._type).encode("utf-8")
        except Exception as exc:
            raise EncodeError(f"cannot encode {type(value).__name__} as JSON: {exc}") from exc

    def decode(self, data: bytes) -> T:
        try:
            result: T = self._converter.loads(bytes(data), self._type)
        except Exception as exc:  # JSON syntax, or cattrs' ClassValidationError (a group)
            raise DecodeError(f"payload is not a valid {self._type_name()}: {exc}") from exc
        return result

    def _type_name(self) -> str:
        return getattr(self._type, "__name__", repr(self._type))

    def __repr__(self) -> str:
        return f"JsonCodec({self._type_name()})"


__all__ = [
    "BytesCodec",
    "Codec",
    "CodecError",
    "DecodeError",
    "EncodeError",
    "JsonCodec",
    "StrCodec",
]
