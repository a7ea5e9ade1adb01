"""How a worker's supervision tree restarts its actors, and why an outage of one queue's
server never stops the other queues (docs/architecture.md, "Restart policy").

Each registration (a job queue or a stream) runs under its own :class:`RegistrationSupervisor`:
its actors are restarted one for one, with backoff, within ``actor_max_restarts`` per
``actor_period``. When that limit is crossed the registration's supervisor gives up. If the
error behind it is *transient* (the server or its slot is unreachable, loading, failing over,
refusing the credentials during a rotation), the registration waits ``outage_backoff`` and
starts again, forever, without counting against the root: one queue's outage cannot escalate
to the root and stop the other queues. Any other error (a configuration error, a missing
permission, a wrong key type, a bug) escalates to the root as before, and the root stops the
whole worker once it sees more than ``root_max_restarts`` of them within ``root_period``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import anyio
import anyio.abc

from supervisors import (
    Backoff,
    BackoffTracker,
    ChildSpec,
    RestartIntensityExceeded,
    StartError,
    Supervisor,
    SupervisorError,
    current_child,
)

from ..errors import RedisUnavailable, ServerError, ServerLoading, ValidationError
from .runtime import WorkerStatistics, log

TRANSIENT_SERVER_CODES = frozenset({"CLUSTERDOWN", "TRYAGAIN", "MASTERDOWN", "LOADING"})
"""Server error codes that mean "not now" rather than "never": the command did not run."""


@dataclass(frozen=True)
class RestartLimits:
    """The restart limits of a worker's supervision tree (``Worker(restart_limits=...)``).

    actor_max_restarts, actor_period: restarts of one registration's actors (all together)
        allowed within ``actor_period`` seconds before its supervisor gives up (default 10 in
        30 s).
    actor_backoff: the delay before restarting one actor (default 0.1 s doubling to 5 s).
    outage_backoff: the delay before starting a registration again after it gave up on a
        transient error (default 1 s doubling to 30 s; reset after 60 s of healthy running).
        Such restarts are unlimited and never count against the root.
    root_max_restarts, root_period: registrations that gave up on a permanent error, allowed
        within ``root_period`` seconds before the whole worker stops (default 3 in 60 s).

    Raises :class:`ValidationError` for a count that is not an int >= 0, a period that is not
    a positive finite number of seconds, or a backoff that is not a ``supervisors.Backoff``.
    """

    actor_max_restarts: int = 10
    actor_period: float = 30.0
    actor_backoff: Backoff = field(default_factory=lambda: Backoff(initial=0.1, maximum=5.0))
    outage_backoff: Backoff = field(
        default_factory=lambda: Backoff(initial=1.0, maximum=30.0, reset_after=60.0)
    )
    root_max_restarts: int = 3
    root_period: float = 60.0

    def __post_init__(self) -> None:
        for name in ("actor_max_restarts", "root_max_restarts"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValidationError(f"{name} must be an int >= 0, got {value!r}")
        for name in ("actor_period", "root_period"):
            value = getattr(self, name)
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not math.isfinite(value)
                or value <= 0
            ):
                raise ValidationError(f"{name} must be a positive number of seconds, got {value!r}")
        for name in ("actor_backoff", "outage_backoff"):
            if not isinstance(getattr(self, name), Backoff):
                raise ValidationError(f"{name} must be a supervisors.Backoff")


def root_cause(exc: BaseException) -> BaseException:
    """The error behind the supervisors' own wrappers (StartError, RestartIntensityExceeded)."""
    cause: BaseException = exc
    while isinstance(cause, SupervisorError) and cause.__cause__ is not None:
        cause = cause.__cause__
    return cause


def is_transient(exc: BaseException) -> bool:
    """Whether a registration's failure is an outage to wait out rather than a fault."""
    cause = root_cause(exc)
    if isinstance(cause, RedisUnavailable | ServerLoading):
        return True
    return isinstance(cause, ServerError) and cause.code in TRANSIENT_SERVER_CODES


class RegistrationSupervisor(Supervisor):
    """The supervisor of one registration's actors that outlives transient outages.

    Its first start behaves like any supervisor's (a failure fails the worker's start: the
    start-up checks); a start after the root restarted it (a fault) reports ready at once and
    treats its own start-up failures like later ones. Afterwards, when it gives up on a
    transient error (see :func:`is_transient`), :meth:`run` waits ``outage_backoff`` and runs
    the actors again instead of raising; a stop request ends the wait. Other errors are raised
    to the parent.
    """

    def __init__(
        self,
        name: str,
        children: Sequence[ChildSpec],
        limits: RestartLimits,
        stats: WorkerStatistics | None = None,
    ) -> None:
        super().__init__(
            name,
            children,
            max_restarts=limits.actor_max_restarts,
            period=limits.actor_period,
            backoff=limits.actor_backoff,
        )
        self._outage_backoff = limits.outage_backoff
        self._stats = stats

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        tracker = BackoffTracker(self._outage_backoff, clock=anyio.current_time)
        try:
            ctx = current_child()
        except RuntimeError:  # run on its own, not as a child
            ctx = None
        ready = _Ready(task_status, tracker)
        if ctx is not None and ctx.restart_count > 0:
            # restarted by the root after a fault: only the worker's own start is strict. The
            # root hears "ready" at once, and an outage while the actors start again is waited
            # out like any other (it used to count against the root, and stop the worker)
            ready.report()
        while True:
            try:
                await super().run(task_status=ready)
                return  # a graceful stop
            except (RestartIntensityExceeded, StartError) as exc:
                if not ready.reported or not is_transient(exc):
                    raise  # a failed first start (the start-up checks), or a fault
                if self._stats is not None:
                    self._stats.outages += 1
                delay = tracker.next_delay()
                log.warning(
                    "%s: gave up on an outage (%s); starting again in %.1fs",
                    self.name,
                    root_cause(exc),
                    delay,
                )
            stop_scope = ctx.stop_scope() if ctx is not None else anyio.CancelScope()
            with stop_scope:
                await anyio.sleep(delay)
            if ctx is not None and ctx.stop_requested:
                return


class _Ready:
    """The task status of every run: the parent hears "ready" once, at the first run; each
    run's readiness starts the outage backoff's healthy-run clock."""

    def __init__(self, parent: anyio.abc.TaskStatus[None], tracker: BackoffTracker) -> None:
        self._parent = parent
        self._tracker = tracker
        self.reported = False

    def started(self, value: None = None) -> None:
        self._tracker.started()
        self.report()

    def report(self) -> None:
        """Tell the parent the registration is running (once)."""
        if not self.reported:
            self.reported = True
            self._parent.started()
