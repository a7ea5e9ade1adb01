"""OTP-style supervision trees on anyio (trio or asyncio).

A :class:`Supervisor` starts its children (:class:`ChildSpec`) in order, each reporting
readiness through ``task_status.started()``; restarts them according to their :class:`Restart`
type and the supervisor's :class:`Strategy`, after a :class:`Backoff` delay; gives up with
:exc:`RestartIntensityExceeded` after too many restarts within a period; and stops them in
reverse order, asking each to stop (:func:`current_child`) before cancelling it at its deadline.
:class:`Mailbox` carries typed messages between children with a bounded buffer.
:meth:`Supervisor.snapshot` and :func:`render_snapshot` show the tree.

See ``docs/supervisors.md`` for the model and a complete example.
"""

from ._context import ChildContext, current_child
from ._errors import (
    DuplicateChild,
    MailboxClosed,
    MailboxEmpty,
    MailboxError,
    MailboxFull,
    RestartIntensityExceeded,
    StartError,
    SupervisorError,
    UnknownChild,
)
from ._mailbox import Mailbox, MailboxReceiver, MailboxSender, MailboxStatistics
from ._policy import Backoff, BackoffTracker, RestartIntensity
from ._snapshot import ChildSnapshot, RunState, SupervisorSnapshot, render_snapshot
from ._spec import ChildSpec, Restart, Strategy
from ._supervisor import Supervisor

__all__ = [
    # supervision
    "Supervisor",
    "ChildSpec",
    "Restart",
    "Strategy",
    "ChildContext",
    "current_child",
    # pure policy objects
    "Backoff",
    "BackoffTracker",
    "RestartIntensity",
    # introspection
    "RunState",
    "ChildSnapshot",
    "SupervisorSnapshot",
    "render_snapshot",
    # mailboxes
    "Mailbox",
    "MailboxSender",
    "MailboxReceiver",
    "MailboxStatistics",
    # errors
    "SupervisorError",
    "StartError",
    "RestartIntensityExceeded",
    "UnknownChild",
    "DuplicateChild",
    "MailboxError",
    "MailboxFull",
    "MailboxEmpty",
    "MailboxClosed",
]
