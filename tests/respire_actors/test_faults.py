"""Fault-injection points (respire_actors/faults.py): off unless armed, fire once on their hit,
and sit where the chaos suite needs them (checked here with the ``raise`` action against a
real server: the reliable queue's ack runs before ``reliable.after-ack`` fires)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from respire_actors import faults
from respire_actors.codecs import StrCodec
from respire_actors.redis.client import RedisClient
from respire_actors.reliable import ReliableQueue


@pytest.fixture(autouse=True)
def disarmed() -> Iterator[None]:
    faults.disarm()
    yield
    faults.disarm()


def test_an_unarmed_point_does_nothing() -> None:
    for name in faults.POINTS:
        faults.point(name)
    assert faults._armed is None


def test_a_point_fires_once_on_its_hit_then_disarms() -> None:
    faults.arm("completer.before-commit:raise:2")
    faults.point("completer.after-commit")  # another point: not counted
    faults.point("completer.before-commit")  # first call: not yet
    with pytest.raises(faults.FaultInjected, match=r"completer\.before-commit"):
        faults.point("completer.before-commit")
    faults.point("completer.before-commit")  # fired once: disarmed
    assert faults._armed is None


def test_arming_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    faults.arm_from_environment()
    assert faults._armed is None
    monkeypatch.setenv(
        faults.ENVIRONMENT_VARIABLE, "reliable.before-ack:raise, promoter.after-promote:kill"
    )
    faults.arm_from_environment()
    assert faults._armed is not None and set(faults._armed) == {
        "reliable.before-ack",
        "promoter.after-promote",
    }


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("completer.nowhere:kill", "unknown fault point"),
        ("completer.after-commit:explode", "unknown fault action"),
        ("completer.after-commit", "unknown fault action"),
        ("completer.after-commit:kill:0", "bad hit count"),
        ("completer.after-commit:kill:x", "bad hit count"),
    ],
)
def test_a_bad_spec_is_refused_and_arms_nothing(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        faults.arm(spec)
    assert faults._armed is None


@pytest.mark.anyio
async def test_reliable_ack_points_sit_before_and_after_the_ack_script(
    client: RedisClient, unique_name: str
) -> None:
    queue = ReliableQueue(client, unique_name, StrCodec())
    await queue.send("a")
    await queue.send("b")
    first, second = await queue.receive(30, max=2)
    faults.arm("reliable.before-ack:raise")
    with pytest.raises(faults.FaultInjected):
        await queue.ack(first)
    faults.arm("reliable.after-ack:raise")
    with pytest.raises(faults.FaultInjected):
        await queue.ack(second)
    # before-ack: nothing was sent, the ack still works; after-ack: it had already run
    assert await queue.ack(first) is True
    assert await queue.ack(second) is False


def test_a_fault_armed_with_a_predicate_counts_only_its_subjects() -> None:
    faults.arm("completer.after-commit:raise", when=lambda batch: batch == ["mine"])
    faults.point("completer.after-commit", ["another job's batch"])  # not counted
    with pytest.raises(faults.FaultInjected):
        faults.point("completer.after-commit", ["mine"])
    assert faults._armed is None
