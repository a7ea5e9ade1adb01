"""Supervisors as children: start and stop through the tree, escalation to the parent."""

from __future__ import annotations

import anyio
import pytest
from supervisors_helpers import Crash, Recorder, start_supervisor

from supervisors import (
    ChildSpec,
    Restart,
    RestartIntensityExceeded,
    RunState,
    StartError,
    Strategy,
    Supervisor,
)

pytestmark = pytest.mark.anyio


def tree(
    rec: Recorder, *, inner_restarts: int = 0, root_restarts: int = 5, **root: object
) -> Supervisor:
    inner = Supervisor(
        "inner",
        [ChildSpec("x", rec.child, "x"), ChildSpec("y", rec.child, "y")],
        max_restarts=inner_restarts,
        backoff=None,
    )
    return Supervisor(
        "root",
        [ChildSpec("a", rec.child, "a"), inner.child_spec(), ChildSpec("b", rec.child, "b")],
        max_restarts=root_restarts,
        backoff=None,
        **root,  # type: ignore[arg-type]
    )


async def test_nested_tree_starts_depth_first_in_order_and_stops_in_reverse(rec: Recorder) -> None:
    root = tree(rec)
    async with anyio.create_task_group() as tg:
        await tg.start(root.run)
        assert rec.events == [
            "start:a", "ready:a", "start:x", "ready:x", "start:y", "ready:y", "start:b", "ready:b",
        ]  # fmt: skip
        await root.stop()
    assert rec.after("ready:b") == ["stop:b", "stop:y", "stop:x", "stop:a"]
    inner = root.snapshot().children[1].supervisor
    assert inner is not None and inner.state is RunState.STOPPED


async def test_escalation_is_a_failure_of_the_child_handled_by_the_parent(rec: Recorder) -> None:
    root = tree(rec)
    async with anyio.create_task_group() as tg:
        await start_supervisor(tg, root)
        rec.crash("x")  # inner allows no restart: it gives up, and root restarts it (one_for_one)
        await rec.wait_for("ready:y", 2)
        assert rec.after("ready:b") == [
            "crash:x", "stop:y", "start:x", "ready:x", "start:y", "ready:y",
        ]  # fmt: skip
        inner = root.snapshot().children[1]
        assert inner.state is RunState.RUNNING
        assert inner.restart_count == 1
        assert inner.last_error is not None
        assert inner.last_error.startswith("RestartIntensityExceeded(")
        await root.stop()


async def test_escalation_follows_the_parent_strategy(rec: Recorder) -> None:
    root = tree(rec, strategy=Strategy.REST_FOR_ONE)
    async with anyio.create_task_group() as tg:
        await start_supervisor(tg, root)
        rec.crash("y")
        await rec.wait_for("ready:b", 2)
        assert rec.after("ready:b") == [
            "crash:y", "stop:x", "stop:b", "start:x", "ready:x", "start:y", "ready:y",
            "start:b", "ready:b",
        ]  # fmt: skip
        assert rec.count("start:a") == 1
        await root.stop()


async def test_escalation_reaches_the_top_with_the_whole_cause_chain(rec: Recorder) -> None:
    root = tree(rec, root_restarts=0)
    async with anyio.create_task_group() as tg:
        running = await start_supervisor(tg, root)
        rec.crash("x")
        await running.wait_finished()
    error = running.error
    assert isinstance(error, RestartIntensityExceeded)
    assert (error.supervisor, error.child) == ("root", "inner")
    inner_error = error.__cause__
    assert isinstance(inner_error, RestartIntensityExceeded)
    assert (inner_error.supervisor, inner_error.child) == ("inner", "x")
    assert isinstance(inner_error.__cause__, Crash)
    # inner stopped y; root then stopped b and a, in reverse order
    assert rec.after("crash:x") == ["stop:y", "stop:b", "stop:a"]
    assert root.state is RunState.FAILED


async def test_a_nested_start_failure_fails_the_parent_start(rec: Recorder) -> None:
    inner = Supervisor(
        "inner", [ChildSpec("x", rec.child, "x"), ChildSpec("bad", rec.fails_start, "bad")]
    )
    root = Supervisor("root", [ChildSpec("a", rec.child, "a"), inner.child_spec()])
    with pytest.raises(StartError) as info:
        await root.run()
    assert (info.value.supervisor, info.value.child) == ("root", "inner")
    cause = info.value.__cause__
    assert isinstance(cause, StartError)
    assert (cause.supervisor, cause.child) == ("inner", "bad")
    assert rec.after("start:bad") == ["stop:x", "stop:a"]


async def test_parent_deadline_cancels_the_whole_nested_supervisor(rec: Recorder) -> None:
    inner = Supervisor("inner", [ChildSpec("s", rec.stubborn, "s", shutdown=60)])
    root = Supervisor("root", [ChildSpec("a", rec.child, "a"), inner.child_spec(shutdown=0.05)])
    async with anyio.create_task_group() as tg:
        await start_supervisor(tg, root)
        with anyio.fail_after(2):
            await root.stop()
    assert rec.after("start:s") == ["cancelled:s", "stop:a"]


async def test_transient_nested_supervisor_that_stops_normally_is_not_restarted(
    rec: Recorder,
) -> None:
    inner = Supervisor("inner", [ChildSpec("x", rec.child, "x")])
    root = Supervisor(
        "root", [inner.child_spec(restart=Restart.TRANSIENT), ChildSpec("a", rec.child, "a")]
    )
    async with anyio.create_task_group() as tg:
        await start_supervisor(tg, root)
        await inner.stop()  # the nested supervisor returns normally
        await rec.wait_for("stop:x")
        states = {c.name: c.state for c in root.snapshot().children}
        assert states == {"inner": RunState.STOPPED, "a": RunState.RUNNING}
        await root.stop()
    assert rec.count("start:x") == 1
