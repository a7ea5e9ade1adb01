"""The public surface of respire_actors.reliable."""

from __future__ import annotations

import respire_actors.reliable as reliable


def test_public_names_are_exactly_all() -> None:
    public = {n for n in dir(reliable) if not n.startswith("_")}
    modules = {"errors", "iterator", "queue", "topic"}
    assert set(reliable.__all__) == public - modules
    assert len(set(reliable.__all__)) == len(reliable.__all__)
    for name in reliable.__all__:
        value = getattr(reliable, name)
        if isinstance(value, type):
            assert value.__module__.startswith("respire_actors.reliable"), name


def test_public_async_methods_document_cancellation() -> None:
    missing = []
    for cls in (reliable.ReliableQueue, reliable.ReliableTopic, reliable.Subscription):
        for name in dir(cls):
            attr = getattr(cls, name)
            if name.startswith("_") or not callable(attr):
                continue
            is_coroutine = bool(getattr(attr, "__code__", None) and attr.__code__.co_flags & 0x80)
            if is_coroutine and "cancel" not in (attr.__doc__ or "").lower():
                missing.append(f"{cls.__name__}.{name}")
    assert missing == []
