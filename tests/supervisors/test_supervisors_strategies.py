"""Strategies and restart types, on both backends."""

from __future__ import annotations

import anyio
import pytest
from supervisors_helpers import Recorder, settle, start_supervisor

from supervisors import ChildSpec, Restart, RunState, Strategy, Supervisor, current_child

pytestmark = pytest.mark.anyio


def supervisor(rec: Recorder, names: str, strategy: Strategy, **kwargs: object) -> Supervisor:
    specs = [ChildSpec(name, rec.child, name) for name in names]
    return Supervisor("sup", specs, strategy=strategy, backoff=None, **kwargs)  # type: ignore[arg-type]


def states(sup: Supervisor) -> dict[str, tuple[RunState, int]]:
    return {c.name: (c.state, c.restart_count) for c in sup.snapshot().children}


async def test_one_for_one_restarts_only_the_failed_child(rec: Recorder) -> None:
    sup = supervisor(rec, "abc", Strategy.ONE_FOR_ONE)
    async with anyio.create_task_group() as tg:
        running = await start_supervisor(tg, sup)
        rec.crash("b")
        await rec.wait_for("ready:b", 2)
        assert rec.after("ready:c") == ["crash:b", "start:b", "ready:b"]
        assert states(sup) == {
            "a": (RunState.RUNNING, 0),
            "b": (RunState.RUNNING, 1),
            "c": (RunState.RUNNING, 0),
        }
        await sup.stop()
    assert running.returned


async def test_one_for_all_stops_the_others_in_reverse_and_restarts_all_in_order(
    rec: Recorder,
) -> None:
    sup = supervisor(rec, "abcd", Strategy.ONE_FOR_ALL)
    async with anyio.create_task_group() as tg:
        await start_supervisor(tg, sup)
        rec.crash("b")
        await rec.wait_for("ready:d", 2)
        assert rec.after("ready:d") == [
            "crash:b",
            "stop:d",
            "stop:c",
            "stop:a",
            "start:a",
            "ready:a",
            "start:b",
            "ready:b",
            "start:c",
            "ready:c",
            "start:d",
            "ready:d",
        ]
        assert {s for s, _ in states(sup).values()} == {RunState.RUNNING}
        assert [n for _, n in states(sup).values()] == [1, 1, 1, 1]
        await sup.stop()


async def test_rest_for_one_restarts_the_failed_child_and_those_after_it(rec: Recorder) -> None:
    sup = supervisor(rec, "abcd", Strategy.REST_FOR_ONE)
    async with anyio.create_task_group() as tg:
        await start_supervisor(tg, sup)
        rec.crash("b")
        await rec.wait_for("ready:d", 2)
        assert rec.after("ready:d") == [
            "crash:b",
            "stop:d",
            "stop:c",
            "start:b",
            "ready:b",
            "start:c",
            "ready:c",
            "start:d",
            "ready:d",
        ]
        assert states(sup)["a"] == (RunState.RUNNING, 0)
        assert [n for _, n in states(sup).values()] == [0, 1, 1, 1]
        await sup.stop()


async def test_rest_for_one_failure_of_the_last_child_restarts_only_it(rec: Recorder) -> None:
    sup = supervisor(rec, "abc", Strategy.REST_FOR_ONE)
    async with anyio.create_task_group() as tg:
        await start_supervisor(tg, sup)
        rec.crash("c")
        await rec.wait_for("ready:c", 2)
        assert rec.after("ready:c") == ["crash:c", "start:c", "ready:c"]
        await sup.stop()


async def test_permanent_child_is_restarted_after_a_normal_return(rec: Recorder) -> None:
    sup = Supervisor("sup", [ChildSpec("p", rec.returns, "p", 2)], backoff=None)
    async with anyio.create_task_group() as tg:
        await start_supervisor(tg, sup)
        await rec.wait_for("start:p", 3)
        assert rec.count("return:p") == 2
        assert states(sup)["p"] == (RunState.RUNNING, 2)
        await sup.stop()
    assert rec.events[-1] == "stop:p"


