"""A TCP proxy that injects connection faults between a client and a Redis server.

``async with open_fault_proxy(port) as proxy:`` listens on ``proxy.url``; every accepted
connection is forwarded to the server. Arm a fault with :meth:`FaultProxy.cut_on_reply`: the
next server reply matching the predicate is *not* forwarded; instead both sides of that
connection are closed. That is exactly "the server ran the command but the reply was lost".
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import anyio
import anyio.abc
import anyio.lowlevel
from anyio.abc import SocketAttribute


class FaultProxy:
    def __init__(self, upstream_port: int, upstream_host: str = "127.0.0.1") -> None:
        self.upstream = (upstream_host, upstream_port)
        self.port = 0
        self.connections = 0
        self.cuts = 0
        self._cut_when: Callable[[bytes], bool] | None = None
        self.cut_done = anyio.Event()
        self.piece_size = 0
        self.pieces = 0
        self.down = False
        self._links: set[anyio.CancelScope] = set()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def cut_on_reply(self, predicate: Callable[[bytes], bool]) -> None:
        """Drop the next server-to-client chunk matching ``predicate`` and close that link."""
        self.cut_done = anyio.Event()
        self._cut_when = predicate

    def go_down(self) -> None:
        """A network outage: close every link, and every new one at once, until
        :meth:`come_back` (nothing sent meanwhile reaches the server)."""
        self.down = True
        for scope in self._links:
            scope.cancel()

    def come_back(self) -> None:
        self.down = False

    def split_replies(self, size: int) -> None:
        """Forward server-to-client bytes in pieces of at most ``size`` bytes."""
        self.piece_size = size

    async def _forward(self, downstream: anyio.abc.SocketStream, chunk: bytes) -> None:
        size = self.piece_size
        if not size:
            await downstream.send(chunk)
            return
        for start in range(0, len(chunk), size):
            await downstream.send(chunk[start : start + size])
            self.pieces += 1
            await anyio.lowlevel.checkpoint()

    async def _handle(self, downstream: anyio.abc.SocketStream) -> None:
        self.connections += 1
        async with downstream:
            if self.down:
                return
            with anyio.CancelScope() as link:
                self._links.add(link)
                try:
                    await self._link(downstream)
                finally:
                    self._links.discard(link)

    async def _link(self, downstream: anyio.abc.SocketStream) -> None:
        try:
            upstream = await anyio.connect_tcp(*self.upstream)
        except OSError:
            return
        async with upstream, anyio.create_task_group() as tg:

            async def client_to_server() -> None:
                try:
                    async for chunk in downstream:
                        await upstream.send(chunk)
                except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                    pass
                tg.cancel_scope.cancel()

            async def server_to_client() -> None:
                try:
                    async for chunk in upstream:
                        cut = self._cut_when
                        if cut is not None and cut(chunk):
                            self._cut_when = None
                            self.cuts += 1
                            self.cut_done.set()
                            break
                        await self._forward(downstream, chunk)
                except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                    pass
                tg.cancel_scope.cancel()

            tg.start_soon(client_to_server)
            tg.start_soon(server_to_client)


@asynccontextmanager
async def open_fault_proxy(upstream_port: int) -> AsyncIterator[FaultProxy]:
    proxy = FaultProxy(upstream_port)
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
    proxy.port = listener.extra(SocketAttribute.local_port)
    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, proxy._handle)
        try:
            yield proxy
        finally:
            tg.cancel_scope.cancel()
