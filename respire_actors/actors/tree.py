"""The supervisor of one consumer: the same actors for job queues and stream workers."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import anyio
import anyio.abc

from supervisors import (
    ChildSpec,
    Mailbox,
    Restart,
    StartError,
    Supervisor,
    SupervisorError,
    SupervisorSnapshot,
    current_child,
)

from ..errors import RespireError, ValidationError
from ..startup import retry_while_loading
from .completer import run_completer
from .options import duration_ms
from .reader import run_reader
from .renewer import run_renewer
from .restarts import RegistrationSupervisor, RestartLimits
from .runner import run_runner_pool
from .runtime import QueueRuntime, WorkerStatistics, log
from .sampler import run_sampler
from .source import PreparingSource, remove_consumer, stream_keys
from .sweeper import run_sweeper


async def run_membership(
    rt: QueueRuntime, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
) -> None:
    """This consumer's membership of its group, as the first child of the registration's
    supervisor (started first, stopped last).

    At start it runs the start-up checks, so a tree from ``build()`` composed into any
    supervisor runs them with no second entry point to forget: it creates the consumer group of
    a new stream (a vanished one raises :class:`ConsumerGroupMissing` unless
    ``recreate_missing_group`` says otherwise), then the source's own checks (a job queue's
    stored rate policy). Steps refused with ``LOADING`` are repeated; any other failure fails
    the start. At a graceful stop, once every other child has stopped (the completer has
    committed what finished), it removes this process's consumer from the group if nothing is
    pending for it, so restarts do not add consumers forever; deliveries left pending keep the
    consumer for recovery."""
    ctx = current_child()
    await retry_while_loading(rt.ensure_group)
    if isinstance(rt.source, PreparingSource):
        await retry_while_loading(rt.source.prepare)
    task_status.started()
    with ctx.stop_scope():
        await anyio.sleep_forever()
    try:
        with anyio.CancelScope(shield=True):
            for stream in stream_keys(rt.source):
                if await remove_consumer(rt.client, stream, rt.group, rt.consumer):
                    rt.stats.consumers_removed += 1
    except RespireError as exc:
        log.warning("%s: could not remove consumer %s at shutdown: %s", rt.name, rt.consumer, exc)


def consumer_supervisor(
    name: str,
    rt: QueueRuntime,
    *,
    recovery: bool = True,
    before_reader: Sequence[ChildSpec] = (),
    limits: RestartLimits | None = None,
) -> Supervisor:
    """``membership, sampler, [renewer], completer, runners, [sweeper], *before_reader,
    reader`` under one_for_one.

    ``membership`` runs the start-up checks and, at a graceful stop, removes this consumer from
    the group when nothing is pending for it (see :func:`run_membership`). The ``renewer``
    (with ``renew_leases``, the default) keeps running handlers' leases alive and cancels the
    lost ones; it starts before the completer and the runners and stops after them, so handlers
    finishing in the shutdown grace, and outcomes the completer still drains, keep their
    leases. Started in that order and stopped in reverse: intake stops first, runners get the
    shutdown grace, the completer drains, the renewer stops after it. Without ``recovery`` no
    sweeper runs (no startup replay, no visibility recovery), and the reader does not wait for a
    replay. ``limits`` (default ``RestartLimits()``) bound the actors' restarts; the returned
    supervisor waits out transient outages (see :class:`RegistrationSupervisor`).
    """
    grace = duration_ms(rt.options.shutdown_grace, what="shutdown_grace", allow_zero=True) / 1000
    io = rt.client.settings.command_timeout + 1
    children = [
        ChildSpec("membership", run_membership, rt, shutdown=io),
        ChildSpec("sampler", run_sampler, rt, shutdown=io),
    ]
    if rt.options.renew_leases:
        # before the completer, so stopped after it: a lease handed over with an outcome is
        # renewed while the completer drains at shutdown
        children.append(ChildSpec("renewer", run_renewer, rt, shutdown=io))
    children.append(ChildSpec("completer", run_completer, rt, shutdown=grace + 2 * io))
    children.append(ChildSpec("runners", run_runner_pool, rt, shutdown=grace))
    if recovery:
        children.append(ChildSpec("sweeper", run_sweeper, rt, shutdown=io))
    else:
        rt.replay_done.set()
    children += list(before_reader)
    children.append(ChildSpec("reader", run_reader, rt, shutdown=io))
    return RegistrationSupervisor(name, children, limits or RestartLimits(), rt.stats)


class _Started(anyio.abc.TaskStatus[None]):
    """A task status that runs a callback when the tree reports itself started."""

    def __init__(self, started: Callable[[None], None]) -> None:
        self._started = started

    def started(self, value: None = None) -> None:
        self._started(value)


class _HostRoot(Supervisor):
    """The root of a worker's tree: when it stops because a registration met an error no
    restart can fix, its ``run`` raises that error, whether the worker's own ``run`` runs it
    or the tree was composed (``build``) into the application's supervisor."""

    def __init__(self, host: ConsumerHost, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._host = host

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        self._host._fatal = None  # a new run (a composed tree restarted by its parent, say)
        for rt in self._host._runtimes.values():
            # closed when an earlier run of this tree ended: fresh ones for this run
            rt.deliveries = _reopened(rt.deliveries)
            rt.completions = _reopened(rt.completions)
        try:
            await super().run(task_status=task_status)
        finally:
            # The tree has stopped: nothing sends or receives any more. Deliveries still
            # buffered were never started and stay pending in Redis for recovery.
            for rt in self._host._runtimes.values():
                rt.deliveries.close()
                rt.completions.close()
        if self._host._fatal is not None:
            raise self._host._fatal


T = TypeVar("T")


def _reopened(mailbox: Mailbox[T]) -> Mailbox[T]:
    """``mailbox``, or a new empty one like it if it was closed."""
    stats = mailbox.statistics()
    return Mailbox[T](stats.capacity, name=stats.name) if stats.closed else mailbox


class ConsumerHost:
    """What job workers and stream workers share: a root supervisor over one consumer
    supervisor per registration, graceful stop, statistics and snapshots."""

    def __init__(self, name: str, restart_limits: RestartLimits | None = None) -> None:
        if restart_limits is not None and not isinstance(restart_limits, RestartLimits):
            raise ValidationError("restart_limits must be a RestartLimits or None")
        self.name = name
        self.restart_limits = restart_limits or RestartLimits()
        self._runtimes: dict[str, QueueRuntime] = {}
        self._supervisor: Supervisor | None = None
        self._fatal: BaseException | None = None
        # the tree of the run in progress, from the moment it reported itself started
        self._live: Supervisor | None = None
        # set when the run in progress (started or starting) has ended; None between runs
        self._ended: anyio.Event | None = None
        # a stop requested while no run had started (between start_soon(worker.run) and the
        # tree's start, or between two runs): the next run stops as soon as it has started
        self._stop_pending = False

    def _refuse_if_running(self) -> None:
        """A second concurrent run would share and overwrite the first's runtimes and tree."""
        if self._ended is not None:
            raise RuntimeError(
                f"{type(self).__name__} {self.name!r} is already running: stop it first, or "
                "create another one to run it twice"
            )

    def _on_fatal(self, exc: BaseException) -> None:
        """A registration hit an error no restart can fix: stop the whole tree; ``run``
        raises it once the tree has stopped."""
        if self._fatal is None:
            self._fatal = exc
        if self._supervisor is not None:
            self._supervisor.request_stop()

    def _root(self, children: Sequence[Supervisor]) -> Supervisor:
        self._fatal = None  # a new run: an earlier run's fatal error is not this run's
        self._supervisor = _HostRoot(
            self,
            self.name,
            [s.child_spec(restart=Restart.PERMANENT, shutdown=math.inf) for s in children],
            max_restarts=self.restart_limits.root_max_restarts,
            period=self.restart_limits.root_period,
        )
        return self._supervisor

    async def _run_tree(
        self, supervisor: Supervisor, task_status: anyio.abc.TaskStatus[None]
    ) -> None:
        def started(value: None = None) -> None:
            self._live = supervisor
            task_status.started(value)
            if self._stop_pending:
                self._stop_pending = False
                log.info("%s: a stop was requested before this run started; stopping it", self.name)
                supervisor.request_stop()

        ended = self._ended = anyio.Event()
        try:
            await supervisor.run(task_status=_Started(started))
        except StartError as exc:
            # Report the registration's own error (a mismatched policy, a vanished group)
            # rather than the supervisors' start errors wrapped around it.
            cause: BaseException | None = exc
            while isinstance(cause, SupervisorError) and cause.__cause__ is not None:
                cause = cause.__cause__
            if isinstance(cause, RespireError):
                raise cause from exc
            raise
        finally:
            self._live = self._ended = None
            self._stop_pending = False
            ended.set()

    def request_stop(self) -> None:
        """Begin graceful shutdown (intake stops, handlers get their grace period). Requested
        while no run has started (``run`` scheduled but not started yet, say, or a worker run
        again after an earlier run ended), the next run stops as soon as it has started."""
        if self._live is None:
            self._stop_pending = True
        else:
            self._live.request_stop()

    async def stop(self) -> None:
        """Graceful shutdown; returns when the tree has stopped. A run still starting stops once
        it has started. With no run in progress or starting, does nothing (a second ``stop``,
        or one in cleanup after a run ended, does not stop the next run; only
        :meth:`request_stop` carries over to a run about to start)."""
        if self._live is not None:
            await self._live.stop()
            return
        if self._ended is not None:  # a run is starting
            self._stop_pending = True
            await self._ended.wait()

    def statistics(self, name: str) -> WorkerStatistics:
        """This process's counters for one registration (queue or stream name); raises
        :class:`ValidationError` for a name that is not registered or before the first run."""
        return self._runtime_of(name).stats

    def _runtime_of(self, name: str) -> QueueRuntime:
        try:
            return self._runtimes[name]
        except KeyError:
            known = ", ".join(sorted(map(repr, self._runtimes))) or "none yet (not run)"
            raise ValidationError(
                f"{name!r} is not a registration of this worker that has run; known: {known}"
            ) from None

    def consumer_name(self, name: str) -> str:
        """The Redis consumer name one registration uses."""
        return self._runtime_of(name).consumer

    def snapshot(self) -> SupervisorSnapshot | None:
        """The supervision tree's state, or None before it was built."""
        return self._supervisor.snapshot() if self._supervisor else None
