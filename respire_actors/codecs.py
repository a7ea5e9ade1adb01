"""Explicit payload codecs: how a typed payload becomes bytes in Redis and back.

A codec is any object with ``encode(value) -> bytes`` and ``decode(data) -> value``. Every
codec here is stateless (or holds only immutable configuration), so one instance can be
shared by any number of tasks and threads.

``decode`` raises :class:`DecodeError` (a :class:`~respire_actors.errors.ValidationError`)
for bytes it cannot turn into a value; ``encode`` raises :class:`EncodeError` for a value it
cannot serialise. Both are raised locally, before or after talking to Redis, never by it.
"""

from __future__ import annotations

import dataclasses
import json
import typing
from collections.abc import Callable, Mapping, MutableMapping
from datetime import time, timedelta
from decimal import Decimal, InvalidOperation
from enum import Enum
from typing import (
    Any,
    Generic,
    NewType,
    Protocol,
    TypeVar,
    cast,
    get_args,
    get_origin,
    runtime_checkable,
)
from uuid import UUID

import attrs
from cattrs import BaseConverter, transform_error
from cattrs.cols import is_mapping, mapping_structure_factory
from cattrs.errors import BaseValidationError
from cattrs.preconf.json import JsonConverter, make_converter

from .errors import ValidationError

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)
T_contra = TypeVar("T_contra", contravariant=True)


def safe_str(exc: BaseException) -> str:
    """``str(exc)``, or a placeholder when the exception's own ``__str__`` fails (a message
    built from it must never raise in its place)."""
    try:
        return str(exc)
    except Exception:
        return f"<{type(exc).__name__} whose str() failed>"


def describe_error(exc: BaseException) -> str:
    """What went wrong, for a codec error's message: each field cattrs refused, with its path
    (``invalid value for type, expected int @ $.qty; required field missing @ $.tenant``),
    else the exception's text."""
    if isinstance(exc, BaseValidationError):
        try:
            return "; ".join(transform_error(exc))
        except Exception:
            pass
    return safe_str(exc)


class CodecError(ValidationError):
    """A payload could not be encoded or decoded."""


class EncodeError(CodecError):
    """A value could not be serialised by its codec; nothing was sent."""


class PayloadTooLarge(EncodeError):
    """An encoded payload is over the client's ``max_payload_bytes``; nothing was sent.

    ``size`` and ``limit`` are in bytes. Store large data elsewhere (a blob store, a database)
    and send a reference to it instead."""

    def __init__(self, message: str, *, size: int, limit: int) -> None:
        super().__init__(message)
        self.size = size
        self.limit = limit


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


def _strict(kind: type[Any], *accepted: type[Any]) -> Any:
    ok = accepted or (kind,)

    def structure(value: Any, _: Any) -> Any:
        # bool is an int subclass: it passes only where bool itself is expected
        if isinstance(value, bool) and kind is not bool:
            raise TypeError(f"expected {kind.__name__}, got bool")
        if not isinstance(value, ok):
            raise TypeError(f"expected {kind.__name__}, got {type(value).__name__}")
        return kind(value)

    return structure


def _scalar_keyed(cl: Any) -> bool:
    """A mapping type whose keys JSON writes as the text of a number or bool: ``dict[int,
    X]``, ``dict[float, X]``, ``dict[bool, X]`` or keyed by an enum of such values."""
    if not is_mapping(cl):
        return False
    args = get_args(cl)
    if not args:
        return False
    key = args[0]
    if key in (int, float, bool):
        return True
    # an enum with number or bool values (its text values, "200" or "true" included, stay
    # text: see _scalar_keyed_mapping)
    return (
        isinstance(key, type)
        and issubclass(key, Enum)
        and any(isinstance(m.value, int | float) for m in key)
    )


def _scalar_key(key: object) -> object:
    """A JSON object key back as the number or bool it was written from (``"7"`` -> 7,
    ``"true"`` -> True); any other text stays text, for the key's strict hook to refuse."""
    if isinstance(key, str):
        try:
            parsed = json.loads(key)
        except ValueError:
            return key
        if isinstance(parsed, int | float):  # bool is an int
            return parsed
    return key


