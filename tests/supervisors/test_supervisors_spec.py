"""Validation of child specs and supervisor arguments."""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import pytest

from supervisors import Backoff, ChildSpec, Restart, Strategy, Supervisor


async def child(*args: Any, task_status: Any) -> None:
    task_status.started()


def test_spec_packs_fn_and_args_with_keyword_only_options() -> None:
    spec = ChildSpec("worker", child, 1, "two", restart=Restart.TRANSIENT, shutdown=2)
    assert spec.name == "worker"
    assert spec.fn is child
    assert spec.args == (1, "two")
    assert spec.restart is Restart.TRANSIENT
    assert spec.shutdown == 2.0
    assert isinstance(spec.shutdown, float)


def test_spec_defaults_are_permanent_and_five_seconds() -> None:
    spec = ChildSpec("worker", child)
    assert spec.args == ()
    assert spec.restart is Restart.PERMANENT
    assert spec.shutdown == 5.0


def test_spec_is_frozen_and_comparable() -> None:
    spec = ChildSpec("worker", child, 1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.name = "other"  # type: ignore[misc]
    assert spec == ChildSpec("worker", child, 1)
    assert spec != ChildSpec("worker", child, 2)


def test_spec_accepts_partial_and_infinite_shutdown() -> None:
    spec = ChildSpec("w", functools.partial(child, 1), shutdown=math.inf)
    assert spec.shutdown == math.inf


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"name": 3}, TypeError, "ChildSpec name must be a str, got 3"),
        ({"name": ""}, ValueError, "ChildSpec name must not be empty"),
        ({"fn": "child"}, TypeError, "ChildSpec 'w': fn must be an async callable, got 'child'"),
        (
            {"restart": "permanent"},
            TypeError,
            "ChildSpec 'w': restart must be a supervisors.Restart, got 'permanent'",
        ),
        ({"shutdown": -1}, ValueError, "ChildSpec 'w': shutdown must be >= 0 seconds, got -1"),
        (
            {"shutdown": math.nan},
            ValueError,
            "ChildSpec 'w': shutdown must be a number of seconds, got nan",
        ),
        (
            {"shutdown": "5"},
            TypeError,
            "ChildSpec 'w': shutdown must be a number of seconds, got '5'",
        ),
        (
            {"shutdown": True},
            TypeError,
            "ChildSpec 'w': shutdown must be a number of seconds, got True",
        ),
    ],
)
def test_spec_rejects_bad_fields_precisely(
    kwargs: dict[str, Any], error: type[Exception], message: str
) -> None:
    name = kwargs.pop("name", "w")
    fn = kwargs.pop("fn", child)
    with pytest.raises(error) as info:
        ChildSpec(name, fn, **kwargs)
    assert str(info.value) == message


def test_supervisor_rejects_duplicate_child_names() -> None:
    with pytest.raises(ValueError, match="Supervisor 'root': duplicate child name 'a'"):
        Supervisor("root", [ChildSpec("a", child), ChildSpec("a", child)])


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "match"),
    [
        ((1,), {}, TypeError, "Supervisor name must be a str, got 1"),
        (("",), {}, ValueError, "Supervisor name must not be empty"),
        (("s", [child]), {}, TypeError, "children must be ChildSpec instances"),
        (("s",), {"strategy": "one_for_one"}, TypeError, "strategy must be a supervisors.Strategy"),
        (("s",), {"max_restarts": -1}, ValueError, "max_restarts must be >= 0, got -1"),
        (("s",), {"max_restarts": 1.5}, TypeError, "max_restarts must be an int, got 1.5"),
        (("s",), {"period": 0}, ValueError, "period must be > 0 seconds, got 0"),
        (("s",), {"period": math.inf}, ValueError, "period must be finite"),
        (("s",), {"backoff": 0.1}, TypeError, "backoff must be a supervisors.Backoff or None"),
    ],
)
def test_supervisor_rejects_bad_arguments(
    args: tuple[Any, ...], kwargs: dict[str, Any], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        Supervisor(*args, **kwargs)


def test_supervisor_accepts_no_backoff_and_zero_restarts() -> None:
    sup = Supervisor("s", [], strategy=Strategy.REST_FOR_ONE, max_restarts=0, backoff=None)
    assert sup.name == "s"
    assert sup.strategy is Strategy.REST_FOR_ONE


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"initial": -0.1}, "Backoff initial must be >= 0, got -0.1"),
        ({"factor": 0.5}, "Backoff factor must be >= 1, got 0.5"),
        ({"initial": 2.0, "maximum": 1.0}, r"Backoff maximum must be >= initial \(2.0\), got 1.0"),
        ({"jitter": 1.5}, r"Backoff jitter must be within \[0, 1\], got 1.5"),
        ({"reset_after": 0}, "Backoff reset_after must be > 0, got 0.0"),
        ({"maximum": math.inf}, "Backoff maximum must be finite"),
    ],
)
def test_backoff_rejects_bad_fields(kwargs: dict[str, float], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Backoff(**kwargs)


def test_backoff_rejects_non_numbers() -> None:
    with pytest.raises(TypeError, match="Backoff initial must be a number of seconds"):
        Backoff(initial="1")  # type: ignore[arg-type]


def test_child_spec_of_a_supervisor_waits_for_it_by_default() -> None:
    sup = Supervisor("inner", [])
    spec = sup.child_spec(restart=Restart.TRANSIENT)
    assert spec.name == "inner"
    assert spec.fn == sup.run
    assert spec.restart is Restart.TRANSIENT
    assert spec.shutdown == math.inf
