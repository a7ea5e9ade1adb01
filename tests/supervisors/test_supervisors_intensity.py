"""Restart intensity: counted across all children, windowed by the injected clock, escalated."""

from __future__ import annotations

import logging

import anyio
import pytest
from supervisors_helpers import Crash, FakeClock, Recorder, start_supervisor

from supervisors import ChildSpec, RestartIntensityExceeded, RunState, Strategy, Supervisor

pytestmark = pytest.mark.anyio


async def test_restarts_are_counted_across_all_children(rec: Recorder, clock: FakeClock) -> None:
    # Each child crashes only once: a per-child count would never reach 3 > max_restarts=2.
    sup = Supervisor(
        "sup",
        [ChildSpec(n, rec.flaky, n, 1) for n in "abc"],
        max_restarts=2,
        period=60,
        backoff=None,
        clock=clock,
    )
    with pytest.raises(RestartIntensityExceeded) as info:
        await sup.run()
    error = info.value
    assert (error.supervisor, error.child, error.max_restarts, error.period) == ("sup", "c", 2, 60)
    assert isinstance(error.__cause__, Crash)
    assert str(error.__cause__) == "c crashed on run 0"
    # a and b were restarted and healthy; they are stopped in reverse order when giving up.
    assert rec.events[-2:] == ["stop:b", "stop:a"]
    assert rec.count("start:c") == 1
    assert sup.state is RunState.FAILED
    states = {c.name: c.state for c in sup.snapshot().children}
    assert states == {"a": RunState.STOPPED, "b": RunState.STOPPED, "c": RunState.FAILED}


async def test_restarts_older_than_the_period_are_forgotten(
    rec: Recorder, clock: FakeClock
) -> None:
    sup = Supervisor(
        "sup",
        [ChildSpec("a", rec.child, "a")],
        max_restarts=1,
        period=10,
        backoff=None,
        clock=clock,
    )
    async with anyio.create_task_group() as tg:
        running = await start_supervisor(tg, sup)
        for n in range(2, 6):
            rec.crash("a")
            await rec.wait_for("ready:a", n)
            assert sup.snapshot().restarts_in_period == 1
            clock.advance(10)  # the previous restart leaves the window
        assert sup.state is RunState.RUNNING
        rec.crash("a")
        await rec.wait_for("ready:a", 6)
        rec.crash("a")  # second restart within 10 s: more than max_restarts=1
        await running.wait_finished()
    assert isinstance(running.error, RestartIntensityExceeded)
    assert running.error.child == "a"
    assert rec.count("start:a") == 6


async def test_zero_max_restarts_gives_up_on_the_first_exit(rec: Recorder) -> None:
    sup = Supervisor(
        "sup",
        [ChildSpec("a", rec.child, "a"), ChildSpec("b", rec.flaky, "b", 1)],
        max_restarts=0,
        backoff=None,
    )
    with pytest.raises(RestartIntensityExceeded) as info:
        await sup.run()
    assert info.value.child == "b"
    assert rec.events == ["start:a", "ready:a", "start:b", "crash:b", "stop:a"]


async def test_permanent_child_returning_repeatedly_escalates_without_cause(
    rec: Recorder,
) -> None:
    sup = Supervisor("sup", [ChildSpec("r", rec.returns, "r")], max_restarts=3, backoff=None)
    with pytest.raises(RestartIntensityExceeded) as info:
        await sup.run()
    assert info.value.__cause__ is None
    assert rec.count("start:r") == 4


async def test_restarts_and_escalation_are_logged_with_the_child_name(
    rec: Recorder, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="supervisors")
    sup = Supervisor(
        "sup", [ChildSpec("worker", rec.flaky, "worker", 5)], max_restarts=1, backoff=None
    )
    with pytest.raises(RestartIntensityExceeded):
        await sup.run()
    records = [r for r in caplog.records if r.name == "supervisors"]
    restarts = [r for r in records if r.levelno == logging.WARNING]
    assert len(restarts) == 1
    assert "'worker'" in restarts[0].getMessage()
    assert "restarting" in restarts[0].getMessage()
    assert restarts[0].child == "worker"  # type: ignore[attr-defined]
    assert restarts[0].supervisor == "sup"  # type: ignore[attr-defined]
    escalation = records[-1]
    assert escalation.levelno == logging.ERROR
    assert "giving up" in escalation.getMessage()
    assert escalation.child == "worker"  # type: ignore[attr-defined]


async def test_one_for_all_group_restart_counts_once(rec: Recorder, clock: FakeClock) -> None:
    sup = Supervisor(
        "sup",
        [ChildSpec(n, rec.child, n) for n in "abcd"],
        strategy=Strategy.ONE_FOR_ALL,
        max_restarts=1,
        period=10,
        backoff=None,
        clock=clock,
    )
    async with anyio.create_task_group() as tg:
        await start_supervisor(tg, sup)
        rec.crash("b")
        await rec.wait_for("ready:d", 2)
        assert sup.snapshot().restarts_in_period == 1
        assert sup.state is RunState.RUNNING
        await sup.stop()
