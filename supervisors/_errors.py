"""Exceptions raised by :mod:`supervisors`.

The whole tree::

    Exception
    ├── SupervisorError                 anything a supervisor itself reports
    │   ├── StartError                  a child failed while being started
    │   ├── RestartIntensityExceeded    too many restarts within the period: the supervisor gave up
    │   ├── UnknownChild (LookupError)  no child of that name
    │   └── DuplicateChild (ValueError) a child of that name already exists
    └── MailboxError
        ├── MailboxFull                 ``send_nowait`` on a mailbox whose buffer is full
        ├── MailboxEmpty                ``receive_nowait`` on a mailbox with nothing buffered
        └── MailboxClosed               the mailbox was closed by its owner

A supervisor reports a child's own exception as the ``__cause__`` of the error it raises, so
``raise ... from`` chains read from the supervisor down to the failing child.
"""

from __future__ import annotations

__all__ = [
    "DuplicateChild",
    "MailboxClosed",
    "MailboxEmpty",
    "MailboxError",
    "MailboxFull",
    "RestartIntensityExceeded",
    "StartError",
    "SupervisorError",
    "UnknownChild",
]


class SupervisorError(Exception):
    """Base class of the errors a supervisor raises.

    Attributes:
        supervisor: name of the supervisor reporting the error.
    """

    def __init__(self, message: str, *, supervisor: str) -> None:
        super().__init__(message)
        self.supervisor = supervisor


class StartError(SupervisorError):
    """A child failed while it was being started (before it called ``task_status.started()``).

    Raised by ``await task_group.start(supervisor.run)`` when a child fails during the
    supervisor's initial start (the children already started have been stopped in reverse order
    by then), and by :meth:`Supervisor.start_child`. The child's exception is the ``__cause__``.

    Attributes:
        supervisor: name of the supervisor.
        child: name of the child that failed to start.
    """

    def __init__(self, *, supervisor: str, child: str) -> None:
        super().__init__(
            f"supervisor {supervisor!r}: child {child!r} failed to start", supervisor=supervisor
        )
        self.child = child


class RestartIntensityExceeded(SupervisorError):
    """More than ``max_restarts`` restarts happened within ``period`` seconds.

    The supervisor has stopped its remaining children in reverse order and raises this from its
    ``run``; to a parent supervisor that is an ordinary failure of the child that ran it. The
    ``__cause__`` is the last exception of the failing child, or ``None`` if it last exited
    without one (a permanent child that kept returning).

    Attributes:
        supervisor: name of the supervisor that gave up.
        child: name of the child whose exit crossed the limit.
        max_restarts: the supervisor's ``max_restarts``.
        period: the supervisor's ``period`` in seconds.
    """

    def __init__(self, *, supervisor: str, child: str, max_restarts: int, period: float) -> None:
        super().__init__(
            f"supervisor {supervisor!r} gave up: child {child!r} exited and more than "
            f"{max_restarts} restart(s) would have happened within {period:g} s",
            supervisor=supervisor,
        )
        self.child = child
        self.max_restarts = max_restarts
        self.period = period


class UnknownChild(SupervisorError, LookupError):
    """No child of that name in the supervisor.

    Attributes:
        supervisor: name of the supervisor.
        child: the name that was looked up.
    """

    def __init__(self, *, supervisor: str, child: str) -> None:
        super().__init__(f"supervisor {supervisor!r} has no child {child!r}", supervisor=supervisor)
        self.child = child


class DuplicateChild(SupervisorError, ValueError):
    """A child of that name already exists in the supervisor.

    Attributes:
        supervisor: name of the supervisor.
        child: the duplicated name.
    """

    def __init__(self, *, supervisor: str, child: str) -> None:
        super().__init__(
            f"supervisor {supervisor!r} already has a child named {child!r}",
            supervisor=supervisor,
        )
        self.child = child


class MailboxError(Exception):
    """Base class of the errors a :class:`Mailbox` raises.

    Attributes:
        mailbox: the mailbox's name.
    """

    def __init__(self, message: str, *, mailbox: str) -> None:
        super().__init__(message)
        self.mailbox = mailbox


class MailboxFull(MailboxError):
    """``send_nowait`` found the buffer full; the message was not added.

    Attributes:
        mailbox: the mailbox's name.
        capacity: its buffer size.
    """

    def __init__(self, *, mailbox: str, capacity: int) -> None:
        super().__init__(
            f"mailbox {mailbox!r} is full ({capacity} message(s) buffered)", mailbox=mailbox
        )
        self.capacity = capacity


class MailboxEmpty(MailboxError):
    """``receive_nowait`` found no message buffered and no sender waiting."""

    def __init__(self, *, mailbox: str) -> None:
        super().__init__(f"mailbox {mailbox!r} is empty", mailbox=mailbox)


class MailboxClosed(MailboxError):
    """The mailbox was closed by its owner: nothing more can be sent or received."""

    def __init__(self, *, mailbox: str) -> None:
        super().__init__(f"mailbox {mailbox!r} is closed", mailbox=mailbox)
