"""What a running child can learn about itself: its name and whether it is asked to stop."""

from __future__ import annotations

import contextvars
from contextlib import AbstractContextManager
from types import TracebackType

import anyio

__all__ = ["ChildContext", "current_child"]


class ChildContext:
    """One run of one child, as the child sees it (see :func:`current_child`).

    A new context is made for every start of the child, so a restarted child never sees the
    stop request meant for its previous run.
    """

    __slots__ = ("_scopes", "_stop_requested", "name", "restart_count", "supervisor")

    def __init__(self, *, name: str, supervisor: str, restart_count: int) -> None:
        self.name = name
        """The child's name."""
        self.supervisor = supervisor
        """The name of the supervisor running it."""
        self.restart_count = restart_count
        """How many times this child had been restarted before this run."""
        self._stop_requested = anyio.Event()
        self._scopes: set[anyio.CancelScope] = set()

    @property
    def stop_requested(self) -> bool:
        """Whether the supervisor has asked this child to stop."""
        return self._stop_requested.is_set()

    async def wait_stop_requested(self) -> None:
        """Wait until the supervisor asks this child to stop.

        The child should then finish its work and return before its shutdown deadline, after
        which its cancel scope is cancelled. If cancelled, nothing is left behind.
        """
        await self._stop_requested.wait()

    def stop_scope(self) -> AbstractContextManager[anyio.CancelScope]:
        """A cancel scope that is cancelled when the supervisor asks this child to stop.

        ``with current_child().stop_scope(): message = await inbox.receive()`` lets a child
        blocked in a wait return promptly on the graceful stop request instead of being
        cancelled at its deadline. Whatever runs inside the scope is cancelled at that
        request, so keep only the wait inside it when the work after it must complete. If the
        request was already made, the scope is cancelled on entry. Usable as
        ``with ctx.stop_scope() as scope:`` (``scope`` is the :class:`anyio.CancelScope`).
        """
        return _StopScope(self)

    def _request_stop(self) -> None:
        self._stop_requested.set()
        for scope in list(self._scopes):
            scope.cancel()

    def __repr__(self) -> str:
        return (
            f"ChildContext(name={self.name!r}, supervisor={self.supervisor!r}, "
            f"restart_count={self.restart_count}, stop_requested={self.stop_requested})"
        )


class _StopScope:
    """Context manager returned by :meth:`ChildContext.stop_scope`."""

    __slots__ = ("_context", "_scope")

    def __init__(self, context: ChildContext) -> None:
        self._context = context
        self._scope = anyio.CancelScope()

    def __enter__(self) -> anyio.CancelScope:
        if self._context.stop_requested:
            self._scope.cancel()
        self._context._scopes.add(self._scope)
        return self._scope.__enter__()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> bool:
        self._context._scopes.discard(self._scope)
        return bool(self._scope.__exit__(exc_type, exc_value, traceback))


_current: contextvars.ContextVar[ChildContext] = contextvars.ContextVar("supervisors_child")


def current_child() -> ChildContext:
    """The :class:`ChildContext` of the supervised child this task belongs to.

    Tasks a child spawns inherit it. Raises :exc:`RuntimeError` when called outside a child.
    """
    try:
        return _current.get()
    except LookupError:
        raise RuntimeError("current_child() called outside a supervised child") from None