def _scalar_keyed_mapping(cl: Any, converter: BaseConverter) -> Callable[[Any, Any], Any]:
    structure_to = get_origin(cl) or cl
    if structure_to in (Mapping, MutableMapping):
        structure_to = dict  # as cattrs builds them
    inner = mapping_structure_factory(cl, converter, structure_to)
    key = get_args(cl)[0]
    # an enum's own text values are keys as they are ("200" of a member whose value is "200")
    texts = (
        frozenset(m.value for m in key if isinstance(m.value, str))
        if isinstance(key, type) and issubclass(key, Enum)
        else frozenset()
    )

    def structure(value: Any, _: Any) -> Any:
        if isinstance(value, Mapping):
            value = {k if k in texts else _scalar_key(k): v for k, v in value.items()}
        return inner(value, cl)

    return structure


def strict_converter() -> JsonConverter:
    """A cattrs JSON converter that structures ``str``, ``int``, ``float`` and ``bool`` fields
    only from JSON values of that type (cattrs' default would turn ``123`` into ``"123"`` and
    ``true`` into ``1``). An ``int`` is accepted where a ``float`` is expected. Mapping keys
    are the exception JSON forces: an object key is always text, so the keys of ``dict[int,
    X]``, ``dict[float, X]``, ``dict[bool, X]`` (or an enum of such values) are read back from
    the text JSON wrote for them (``"7"`` -> 7; ``"7.5"`` is no ``int``). Unknown keys are
    ignored, so producers can add fields before every worker is upgraded. ``UUID``,
    ``Decimal`` and ``datetime.time`` are written as their text, ``timedelta`` as seconds
    (exact to the microsecond up to about 285 years), and read back from that (a
    ``Decimal`` from text or an int only: a JSON float would bring its binary rounding)."""
    converter = make_converter()
    converter.register_structure_hook(str, _strict(str))
    converter.register_structure_hook(int, _strict(int))
    converter.register_structure_hook(float, _strict(float, int, float))
    converter.register_structure_hook(bool, _strict(bool))
    converter.register_structure_hook_factory(_scalar_keyed, _scalar_keyed_mapping)
    # cattrs zips a fixed-length tuple with its annotation, dropping any extra items
    converter.register_unstructure_hook_factory(_fixed_tuple, _fixed_tuple_unstructure)
    # common value types JSON has no form for: text (or seconds) that reads back exactly
    converter.register_unstructure_hook(UUID, str)
    converter.register_structure_hook(UUID, _from_text(UUID))
    converter.register_unstructure_hook(Decimal, str)
    converter.register_structure_hook(Decimal, _decimal)
    converter.register_unstructure_hook(time, time.isoformat)
    converter.register_structure_hook(time, _from_text(time.fromisoformat))
    converter.register_unstructure_hook(timedelta, timedelta.total_seconds)
    converter.register_structure_hook(timedelta, _timedelta)
    return converter


def _fixed_tuple(cl: Any) -> bool:
    """``tuple[X, Y]`` (a fixed number of items), not ``tuple[X, ...]`` or a bare tuple."""
    args = get_args(cl)
    return get_origin(cl) is tuple and bool(args) and args[-1] is not Ellipsis


def _fixed_tuple_unstructure(cl: Any, converter: BaseConverter) -> Callable[[Any], Any]:
    args = get_args(cl)

    def unstructure(value: Any) -> list[Any]:
        items = list(value)
        if len(items) != len(args):
            raise ValueError(
                f"{len(items)} items where {str(cl).replace('typing.', '')} holds exactly "
                f"{len(args)}"
            )
        return [
            converter.unstructure(v, unstructure_as=a) for v, a in zip(items, args, strict=True)
        ]

    return unstructure