async def test_transient_child_is_not_restarted_after_a_normal_return(rec: Recorder) -> None:
    sup = Supervisor(
        "sup",
        [
            ChildSpec("t", rec.returns, "t", restart=Restart.TRANSIENT),
            ChildSpec("a", rec.child, "a"),
        ],
        backoff=None,
    )
    async with anyio.create_task_group() as tg:
        await start_supervisor(tg, sup)
        await rec.wait_for("return:t")
        # Let the supervisor process the exit: it must leave the child stopped.
        await settle()
        snapshot = sup.snapshot()
        assert [(c.name, c.state) for c in snapshot.children] == [
            ("t", RunState.STOPPED),
            ("a", RunState.RUNNING),
        ]
        assert snapshot.restarts_in_period == 0
        await sup.stop()
    assert rec.count("start:t") == 1


async def test_transient_child_is_restarted_after_an_exception(rec: Recorder) -> None:
    sup = Supervisor(
        "sup", [ChildSpec("t", rec.flaky, "t", 1, restart=Restart.TRANSIENT)], backoff=None
    )
    async with anyio.create_task_group() as tg:
        await start_supervisor(tg, sup)
        await rec.wait_for("ready:t")
        assert rec.events == ["start:t", "crash:t", "start:t", "ready:t"]
        child = sup.snapshot().children[0]
        assert child.restart_count == 1
        assert child.last_error == "Crash('t crashed on run 0')"
        await sup.stop()


@pytest.mark.parametrize("crashes", [True, False])
async def test_temporary_child_is_never_restarted_and_is_removed(
    rec: Recorder, crashes: bool
) -> None:
    fn = rec.flaky if crashes else rec.returns
    sup = Supervisor(
        "sup",
        [ChildSpec("tmp", fn, "tmp", 1, restart=Restart.TEMPORARY), ChildSpec("a", rec.child, "a")],
        backoff=None,
    )
    async with anyio.create_task_group() as tg:
        await start_supervisor(tg, sup)
        await rec.wait_for("crash:tmp" if crashes else "return:tmp")
        await settle()
        assert [c.name for c in sup.snapshot().children] == ["a"]
        assert sup.snapshot().restarts_in_period == 0
        await sup.stop()
    assert rec.count("start:tmp") == 1


async def test_one_for_all_does_not_restart_a_temporary_sibling(rec: Recorder) -> None:
    sup = Supervisor(
        "sup",
        [
            ChildSpec("a", rec.child, "a"),
            ChildSpec("tmp", rec.child, "tmp", restart=Restart.TEMPORARY),
        ],
        strategy=Strategy.ONE_FOR_ALL,
        backoff=None,
    )
    async with anyio.create_task_group() as tg:
        await start_supervisor(tg, sup)
        rec.crash("a")
        await rec.wait_for("ready:a", 2)
        assert rec.after("ready:tmp") == ["crash:a", "stop:tmp", "start:a", "ready:a"]
        assert [c.name for c in sup.snapshot().children] == ["a"]
        await sup.stop()


async def test_one_for_all_restarts_a_transient_sibling_that_had_finished(rec: Recorder) -> None:
    # OTP: a group restart starts every child still in the supervisor, including a transient
    # child that had returned normally.
    sup = Supervisor(
        "sup",
        [
            ChildSpec("t", rec.returns, "t", 1, restart=Restart.TRANSIENT),
            ChildSpec("a", rec.child, "a"),
        ],
        strategy=Strategy.ONE_FOR_ALL,
        backoff=None,
    )
    async with anyio.create_task_group() as tg:
        await start_supervisor(tg, sup)
        await rec.wait_for("return:t")
        await settle()
        rec.crash("a")
        await rec.wait_for("ready:a", 2)
        assert rec.after("crash:a") == ["start:t", "start:a", "ready:a"]
        assert states(sup)["t"] == (RunState.RUNNING, 1)
        await sup.stop()


async def test_restarted_child_gets_a_fresh_context(rec: Recorder) -> None:
    contexts = []

    async def child(*, task_status: anyio.abc.TaskStatus[None]) -> None:
        ctx = current_child()
        contexts.append((ctx.name, ctx.supervisor, ctx.restart_count, ctx.stop_requested))
        task_status.started()
        if ctx.restart_count == 0:
            raise ValueError("first run fails")
        rec.record("second run")
        await ctx.wait_stop_requested()

    sup = Supervisor("sup", [ChildSpec("c", child)], backoff=None)
    async with anyio.create_task_group() as tg:
        await start_supervisor(tg, sup)
        await rec.wait_for("second run")
        await sup.stop()
    assert contexts == [("c", "sup", 0, False), ("c", "sup", 1, False)]
