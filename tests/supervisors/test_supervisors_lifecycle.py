"""Ordered start, reverse-order graceful shutdown with deadlines, start failures, cancellation."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
from anyio.abc import TaskStatus
from supervisors_helpers import Crash, Recorder, settle, start_supervisor

from supervisors import (
    ChildSpec,
    RestartIntensityExceeded,
    RunState,
    StartError,
    Supervisor,
    current_child,
)

pytestmark = pytest.mark.anyio


async def slow_to_start(
    rec: Recorder, name: str, *, task_status: TaskStatus[str] = anyio.TASK_STATUS_IGNORED
) -> None:
    """Yields to the scheduler several times before it is ready."""
    rec.record(f"start:{name}")
    for _ in range(5):
        await anyio.lowlevel.checkpoint()
    rec.record(f"ready:{name}")
    task_status.started(name)
    await current_child().wait_stop_requested()
    rec.record(f"stop:{name}")


async def test_children_start_in_order_each_after_the_previous_is_ready(rec: Recorder) -> None:
    sup = Supervisor("sup", [ChildSpec(n, slow_to_start, rec, n) for n in "abc"])
    async with anyio.create_task_group() as tg:
        await tg.start(sup.run)
        # start() returned: every child is ready, and each started after the previous was.
        assert rec.events == ["start:a", "ready:a", "start:b", "ready:b", "start:c", "ready:c"]
        assert sup.state is RunState.RUNNING
        assert [c.state for c in sup.snapshot().children] == [RunState.RUNNING] * 3
        await sup.stop()


async def test_stop_is_graceful_and_in_reverse_order(rec: Recorder) -> None:
    sup = Supervisor("sup", [ChildSpec(n, rec.child, n) for n in "abc"])
    async with anyio.create_task_group() as tg:
        running = await start_supervisor(tg, sup)
        await sup.stop()
        assert running.finished.is_set()
    assert rec.after("ready:c") == ["stop:c", "stop:b", "stop:a"]
    assert running.returned and running.error is None
    assert sup.state is RunState.STOPPED
    assert [c.state for c in sup.snapshot().children] == [RunState.STOPPED] * 3


async def test_request_stop_does_not_wait_and_is_idempotent(rec: Recorder) -> None:
    sup = Supervisor("sup", [ChildSpec("a", rec.child, "a")])
    async with anyio.create_task_group() as tg:
        running = await start_supervisor(tg, sup)
        sup.request_stop()
        sup.request_stop()
        assert not running.finished.is_set()
        await running.wait_finished()
    assert running.returned
    assert rec.events == ["start:a", "ready:a", "stop:a"]


async def test_stop_when_not_running_returns_at_once() -> None:
    sup = Supervisor("sup", [])
    await sup.stop()
    sup.request_stop()
    assert sup.state is RunState.STOPPED


async def test_child_ignoring_the_stop_request_is_cancelled_at_its_deadline(
    rec: Recorder,
) -> None:
    sup = Supervisor(
        "sup",
        [
            ChildSpec("a", rec.child, "a"),
            ChildSpec("stubborn", rec.stubborn, "stubborn", shutdown=0.05),
            ChildSpec("c", rec.child, "c"),
        ],
    )
    async with anyio.create_task_group() as tg:
        await start_supervisor(tg, sup)
        before = anyio.current_time()
        await sup.stop()
        elapsed = anyio.current_time() - before
    # c returned on request; the stubborn child was cancelled only at its deadline; a stopped
    # after it (one child at a time, in reverse order).
    assert rec.after("ready:c") == ["stop:c", "cancelled:stubborn", "stop:a"]
    assert 0.04 <= elapsed < 2.0


async def test_zero_shutdown_cancels_at_once(rec: Recorder) -> None:
    sup = Supervisor("sup", [ChildSpec("s", rec.stubborn, "s", shutdown=0)])
    async with anyio.create_task_group() as tg:
        await start_supervisor(tg, sup)
        with anyio.fail_after(1):
            await sup.stop()
    assert rec.events == ["start:s", "cancelled:s"]


async def test_stopping_state_is_visible_while_waiting_for_the_deadline(rec: Recorder) -> None:
    sup = Supervisor("sup", [ChildSpec("s", rec.stubborn, "s", shutdown=60)])
    async with anyio.create_task_group() as tg:
        await start_supervisor(tg, sup)
        sup.request_stop()
        await settle()
        assert sup.state is RunState.STOPPING
        assert sup.snapshot().children[0].state is RunState.STOPPING
        tg.cancel_scope.cancel()  # don't wait out the minute
    assert rec.events == ["start:s", "cancelled:s"]


async def test_child_sees_the_stop_request(rec: Recorder) -> None:
    seen = []

    async def child(*, task_status: TaskStatus[None]) -> None:
        ctx = current_child()
        task_status.started()
        seen.append(ctx.stop_requested)
        await ctx.wait_stop_requested()
        seen.append(ctx.stop_requested)

    sup = Supervisor("sup", [ChildSpec("c", child)])
    async with anyio.create_task_group() as tg:
        await start_supervisor(tg, sup)
        await settle()
        await sup.stop()
    assert seen == [False, True]


async def test_stop_scope_ends_a_blocked_wait_on_the_stop_request(rec: Recorder) -> None:
    async def waiter(*, task_status: TaskStatus[None]) -> None:
        ctx = current_child()
        task_status.started()
        with ctx.stop_scope() as scope:
            await anyio.sleep_forever()
        rec.record(f"left scope, cancelled={scope.cancel_called}")
        with ctx.stop_scope():  # already requested: cancelled on entry
            await anyio.sleep_forever()
        rec.record("second scope ended too")

    sup = Supervisor("sup", [ChildSpec("w", waiter, shutdown=60)])
    async with anyio.create_task_group() as tg:
        await start_supervisor(tg, sup)
        with anyio.fail_after(2):
            await sup.stop()
    assert rec.events == ["left scope, cancelled=True", "second scope ended too"]


async def test_error_raised_while_stopping_is_recorded_not_restarted(rec: Recorder) -> None:
    async def messy(*, task_status: TaskStatus[None]) -> None:
        task_status.started()
        await current_child().wait_stop_requested()
        raise Crash("cleanup failed")

    sup = Supervisor("sup", [ChildSpec("m", messy)], backoff=None)
    async with anyio.create_task_group() as tg:
        running = await start_supervisor(tg, sup)
        await sup.stop()
    assert running.returned
    child = sup.snapshot().children[0]
    assert (child.state, child.restart_count, child.last_error) == (
        RunState.STOPPED,
        0,
        "Crash('cleanup failed')",
    )


async def test_current_child_outside_a_child_raises() -> None:
    with pytest.raises(RuntimeError, match="outside a supervised child"):
        current_child()


async def test_start_failure_stops_started_children_and_raises_start_error(
    rec: Recorder,
) -> None:
    sup = Supervisor(
        "sup",
        [
            ChildSpec("a", rec.child, "a"),
            ChildSpec("b", rec.child, "b"),
            ChildSpec("bad", rec.fails_start, "bad"),
            ChildSpec("c", rec.child, "c"),
        ],
    )
    async with anyio.create_task_group() as tg:
        with pytest.raises(StartError) as info:
            await tg.start(sup.run)
    assert info.value.supervisor == "sup"
    assert info.value.child == "bad"
    assert isinstance(info.value.__cause__, Crash)
    assert "'bad' failed to start" in str(info.value)
    assert rec.after("ready:b") == ["start:bad", "stop:b", "stop:a"]
    assert "start:c" not in rec.events
    assert sup.state is RunState.FAILED
    states = {c.name: c.state for c in sup.snapshot().children}
    assert states == {
        "a": RunState.STOPPED,
        "b": RunState.STOPPED,
        "bad": RunState.FAILED,
        "c": RunState.STOPPED,
    }


async def test_child_returning_before_started_is_a_start_failure() -> None:
    async def never_ready(*, task_status: TaskStatus[None]) -> None:
        return

    sup = Supervisor("sup", [ChildSpec("lazy", never_ready)])
    with pytest.raises(StartError) as info:
        await sup.run()
    assert isinstance(info.value.__cause__, RuntimeError)
    assert "without calling task_status.started()" in str(info.value.__cause__)


async def test_child_without_task_status_parameter_is_a_start_failure() -> None:
    async def no_status() -> None:
        raise AssertionError("never called this way")

    sup = Supervisor("sup", [ChildSpec("x", no_status)])
    with pytest.raises(StartError) as info:
        await sup.run()
    assert isinstance(info.value.__cause__, TypeError)


async def test_failures_while_restarting_count_toward_intensity(rec: Recorder) -> None:
    async def breaks_after_first_run(*, task_status: TaskStatus[None]) -> None:
        ctx = current_child()
        rec.record(f"attempt:{ctx.restart_count}")
        if ctx.restart_count > 0:
            raise Crash(f"cannot start again ({ctx.restart_count})")
        task_status.started()
        raise Crash("first run failed")

    sup = Supervisor("sup", [ChildSpec("x", breaks_after_first_run)], max_restarts=2, backoff=None)
    with pytest.raises(RestartIntensityExceeded) as info:
        await sup.run()
    # first run crashed (restart 1), restart failed twice during start (restarts 2 and 3 > 2).
    assert rec.events == ["attempt:0", "attempt:1", "attempt:2"]
    assert str(info.value.__cause__) == "cannot start again (2)"
    assert sup.snapshot().children[0].state is RunState.FAILED


async def test_cancelling_from_outside_cancels_every_child_promptly(rec: Recorder) -> None:
    sup = Supervisor(
        "sup",
        [
            ChildSpec("a", rec.child, "a"),
            ChildSpec("s", rec.stubborn, "s", shutdown=60),
            ChildSpec("c", rec.child, "c"),
        ],
    )
    tasks_before = len(anyio.get_running_tasks())
    with anyio.fail_after(2):  # far below the stubborn child's 60 s deadline
        async with anyio.create_task_group() as tg:
            await tg.start(sup.run)
            assert len(anyio.get_running_tasks()) > tasks_before
            tg.cancel_scope.cancel()
    assert sorted(e for e in rec.events if e.startswith("cancelled:")) == [
        "cancelled:a",
        "cancelled:c",
        "cancelled:s",
    ]
    assert not [e for e in rec.events if e.startswith("stop:")]
    assert len(anyio.get_running_tasks()) == tasks_before  # no orphan tasks
    assert sup.state is RunState.STOPPED


async def test_cancelling_during_start_cancels_the_starting_children(rec: Recorder) -> None:
    async def hangs_in_start(*, task_status: TaskStatus[None]) -> None:
        rec.record("start:hang")
        try:
            await anyio.sleep_forever()
        finally:
            rec.record("exit:hang")

    sup = Supervisor("sup", [ChildSpec("a", rec.child, "a"), ChildSpec("hang", hangs_in_start)])
    async with anyio.create_task_group() as tg:
        tg.start_soon(sup.run)
        await rec.wait_for("start:hang")
        assert sup.state is RunState.STARTING
        assert [c.state for c in sup.snapshot().children] == [
            RunState.RUNNING,
            RunState.STARTING,
        ]
        tg.cancel_scope.cancel()
    assert set(rec.after("start:hang")) == {"exit:hang", "cancelled:a"}


async def test_run_twice_at_once_is_refused(rec: Recorder) -> None:
    sup = Supervisor("sup", [ChildSpec("a", rec.child, "a")])
    async with anyio.create_task_group() as tg:
        await tg.start(sup.run)
        with pytest.raises(RuntimeError, match="already running"):
            await sup.run()
        await sup.stop()


async def test_a_supervisor_can_run_again_after_stopping(rec: Recorder) -> None:
    sup = Supervisor("sup", [ChildSpec("a", rec.flaky, "a", 1)], backoff=None)
    for _ in range(2):
        async with anyio.create_task_group() as tg:
            await tg.start(sup.run)
            await rec.wait_for("ready:a", rec.count("ready:a") + 1)
            assert sup.snapshot().children[0].restart_count == 1
            await sup.stop()
    # each run starts afresh: the child crashed once per run (restart counts reset)
    assert rec.count("crash:a") == 2


async def test_a_childs_own_cancelled_error_is_a_failure_not_a_stop() -> None:
    """A child that awaits a future someone else cancelled (asyncio), or raises
    asyncio.CancelledError itself (trio), has failed: it is restarted and its sibling keeps
    running. It used to end the supervisor's task group on asyncio (the sibling cancelled
    without a stop request, run returning as if stopped) and escape run on trio."""
    import asyncio

    from supervisors import ChildSpec as Spec
    from supervisors import Supervisor as Sup
    from supervisors import current_child as child

    events: list[str] = []

    async def sibling(*, task_status: anyio.abc.TaskStatus[None]) -> None:
        ctx = child()
        task_status.started()
        try:
            await ctx.wait_stop_requested()
            events.append("sibling stopped gracefully")
        except anyio.get_cancelled_exc_class():
            events.append("sibling cancelled")
            raise

    async def victim(*, task_status: anyio.abc.TaskStatus[None]) -> None:
        ctx = child()
        events.append(f"victim {ctx.restart_count}")
        task_status.started()
        if ctx.restart_count == 0:
            await anyio.sleep(0.01)
            if anyio.get_cancelled_exc_class() is asyncio.CancelledError:
                future = asyncio.get_running_loop().create_future()
                asyncio.get_running_loop().call_soon(future.cancel)
                await future
            raise asyncio.CancelledError("its own")
        await ctx.wait_stop_requested()

    sup = Sup("sup", [Spec("sibling", sibling), Spec("victim", victim)], backoff=None)
    async with anyio.create_task_group() as tg:
        await tg.start(sup.run)
        with anyio.fail_after(5):
            while "victim 1" not in events:  # noqa: ASYNC110 - the restart is what we wait on
                await anyio.sleep(0.01)
        assert sup.state.value == "running"
        await sup.stop()
    assert events == ["victim 0", "victim 1", "sibling stopped gracefully"]


async def test_a_childs_own_cancelled_error_inside_its_task_group_is_a_failure() -> None:
    """The same raised inside the child's own task group arrives wrapped in a group: under
    trio it used to end the whole tree (every sibling killed, run raising the group). (On
    asyncio, anyio's task group takes a subtask's CancelledError for a cancellation and never
    raises it: nothing reaches the supervisor.)"""
    import asyncio

    if anyio.get_cancelled_exc_class() is asyncio.CancelledError:
        pytest.skip("asyncio: the child's task group swallows it; nothing to supervise")

    from supervisors import ChildSpec as Spec
    from supervisors import Supervisor as Sup
    from supervisors import current_child as child

    events: list[str] = []

    async def sibling(*, task_status: anyio.abc.TaskStatus[None]) -> None:
        task_status.started()
        await child().wait_stop_requested()
        events.append("sibling stopped gracefully")

    async def raises_own() -> None:
        await anyio.sleep(0.01)
        raise asyncio.CancelledError("its own")

    async def victim(*, task_status: anyio.abc.TaskStatus[None]) -> None:
        ctx = child()
        events.append(f"victim {ctx.restart_count}")
        task_status.started()
        if ctx.restart_count == 0:
            async with anyio.create_task_group() as tg:
                tg.start_soon(raises_own)
                await anyio.sleep_forever()
        await ctx.wait_stop_requested()

    sup = Sup("sup", [Spec("sibling", sibling), Spec("victim", victim)], backoff=None)
    async with anyio.create_task_group() as tg:
        await tg.start(sup.run)
        with anyio.fail_after(5):
            while "victim 1" not in events:  # noqa: ASYNC110 - the restart is awaited
                await anyio.sleep(0.01)
        assert sup.state.value == "running"
        await sup.stop()
    assert events == ["victim 0", "victim 1", "sibling stopped gracefully"]


class _OwnBase(BaseException):
    """An application's own BaseException subclass (not an Exception)."""