def _from_text(parse: Callable[[str], Any]) -> Any:
    def structure(value: Any, _: Any) -> Any:
        if not isinstance(value, str):
            raise TypeError(f"expected text, got {type(value).__name__}")
        return parse(value)

    return structure


def _decimal(value: Any, _: Any) -> Decimal:
    # text (exact), or an int; a JSON float would carry its binary rounding into the Decimal
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise TypeError(f"expected a decimal as text, got {type(value).__name__}")
    try:
        return Decimal(value)
    except InvalidOperation:
        raise ValueError(f"{value!r} is not a decimal number") from None


def _timedelta(value: Any, _: Any) -> timedelta:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"expected seconds, got {type(value).__name__}")
    return timedelta(seconds=value)


_DEFAULT_CONVERTER: JsonConverter = strict_converter()


def _is_type(value: object) -> bool:
    """A class, or a typing form cattrs can structure into (``list[int]``, ``A | None``,
    ``Literal[...]``, ``Annotated[...]``, ``Any``, a ``NewType``)."""
    if isinstance(value, type) or value is Any:
        return True
    if get_origin(value) is not None:
        return True
    alias = getattr(typing, "TypeAliasType", None)  # `type X = ...` (Python 3.12+)
    if alias is not None and isinstance(value, alias):
        return True
    return isinstance(value, NewType | TypeVar)


class JsonCodec(Generic[T]):
    """Payloads of type ``T`` (dataclasses, attrs classes, builtins) as JSON via cattrs.

    ``JsonCodec(Order)`` structures decoded JSON into ``Order``; pass ``converter`` to use a
    customised :class:`cattrs.preconf.json.JsonConverter` (configure it fully before sharing:
    a converter is safe for concurrent use once its hooks are registered). The default
    converter is strict about primitive fields (see :func:`strict_converter`): ``{"to": 123}``
    does not decode into a ``str`` field. ``JsonCodec(Order)`` must be given the type: a codec
    class is not a codec (pass ``JsonCodec(Order)``, not ``JsonCodec``).

    ``encode`` refuses (:class:`EncodeError`) what JSON would not carry intact: a value that
    would not decode back into ``T``, a fixed-length tuple with another number of items
    (``(1, 2, 3)`` for ``tuple[int, int]``; checked by the default converter, so build a custom
    one from :func:`strict_converter`), two mapping keys JSON would write as one (``1`` and
    ``"1"``), and NaN or infinite floats (not JSON).
    """

    __slots__ = ("_converter", "_type")

    def __init__(self, type_: type[T], *, converter: JsonConverter | None = None) -> None:
        if converter is not None and not isinstance(converter, JsonConverter):
            raise ValidationError("converter must be a cattrs.preconf.json.JsonConverter")
        if not _is_type(type_):
            raise ValidationError(
                f"JsonCodec needs the payload's type, got {type(type_).__name__} value "
                f"{type_!r}: pass the class, as in JsonCodec(Email), or a typing form "
                "(list[int], dict[str, Email], Email | None)"
            )
        self._type = type_
        self._converter = converter if converter is not None else _DEFAULT_CONVERTER

    @property
    def type(self) -> Any:
        """The payload type this codec structures into."""
        return self._type

    def encode(self, value: T) -> bytes:
        """JSON of ``value``, checked to decode back into the codec's type: a payload whose
        fields do not match their annotations (a plain dataclass does not check them) is an
        :class:`EncodeError` here, not a message every consumer would fail to decode."""
        try:
            # two keys that JSON would write as one (1 and "1") are refused, not merged
            _check_source_keys(value, self._converter)
            data = self._converter.dumps(value, unstructure_as=self._type, allow_nan=False).encode(
                "utf-8"
            )
        except Exception as exc:
            raise EncodeError(
                f"cannot encode {type(value).__name__} as JSON: {describe_error(exc)}"
            ) from exc
        try:
            self._converter.loads(data, self._type)
        except Exception as exc:
            raise EncodeError(
                f"{type(value).__name__} would not decode as a {self._type_name()}: "
                f"{describe_error(exc)}"
            ) from exc
        return data

    def decode(self, data: bytes) -> T:
        try:
            result: T = self._converter.loads(bytes(data), self._type)
        except Exception as exc:  # JSON syntax, or cattrs' ClassValidationError (a group)
            raise DecodeError(
                f"payload is not a valid {self._type_name()}: {describe_error(exc)}"
            ) from exc
        return result

    def _type_name(self) -> str:
        return getattr(self._type, "__name__", repr(self._type))

    def __repr__(self) -> str:
        return f"JsonCodec({self._type_name()})"


