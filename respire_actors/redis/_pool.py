"""Connection pools with the coredis waiter stall fixed.

coredis 6.9's internal ``Queue.get`` registers a wake-up event and waits on it while holding a
lock. When that waiter is cancelled (by a cancel scope or by the pool timeout), its event stays
registered: the next ``release`` sets the dead event, and the task that queued behind it is never
woken, although an idle connection sits in the pool. The whole client then stalls.

:class:`SafeQueue` removes a cancelled waiter's event so the next release wakes a live waiter.
:class:`SafeConnectionPool` also returns the connection slot to the pool when a task is cancelled
while it is opening a new connection, and when a leased connection dies (a cancelled blocking
read closes its socket): coredis leaks the slot in both cases, shrinking the pool for good.

Both pools also close a connection's internal memory streams when the connection task ends:
coredis opens them when the connection object is built but closes them only once the socket was
connected, so every failed connection attempt leaked six streams (``ResourceWarning``); the
cluster pool closes its layout's error stream on exit, which coredis never does.
"""

from __future__ import annotations

import contextlib
from types import TracebackType
from typing import Any

from anyio import TASK_STATUS_IGNORED, Event, fail_after
from anyio.abc import TaskStatus
from coredis._concurrency import Queue, QueueFull
from coredis.connection import ClusterConnection, TCPLocation
from coredis.pool import ClusterConnectionPool, ConnectionPool


class SafeQueue(Queue[Any]):
    """coredis's LIFO connection queue, safe to cancel while waiting."""

    async def get(self) -> Any:
        async with self._lock:
            while self.empty():
                event = Event()
                self._getters.append(event)
                try:
                    await event.wait()
                except BaseException:
                    # A cancelled waiter must not keep a wake-up slot: releasing into a dead
                    # event would leave the next waiter asleep forever.
                    with contextlib.suppress(ValueError):
                        self._getters.remove(event)
                    raise
            item = self._queue.pop()
            if self._putters and not self.full():
                self._putters.popleft().set()
            return item


class SafeConnectionPool(ConnectionPool[Any]):
    """A single-server pool whose waiters and connection slots survive cancellation."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._available_connections = SafeQueue(self.max_connections)

    async def get_connection(self, **_: Any) -> Any:
        with fail_after(self.timeout):
            connection = await self._available_connections.get()
        if connection is not None and connection.reusable:
            self.statistics.connection_leased(connection)
            return connection
        if connection is not None:
            connection.invalidate()
        # We hold an empty slot now; give it back unless a live connection takes its place.
        try:
            connection = await self._construct_connection()
            error = await self.task_group.start(self._run_connection, connection)
            if error:
                raise error
        except BaseException:
            self._available_connections.append_nowait(None)
            raise
        self.statistics.connection_created(connection)
        self._online_connections.add(connection)
        self.statistics.connection_leased(connection)
        return connection

    async def _run_connection(
        self, connection: Any, *, task_status: TaskStatus[Any] = TASK_STATUS_IGNORED
    ) -> None:
        wrap = self._ConnectionPool__wrap_connection  # type: ignore[attr-defined]
        try:
            await wrap(connection, task_status=task_status)
        finally:
            _close_buffers(connection)

    def release(self, connection: Any) -> None:
        self.statistics.connection_released(connection)
        if connection.usable:
            self._available_connections.put_nowait(connection)
        else:
            # A leased connection that died (a cancelled blocking read closes its socket) must
            # hand its slot back, or a pool of one is dead for good.
            connection.invalidate()
            self._available_connections.put_nowait(None)


class SafeClusterConnectionPool(ClusterConnectionPool):
    """A cluster pool whose per-node queues and connection slots survive cancellation."""

    def _default_node_queue(self) -> Queue[ClusterConnection]:
        nodes = max(1, len(list(self.cluster_layout.nodes)))
        per_node = self.max_connections_per_node
        size = max(1, self.max_connections if per_node else self.max_connections // nodes)
        return SafeQueue(size)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> None:
        try:
            await super().__aexit__(exc_type, exc_val, exc_tb)
        finally:
            if self._counter == 0:
                # coredis never closes the layout's error stream (ResourceWarning); the pool is
                # not entered again (RedisClient builds a new coredis client per entry).
                for stream in self.cluster_layout._error_stream:
                    stream.close()

    async def _get_connection_by_node(self, node: Any) -> ClusterConnection:
        location = TCPLocation(node.host, node.port)
        queue = self._node_pool(location)
        with fail_after(self.timeout):
            connection = await queue.get()
        if connection is not None and connection.reusable:
            return connection
        if connection is not None:
            connection.invalidate()
        try:
            return await self._make_node_connection(node)
        except BaseException:
            # coredis catches Exception only: a cancellation here leaked the node's slot.
            queue.append_nowait(None)
            raise

    async def _wrap_connection(
        self, connection: ClusterConnection, *, task_status: TaskStatus[Any] = TASK_STATUS_IGNORED
    ) -> None:
        try:
            await super()._wrap_connection(connection, task_status=task_status)
        finally:
            _close_buffers(connection)

    def release(self, connection: ClusterConnection) -> None:
        self.statistics.connection_released(connection)
        queue = self._node_pool(connection.location)
        try:
            if connection.usable:
                queue.put_nowait(connection)
            else:
                connection.invalidate()
                queue.put_nowait(None)
        except QueueFull:
            pass


_BUFFERS = (
    "_write_buffer_in",
    "_write_buffer_out",
    "_push_message_buffer_in",
    "_push_message_buffer_out",
    "_streamed_message_buffer_in",
    "_streamed_message_buffer_out",
)


def _close_buffers(connection: Any) -> None:
    # Closing an already closed memory stream is a no-op.
    for name in _BUFFERS:
        stream = getattr(connection, name, None)
        if stream is not None:
            stream.close()
