"""Children added and removed while the supervisor runs."""

from __future__ import annotations

import anyio
import anyio.abc
import pytest
from supervisors_helpers import Crash, Recorder, settle, start_supervisor

from supervisors import (
    ChildSpec,
    DuplicateChild,
    RunState,
    StartError,
    Strategy,
    Supervisor,
    UnknownChild,
    current_child,
)

pytestmark = pytest.mark.anyio


async def test_start_child_returns_its_started_value_and_supervises_it(rec: Recorder) -> None:
    sup = Supervisor("sup", [ChildSpec("a", rec.child, "a")], backoff=None)
    async with anyio.create_task_group() as tg:
        await start_supervisor(tg, sup)
        assert await sup.start_child(ChildSpec("d", rec.child, "d")) == "d"
        assert [c.name for c in sup.snapshot().children] == ["a", "d"]
        rec.crash("d")
        await rec.wait_for("ready:d", 2)
        assert sup.snapshot().children[1].restart_count == 1
        await sup.stop()
    assert rec.events[-2:] == ["stop:d", "stop:a"]


async def test_dynamic_children_join_the_rest_for_one_order(rec: Recorder) -> None:
    sup = Supervisor(
        "sup", [ChildSpec("a", rec.child, "a")], strategy=Strategy.REST_FOR_ONE, backoff=None
    )
    async with anyio.create_task_group() as tg:
        await start_supervisor(tg, sup)
        await sup.start_child(ChildSpec("d", rec.child, "d"))
        rec.crash("a")
        await rec.wait_for("ready:d", 2)
        assert rec.after("crash:a") == ["stop:d", "start:a", "ready:a", "start:d", "ready:d"]
        await sup.stop()


async def test_terminate_child_stops_it_gracefully_and_removes_it(rec: Recorder) -> None:
    sup = Supervisor("sup", [ChildSpec(n, rec.child, n) for n in "abc"])
    async with anyio.create_task_group() as tg:
        await start_supervisor(tg, sup)
        await sup.terminate_child("b")
        assert rec.events[-1] == "stop:b"
        assert [c.name for c in sup.snapshot().children] == ["a", "c"]
        with pytest.raises(UnknownChild) as info:
            await sup.terminate_child("b")
        assert (info.value.supervisor, info.value.child) == ("sup", "b")
        await sup.stop()
    assert rec.after("stop:b") == ["stop:c", "stop:a"]


async def test_terminate_child_cancels_a_stubborn_child_at_its_deadline(rec: Recorder) -> None:
    sup = Supervisor("sup", [ChildSpec("s", rec.stubborn, "s", shutdown=0.01)])
    async with anyio.create_task_group() as tg:
        await start_supervisor(tg, sup)
        await sup.terminate_child("s")
        assert rec.events == ["start:s", "cancelled:s"]
        await sup.stop()


async def test_a_cancelled_terminate_child_cancels_the_child_at_once(rec: Recorder) -> None:
    """The caller gives up while the child is still stopping gracefully: the child used to
    keep running unsupervised (gone from the snapshot, no deadline) and stop() then waited
    for it forever."""
    sup = Supervisor("sup", [ChildSpec("s", rec.stubborn, "s", shutdown=30)])
    async with anyio.create_task_group() as tg:
        await start_supervisor(tg, sup)
        with anyio.move_on_after(0.1):
            await sup.terminate_child("s")
        await rec.wait_for("cancelled:s", 1)
        assert sup.snapshot().children == ()
        with anyio.fail_after(5):
            await sup.stop()


async def test_a_child_failing_while_it_stops_is_logged(
    rec: Recorder, caplog: pytest.LogCaptureFixture
) -> None:
    async def fails_on_stop(*, task_status: anyio.abc.TaskStatus[None]) -> None:
        task_status.started()
        await current_child().wait_stop_requested()
        raise Crash("flush failed")

    sup = Supervisor("sup", [ChildSpec("f", fails_on_stop)])
    async with anyio.create_task_group() as tg:
        await start_supervisor(tg, sup)
        await sup.stop()
    (record,) = [r for r in caplog.records if "failed while stopping" in r.getMessage()]
    assert record.levelname == "ERROR" and "flush failed" in record.getMessage()


async def test_start_child_rejects_a_duplicate_name(rec: Recorder) -> None:
    sup = Supervisor("sup", [ChildSpec("a", rec.child, "a")])
    async with anyio.create_task_group() as tg:
        await start_supervisor(tg, sup)
        with pytest.raises(DuplicateChild, match="already has a child named 'a'"):
            await sup.start_child(ChildSpec("a", rec.child, "a"))
        assert rec.count("start:a") == 1
        await sup.stop()


async def test_start_child_failure_raises_and_is_not_kept_nor_counted(rec: Recorder) -> None:
    sup = Supervisor("sup", [ChildSpec("a", rec.child, "a")], max_restarts=0)
    async with anyio.create_task_group() as tg:
        running = await start_supervisor(tg, sup)
        with pytest.raises(StartError) as info:
            await sup.start_child(ChildSpec("bad", rec.fails_start, "bad"))
        assert info.value.child == "bad"
        assert isinstance(info.value.__cause__, Crash)
        await settle()
        assert [c.name for c in sup.snapshot().children] == ["a"]
        assert sup.state is RunState.RUNNING and not running.finished.is_set()
        await sup.stop()


async def test_cancelled_start_child_cancels_the_child_and_drops_it(rec: Recorder) -> None:
    async def hangs(*, task_status: anyio.abc.TaskStatus[None]) -> None:
        rec.record("start:hang")
        try:
            await anyio.sleep_forever()
        finally:
            rec.record("exit:hang")

    sup = Supervisor("sup", [ChildSpec("a", rec.child, "a")])
    async with anyio.create_task_group() as tg:
        await start_supervisor(tg, sup)
        with anyio.CancelScope() as scope:

            async def cancel_once_starting() -> None:
                await rec.wait_for("start:hang")
                scope.cancel()

            tg.start_soon(cancel_once_starting)
            await sup.start_child(ChildSpec("hang", hangs))
        assert scope.cancelled_caught
        await rec.wait_for("exit:hang")
        assert [c.name for c in sup.snapshot().children] == ["a"]
        await sup.stop()


async def test_dynamic_calls_need_a_running_supervisor(rec: Recorder) -> None:
    sup = Supervisor("sup", [ChildSpec("a", rec.child, "a")])
    with pytest.raises(RuntimeError, match="is not running"):
        await sup.start_child(ChildSpec("d", rec.child, "d"))
    with pytest.raises(RuntimeError, match="is not running"):
        await sup.terminate_child("a")
    with pytest.raises(TypeError, match="expects a ChildSpec"):
        await sup.start_child("d")  # type: ignore[arg-type]


async def test_dynamic_children_are_not_kept_across_runs(rec: Recorder) -> None:
    sup = Supervisor("sup", [ChildSpec("a", rec.child, "a")])
    async with anyio.create_task_group() as tg:
        await tg.start(sup.run)
        await sup.start_child(ChildSpec("d", rec.child, "d"))
        await sup.stop()
        await tg.start(sup.run)
        assert [c.name for c in sup.snapshot().children] == ["a"]
        await sup.stop()
    assert rec.count("start:d") == 1
