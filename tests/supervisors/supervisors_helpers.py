"""Helpers for the supervisors tests: scriptable children and a way to wait on them.

Children record what happens to them in a :class:`Recorder` (``"start:a"``, ``"ready:a"``,
``"stop:a"`` for a graceful return after the stop request, ``"cancelled:a"`` when cancelled), and
tests wait for those events instead of sleeping.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable

import anyio
import sniffio
from anyio.abc import TaskStatus

from supervisors import Supervisor, current_child

TIMEOUT = 5.0  # seconds any single wait in a test may take before the test fails


async def settle() -> None:
    """Wait until every other task is blocked (the supervisor has acted on what happened).

    On trio this is ``wait_all_tasks_blocked``; anyio's asyncio version of it sleeps 0.1 s per
    poll, so on asyncio the same check (a task is blocked when it waits on an unfinished
    future) is polled at every loop iteration instead.
    """
    if sniffio.current_async_library() != "asyncio":
        await anyio.wait_all_tasks_blocked()
        return
    this_task = asyncio.current_task()
    while True:
        await asyncio.sleep(0)
        for task in asyncio.all_tasks():
            waiter = getattr(task, "_fut_waiter", None)
            if task is not this_task and (waiter is None or waiter.done()):
                break
        else:
            return


class Crash(Exception):
    """What scripted children raise."""


class FakeClock:
    """A clock the test moves by hand (for intensity windows, uptime and backoff resets)."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class Recorder:
    """An ordered log of child events that tests can wait on, plus scriptable children."""

    def __init__(self) -> None:
        self.events: list[str] = []
        self._changed: anyio.Event | None = None
        self._crash: dict[str, anyio.Event] = {}

    # -- log ----------------------------------------------------------------------------------

    def record(self, event: str) -> None:
        self.events.append(event)
        if self._changed is not None:
            self._changed.set()
            self._changed = None

    def count(self, event: str) -> int:
        return self.events.count(event)

    def after(self, event: str, occurrence: int = 1) -> list[str]:
        """The events recorded after the ``occurrence``-th ``event``."""
        seen = 0
        for i, recorded in enumerate(self.events):
            if recorded == event:
                seen += 1
                if seen == occurrence:
                    return self.events[i + 1 :]
        raise AssertionError(f"{event!r} recorded {seen} time(s), not {occurrence}")

    async def wait_until(self, predicate: Callable[[list[str]], bool]) -> None:
        """Wait until ``predicate(events)`` holds and every task has settled (is blocked)."""
        with anyio.fail_after(TIMEOUT):
            while not predicate(self.events):
                if self._changed is None:
                    self._changed = anyio.Event()
                await self._changed.wait()
            await settle()

    async def wait_for(self, event: str, count: int = 1) -> None:
        """Wait until ``event`` has been recorded ``count`` times."""
        await self.wait_until(lambda events: events.count(event) >= count)

    def crash(self, name: str) -> None:
        """Make the running scripted child ``name`` raise :class:`Crash`."""
        self._crash.pop(name).set()

    # -- children -----------------------------------------------------------------------------

    async def child(
        self, name: str, *, task_status: TaskStatus[str] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Ready at once; raises Crash on :meth:`crash`; returns when asked to stop."""
        ctx = current_child()
        crash = self._crash[name] = anyio.Event()
        self.record(f"start:{name}")
        try:
            task_status.started(name)
            self.record(f"ready:{name}")
            crashed = False
            async with anyio.create_task_group() as tg:

                async def on_crash() -> None:
                    nonlocal crashed
                    await crash.wait()
                    crashed = True
                    tg.cancel_scope.cancel()

                async def on_stop() -> None:
                    await ctx.wait_stop_requested()
                    tg.cancel_scope.cancel()

                tg.start_soon(on_crash)
                tg.start_soon(on_stop)
        except anyio.get_cancelled_exc_class():
            self.record(f"cancelled:{name}")
            raise
        if crashed:
            self.record(f"crash:{name}")
            raise Crash(f"{name} crashed")
        self.record(f"stop:{name}")

    async def flaky(
        self, name: str, crashes: int, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Crashes right after reporting ready on its first ``crashes`` runs, then behaves."""
        ctx = current_child()
        self.record(f"start:{name}")
        task_status.started()
        if ctx.restart_count < crashes:
            self.record(f"crash:{name}")
            raise Crash(f"{name} crashed on run {ctx.restart_count}")
        self.record(f"ready:{name}")
        await ctx.wait_stop_requested()
        self.record(f"stop:{name}")

    async def returns(
        self,
        name: str,
        times: float = math.inf,
        *,
        task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Returns normally right after reporting ready on its first ``times`` runs."""
        ctx = current_child()
        self.record(f"start:{name}")
        task_status.started()
        if ctx.restart_count < times:
            self.record(f"return:{name}")
            return
        await ctx.wait_stop_requested()
        self.record(f"stop:{name}")

    async def stubborn(
        self, name: str, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Ignores the stop request; only cancellation ends it."""
        self.record(f"start:{name}")
        task_status.started()
        try:
            await anyio.sleep_forever()
        except anyio.get_cancelled_exc_class():
            self.record(f"cancelled:{name}")
            raise

    async def fails_start(
        self, name: str, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Raises before reporting ready."""
        self.record(f"start:{name}")
        await anyio.lowlevel.checkpoint()
        raise Crash(f"{name} failed to start")


class _WatchedStatus(TaskStatus[None]):
    def __init__(self, inner: TaskStatus[None]) -> None:
        self.inner = inner
        self.called = False

    def started(self, value: None = None) -> None:
        self.called = True
        self.inner.started()


class Running:
    """A supervisor's ``run`` in a task group, with how it ended."""

    def __init__(self, supervisor: Supervisor) -> None:
        self.supervisor = supervisor
        self.error: BaseException | None = None
        self.returned = False
        self.finished = anyio.Event()

    async def _main(self, *, task_status: TaskStatus[None]) -> None:
        status = _WatchedStatus(task_status)
        try:
            await self.supervisor.run(task_status=status)
            self.returned = True
        except Exception as exc:
            if not status.called:
                raise  # a start failure: let TaskGroup.start raise it
            self.error = exc
        finally:
            self.finished.set()

    async def wait_finished(self) -> None:
        with anyio.fail_after(TIMEOUT):
            await self.finished.wait()


async def start_supervisor(tg: anyio.abc.TaskGroup, supervisor: Supervisor) -> Running:
    """Start ``supervisor.run`` in ``tg``; failures after readiness land in ``Running.error``."""
    running = Running(supervisor)
    await tg.start(running._main)
    return running
