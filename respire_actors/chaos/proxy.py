"""A TCP proxy whose upstream can be switched: the failover scenario's stand-in for a virtual IP,
a DNS name or a Sentinel-aware load balancer that moves to the promoted replica.

``await tg.start(proxy.serve)`` listens on ``proxy.url``; every accepted connection is forwarded
to the current upstream. :meth:`SwitchProxy.switch` points new connections at another server and
closes every open one (both sides), as the old primary's death or a VIP move would: a command in
flight on a closed connection has an unknown outcome, and clients reconnect to the new upstream.
:meth:`SwitchProxy.partition` keeps the connections open but drops every byte from then on (a
network partition: put a replica's replication link through it to make it fall behind).
"""

from __future__ import annotations

import anyio
import anyio.abc
from anyio.abc import SocketAttribute, TaskStatus


class SwitchProxy:
    def __init__(self, upstream_port: int, upstream_host: str = "127.0.0.1") -> None:
        self.upstream = (upstream_host, upstream_port)
        self.port = 0
        self.connections = 0
        self.closed_by_switch = 0
        self.partitioned = False
        self.dropped = 0  # bytes dropped while partitioned
        self._open: set[anyio.CancelScope] = set()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def switch(self, upstream_port: int) -> int:
        """Forward new connections to ``upstream_port``; close every open one. Returns how
        many were closed."""
        self.upstream = (self.upstream[0], upstream_port)
        scopes, self._open = self._open, set()
        for scope in scopes:
            scope.cancel()
        self.closed_by_switch += len(scopes)
        return len(scopes)

    def partition(self) -> None:
        """Drop every byte in both directions from now on; connections stay open."""
        self.partitioned = True

    async def serve(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Listen until cancelled (start it with ``await tg.start(proxy.serve)``)."""
        listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=self.port)
        self.port = listener.extra(SocketAttribute.local_port)
        async with listener:
            task_status.started()
            await listener.serve(self._handle)

    async def _handle(self, downstream: anyio.abc.SocketStream) -> None:
        self.connections += 1
        scope = anyio.CancelScope()
        self._open.add(scope)
        with scope:
            async with downstream:
                try:
                    upstream = await anyio.connect_tcp(*self.upstream)
                except OSError:
                    return  # the upstream is down: the client sees the connection close
                async with upstream, anyio.create_task_group() as tg:
                    tg.start_soon(self._pump, downstream, upstream, tg.cancel_scope)
                    tg.start_soon(self._pump, upstream, downstream, tg.cancel_scope)
        self._open.discard(scope)

    async def _pump(
        self, source: anyio.abc.SocketStream, sink: anyio.abc.SocketStream, scope: anyio.CancelScope
    ) -> None:
        try:
            async for chunk in source:
                if self.partitioned:
                    self.dropped += len(chunk)
                    continue
                await sink.send(chunk)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            pass
        scope.cancel()
