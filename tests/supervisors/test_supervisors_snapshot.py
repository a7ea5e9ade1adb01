"""Snapshots of the tree and their text rendering."""

from __future__ import annotations

import dataclasses

import anyio
import pytest
from supervisors_helpers import FakeClock, Recorder, settle, start_supervisor

from supervisors import (
    Backoff,
    ChildSnapshot,
    ChildSpec,
    Restart,
    RunState,
    Strategy,
    Supervisor,
    SupervisorSnapshot,
    render_snapshot,
)

pytestmark = pytest.mark.anyio


def test_snapshot_of_a_supervisor_that_never_ran(rec: Recorder) -> None:
    sup = Supervisor(
        "root", [ChildSpec("a", rec.child, "a")], strategy=Strategy.ONE_FOR_ALL, max_restarts=4
    )
    snapshot = sup.snapshot()
    assert (snapshot.name, snapshot.strategy, snapshot.state) == (
        "root",
        Strategy.ONE_FOR_ALL,
        RunState.STOPPED,
    )
    assert (snapshot.max_restarts, snapshot.period, snapshot.restarts_in_period) == (4, 5.0, 0)
    assert snapshot.children == (
        ChildSnapshot("a", RunState.STOPPED, Restart.PERMANENT, 0, None, None, None),
    )


async def test_snapshot_of_a_running_tree(rec: Recorder, clock: FakeClock) -> None:
    inner = Supervisor(
        "inner", [ChildSpec("x", rec.child, "x", restart=Restart.TRANSIENT)], clock=clock
    )
    root = Supervisor(
        "root",
        [ChildSpec("a", rec.child, "a"), inner.child_spec()],
        strategy=Strategy.REST_FOR_ONE,
        clock=clock,
    )
    async with anyio.create_task_group() as tg:
        await tg.start(root.run)
        started = clock.now
        clock.advance(2.5)
        snapshot = root.snapshot()
        await root.stop()
    assert snapshot.state is RunState.RUNNING
    assert snapshot.strategy is Strategy.REST_FOR_ONE
    assert snapshot.taken_at == started + 2.5
    a, nested = snapshot.children
    assert a == ChildSnapshot("a", RunState.RUNNING, Restart.PERMANENT, 0, None, started, None)
    assert nested.name == "inner"
    assert nested.supervisor is not None
    assert nested.supervisor.children == (
        ChildSnapshot("x", RunState.RUNNING, Restart.TRANSIENT, 0, None, started, None),
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        snapshot.name = "changed"  # type: ignore[misc]
    assert isinstance(snapshot.children, tuple)


async def test_snapshot_shows_a_pending_restart_and_stop_does_not_wait_for_it(
    rec: Recorder,
) -> None:
    sup = Supervisor(
        "sup",
        [ChildSpec("a", rec.child, "a")],
        backoff=Backoff(initial=60, maximum=60, jitter=0),
    )
    async with anyio.create_task_group() as tg:
        await start_supervisor(tg, sup)
        rec.crash("a")
        await rec.wait_for("crash:a")
        await settle()
        snapshot = sup.snapshot()
        assert snapshot.restarts_in_period == 1
        child = snapshot.children[0]
        assert (child.state, child.last_error, child.started_at) == (
            RunState.RESTARTING,
            "Crash('a crashed')",
            None,
        )
        with anyio.fail_after(1):  # the 60 s backoff is abandoned
            await sup.stop()
    assert rec.count("start:a") == 1
    assert sup.snapshot().children[0].state is RunState.STOPPED


def _example() -> SupervisorSnapshot:
    inner = SupervisorSnapshot(
        name="workers",
        strategy=Strategy.ONE_FOR_ALL,
        state=RunState.RUNNING,
        max_restarts=3,
        period=5.0,
        restarts_in_period=1,
        taken_at=100.0,
        children=(
            ChildSnapshot("w1", RunState.RUNNING, Restart.TRANSIENT, 2, None, 98.0),
            ChildSnapshot("w2", RunState.RESTARTING, Restart.PERMANENT, 1, "ValueError('x')", None),
        ),
    )
    return SupervisorSnapshot(
        name="root",
        strategy=Strategy.ONE_FOR_ONE,
        state=RunState.RUNNING,
        max_restarts=3,
        period=5.0,
        restarts_in_period=0,
        taken_at=100.0,
        children=(
            ChildSnapshot("db", RunState.RUNNING, Restart.PERMANENT, 0, None, 12.5),
            ChildSnapshot("workers", RunState.RUNNING, Restart.PERMANENT, 1, None, 90.0, inner),
            ChildSnapshot("audit", RunState.STOPPED, Restart.TEMPORARY, 0, None, None),
        ),
    )


def test_render_snapshot_draws_an_aligned_tree() -> None:
    expected = "\n".join(
        [
            "NAME         STATE       RESTARTS   UPTIME  DETAIL",
            "root         running     0/3 in 5s          one_for_one",
            "├── db       running     0          1m27s   permanent",
            "├── workers  running     1          10.0s   "
            "permanent, one_for_all supervisor, 1/3 restarts in 5s",
            "│   ├── w1   running     2          2.0s    transient",
            "│   └── w2   restarting  1          -       permanent  last error: ValueError('x')",
            "└── audit    stopped     0          -       temporary",
        ]
    )
    assert render_snapshot(_example()) == expected


def test_render_snapshot_formats_long_uptimes() -> None:
    snapshot = dataclasses.replace(
        _example(),
        children=(ChildSnapshot("old", RunState.RUNNING, Restart.PERMANENT, 0, None, -3600.0),),
    )
    assert render_snapshot(snapshot).splitlines()[2].split()[4] == "1h01m"


async def test_render_a_live_tree(rec: Recorder) -> None:
    inner = Supervisor("inner", [ChildSpec("x", rec.child, "x")])
    root = Supervisor("root", [ChildSpec("a", rec.child, "a"), inner.child_spec()])
    async with anyio.create_task_group() as tg:
        await tg.start(root.run)
        text = render_snapshot(root.snapshot())
        await root.stop()
    lines = text.splitlines()
    assert lines[1].startswith("root ")
    assert lines[2].startswith("├── a ")
    assert lines[3].startswith("└── inner ")
    assert lines[4].startswith("    └── x ")
    assert all(" running " in line for line in lines[1:])
