"""The public surface: everything in ``__all__`` exists, and nothing public is left out."""

from __future__ import annotations

import importlib

import pytest

PACKAGES = [
    "respire_actors",
    "respire_actors.jobs",
    "respire_actors.reliable",
    "respire_actors.streams",
    "respire_actors.redis",
]


@pytest.mark.parametrize("name", PACKAGES)
def test_all_names_exist_and_are_unique(name: str) -> None:
    module = importlib.import_module(name)
    exported = module.__all__
    assert len(exported) == len(set(exported))
    missing = [n for n in exported if not hasattr(module, n)]
    assert not missing


@pytest.mark.parametrize(
    "public",
    [
        "JobQueue",
        "Worker",
        "WorkerOptions",
        "ReliableQueue",
        "ReliableTopic",
        "StreamWorker",
        "StreamWorkerOptions",
        "connect",
        "open_embedded_server",
        "ValidationError",
        "__version__",
    ],
)
def test_top_level_exports_the_main_entry_points(public: str) -> None:
    import respire_actors

    assert public in respire_actors.__all__


def test_top_level_exports_every_public_class_of_its_modules() -> None:
    import respire_actors

    for name in dir(respire_actors):
        obj = getattr(respire_actors, name)
        if name.startswith("_") or not isinstance(obj, type):
            continue
        assert name in respire_actors.__all__, f"{name} is importable but not in __all__"
