"""The registry of chaos scenarios, in seed 004's order. Each module defines one class
implementing :class:`respire_actors.chaos.model.Scenario`; add it to ``SCENARIOS`` here."""

from __future__ import annotations

from ..model import Scenario

SCENARIOS: dict[str, type[Scenario]] = {}


def register(cls: type[Scenario]) -> type[Scenario]:
    """Class decorator: add a scenario to the registry under its ``name``."""
    if cls.name in SCENARIOS:
        raise ValueError(f"two chaos scenarios are named {cls.name!r}")
    SCENARIOS[cls.name] = cls
    return cls


def load_all() -> dict[str, type[Scenario]]:
    """Import every scenario module (they register themselves) and return the registry."""
    import importlib
    import pkgutil

    for module in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{module.name}")
    return dict(SCENARIOS)