def _json_key(key: object) -> str:
    """The text ``json.dumps`` writes for a mapping key (what it refuses, it refuses later)."""
    if isinstance(key, str):
        return key
    if key is True or key is False or key is None or isinstance(key, int | float):
        return json.dumps(key)
    return repr(key)


_LEAVES = frozenset({str, int, float, bool, type(None), bytes})
"""Types that hold no mapping: skipped by the key-collision walks without further checks."""


def _check_source_keys(value: object, converter: JsonConverter) -> None:
    """Raise ValueError if a mapping anywhere in ``value`` (inside lists, sets, dataclasses
    and attrs classes too) has two keys that unstructure to the same JSON key text
    (``{Color.RED: 1, 1: 2}`` with ``Color.RED.value == 1``): the unstructured copy would hold
    only one of them, too late to tell."""
    stack: list[Any] = [value]
    seen_ids: set[int] = set()
    leaves = _LEAVES
    while stack:
        item = stack.pop()
        kind = type(item)
        if kind in leaves:
            continue
        if kind is list or kind is tuple:  # the common containers, without the ABC checks
            if id(item) not in seen_ids:
                seen_ids.add(id(item))
                stack.extend([x for x in item if type(x) not in leaves])
            continue
        if id(item) in seen_ids:
            continue
        if kind is dict and all(type(k) is str for k in item):
            seen_ids.add(id(item))
            stack.extend([x for x in item.values() if type(x) not in leaves])
            continue
        if isinstance(item, Mapping):
            seen_ids.add(id(item))
            if not all(type(k) is str for k in item):
                texts: dict[str, object] = {}
                plain: dict[object, object] = {}
                for key in item:
                    unstructured = converter.unstructure(key)
                    text = _json_key(unstructured)
                    if text in texts:
                        raise ValueError(
                            f"keys {texts[text]!r} and {key!r} would both be the JSON key {text!r}"
                        )
                    texts[text] = key
                    # unstructured values Python takes for one key (1 == 1.0 == True) merge
                    # before JSON writes them
                    try:
                        other = plain.setdefault(unstructured, key)
                    except TypeError:
                        continue  # unhashable: cattrs cannot use it as a key either
                    if other is not key:
                        raise ValueError(
                            f"keys {other!r} and {key!r} would merge into one JSON key "
                            f"({unstructured!r})"
                        )
            stack.extend(item.values())
        elif isinstance(item, list | tuple | set | frozenset):
            seen_ids.add(id(item))
            stack.extend(item)
        elif dataclasses.is_dataclass(item) and not isinstance(item, type):
            seen_ids.add(id(item))
            stack.extend(getattr(item, f.name, None) for f in dataclasses.fields(item))
        elif attrs.has(type(item)):
            seen_ids.add(id(item))
            stack.extend(getattr(item, a.name, None) for a in attrs.fields(cast(Any, type(item))))


