"""The supervisor: starts children in order, restarts them by policy, stops them in reverse.

Invariants kept by this module:

* Every decision (exit handling, restarts, dynamic start/terminate, shutdown) runs while holding
  ``Supervisor._lock``, so they never interleave; children only *report* exits, through the
  supervisor's inbox, and never touch supervisor state themselves.
* Each start of a child is a fresh ``_Run``; an exit report is acted on only if its run is still
  the child's current run and the supervisor did not stop it itself, so late reports from runs
  the supervisor already replaced or stopped are ignored.
* Child tasks never let an ``Exception`` escape into the supervisor's task group (it is recorded
  on the run instead), so the task group only ever raises cancellation or ``BaseException`` s
  such as ``KeyboardInterrupt``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random as _random
import time
from collections.abc import Iterable
from typing import Any

import anyio
from anyio.abc import TaskGroup, TaskStatus
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from . import _context
from ._context import ChildContext
from ._errors import DuplicateChild, RestartIntensityExceeded, StartError, UnknownChild
from ._policy import (
    Backoff,
    BackoffTracker,
    Clock,
    RandomSource,
    RestartIntensity,
    restart_range,
    should_restart,
)
from ._snapshot import ChildSnapshot, RunState, SupervisorSnapshot
from ._spec import ChildSpec, Restart, Strategy

__all__ = ["Supervisor"]

_log = logging.getLogger("supervisors")

# States in which a child has a task the supervisor may have to stop.
_ACTIVE = (RunState.STARTING, RunState.RUNNING, RunState.STOPPING)


@contextlib.contextmanager
def _bare_interrupt() -> Any:
    """Re-raise a KeyboardInterrupt or SystemExit that a child let out on its own, not wrapped
    in the task group's exception group (with nothing but cancellations beside it), so
    ``except KeyboardInterrupt`` around ``run`` and a child's ``sys.exit(3)`` work the same on
    trio and asyncio."""
    try:
        yield
    except BaseExceptionGroup as group:
        interrupts, rest = group.split((KeyboardInterrupt, SystemExit))
        if interrupts is None:
            raise
        if rest is not None:
            _, other = rest.split(anyio.get_cancelled_exc_class())
            if other is not None:
                raise
        first = _first_leaf(interrupts)
        raise first from None


def _first_leaf(group: BaseExceptionGroup[BaseException]) -> BaseException:
    exc: BaseException = group
    while isinstance(exc, BaseExceptionGroup):
        exc = exc.exceptions[0]
    return exc


class _Run:
    """One start of one child."""

    __slots__ = (
        "child",
        "context",
        "done",
        "error",
        "escaping",
        "ready",
        "scope",
        "settled",
        "stopped",
        "value",
    )

    def __init__(self, child: _Child, context: ChildContext) -> None:
        self.child = child
        self.context = context
        self.scope = anyio.CancelScope()
        self.settled = anyio.Event()  # set once the child is ready or has exited before that
        self.done = anyio.Event()  # set once the child's task has finished
        self.ready = False
        self.value: Any = None
        self.error: BaseException | None = None
        # A KeyboardInterrupt or SystemExit leaving the child: it ends the supervisor, so the
        # run sends no exit report (it would be taken for a clean exit and restarted)
        self.escaping = False
        # Set when the supervisor itself ends this run: its exit report is then not a failure.
        self.stopped = False


class _TaskStatus(TaskStatus[Any]):
    """The ``task_status`` a child receives: reports readiness to the supervisor."""

    def __init__(self, run: _Run) -> None:
        self._run = run

    def started(self, value: Any = None) -> None:
        if self._run.ready:
            raise RuntimeError("called 'started' twice on the same task status")
        if self._run.done.is_set():
            raise RuntimeError("called 'started' after the child has finished")
        self._run.ready = True
        self._run.value = value
        self._run.settled.set()


class _Child:
    """The supervisor's record of one child across its restarts."""

    __slots__ = (
        "attempted",
        "backoff",
        "due",
        "last_error",
        "restart_count",
        "run",
        "spec",
        "started_at",
        "state",
    )

    def __init__(self, spec: ChildSpec, backoff: BackoffTracker | None) -> None:
        self.spec = spec
        self.backoff = backoff
        self.state = RunState.STOPPED
        self.run: _Run | None = None
        self.attempted = False
        self.restart_count = 0
        self.last_error: BaseException | None = None
        self.started_at: float | None = None
        self.due: float | None = None  # anyio time of a pending restart


