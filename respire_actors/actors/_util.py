"""Reply parsing shared by the actors."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def field_map(flat: Sequence[Any] | Mapping[Any, Any] | None) -> dict[bytes, bytes]:
    if not flat:
        return {}
    if isinstance(flat, Mapping):
        return {_b(k): _b(v) for k, v in flat.items()}
    return {_b(k): _b(v) for k, v in zip(flat[0::2], flat[1::2], strict=True)}


def _b(value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    return str(value).encode("utf-8")