@pytest.mark.parametrize("kind", [_OwnBase, GeneratorExit])
async def test_a_childs_base_exception_is_a_failure_not_a_clean_exit(
    kind: type[BaseException], caplog: pytest.LogCaptureFixture
) -> None:
    """Found by review: a child ending with GeneratorExit or its own BaseException subclass was
    logged as "exited with no exception" and, being transient, not restarted; it is a
    failure, restarted like any other."""
    import logging

    from supervisors import ChildSpec as Spec
    from supervisors import Restart
    from supervisors import Supervisor as Sup
    from supervisors import current_child as child

    events: list[str] = []

    async def victim(*, task_status: anyio.abc.TaskStatus[None]) -> None:
        ctx = child()
        events.append(f"victim {ctx.restart_count}")
        task_status.started()
        if ctx.restart_count == 0:
            await anyio.sleep(0.01)
            raise kind()
        await ctx.wait_stop_requested()

    sup = Sup("sup", [Spec("victim", victim, restart=Restart.TRANSIENT)], backoff=None)
    with caplog.at_level(logging.INFO, logger="supervisors"):
        async with anyio.create_task_group() as tg:
            await tg.start(sup.run)
            with anyio.fail_after(5):
                while "victim 1" not in events:  # noqa: ASYNC110 - the restart we wait on
                    await anyio.sleep(0.01)
            await sup.stop()
    assert events == ["victim 0", "victim 1"]
    assert not [r for r in caplog.records if "no exception" in r.getMessage()]


