"""Connection pools with the coredis waiter stall fixed.

coredis 6.9's internal ``Queue.get`` registers a wake-up event and waits on it while holding a
lock. When that waiter is cancelled (by a cancel scope or by the pool timeout), its event stays
registered: the next ``release`` sets the dead event, and the task that queued behind it is never
woken, although an idle connection sits in the pool. The whole client then stalls.

:class:`SafeQueue` removes a cancelled waiter's event so the next release wakes a live waiter.
:class:`SafeConnectionPool` also returns the connection slot to the pool when a task is cancelled
while it is opening a new connection, and when a leased connection dies (a cancelled blocking
read closes its socket): coredis leaks the slot in both cases, shrinking the pool for good.
"""

from __future__ import annotations

from typing import Any

from anyio import Event, fail_after
from coredis._concurrency import Queue, QueueFull
from coredis.connection import ClusterConnection
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
                    try:
                        self._getters.remove(event)
                    except ValueError:
                        pass
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
            wrap = self._ConnectionPool__wrap_connection  # type: ignore[attr-defined]
            error = await self.task_group.start(wrap, connection)
            if error:
                raise error
        except BaseException:
            self._available_connections.append_nowait(None)
            raise
        self.statistics.connection_created(connection)
        self._online_connections.add(connection)
        self.statistics.connection_leased(connection)
        return connection

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
    """A cluster pool whose per-node queues survive cancelled waiters."""

    def _default_node_queue(self) -> Queue[ClusterConnection]:
        nodes = max(1, len(list(self.cluster_layout.nodes)))
        size = max(
            1,
            self.max_connections if self.max_connections_per_node else self.max_connections // nodes,
        )
        return SafeQueue(size)

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