def _nested(spec: ChildSpec) -> Supervisor | None:
    """The supervisor a spec runs, if its ``fn`` is some supervisor's ``run``."""
    owner = getattr(spec.fn, "__self__", None)
    if isinstance(owner, Supervisor) and getattr(spec.fn, "__name__", None) == "run":
        return owner
    return None


def _raised_by_child() -> bool:
    """Whether the ``asyncio.CancelledError`` being handled is the child's own rather than a
    cancellation of its task: on asyncio a cancel scope cancels with ``Task.cancel()``, which
    ``Task.cancelling()`` counts; under trio cancellation is ``trio.Cancelled``, so an
    ``asyncio.CancelledError`` is always the child's."""
    if anyio.get_cancelled_exc_class() is not asyncio.CancelledError:
        return True
    task = asyncio.current_task()
    return task is not None and task.cancelling() == 0


class Supervisor:
    """Runs children, restarts them according to a strategy, and stops them in reverse order.

    ``Supervisor(name, children, *, strategy=..., max_restarts=3, period=5.0, backoff=Backoff())``

    Start it with ``await task_group.start(supervisor.run)``: that returns once every child has
    started (in spec order, each after the previous one reported ready). A supervisor is itself
    a valid child: use :meth:`child_spec` (or ``ChildSpec(name, supervisor.run)``).

    Args:
        name: the supervisor's name, used in logs, errors and snapshots.
        children: child specs in start order; names must be unique.
        strategy: which children are restarted along with one that exited.
        max_restarts: restarts (of all children together) allowed within ``period``; one more
            makes the supervisor stop all children and raise :exc:`RestartIntensityExceeded`.
        period: the intensity window, seconds.
        backoff: delay schedule applied before each restart (per child), or ``None`` to restart
            at once.
        clock: monotonic seconds for the intensity window, the backoff reset rule and
            snapshots; defaults to :func:`anyio.current_time`.
        random: source of floats in ``[0, 1)`` for backoff jitter; defaults to
            :func:`random.random`.

    Raises:
        TypeError, ValueError: an argument is invalid (with the rule it broke).
    """

    def __init__(
        self,
        name: str,
        children: Iterable[ChildSpec] = (),
        *,
        strategy: Strategy = Strategy.ONE_FOR_ONE,
        max_restarts: int = 3,
        period: float = 5.0,
        backoff: Backoff | None = Backoff(),  # noqa: B008 - frozen, so sharing it is safe
        clock: Clock | None = None,
        random: RandomSource = _random.random,
    ) -> None:
        if not isinstance(name, str):
            raise TypeError(f"Supervisor name must be a str, got {name!r}")
        if not name:
            raise ValueError("Supervisor name must not be empty")
        specs = tuple(children)
        seen: set[str] = set()
        for spec in specs:
            if not isinstance(spec, ChildSpec):
                raise TypeError(
                    f"Supervisor {name!r}: children must be ChildSpec instances, got {spec!r}"
                )
            if spec.name in seen:
                raise ValueError(f"Supervisor {name!r}: duplicate child name {spec.name!r}")
            seen.add(spec.name)
        if not isinstance(strategy, Strategy):
            raise TypeError(
                f"Supervisor {name!r}: strategy must be a supervisors.Strategy, got {strategy!r}"
            )
        if backoff is not None and not isinstance(backoff, Backoff):
            raise TypeError(
                f"Supervisor {name!r}: backoff must be a supervisors.Backoff or None, "
                f"got {backoff!r}"
            )
        # Validates max_restarts and period with the same messages the tracker uses.
        RestartIntensity(max_restarts, period, clock=time.monotonic)

        self._name = name
        self._specs = specs
        self._strategy = strategy
        self._max_restarts = max_restarts
        self._period = float(period)
        self._backoff = backoff
        self._clock: Clock = clock if clock is not None else anyio.current_time
        self._random = random

        self._state = RunState.STOPPED
        self._running = False
        self._stop_requested = False
        self._children: list[_Child] = [_Child(spec, None) for spec in specs]
        self._intensity = RestartIntensity(max_restarts, period, clock=self._now)
        self._failure: RestartIntensityExceeded | None = None
        # Set up for real at the start of each run.
        self._tg: TaskGroup | None = None
        self._inbox: MemoryObjectSendStream[_Run | None] | None = None
        self._lock: anyio.Lock | None = None
        self._finished: anyio.Event | None = None

    # -- public API ---------------------------------------------------------------------------

    @property
    def name(self) -> str:
        """The supervisor's name."""
        return self._name

    @property
    def strategy(self) -> Strategy:
        """The supervisor's restart strategy."""
        return self._strategy

    @property
    def state(self) -> RunState:
        """The supervisor's own lifecycle state."""
        return self._state

    def child_spec(
        self, *, restart: Restart = Restart.PERMANENT, shutdown: float = math.inf
    ) -> ChildSpec:
        """A :class:`ChildSpec` that runs this supervisor as a child of another one.

        The default ``shutdown`` is infinite: a supervisor stops its own children within their
        own deadlines, so its parent waits for it (OTP does the same).
        """
        return ChildSpec(self._name, self.run, restart=restart, shutdown=shutdown)

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Start the children, supervise them until stopped, then stop them in reverse order.

        Reports ready (``task_status.started()``) once every child has started. Returns
        normally after :meth:`stop` / :meth:`request_stop`, or after the parent supervisor's
        graceful stop request when run as a child.

        Raises:
            StartError: a child failed while the supervisor was starting (before ready); the
                children already started were stopped in reverse order first.
            RestartIntensityExceeded: too many restarts; the remaining children were stopped
                in reverse order first.
            RuntimeError: this supervisor is already running.

        If cancelled, every child's task is cancelled with it (no graceful stop request, no
        deadline); none outlives the call.
        """
        if self._running:
            raise RuntimeError(f"supervisor {self._name!r} is already running")
        self._running = True
        parent = _context._current.get(None)
        self._begin()
        failure: Exception | None = None
        inbox_send, inbox_receive = anyio.create_memory_object_stream[_Run | None](math.inf)
        self._inbox = inbox_send
        try:
            with _bare_interrupt(), inbox_send, inbox_receive:
                async with anyio.create_task_group() as tg:
                    self._tg = tg
                    failure = await self._start_children()
                    if failure is None:
                        watch_scope = anyio.CancelScope()
                        if parent is not None:
                            tg.start_soon(self._watch_parent, parent, watch_scope)
                        self._state = RunState.RUNNING
                        task_status.started()
                        failure = await self._supervise(inbox_receive)
                        self._state = RunState.STOPPING
                        assert self._lock is not None
                        async with self._lock:
                            await self._stop_all()
                        watch_scope.cancel()
        finally:
            self._end(failed=failure is not None)
        if failure is not None:
            raise failure

    def request_stop(self) -> None:
        """Ask the supervisor to stop gracefully, without waiting (safe to call repeatedly).

        Its children are then stopped in reverse order, each asked to stop and cancelled at
        its shutdown deadline, and :meth:`run` returns. A request made while the supervisor is
        still starting takes effect once it is ready. Does nothing if it is not running.
        """
        if not self._running or self._stop_requested:
            return
        self._stop_requested = True
        if self._inbox is not None:
            with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):
                self._inbox.send_nowait(None)

    async def stop(self) -> None:
        """Stop gracefully (see :meth:`request_stop`) and wait until :meth:`run` has finished.

        Returns at once if the supervisor is not running. If cancelled, the stop still goes on.
        """
        finished = self._finished
        if not self._running or finished is None:
            return
        self.request_stop()
        await finished.wait()

    async def start_child(self, spec: ChildSpec) -> Any:
        """Add a child at the end of the start order, start it and return its ``started`` value.

        The child is not kept when the supervisor runs again: each :meth:`run` starts from the
        specs given to the constructor. A failure to start is not counted as a restart.

        Raises:
            DuplicateChild: a child of that name exists.
            StartError: the child failed during start (its exception is the ``__cause__``);
                it is not kept.
            RuntimeError: the supervisor is not running, or is stopping.

        If cancelled while the child starts, the child is cancelled and not kept.
        """
        if not isinstance(spec, ChildSpec):
            raise TypeError(f"start_child expects a ChildSpec, got {spec!r}")
        lock = self._require_running()
        async with lock:
            self._require_accepting()
            if any(c.spec.name == spec.name for c in self._children):
                raise DuplicateChild(supervisor=self._name, child=spec.name)
            child = self._new_child(spec)
            self._children.append(child)
            try:
                error = await self._start(child)
            except BaseException:
                self._children.remove(child)
                raise
            if error is not None:
                self._children.remove(child)
                raise StartError(supervisor=self._name, child=spec.name) from error
            assert child.run is not None
            return child.run.value

    async def terminate_child(self, name: str) -> None:
        """Stop the named child gracefully (request, then cancel at its deadline), remove it.

        Raises:
            UnknownChild: no child of that name.
            RuntimeError: the supervisor is not running, or is stopping.

        If cancelled, the child is cancelled at once and still removed.
        """
        lock = self._require_running()
        async with lock:
            self._require_accepting()
            for child in self._children:
                if child.spec.name == name:
                    break
            else:
                raise UnknownChild(supervisor=self._name, child=name)
            try:
                await self._stop_child(child)
            finally:
                self._children.remove(child)
            _log.info(
                "supervisor %r: child %r terminated",
                self._name,
                name,
                extra={"supervisor": self._name, "child": name},
            )

    def snapshot(self) -> SupervisorSnapshot:
        """An immutable picture of this supervisor and its children (nested ones included)."""
        try:
            taken_at = self._now()
        except RuntimeError:  # no event loop to ask for anyio's clock
            taken_at = time.monotonic()
        children = []
        for child in self._children:
            nested = _nested(child.spec)
            children.append(
                ChildSnapshot(
                    name=child.spec.name,
                    state=child.state,
                    restart=child.spec.restart,
                    restart_count=child.restart_count,
                    last_error=None if child.last_error is None else repr(child.last_error),
                    started_at=child.started_at,
                    supervisor=None if nested is None else nested.snapshot(),
                )
            )
        try:
            restarts = self._intensity.restarts_in_period
        except RuntimeError:
            restarts = 0
        return SupervisorSnapshot(
            name=self._name,
            strategy=self._strategy,
            state=self._state,
            max_restarts=self._max_restarts,
            period=self._period,
            restarts_in_period=restarts,
            taken_at=taken_at,
            children=tuple(children),
        )

    def __repr__(self) -> str:
        return (
            f"<Supervisor {self._name!r} {self._strategy.value} {self._state.value}, "
            f"{len(self._children)} children>"
        )

    # -- run lifecycle ------------------------------------------------------------------------

    def _now(self) -> float:
        return self._clock()

    def _new_child(self, spec: ChildSpec) -> _Child:
        tracker = None
        if self._backoff is not None:
            tracker = BackoffTracker(self._backoff, clock=self._now, random=self._random)
        return _Child(spec, tracker)

    def _begin(self) -> None:
        self._state = RunState.STARTING
        self._stop_requested = False
        self._failure = None
        self._lock = anyio.Lock()
        self._finished = anyio.Event()
        self._intensity = RestartIntensity(self._max_restarts, self._period, clock=self._now)
        self._children = [self._new_child(spec) for spec in self._specs]

    def _end(self, *, failed: bool) -> None:
        for child in self._children:
            if child.state is not RunState.FAILED:
                child.state = RunState.STOPPED
            child.run = None
            child.started_at = None
            child.due = None
        self._state = RunState.FAILED if failed else RunState.STOPPED
        self._tg = None
        self._inbox = None
        self._running = False
        assert self._finished is not None
        self._finished.set()

    def _require_running(self) -> anyio.Lock:
        if not self._running or self._lock is None:
            raise RuntimeError(f"supervisor {self._name!r} is not running")
        return self._lock

    def _require_accepting(self) -> None:
        if not self._running or self._stop_requested or self._state is not RunState.RUNNING:
            raise RuntimeError(
                f"supervisor {self._name!r} is not running (state {self._state.value})"
            )

    async def _watch_parent(self, parent: ChildContext, scope: anyio.CancelScope) -> None:
        with scope:
            await parent.wait_stop_requested()
            self.request_stop()

    async def _start_children(self) -> StartError | None:
        """Start every child in order; on a failure stop the started ones in reverse order."""
        assert self._lock is not None
        async with self._lock:
            for child in self._children:
                error = await self._start(child)
                if error is None:
                    continue
                child.state = RunState.FAILED
                _log.error(
                    "supervisor %r: child %r failed to start: %r; stopping the started children",
                    self._name,
                    child.spec.name,
                    error,
                    exc_info=error,
                    extra={"supervisor": self._name, "child": child.spec.name},
                )
                self._state = RunState.STOPPING
                await self._stop_all()
                start_error = StartError(supervisor=self._name, child=child.spec.name)
                start_error.__cause__ = error
                return start_error
        return None

    async def _supervise(
        self, inbox: MemoryObjectReceiveStream[_Run | None]
    ) -> RestartIntensityExceeded | None:
        """Handle exits and due restarts until a stop request or an escalation."""
        assert self._lock is not None
        while not self._stop_requested:
            item: _Run | None = None
            # Sleep until the next report, or until the earliest pending restart is due.
            with anyio.CancelScope(deadline=self._next_due()):
                item = await inbox.receive()
            async with self._lock:
                if self._stop_requested:
                    break
                if item is not None:
                    await self._on_exit(item)
                if self._failure is None:
                    await self._start_due()
                if self._failure is not None:
                    return self._failure
        return None

    async def _stop_all(self) -> None:
        """Stop every child in reverse start order (the caller holds the lock)."""
        for child in reversed(self._children):
            await self._stop_child(child)

    # -- children -----------------------------------------------------------------------------

    async def _child_main(self, run: _Run) -> None:
        _context._current.set(run.context)
        spec = run.child.spec
        try:
            with run.scope:
                await spec.fn(*spec.args, task_status=_TaskStatus(run))
        except Exception as exc:
            run.error = exc
        except asyncio.CancelledError as exc:
            if not _raised_by_child():
                raise  # this task is being cancelled
            # the child awaited something that was cancelled (or raised it): a failure like any
            # other. Left to propagate it would end the supervisor's task group on asyncio
            # (every sibling cancelled, run returning as if stopped) and escape run on trio.
            failure = RuntimeError(
                f"child {spec.name!r} raised a CancelledError of its own (it awaited a future or "
                "task that was cancelled): treated as a failure"
            )
            failure.__cause__ = exc
            run.error = failure
        except BaseExceptionGroup as group:
            # raised inside the child's own task group (it arrives wrapped)
            if group.subgroup((KeyboardInterrupt, SystemExit)) is not None:
                run.escaping = True
                raise
            _, rest = group.split(anyio.get_cancelled_exc_class())
            if rest is None:  # cancellations only
                if anyio.get_cancelled_exc_class() is not asyncio.CancelledError or not (
                    _raised_by_child()
                ):
                    raise  # this task is being cancelled
                failure = RuntimeError(
                    f"child {spec.name!r} raised CancelledErrors of its own in a task group: "
                    "treated as a failure"
                )
            else:
                # a BaseException that is not an Exception (an application's own subclass,
                # GeneratorExit) among them: a failure, like the same exception unwrapped
                failure = RuntimeError(
                    f"child {spec.name!r} raised {type(rest).__name__} of {len(rest.exceptions)} "
                    "exception(s) holding a BaseException that is not an Exception: treated as "
                    "a failure"
                )
            failure.__cause__ = group
            run.error = failure
        except (KeyboardInterrupt, SystemExit):
            run.escaping = True
            raise
        except BaseException as exc:
            if isinstance(exc, anyio.get_cancelled_exc_class()):
                raise  # this task is being cancelled (trio's Cancelled)
            # GeneratorExit or an application's own BaseException subclass: a failure, not a
            # clean exit (it used to be reported as "exited with no exception")
            failure = RuntimeError(
                f"child {spec.name!r} raised {type(exc).__name__}, a BaseException that is not "
                "an Exception: treated as a failure"
            )
            failure.__cause__ = exc
            run.error = failure
        finally:
            run.done.set()
            if run.escaping:
                run.settled.set()
            elif run.ready:
                if self._inbox is not None:
                    with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):
                        self._inbox.send_nowait(run)
            else:
                run.settled.set()

    async def _start(self, child: _Child) -> BaseException | None:
        """Start ``child`` and wait until it is ready; return its start failure, if any."""
        assert self._tg is not None
        if child.attempted:
            child.restart_count += 1
        child.attempted = True
        context = ChildContext(
            name=child.spec.name, supervisor=self._name, restart_count=child.restart_count
        )
        run = _Run(child, context)
        child.run = run
        child.state = RunState.STARTING
        child.due = None
        self._tg.start_soon(self._child_main, run, name=f"{self._name}/{child.spec.name}")
        try:
            await run.settled.wait()
        except BaseException:
            run.stopped = True
            run.scope.cancel()
            raise
        if run.ready:
            child.state = RunState.RUNNING
            child.started_at = self._now()
            if child.backoff is not None:
                child.backoff.started()
            return None
        child.run = None
        child.state = RunState.STOPPED
        error = run.error
        if error is None:
            error = RuntimeError(
                f"child {child.spec.name!r} returned without calling task_status.started()"
            )
        child.last_error = error
        return error

    async def _stop_child(self, child: _Child) -> None:
        """Ask ``child`` to stop, cancel it at its shutdown deadline, wait until it is gone."""
        run = child.run
        if run is None or child.state not in _ACTIVE:
            if child.state is RunState.RESTARTING:
                child.state = RunState.STOPPED
                child.due = None
            return
        run.stopped = True  # from here on its exit report is ignored
        child.state = RunState.STOPPING
        run.context._request_stop()
        try:
            if not run.done.is_set():
                with anyio.move_on_after(child.spec.shutdown):
                    await run.done.wait()
                if not run.done.is_set():
                    _log.warning(
                        "supervisor %r: child %r did not stop within %g s; cancelling it",
                        self._name,
                        child.spec.name,
                        child.spec.shutdown,
                        extra={"supervisor": self._name, "child": child.spec.name},
                    )
                    run.scope.cancel()
                    await run.done.wait()
        except BaseException:
            # the caller was cancelled while waiting: the child is cancelled at once rather
            # than left running unsupervised (with no deadline, out of every snapshot)
            run.scope.cancel()
            child.run = None
            child.started_at = None
            child.state = RunState.STOPPED
            raise
        if run.error is not None:
            # it failed on its way out, or just before the stop (its exit report is ignored)
            child.last_error = run.error
            _log.error(
                "supervisor %r: child %r failed while stopping: %r",
                self._name,
                child.spec.name,
                run.error,
                exc_info=run.error,
                extra={"supervisor": self._name, "child": child.spec.name},
            )
        child.run = None
        child.started_at = None
        child.state = RunState.STOPPED

    def _next_due(self) -> float:
        return min(
            (c.due for c in self._children if c.state is RunState.RESTARTING and c.due is not None),
            default=math.inf,
        )

    async def _on_exit(self, run: _Run) -> None:
        child = run.child
        if run.stopped or run is not child.run or child not in self._children:
            return  # the supervisor ended or replaced this run itself
        child.run = None
        child.started_at = None
        await self._child_exited(child, run.error)

    async def _start_due(self) -> None:
        """Start, in order, the children whose restart is due; a failure is handled as an exit."""
        while self._failure is None and not self._stop_requested:
            now = anyio.current_time()
            child = next(
                (
                    c
                    for c in self._children
                    if c.state is RunState.RESTARTING and c.due is not None and c.due <= now
                ),
                None,
            )
            if child is None:
                return
            error = await self._start(child)
            if error is None:
                _log.info(
                    "supervisor %r: child %r restarted (restart %d)",
                    self._name,
                    child.spec.name,
                    child.restart_count,
                    extra={"supervisor": self._name, "child": child.spec.name},
                )
            else:
                await self._child_exited(child, error, during_start=True)

    async def _child_exited(
        self, child: _Child, error: BaseException | None, *, during_start: bool = False
    ) -> None:
        """Apply the restart policy to ``child``, which exited (or failed to start)."""
        name = child.spec.name
        extra = {"supervisor": self._name, "child": name}
        how = "failed during restart with" if during_start else "exited with"
        outcome = "no exception" if error is None else repr(error)
        if error is not None:
            child.last_error = error
        if not should_restart(child.spec.restart, error):
            child.state = RunState.STOPPED
            if child.spec.restart is Restart.TEMPORARY:
                self._children.remove(child)
            _log.info(
                "supervisor %r: %s child %r %s %s; not restarting it",
                self._name,
                child.spec.restart.value,
                name,
                how,
                outcome,
                extra=extra,
            )
            return
        if not self._intensity.record():
            child.state = RunState.FAILED
            _log.error(
                "supervisor %r: child %r %s %s; more than %d restart(s) within %g s, giving up",
                self._name,
                name,
                how,
                outcome,
                self._max_restarts,
                self._period,
                exc_info=error,
                extra=extra,
            )
            failure = RestartIntensityExceeded(
                supervisor=self._name,
                child=name,
                max_restarts=self._max_restarts,
                period=self._period,
            )
            failure.__cause__ = error
            self._failure = failure
            return
        delay = 0.0 if child.backoff is None else child.backoff.next_delay()
        index = self._children.index(child)
        group = [
            self._children[i] for i in restart_range(self._strategy, index, len(self._children))
        ]
        for sibling in reversed(group):
            if sibling is not child:
                await self._stop_child(sibling)
        due = anyio.current_time() + delay
        for member in group:
            if member is not child and member.spec.restart is Restart.TEMPORARY:
                self._children.remove(member)  # OTP: temporary siblings are not restarted
                continue
            member.state = RunState.RESTARTING
            member.due = due
        others = [m.spec.name for m in group if m is not child and m in self._children]
        _log.warning(
            "supervisor %r: child %r %s %s; restarting it%s in %.3f s",
            self._name,
            name,
            how,
            outcome,
            f" with {', '.join(repr(o) for o in others)} ({self._strategy.value})"
            if others
            else "",
            delay,
            exc_info=error,
            extra=extra,
        )