async def test_a_base_exception_from_a_childs_own_task_group_is_a_failure() -> None:
    """Found by review: an application's own BaseException raised in a task group inside the
    child arrives as a BaseExceptionGroup, which escaped: the supervisor died, cancelling every
    sibling without a stop request, instead of restarting the child."""
    from supervisors import ChildSpec as Spec
    from supervisors import Supervisor as Sup
    from supervisors import current_child as child

    events: list[str] = []

    async def victim(*, task_status: anyio.abc.TaskStatus[None]) -> None:
        ctx = child()
        events.append(f"victim {ctx.restart_count}")
        task_status.started()
        if ctx.restart_count == 0:

            async def boom() -> None:
                raise _OwnBase()

            async with anyio.create_task_group() as tg:
                tg.start_soon(boom)
        await ctx.wait_stop_requested()

    async def sibling(*, task_status: anyio.abc.TaskStatus[None]) -> None:
        task_status.started()
        await child().wait_stop_requested()
        events.append("sibling stopped gracefully")

    sup = Sup("sup", [Spec("sibling", sibling), Spec("victim", victim)], backoff=None)
    async with anyio.create_task_group() as tg:
        await tg.start(sup.run)
        with anyio.fail_after(5):
            while "victim 1" not in events:  # noqa: ASYNC110 - the restart is awaited
                await anyio.sleep(0.01)
        assert sup.state.value == "running"
        snapshot = sup.snapshot()
        assert snapshot is not None and snapshot.children[1].restart_count == 1
        await sup.stop()
    assert events == ["victim 0", "victim 1", "sibling stopped gracefully"]


