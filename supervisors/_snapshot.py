"""Immutable pictures of a supervision tree, and a plain-text rendering of them."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from ._spec import Restart, Strategy

__all__ = ["ChildSnapshot", "RunState", "SupervisorSnapshot", "render_snapshot"]


class RunState(enum.Enum):
    """Lifecycle state of a child or of a supervisor."""

    STARTING = "starting"
    """Started, not yet ready (has not called ``task_status.started()``)."""
    RUNNING = "running"
    """Ready and running."""
    STOPPING = "stopping"
    """Asked to stop; waiting for it to return or for its shutdown deadline."""
    STOPPED = "stopped"
    """Not running and not going to be restarted (or not started yet)."""
    RESTARTING = "restarting"
    """Exited; waiting out its backoff delay before it is started again."""
    FAILED = "failed"
    """Exited with an error and not restarted (its supervisor gave up)."""


@dataclass(frozen=True)
class ChildSnapshot:
    """One child at the moment the snapshot was taken.

    Attributes:
        name: the child's name.
        state: its :class:`RunState`.
        restart: its restart type.
        restart_count: how many times it was restarted during this run of its supervisor.
        last_error: ``repr`` of the last exception it exited with, or ``None``.
        started_at: supervisor-clock time it last reported ready, or ``None`` if it is not
            running.
        supervisor: the subtree when the child is itself a supervisor, else ``None``.
    """

    name: str
    state: RunState
    restart: Restart
    restart_count: int
    last_error: str | None
    started_at: float | None
    supervisor: SupervisorSnapshot | None = None


@dataclass(frozen=True)
class SupervisorSnapshot:
    """A supervisor and its children, in start order.

    Attributes:
        name: the supervisor's name.
        strategy: its restart strategy.
        state: its :class:`RunState`.
        max_restarts: restarts allowed within ``period``.
        period: intensity window in seconds.
        restarts_in_period: restarts counted in the current window.
        taken_at: supervisor-clock time the snapshot was taken (compare with ``started_at``).
        children: one :class:`ChildSnapshot` per child.
    """

    name: str
    strategy: Strategy
    state: RunState
    max_restarts: int
    period: float
    restarts_in_period: int
    taken_at: float
    children: tuple[ChildSnapshot, ...]


def _uptime(started_at: float | None, taken_at: float) -> str:
    if started_at is None:
        return "-"
    seconds = max(0.0, taken_at - started_at)
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, seconds = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{seconds:02d}s"


def render_snapshot(snapshot: SupervisorSnapshot) -> str:
    """Render a snapshot as an aligned text tree, one line per supervisor or child.

    Columns: name (indented as a tree), state, restarts (for the top supervisor: restarts in
    the current intensity window out of ``max_restarts``), uptime since the child last reported
    ready, and details (restart type, nested supervisor strategy, last error). Example::

        NAME         STATE       RESTARTS   UPTIME  DETAIL
        root         running     0/3 in 5s          one_for_one
        ├── db       running     0          1m27s   permanent
        ├── workers  running     1          10.0s   permanent, one_for_all supervisor, 1/3 ...
        │   ├── w1   running     2          2.0s    transient
        │   └── w2   restarting  1          -       permanent  last error: ValueError('x')
        └── audit    stopped     0          -       temporary
    """
    rows: list[tuple[str, str, str, str, str]] = []

    def add_supervisor(node: SupervisorSnapshot, prefix: str, label: str) -> None:
        if not rows:
            rows.append(
                (
                    label,
                    node.state.value,
                    f"{node.restarts_in_period}/{node.max_restarts} in {node.period:g}s",
                    "",
                    node.strategy.value,
                )
            )
        last = len(node.children) - 1
        for i, child in enumerate(node.children):
            branch = "└── " if i == last else "├── "
            detail = child.restart.value
            if child.supervisor is not None:
                sub = child.supervisor
                detail += (
                    f", {sub.strategy.value} supervisor, "
                    f"{sub.restarts_in_period}/{sub.max_restarts} restarts in {sub.period:g}s"
                )
            if child.last_error is not None:
                detail += f"  last error: {child.last_error}"
            rows.append(
                (
                    prefix + branch + child.name,
                    child.state.value,
                    str(child.restart_count),
                    _uptime(child.started_at, node.taken_at),
                    detail,
                )
            )
            if child.supervisor is not None:
                add_supervisor(child.supervisor, prefix + ("    " if i == last else "│   "), "")

    add_supervisor(snapshot, "", snapshot.name)
    header = ("NAME", "STATE", "RESTARTS", "UPTIME", "DETAIL")
    widths = [max(len(row[col]) for row in [header, *rows]) for col in range(4)]
    lines = []
    for row in [header, *rows]:
        cells = [row[col].ljust(widths[col]) for col in range(4)]
        lines.append("  ".join([*cells, row[4]]).rstrip())
    return "\n".join(lines)