def _check_object_keys(value: object) -> None:
    """Raise ValueError if a mapping in ``value`` has two keys JSON writes alike."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            if not all(type(k) is str for k in item):
                seen: dict[str, object] = {}
                for key in item:
                    text = _json_key(key)
                    if text in seen:
                        raise ValueError(
                            f"keys {seen[text]!r} and {key!r} would both be the JSON key {text!r}"
                        )
                    seen[text] = key
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)


class JsonValueCodec:
    """Plain JSON values: ``encode`` unstructures with cattrs first, so dataclasses, attrs
    classes, enums, datetimes, sets and tuples become JSON objects, strings and arrays;
    ``decode`` returns what JSON holds (dicts, lists, str, int, float, bool, None). The default
    result codec of job workers."""

    __slots__ = ("_converter",)

    def __init__(self, *, converter: JsonConverter | None = None) -> None:
        self._converter = converter if converter is not None else _DEFAULT_CONVERTER

    def encode(self, value: object) -> bytes:
        """JSON of ``value`` unstructured. Raises :class:`EncodeError` for what JSON cannot
        hold, and for a mapping whose keys would collide as JSON object keys (``{1: "a",
        "1": "b"}``, ``{True: 1, "true": 2}``): JSON would keep only one of them."""
        try:
            _check_source_keys(value, self._converter)
            plain = self._converter.unstructure(value)
            _check_object_keys(plain)
            return json.dumps(plain, ensure_ascii=False, allow_nan=False).encode("utf-8")
        except Exception as exc:
            raise EncodeError(
                f"cannot encode {type(value).__name__} as JSON: {describe_error(exc)}"
            ) from exc

    def decode(self, data: bytes) -> Any:
        try:
            return json.loads(bytes(data))
        except Exception as exc:
            raise DecodeError(f"not a JSON value: {safe_str(exc)}") from exc

    def __repr__(self) -> str:
        return "JsonValueCodec()"


def check_codec(codec: object, *, what: str = "codec") -> None:
    """Raise :class:`ValidationError` unless ``codec`` is a codec instance: an object with
    callable ``encode`` and ``decode`` (a codec class, ``None`` or a plain value is not)."""
    if isinstance(codec, type):
        example = "JsonCodec(Email)" if codec is JsonCodec else f"{codec.__name__}()"
        raise ValidationError(f"{what} must be a codec instance, not the class: pass {example}")
    if not callable(getattr(codec, "encode", None)) or not callable(getattr(codec, "decode", None)):
        raise ValidationError(
            f"{what} must have encode(value) -> bytes and decode(bytes) -> value, "
            f"got {type(codec).__name__}"
        )


def encode_with(codec: Codec[Any], value: object, *, limit: int | None = None) -> bytes:
    """Encode ``value`` at a queue boundary: anything the codec raises becomes an
    :class:`EncodeError`, and a codec that returns something other than bytes (``bytearray``
    and ``memoryview`` are copied) raises one too, so nothing malformed reaches Redis. With
    ``limit``, an encoding longer than that many bytes raises :class:`PayloadTooLarge`."""
    try:
        data = codec.encode(value)
    except EncodeError:
        raise
    except Exception as exc:
        raise EncodeError(f"the codec could not encode the value: {describe_error(exc)}") from exc
    if not isinstance(data, bytes | bytearray | memoryview):
        raise EncodeError(f"the codec returned {type(data).__name__}, not bytes")
    if limit is not None and len(data) > limit:
        raise PayloadTooLarge(
            f"the encoded payload is {len(data):,} bytes, over this client's max_payload_bytes "
            f"({limit:,}); nothing was sent. Store large data elsewhere and send a reference "
            "to it (or raise max_payload_bytes up to the server's proto-max-bulk-len)",
            size=len(data),
            limit=limit,
        )
    return bytes(data)


def decode_with(codec: Codec[T], data: bytes) -> T:
    """Decode ``data``; anything the codec raises becomes a :class:`DecodeError`."""
    try:
        return codec.decode(data)
    except DecodeError:
        raise
    except Exception as exc:
        raise DecodeError(f"the codec could not decode the payload: {describe_error(exc)}") from exc


__all__ = [
    "BytesCodec",
    "Codec",
    "CodecError",
    "DecodeError",
    "EncodeError",
    "PayloadTooLarge",
    "JsonCodec",
    "JsonValueCodec",
    "StrCodec",
    "check_codec",
    "decode_with",
    "encode_with",
    "strict_converter",
]