_EXITING_TREE = """
import sys
import anyio
from supervisors import ChildSpec, Supervisor

async def sibling(*, task_status):
    task_status.started()
    try:
        await anyio.sleep_forever()
    finally:
        print("sibling ended", flush=True)

async def exits(*, task_status):
    task_status.started()
    await anyio.sleep(0.01)
    sys.exit(3)

async def main():
    await Supervisor("sup", [ChildSpec("sibling", sibling), ChildSpec("exits", exits)]).run()

try:
    anyio.run(main, backend=sys.argv[1])
except SystemExit as exc:
    print(f"caught SystemExit {exc.code}", flush=True)
    raise
"""


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_a_childs_system_exit_leaves_run_as_it_is(backend: str, tmp_path: Path) -> None:
    """Found by review: on trio a child's sys.exit(3) left run as an exception group (the
    process exited 1, and `except SystemExit` around run missed it), and the supervisor was
    told of a clean exit. It now ends the tree and leaves run bare on both backends."""
    import subprocess
    import sys

    script = tmp_path / "exiting_tree.py"
    script.write_text(_EXITING_TREE)
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, str(script), backend],
        cwd=root, capture_output=True, text=True, timeout=30, check=False,
        env={**__import__("os").environ, "PYTHONPATH": str(root)},
    )  # fmt: skip
    assert done.returncode == 3, done.stderr
    assert done.stdout.splitlines() == ["sibling ended", "caught SystemExit 3"], done.stderr
    assert "no exception" not in done.stderr
